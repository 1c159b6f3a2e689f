# cmake -DSOURCE_DIR=... -DOUTPUT=... -P GitRevision.cmake
# Writes OUTPUT (a header defining DDPRUN_GIT_REVISION) with the source tree's git revision,
# "-dirty" when it has uncommitted changes, "unknown" outside git. The file is rewritten only
# when the text changes, so an unchanged revision rebuilds nothing.
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD
  OUTPUT_VARIABLE rev OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
if(NOT rc EQUAL 0 OR rev STREQUAL "")
  set(rev "unknown")
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" status --porcelain --untracked-files=no
    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT changes STREQUAL "")
    string(APPEND rev "-dirty")
  endif()
endif()
set(text "#pragma once\n#define DDPRUN_GIT_REVISION \"${rev}\"\n")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
