# Packaging tests (issue 22): shift-run in the build tree (label unit), and
# the DEB/RPM builds with their linters (label pkg: minutes, run by
# scripts/test, not by the unit tier).
add_test(NAME pkg_shift_run
  COMMAND ${CMAKE_SOURCE_DIR}/tests/pkg/shift_run.sh ${CMAKE_BINARY_DIR}/bin ${CMAKE_BINARY_DIR}/lib)
set_tests_properties(pkg_shift_run PROPERTIES LABELS unit TIMEOUT 60)
add_test(NAME pkg_deb COMMAND ${CMAKE_SOURCE_DIR}/tests/pkg/deb.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(pkg_deb PROPERTIES LABELS pkg TIMEOUT 900)
add_test(NAME pkg_rpm COMMAND ${CMAKE_SOURCE_DIR}/tests/pkg/rpm.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(pkg_rpm PROPERTIES LABELS pkg TIMEOUT 900)
# The packages installed on the QEMU testbed (as root, like e2e_testbed):
# shift-system makes an unmodified ib_write_bw survive a NIC failure, its
# removal restores the distro library, shift-run protects with shift alone
# (about 4 minutes, 10 on a slow host: dpkg in a guest).
add_test(NAME pkg_testbed
  COMMAND ${CMAKE_SOURCE_DIR}/tests/pkg/testbed_install.sh ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR})
set_tests_properties(pkg_testbed PROPERTIES LABELS "pkg;e2e" TIMEOUT 1200
  RESOURCE_LOCK testbed RUN_SERIAL TRUE)
