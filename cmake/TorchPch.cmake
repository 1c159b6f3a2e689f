# Precompiled LibTorch headers, for the build's speed only (no source depends on them).
#
# Parsing <torch/torch.h> is most of what building one of our LibTorch sources costs: on the
# 2-core CI machine a source that takes ~60 s of CPU spends ~35 s of it in that parse, and 55
# of our sources include it. GCC loads a precompiled copy in 10-15 s instead. Loading it is not
# free (the .gch is ~0.8 GB), so a source that reaches no LibTorch header is built without it:
# there the load would cost more than the whole build.
#
# ddprun_torch_pch_everywhere(), called once at the end of the top-level CMakeLists.txt: in
# every target of the tree, the sources that include a LibTorch header (<torch/...>, <ATen/...>,
# <c10/...>), directly or through a project header that does, are compiled with <torch/torch.h>
# precompiled; the others are marked SKIP_PRECOMPILE_HEADERS. A new target needs nothing. The
# scan runs at configure time: a header that starts or stops including LibTorch changes only
# speed until the next configure. GCC only; other compilers build as before.
#
# Two precompiled headers serve every target: GCC rejects one built with -fPIC in a -fPIE
# compile and the reverse, and our libraries are built position-independent (-fPIC) while our
# executables are PIE. Each target reuses one (REUSE_FROM), so each is parsed once per build.

# The project headers that reach LibTorch, as paths relative to the source tree (fixed point
# over the include graph: a header is in when it includes LibTorch or a header that is in).
function(_ddprun_torch_reaching_headers out)
  file(GLOB_RECURSE headers RELATIVE ${PROJECT_SOURCE_DIR}
       ${PROJECT_SOURCE_DIR}/base/*.h ${PROJECT_SOURCE_DIR}/rendezvous/*.h
       ${PROJECT_SOURCE_DIR}/launcher/*.h ${PROJECT_SOURCE_DIR}/worker_runtime/*.h
       ${PROJECT_SOURCE_DIR}/trainers/*.h ${PROJECT_SOURCE_DIR}/tests/*.h
       ${PROJECT_SOURCE_DIR}/bench/*.h)
  set(reaching "")
  foreach(h IN LISTS headers)
    _ddprun_project_includes(${PROJECT_SOURCE_DIR}/${h} _inc_${h} direct)
    if(direct)
      list(APPEND reaching ${h})
    endif()
  endforeach()
  set(changed TRUE)
  while(changed)
    set(changed FALSE)
    foreach(h IN LISTS headers)
      if(h IN_LIST reaching)
        continue()
      endif()
      foreach(i IN LISTS _inc_${h})
        if(i IN_LIST reaching)
          list(APPEND reaching ${h})
          set(changed TRUE)
          break()
        endif()
      endforeach()
    endforeach()
  endwhile()
  set(${out} ${reaching} PARENT_SCOPE)
endfunction()

# FILE's #include "..." lines resolved to paths relative to the source tree (next to FILE
# first, then from the tree's root, as the compiler looks), into OUT; DIRECT is TRUE when FILE
# includes a LibTorch header itself.
function(_ddprun_project_includes file out direct)
  file(STRINGS ${file} lines REGEX "^#include [<\"]")
  get_filename_component(dir ${file} DIRECTORY)
  set(found "")
  set(torch FALSE)
  foreach(line IN LISTS lines)
    if(line MATCHES "^#include <(torch|ATen|c10)/")
      set(torch TRUE)
    elseif(line MATCHES "^#include \"([^\"]+)\"")
      set(name ${CMAKE_MATCH_1})
      if(EXISTS ${dir}/${name})
        file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${dir}/${name})
        list(APPEND found ${rel})
      else()
        list(APPEND found ${name})
      endif()
    endif()
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
  set(${direct} ${torch} PARENT_SCOPE)
endfunction()

# The two hosts of the precompiled header: object libraries of one empty source each, built
# with exactly the flags their users have (LibTorch's compile options and definitions, C++20,
# our warnings), one -fPIC and one -fPIE.
function(_ddprun_torch_pch_hosts)
  set(stub ${CMAKE_BINARY_DIR}/ddprun_torch_pch_stub.cpp)
  if(NOT EXISTS ${stub})  # written once: a new stub would rebuild both hosts' objects
    file(WRITE ${stub} "// The host of the precompiled LibTorch header (cmake/TorchPch.cmake).\n")
  endif()
  foreach(kind pic pie)
    add_library(ddprun_torch_pch_${kind} OBJECT ${stub})
    target_link_libraries(ddprun_torch_pch_${kind} PRIVATE ${TORCH_LIBRARIES} ddprun_warnings)
    target_compile_options(ddprun_torch_pch_${kind} PRIVATE ${TORCH_CXX_FLAGS})
    target_precompile_headers(ddprun_torch_pch_${kind} PRIVATE <torch/torch.h>)
  endforeach()
  set_target_properties(ddprun_torch_pch_pic PROPERTIES POSITION_INDEPENDENT_CODE ON)
  set_target_properties(ddprun_torch_pch_pie PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(ddprun_torch_pch_pie PRIVATE -fPIE)
endfunction()

# TARGET's LibTorch sources use the precompiled header of its kind; its others skip it. Adds
# the number of its LibTorch sources to the variable named COUNT_VAR.
function(_ddprun_torch_pch target reaching count_var)
  get_target_property(type ${target} TYPE)
  # A target built neither -fPIC nor -fPIE could use neither host's header (the top-level
  # CMakeLists.txt turns POSITION_INDEPENDENT_CODE on for all; only the -fPIE host has it off).
  get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
  if(NOT type MATCHES "^(EXECUTABLE|STATIC_LIBRARY|SHARED_LIBRARY|OBJECT_LIBRARY)$" OR NOT pic
     OR target MATCHES "^ddprun_torch_pch_")
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(n 0)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.cpp$")
      continue()  # $<TARGET_OBJECTS:...>, .cu, headers
    endif()
    if(IS_ABSOLUTE ${src})
      set(path ${src})
    else()
      set(path ${source_dir}/${src})
    endif()
    _ddprun_project_includes(${path} includes direct)
    set(user ${direct})
    foreach(i IN LISTS includes)
      if(i IN_LIST reaching)
        set(user TRUE)
        break()
      endif()
    endforeach()
    if(user)
      math(EXPR n "${n} + 1")
    else()
      set_source_files_properties(${path} TARGET_DIRECTORY ${target}
                                  PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
    endif()
  endforeach()
  math(EXPR total "${${count_var}} + ${n}")
  set(${count_var} ${total} PARENT_SCOPE)
  if(n EQUAL 0)
    return()
  endif()
  if(type STREQUAL "EXECUTABLE")
    target_precompile_headers(${target} REUSE_FROM ddprun_torch_pch_pie)
  else()
    target_precompile_headers(${target} REUSE_FROM ddprun_torch_pch_pic)
  endif()
endfunction()

# The targets of DIR and of every directory below it, into OUT.
function(_ddprun_targets_below dir out)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    _ddprun_targets_below(${sub} below)
    list(APPEND targets ${below})
  endforeach()
  set(${out} ${targets} PARENT_SCOPE)
endfunction()

function(ddprun_torch_pch_everywhere)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    return()
  endif()
  _ddprun_targets_below(${PROJECT_SOURCE_DIR} targets)
  _ddprun_torch_reaching_headers(reaching)
  _ddprun_torch_pch_hosts()
  set(users 0)
  foreach(target IN LISTS targets)
    _ddprun_torch_pch(${target} "${reaching}" users)
  endforeach()
  message(STATUS "ddprun: <torch/torch.h> precompiled for ${users} LibTorch sources")
endfunction()
