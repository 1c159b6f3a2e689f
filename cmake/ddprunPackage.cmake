# The installed CMake package: `cmake --install <build> [--component runtime]` puts the static
# libraries ddprun::runtime and ddprun::rendezvous, their public headers and
# lib/cmake/ddprun/ddprunConfig.cmake under the prefix, so that another project can
#   find_package(ddprun REQUIRED)
#   target_link_libraries(app PRIVATE ddprun::runtime)
# (examples/ is such a project). The install rules of the two libraries are in their folders.
include(CMakePackageConfigHelpers)
set(DDPRUN_CMAKE_DIR lib/cmake/ddprun)
install(EXPORT ddprunTargets NAMESPACE ddprun:: DESTINATION ${DDPRUN_CMAKE_DIR}
  COMPONENT runtime)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/ddprunConfig.cmake.in
  ${CMAKE_BINARY_DIR}/ddprunConfig.cmake INSTALL_DESTINATION ${DDPRUN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/ddprunConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/ddprunConfig.cmake ${CMAKE_BINARY_DIR}/ddprunConfigVersion.cmake
  DESTINATION ${DDPRUN_CMAKE_DIR} COMPONENT runtime)
