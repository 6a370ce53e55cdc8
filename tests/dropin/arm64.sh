#!/bin/sh
# The drop-in on arm64 (issue 22 item 10): cross-build it with
# cmake/aarch64-linux-gnu.cmake into BUILD_DIR (incremental: only the
# drop-in, shift_core and the loader tests are built) and run its loader
# tests (dropin_nccl_loader, dropin_local_scope, and noreal.sh: the
# real library missing or unusable, the search, the package path) under
# qemu-user.
# Exit 77 (ctest: skipped) only when the cross toolchain is not installed
# (scripts/deps installs it).
# Usage: arm64.sh SOURCE_DIR BUILD_DIR
set -u
src=$1 bld=$2
missing=
for t in aarch64-linux-gnu-gcc aarch64-linux-gnu-nm qemu-aarch64; do
	command -v "$t" >/dev/null 2>&1 || missing="$missing $t"
done
for f in /usr/lib/aarch64-linux-gnu/libibverbs.so.1 /lib/ld-linux-aarch64.so.1 \
	 /usr/lib/aarch64-linux-gnu/pkgconfig/hiredis.pc \
	 /usr/lib/aarch64-linux-gnu/pkgconfig/cmocka.pc; do
	[ -e "$f" ] || missing="$missing $f"
done
if [ -n "$missing" ]; then
	echo "SKIP: arm64 cross toolchain absent (missing:$missing); run scripts/deps"
	exit 77
fi
set -e
# (configured every time: quick, and picks up new targets)
cmake -S "$src" -B "$bld" -DCMAKE_TOOLCHAIN_FILE="$src/cmake/aarch64-linux-gnu.cmake" \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo >"$bld.configure.log" 2>&1 ||
	{ cat "$bld.configure.log"; exit 1; }
nice cmake --build "$bld" -j2 --target ibverbs nccl_loader scope_loader \
	scope_mod_a scope_mod_b scope_mod_c noreal_prog noverbs ibverbs_nodefault \
	ibverbs_pkg simverbs >"$bld.build.log" 2>&1 ||
	{ tail -40 "$bld.build.log"; exit 1; }
file -L "$bld/lib/libibverbs.so.1" | grep -q "ARM aarch64" ||
	{ echo "FAIL: $bld/lib/libibverbs.so.1 is not an arm64 library"; exit 1; }
ctest --test-dir "$bld" -R '^dropin_(nccl_loader|local_scope)$' --output-on-failure
SHIFT_TEST_EMULATOR=qemu-aarch64 "$src/tests/dropin/noreal.sh" "$bld/lib" \
	"$bld/tests/dropin/nodefault" "$bld/bin/noreal_prog" "$bld/lib/libnoverbs.so" \
	"$bld/tests/dropin/pkg" "$bld/tests/dropin/pkglib" "$bld/tests/dropin/libsimverbs.so"
