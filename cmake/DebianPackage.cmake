# The Debian package: `scripts/package` (or `cpack -G DEB` in the build directory) builds
# ddprun_<version>_amd64.deb with
#   /usr/bin/ddprun, ddprun-store, ddprun-bench, ddprun-trace
#   /usr/lib/libddprun_*.a, /usr/include/ddprun/, /usr/lib/cmake/ddprun/  (find_package(ddprun))
#   /usr/share/man/man1/ddprun.1.gz, ddprun-store.1.gz, ddprun-bench.1.gz  (help2man)
#   /usr/share/bash-completion/completions/ddprun        (ddprun's flags, from --help)
#   /usr/share/doc/ddprun/copyright, changelog.gz, README.md
# Depends: the Debian runtime packages the programs link (dpkg-shlibdeps). Recommends
# openssh-client (--hosts); Suggests slurm-client and the -dev packages a project that
# find_package()s ddprun needs. tests/package/ checks it from an unpacked copy and with lintian.
set(DDPRUN_PKG ${CMAKE_BINARY_DIR}/package)

install(TARGETS ddprun ddprun-store ddprun-bench ddprun-trace RUNTIME DESTINATION bin COMPONENT programs)
# ddprun-bench's scripts, where an installed ddprun-bench looks for them (bench/paths.h).
install(FILES bench/torchrun_wrapper.py bench/ddp_mnist.py bench/mpi_allreduce.c DESTINATION share/ddprun
  COMPONENT programs)

# Man pages from --help (help2man), and the bash completion from ddprun's flag table.
find_program(HELP2MAN help2man)
find_program(GZIP gzip)
if(HELP2MAN AND GZIP)
  set(man_pages)
  foreach(prog ddprun ddprun-store ddprun-bench ddprun-trace)
    if(prog STREQUAL "ddprun")
      set(name "launch and supervise distributed training workers (a torchrun drop-in)")
      set(version_opt)
    elseif(prog STREQUAL "ddprun-bench")
      set(name "benchmarks of ddprun against torchrun, c10d and Gloo")
      set(version_opt)
    elseif(prog STREQUAL "ddprun-trace")
      set(name "summarise a ddprun job timeline: compute, communication, restarts, the straggler")
      set(version_opt --version-string=${PROJECT_VERSION})
    else()
      set(name "a TCPStore-compatible key-value store for ddprun and PyTorch")
      set(version_opt --version-string=${PROJECT_VERSION})
    endif()
    add_custom_command(OUTPUT ${DDPRUN_PKG}/${prog}.1.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${DDPRUN_PKG}
      COMMAND ${CMAKE_COMMAND} -E env PATH=$<TARGET_FILE_DIR:${prog}>:/usr/bin:/bin
              ${HELP2MAN} --no-info --section=1 --name=${name} ${version_opt}
              --output=${DDPRUN_PKG}/${prog}.1 ${prog}
      COMMAND ${GZIP} -9nf ${DDPRUN_PKG}/${prog}.1
      DEPENDS ${prog} VERBATIM)
    list(APPEND man_pages ${DDPRUN_PKG}/${prog}.1.gz)
  endforeach()
  add_custom_target(ddprun_man_pages ALL DEPENDS ${man_pages})
  install(FILES ${man_pages} DESTINATION share/man/man1 COMPONENT programs)
else()
  message(STATUS "ddprun: no help2man or gzip: the package has no man pages (scripts/setup installs help2man)")
endif()

add_custom_command(OUTPUT ${DDPRUN_PKG}/ddprun.bash-completion
  COMMAND ${CMAKE_COMMAND} -DDDPRUN=$<TARGET_FILE:ddprun>
          -DTEMPLATE=${PROJECT_SOURCE_DIR}/packaging/ddprun.bash-completion.in
          -DOUTPUT=${DDPRUN_PKG}/ddprun.bash-completion -P ${PROJECT_SOURCE_DIR}/cmake/Completion.cmake
  DEPENDS ddprun ${PROJECT_SOURCE_DIR}/packaging/ddprun.bash-completion.in
          ${PROJECT_SOURCE_DIR}/cmake/Completion.cmake VERBATIM)
add_custom_command(OUTPUT ${DDPRUN_PKG}/changelog.gz
  COMMAND ${CMAKE_COMMAND} -E make_directory ${DDPRUN_PKG}
  COMMAND sh -c "${GZIP} -9nc ${PROJECT_SOURCE_DIR}/packaging/changelog > ${DDPRUN_PKG}/changelog.gz"
  DEPENDS ${PROJECT_SOURCE_DIR}/packaging/changelog VERBATIM)
add_custom_target(ddprun_package_files ALL
  DEPENDS ${DDPRUN_PKG}/ddprun.bash-completion ${DDPRUN_PKG}/changelog.gz)
install(FILES ${DDPRUN_PKG}/ddprun.bash-completion RENAME ddprun
  DESTINATION share/bash-completion/completions COMPONENT programs)
install(FILES packaging/copyright ${DDPRUN_PKG}/changelog.gz README.md
  DESTINATION share/doc/ddprun COMPONENT programs)

# CPack: one package with every component.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_PACKAGE_CONTACT "ddprun maintainers <maintainers@users.noreply.a-seed-fc527918.example>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "C++ launcher for distributed data-parallel training")
# The extended description (CPack puts the summary above it as the synopsis).
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "ddprun starts, supervises and restarts distributed training workers, as
PyTorch's torchrun does, with the same flags and worker environment, and
without Python in the launch path. It launches under Slurm with no flags and
across hosts over ssh from one command. The package also holds ddprun-store
(a TCPStore-compatible key-value store), ddprun-bench, and the worker runtime
library for LibTorch programs with its headers and CMake package.")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # ddprun_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# OpenSSL is dlopen()ed at its first use (rendezvous/openssl/lazy_openssl.h), so no program's
# DT_NEEDED names it and dpkg-shlibdeps cannot see it: it is named here (the package of
# libssl.so.3 and libcrypto.so.3, the sonames the forwarders load).
# libnghttp2-14: etcd's gRPC transport (rendezvous/etcd/grpc/), likewise dlopen()ed at its first
# use (lazy_nghttp2.h), so dpkg-shlibdeps cannot see it either.
if(DDPRUN_LAZY_OPENSSL)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libssl3, libnghttp2-14")
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libnghttp2-14")
endif()
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "openssh-client")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS
  "slurm-client, libtorch-dev, libgloo-dev, libboost-dev, libssl-dev, nlohmann-json3-dev, zlib1g-dev, cmake")
set(CPACK_STRIP_FILES ON)  # the programs; the static libraries lose their debug info below
set(CPACK_PRE_BUILD_SCRIPTS ${PROJECT_SOURCE_DIR}/cmake/DebianStripLibraries.cmake)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS OFF)
set(CPACK_PACKAGE_DIRECTORY ${DDPRUN_PKG})
# Only what is installed above (no test programs): every component but none other.
set(CPACK_COMPONENTS_ALL runtime programs)
include(CPack)
