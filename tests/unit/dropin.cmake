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

# Plugin-style loading: RTLD_LOCAL modules found through LD_LIBRARY_PATH all
# bind to the drop-in (the real library must stay out of the global scope).
if(IBVERBS_LINK_LIBRARIES)
  set(_scope_verbs ${IBVERBS_LINK_LIBRARIES})
else()
  set(_scope_verbs ${SHIFT_REAL_LIBIBVERBS_PATH})
endif()
add_executable(scope_loader ${CMAKE_SOURCE_DIR}/tests/dropin/scope_loader.c)
target_link_libraries(scope_loader PRIVATE ${CMAKE_DL_LIBS})
add_dependencies(scope_loader ibverbs)
foreach(_m a b c)
  add_library(scope_mod_${_m} MODULE ${CMAKE_SOURCE_DIR}/tests/dropin/scope_mod.c)
  target_link_libraries(scope_mod_${_m} PRIVATE ${_scope_verbs})
  set_target_properties(scope_mod_${_m} PROPERTIES SKIP_BUILD_RPATH TRUE)
  add_dependencies(scope_loader scope_mod_${_m})
endforeach()
add_test(NAME dropin_local_scope
  COMMAND scope_loader ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/libibverbs.so.1
          $<TARGET_FILE:scope_mod_a> $<TARGET_FILE:scope_mod_b> $<TARGET_FILE:scope_mod_c>)
set_tests_properties(dropin_local_scope PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "LD_LIBRARY_PATH=${CMAKE_LIBRARY_OUTPUT_DIRECTORY};SHIFT_LOG_LEVEL=error")

# The real library missing or unusable: an error exit, never a signal; and
# the run-time search (tests/dropin/noreal.sh).
add_executable(noreal_prog ${CMAKE_SOURCE_DIR}/tests/dropin/noreal_prog.c)
target_link_libraries(noreal_prog PRIVATE ${_scope_verbs})
set_target_properties(noreal_prog PROPERTIES SKIP_BUILD_RPATH TRUE)
add_dependencies(noreal_prog ibverbs ibverbs_nodefault)
add_library(noverbs MODULE ${CMAKE_SOURCE_DIR}/tests/dropin/noverbs.c)
add_test(NAME dropin_noreal
  COMMAND ${CMAKE_SOURCE_DIR}/tests/dropin/noreal.sh ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}
          $<TARGET_FILE_DIR:ibverbs_nodefault> $<TARGET_FILE:noreal_prog>
          $<TARGET_FILE:noverbs>)
set_tests_properties(dropin_noreal PROPERTIES LABELS unit TIMEOUT 60)

# arm64: cross build and loader tests under qemu-user (tests/dropin/arm64.sh;
# skipped, exit 77, only without the cross toolchain). Not from a cross
# build itself.
if(NOT CMAKE_CROSSCOMPILING)
  add_test(NAME dropin_arm64
    COMMAND ${CMAKE_SOURCE_DIR}/tests/dropin/arm64.sh ${CMAKE_SOURCE_DIR}
            ${CMAKE_BINARY_DIR}/arm64)
  set_tests_properties(dropin_arm64 PROPERTIES LABELS unit TIMEOUT 900
    SKIP_RETURN_CODE 77)
endif()
