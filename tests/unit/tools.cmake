# Unit tests of the test tools' pure cores (no RDMA device needed):
#   tools_check       pattern generate/verify, notification accounting, counters
#   tools_check_opts  shift-nccl-check's command line
set(_nc ${CMAKE_SOURCE_DIR}/tests/tools/nccl_check)
shift_unit_test(tools_check
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_check.c ${_nc}/check.c)
shift_unit_test(tools_check_opts
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_check_opts.c ${_nc}/opts.c)

# shiftctl's outputs: --help, config masking and bad values, status --json,
# untrusted status directories skipped (tests/shiftctl/shiftctl_test.sh).
add_test(NAME shiftctl_outputs
  COMMAND ${CMAKE_SOURCE_DIR}/tests/shiftctl/shiftctl_test.sh $<TARGET_FILE:shiftctl>)
set_tests_properties(shiftctl_outputs PROPERTIES LABELS unit TIMEOUT 30)
