# CPack pre-build script (cmake/DebianPackage.cmake): strips the debug information from the
# staged static libraries (a RelWithDebInfo build's libddprun_runtime.a is ~100 MiB with it).
file(GLOB_RECURSE libs "${CPACK_TEMPORARY_INSTALL_DIRECTORY}/*.a")
foreach(lib ${libs})
  execute_process(COMMAND strip --strip-debug "${lib}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "strip --strip-debug ${lib} failed")
  endif()
endforeach()
