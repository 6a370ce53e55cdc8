# Cross build for arm64 on a Debian host with multiarch (docs/dropin.md,
# "arm64"): gcc-aarch64-linux-gnu, qemu-user, and the :arm64 -dev packages
# (libibverbs-dev, libhiredis-dev, libcmocka-dev) installed by scripts/deps.
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Tests run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_ASM_COMPILER aarch64-linux-gnu-gcc)
# the arm64 libraries' .pc files, not the host's
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
find_program(SHIFT_QEMU_AARCH64 qemu-aarch64)
if(SHIFT_QEMU_AARCH64)
  # the arm64 dynamic linker and libc come from libc6:arm64 (multiarch,
  # /lib/ld-linux-aarch64.so.1): no -L prefix, no binfmt needed
  set(CMAKE_CROSSCOMPILING_EMULATOR ${SHIFT_QEMU_AARCH64})
endif()
