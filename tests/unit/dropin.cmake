# The drop-in's loading contract (issue 2): exported surface, NCCL-style
# dlvsym resolution, and invisibility to the verbs tools.
add_executable(nccl_loader ${CMAKE_SOURCE_DIR}/tests/dropin/nccl_loader.c)
target_link_libraries(nccl_loader PRIVATE ${CMAKE_DL_LIBS})
add_dependencies(nccl_loader ibverbs)

add_test(NAME dropin_exports
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/dropin/check_exports.py
          ${SHIFT_REAL_LIBIBVERBS_PATH} $<TARGET_FILE:ibverbs>)
add_test(NAME dropin_exports_selftest
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/dropin/check_exports.py
          --self-test ${SHIFT_REAL_LIBIBVERBS_PATH} $<TARGET_FILE:ibverbs>)
add_test(NAME dropin_nccl_loader
  COMMAND nccl_loader ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/libibverbs.so)
add_test(NAME dropin_tools
  COMMAND ${CMAKE_SOURCE_DIR}/tests/dropin/compare_tools.sh ${CMAKE_LIBRARY_OUTPUT_DIRECTORY})
set_tests_properties(dropin_exports dropin_exports_selftest dropin_nccl_loader dropin_tools
  PROPERTIES LABELS unit TIMEOUT 60)
