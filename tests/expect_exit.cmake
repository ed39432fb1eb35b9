# cmake -DEXE=prog -DARGS="a;b" -DEXPECT=2 -P expect_exit.cmake: fails unless prog exits EXPECT.
execute_process(COMMAND ${EXE} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc STREQUAL "${EXPECT}")
  message(FATAL_ERROR "${EXE} ${ARGS} exited ${rc}, expected ${EXPECT}\n${out}\n${err}")
endif()
message(STATUS "exit ${rc} as expected: ${err}")
