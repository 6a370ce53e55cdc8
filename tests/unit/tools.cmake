# Unit tests of the test tools' pure cores (no RDMA device needed):
#   tools_check       pattern generate/verify, notification accounting, counters
#   tools_check_opts  shift-nccl-check's command line
set(_nc ${CMAKE_SOURCE_DIR}/tests/tools/nccl_check)
shift_unit_test(tools_check
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_check.c ${_nc}/check.c)
shift_unit_test(tools_check_opts
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_check_opts.c ${_nc}/opts.c)
