# Unit tests of the simulated RNIC (tests/sim/rnic). They link shift_sim
# only, never the real libibverbs.
foreach(_t test_sim test_sim_rc test_sim_ud)
  shift_unit_test(${_t} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/${_t}.c LIBS shift_sim)
  target_include_directories(${_t} PRIVATE ${CMAKE_SOURCE_DIR}/tests/sim/fixture)
endforeach()
