# SHIFT core unit tests (fake provider; the simulated RNIC has its own).
shift_unit_test(test_ctx SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_ctx.c LIBS shift_core)
shift_unit_test(test_dqp SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_dqp.c LIBS shift_core)
shift_unit_test(test_exchange SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_exchange.c LIBS shift_core)
if(TARGET shift_sim)
  shift_unit_test(test_shadow SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_shadow.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_failover SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_failover.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_channel SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_channel.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_exverbs SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_exverbs.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_srq SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_srq.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_apperr SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_apperr.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_appctl SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_appctl.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_lifecycle SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_lifecycle.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_threads SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_threads.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_limits SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_limits.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_giveup SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_giveup.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_access SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_access.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_poll SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_poll.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_rkeys SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_rkeys.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_early SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_early.c
    LIBS shift_core shift_sim)
endif()
if(TARGET shift_sim)
  shift_unit_test(test_reentry SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_reentry.c
    LIBS shift_core shift_sim)
endif()
shift_unit_test(test_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config.c LIBS shift_base)
# test_post_chain: the Default-state chain path of post_send mirrors a
# chain (inline too) as the general path would, counts once when it hands
# a chain over, and keeps only the WRs before one the provider refuses.
if(TARGET shift_sim)
  shift_unit_test(test_post_chain SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_post_chain.c
    LIBS shift_core shift_sim)
endif()
# test_pmap: the intrusive pointer-keyed hash of the shadow layer's lookups.
shift_unit_test(test_pmap SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_pmap.c
  LIBS shift_core)
# test_prefault: every page of a loaded object made resident ahead of a
# failover (shift/base/prefault.c), shown on a cold 4 MiB module.
add_library(prefault_cold MODULE ${CMAKE_CURRENT_SOURCE_DIR}/prefault_cold.c)
# (the same, to be cut on disk once loaded: nothing of it may run after,
# so no constructor or destructor at all, not even a sanitizer's)
add_library(prefault_cut MODULE ${CMAKE_CURRENT_SOURCE_DIR}/prefault_cold.c)
target_compile_options(prefault_cut PRIVATE -fno-sanitize=all)
target_link_options(prefault_cut PRIVATE -nostartfiles -fno-sanitize=all)
shift_unit_test(test_prefault SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_prefault.c
  LIBS shift_core ${CMAKE_DL_LIBS})
target_compile_definitions(test_prefault PRIVATE
  PREFAULT_COLD_SO="$<TARGET_FILE:prefault_cold>"
  PREFAULT_CUT_SO="$<TARGET_FILE:prefault_cut>")
add_dependencies(test_prefault prefault_cold prefault_cut)
# test_mlx5_wqe: mlx5 WQEs, built byte by byte from the format, read back
# into mirror entries (providers/mlx5_wqe.c), and every WQE that is not the
# one posted refused.
shift_unit_test(test_mlx5_wqe SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_mlx5_wqe.c
  LIBS shift_providers shift_core)
