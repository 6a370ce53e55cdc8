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
add_dependencies(noreal_prog ibverbs ibverbs_nodefault ibverbs_pkg)
add_library(noverbs MODULE ${CMAKE_SOURCE_DIR}/tests/dropin/noverbs.c)

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

# LD_LIBRARY_PATH with modules dlopen'd later that create QPs: listed as
# protected by shiftctl status (tests/dropin/qp_loader.c), over a simulated
# libibverbs (tests/dropin/simverbs.c) as the "real" library.
if(TARGET shift_sim)
  add_library(simverbs SHARED ${CMAKE_SOURCE_DIR}/tests/dropin/simverbs.c)
  target_link_libraries(simverbs PRIVATE shift_sim Threads::Threads)
  target_link_options(simverbs PRIVATE
    -Wl,--version-script=${CMAKE_SOURCE_DIR}/tests/dropin/simverbs.map -Wl,-z,now)
  set_target_properties(simverbs PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/dropin
    LINK_DEPENDS ${CMAKE_SOURCE_DIR}/tests/dropin/simverbs.map)
  add_executable(qp_loader ${CMAKE_SOURCE_DIR}/tests/dropin/qp_loader.c)
  target_link_libraries(qp_loader PRIVATE ${CMAKE_DL_LIBS})
  add_dependencies(qp_loader ibverbs simverbs shiftctl)
  foreach(_m a b)
    add_library(qpmod_${_m} MODULE ${CMAKE_SOURCE_DIR}/tests/dropin/qpmod.c)
    target_link_libraries(qpmod_${_m} PRIVATE ${_scope_verbs})
    set_target_properties(qpmod_${_m} PROPERTIES SKIP_BUILD_RPATH TRUE)
    add_dependencies(qp_loader qpmod_${_m})
  endforeach()
  add_test(NAME dropin_ldpath_protected
    COMMAND qp_loader $<TARGET_FILE:shiftctl> ${CMAKE_BINARY_DIR}/tests/dropin/status
            $<TARGET_FILE:qpmod_a> $<TARGET_FILE:qpmod_b>)
  set_tests_properties(dropin_ldpath_protected PROPERTIES LABELS unit TIMEOUT 60
    ENVIRONMENT "LD_LIBRARY_PATH=${CMAKE_LIBRARY_OUTPUT_DIRECTORY};SHIFT_REAL_LIBIBVERBS=$<TARGET_FILE:simverbs>;SHIFT_KV_URL=mem://dropin-ldpath;SHIFT_STATUS_DIR=${CMAKE_BINARY_DIR}/tests/dropin/status;SHIFT_LOG_LEVEL=info")
endif()

# LD_PRELOAD and NCCL's dlopen("libibverbs.so"): with libibverbs-dev's
# libibverbs.so link in the system directory, LD_PRELOAD alone loads the
# real library a second time under that name (glibc matches an already
# loaded object by file or by soname, and "libibverbs.so" is neither);
# LD_LIBRARY_PATH naming the drop-in's directory as well makes the name
# find the drop-in's own libibverbs.so (docs/dropin.md).
# (a sanitizer build's runtime must come first in the preload list)
set(_san_preload "")
foreach(_san asan tsan)
  if(SHIFT_SANITIZE MATCHES "address" AND _san STREQUAL "asan" OR
     SHIFT_SANITIZE MATCHES "thread" AND _san STREQUAL "tsan")
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=lib${_san}.so
      OUTPUT_VARIABLE _rt OUTPUT_STRIP_TRAILING_WHITESPACE)
    set(_san_preload "${_rt}:")
  endif()
endforeach()
add_test(NAME dropin_preload_nccl
  COMMAND nccl_loader libibverbs.so ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/libibverbs.so)
set_tests_properties(dropin_preload_nccl PROPERTIES LABELS unit TIMEOUT 60
  ENVIRONMENT "LD_PRELOAD=${_san_preload}${CMAKE_LIBRARY_OUTPUT_DIRECTORY}/libibverbs.so.1;LD_LIBRARY_PATH=${CMAKE_LIBRARY_OUTPUT_DIRECTORY};SHIFT_LOG_LEVEL=error")

# (after simverbs: the package path's stand-in for the distro library)
set(_noreal_pkg)
if(TARGET simverbs)
  set(_noreal_pkg $<TARGET_FILE_DIR:ibverbs_pkg> ${CMAKE_BINARY_DIR}/tests/dropin/pkglib
                  $<TARGET_FILE:simverbs>)
endif()
add_test(NAME dropin_noreal
  COMMAND ${CMAKE_SOURCE_DIR}/tests/dropin/noreal.sh ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}
          $<TARGET_FILE_DIR:ibverbs_nodefault> $<TARGET_FILE:noreal_prog>
          $<TARGET_FILE:noverbs> ${_noreal_pkg})
set_tests_properties(dropin_noreal PROPERTIES LABELS unit TIMEOUT 60)

# The libmlx5.so.1 front (libmlx5/): the exported surface equals the real
# libmlx5's, and object-creating mlx5dv calls say they are not protected.
if(TARGET mlx5front)
  add_test(NAME dropin_mlx5_exports
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/tests/dropin/check_exports.py
            ${SHIFT_REAL_LIBMLX5_PATH} $<TARGET_FILE:mlx5front>)
  add_executable(mlx5_prog ${CMAKE_SOURCE_DIR}/tests/dropin/mlx5_prog.c)
  target_link_libraries(mlx5_prog PRIVATE ${SHIFT_REAL_LIBMLX5_PATH} ${_scope_verbs})
  set_target_properties(mlx5_prog PROPERTIES SKIP_BUILD_RPATH TRUE)
  add_dependencies(mlx5_prog mlx5front ibverbs)
  add_test(NAME dropin_mlx5_front
    COMMAND ${CMAKE_SOURCE_DIR}/tests/dropin/mlx5_front.sh ${CMAKE_LIBRARY_OUTPUT_DIRECTORY}
            $<TARGET_FILE:mlx5_prog>)
  set_tests_properties(dropin_mlx5_exports dropin_mlx5_front PROPERTIES LABELS unit TIMEOUT 60)
endif()
