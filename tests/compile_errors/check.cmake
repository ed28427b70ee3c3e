# Compiles one file of this folder, which must fail with exactly one error: the static_assert
# its first line names ("// expect: <text>"). Run by ctest (tests/CMakeLists.txt).
file(STRINGS ${SOURCE} first LIMIT_COUNT 1)
string(REGEX REPLACE "^// expect: " "" expected "${first}")
execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only -I${INCLUDE} ${SOURCE}
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled: expected the error '${expected}'")
endif()
string(REGEX MATCHALL "error:" errors "${err}")
list(LENGTH errors n)
string(FIND "${err}" "${expected}" at)
if(NOT n EQUAL 1 OR at EQUAL -1)
  message(FATAL_ERROR "${SOURCE}: expected exactly one error containing '${expected}', got ${n}:\n${err}")
endif()
