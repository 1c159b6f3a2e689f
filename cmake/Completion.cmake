# cmake -DDDPRUN=... -DTEMPLATE=... -DOUTPUT=... -P Completion.cmake
# Writes ddprun's bash completion: TEMPLATE with @DDPRUN_FLAGS@ replaced by every long flag
# that `ddprun --help` lists (both spellings), so the completion follows the flag table.
execute_process(COMMAND "${DDPRUN}" --help OUTPUT_VARIABLE help RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${DDPRUN} --help failed (${rc})")
endif()
string(REGEX MATCHALL "--[a-z][a-z0-9_-]*" found "${help}")
list(REMOVE_DUPLICATES found)
list(SORT found)
list(JOIN found " " DDPRUN_FLAGS)
configure_file("${TEMPLATE}" "${OUTPUT}" @ONLY)
