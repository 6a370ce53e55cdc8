#!/bin/sh
# The real libibverbs missing or unusable: a verbs program under the drop-in
# gets an error from ibv_get_device_list (errno ELIBACC) and one error line,
# never a signal; and a drop-in whose build-time path is gone still finds the
# real library by searching the system library directories.
# The system-wide package's <libdir>/shift/real/libibverbs.so.1 comes before
# the build-time path and the search (PKG_DIR's drop-in has PKG_LIBDIR as its
# libdir; OTHER_LIB, a libibverbs that is not the system's, stands there);
# and SHIFT_REAL_LIBIBVERBS naming the drop-in itself is refused, then the
# search runs.
# Usage: noreal.sh DROPIN_DIR NODEFAULT_DIR PROG NOVERBS_LIB [PKG_DIR PKG_LIBDIR OTHER_LIB]
# SHIFT_TEST_EMULATOR (e.g. qemu-aarch64) runs PROG of a cross build.
set -u
run=${SHIFT_TEST_EMULATOR:-}
dropin=$1 nodefault=$2 prog=$3 noverbs=$4 pkg=${5:-} pkglib=${6:-} other=${7:-}
tmp=$(mktemp -d) || exit 2
trap 'rm -rf "$tmp"' EXIT
echo "not a library" > "$tmp/libibverbs.so.1"
fail=0

# expect_error LABEL VALUE REASON: exit 1 (not a signal), the reason, one line
expect_error() {
	SHIFT_REAL_LIBIBVERBS=$2 LD_LIBRARY_PATH=$dropin $run "$prog" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	lines=$(grep -c "cannot load the real libibverbs" "$tmp/err")
	if [ "$rc" -ne 1 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$3" "$tmp/err" ||
	   ! grep -q "errno $(printf '%d' 79)" "$tmp/err"; then
		echo "FAIL: $1: exit $rc (want 1), $lines error lines (want 1), reason '$3':"
		cat "$tmp/err"
		fail=1
	else
		echo "ok: $1: exit 1: $(grep 'cannot load' "$tmp/err")"
	fi
}

expect_error "missing file" /nonexistent/libibverbs.so.1 "no such file"
expect_error "not an ELF file" "$tmp/libibverbs.so.1" "not an ELF file"
expect_error "no verbs in it" "$noverbs" "not a libibverbs"
expect_error "relative path" libibverbs.so.1 "must be an absolute path"

# the build-time path of this drop-in does not exist: the search finds the
# real library, and the program sees what it sees without SHIFT
$run "$prog" >"$tmp/plain" 2>&1
plain=$?
SHIFT_LOG_LEVEL=info LD_LIBRARY_PATH=$nodefault $run "$prog" >"$tmp/out" 2>"$tmp/err"
rc=$?
grep -v '^shift:' "$tmp/err" >>"$tmp/out"
if [ "$rc" -ne "$plain" ] || ! cmp -s "$tmp/plain" "$tmp/out" ||
   ! grep -q "SHIFT [0-9.]* *enabled over /.*libibverbs.so" "$tmp/err"; then
	echo "FAIL: search without the build-time path: exit $rc (plain $plain):"
	cat "$tmp/plain" "$tmp/out" "$tmp/err"
	fail=1
else
	echo "ok: search: $(grep -o 'SHIFT [0-9.]* *enabled over .*' "$tmp/err")"
fi
# SHIFT_REAL_LIBIBVERBS at the drop-in itself: one error line, then the search
SHIFT_REAL_LIBIBVERBS=$dropin/libibverbs.so.1 SHIFT_LOG_LEVEL=info LD_LIBRARY_PATH=$dropin \
	$run "$prog" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -ne "$plain" ] || ! grep -q "is SHIFT itself; searching instead" "$tmp/err" ||
   ! grep -q "SHIFT [0-9.]* *enabled over /.*libibverbs.so" "$tmp/err" ||
   grep "SHIFT [0-9.]* *enabled over" "$tmp/err" | grep -q "$dropin"; then
	echo "FAIL: SHIFT_REAL_LIBIBVERBS at the drop-in: exit $rc (plain $plain):"
	cat "$tmp/err"
	fail=1
else
	echo "ok: itself: $(grep -o 'SHIFT [0-9.]* *enabled over .*' "$tmp/err")"
fi

# the package's diverted library is taken first
if [ -n "$pkg" ]; then
	mkdir -p "$pkglib/shift/real"
	ln -sf "$other" "$pkglib/shift/real/libibverbs.so.1"
	SHIFT_LOG_LEVEL=info LD_LIBRARY_PATH=$pkg $run "$prog" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" -ne 0 ] ||
	   ! grep -q "SHIFT [0-9.]* *enabled over $pkglib/shift/real/libibverbs.so.1" "$tmp/err"; then
		echo "FAIL: <libdir>/shift/real not taken first: exit $rc:"
		cat "$tmp/out" "$tmp/err"
		fail=1
	else
		echo "ok: package path: $(grep -o 'SHIFT [0-9.]* *enabled over .*' "$tmp/err"): $(cat "$tmp/out")"
	fi
	# a symbol the real library lacks: exit 127 with the message, as the
	# dynamic linker would end it, not a signal
	SHIFT_REAL_LIBIBVERBS=$other LD_LIBRARY_PATH=$dropin $run "$prog" str >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ "$rc" -ne 127 ] || ! grep -q "symbol lookup error" "$tmp/err"; then
		echo "FAIL: a symbol missing from the real library: exit $rc (want 127):"
		cat "$tmp/out" "$tmp/err"
		fail=1
	else
		echo "ok: missing symbol: exit 127: $(cat "$tmp/err")"
	fi
fi
exit $fail
