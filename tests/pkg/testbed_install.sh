#!/bin/sh
# The Debian packages on the two-host testbed (issue #22): build shift and
# shift-system from a copy of the tree, boot the testbed, install them in
# both guests (each guest's root is this machine's root read-only under a
# tmpfs overlay, so this machine's own /usr/lib is never touched; checked at
# the end), and run an unmodified ib_write_bw with no SHIFT variable set
# through a NIC failure (A's rail-0 NIC down 5 s):
#   1. shift-system installed: it survives, failover and failback logged,
#      SHIFT loaded from the diverted distro library in shift/real;
#   2. shift-system removed: the distro library is back (link and
#      diversions as before) and the same run fails, as plain does;
#   3. shift alone, through shift-run (namespace from SLURM_JOB_ID): it
#      survives again.
# The KV URL and log level come from /etc/shift/shift.conf, written in each
# guest as an administrator would.
#   testbed_install.sh SOURCE_DIR BUILD_DIR
set -u
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
tb="$src/scripts/testbed"
export SHIFT_BUILD_DIR="$build"
export SHIFT_TESTBED_DIR="$build/testbed-pkg"
tmp=$(mktemp -d /tmp/shift-tbpkg.XXXXXX)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
cleanup() { "$tb" down >/dev/null 2>&1; rm -rf "$tmp"; }
trap cleanup EXIT
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
lib=/usr/lib/$ma
host_link=$(readlink "$lib/libibverbs.so.1")

# -- the packages, built before the guests boot (they read them over 9p)
mkdir "$tmp/src"
(cd "$src" && git ls-files -co --exclude-standard -z) |
	(cd "$src" && xargs -0 cp --parents -t "$tmp/src")
(cd "$tmp/src" && dpkg-buildpackage -us -uc -b -j2 >"$tmp/build.log" 2>&1) ||
	{ tail -30 "$tmp/build.log"; exit 1; }
deb=$(ls "$tmp"/shift_*.deb | grep -v dbgsym)
sys=$(ls "$tmp"/shift-system_*.deb)

"$tb" prepare >"$tmp/prepare.log" 2>&1 || { tail -20 "$tmp/prepare.log"; exit 1; }
"$tb" up >"$tmp/up.log" 2>&1 || { tail -20 "$tmp/up.log"; exit 1; }

# dpkg in a guest reads its whole database over 9p: 160 s on a slow host
# (2026-11-28), past exec's default 120 s; both guests at once
dpkg_timeout=900
for h in A B; do
	"$tb" exec --timeout $dpkg_timeout $h "dpkg -i $deb $sys >/tmp/dpkg.log 2>&1 ||
		{ tail -5 /tmp/dpkg.log; exit 1; }
		printf 'kv_url = %s\nkv_namespace = tbpkg\nlog_level = info\n' \"\$SHIFT_KV_URL\" \
			>/etc/shift/shift.conf && chmod 644 /etc/shift/shift.conf" >"$tmp/install.$h" 2>&1 ||
		echo "install on $h failed: $(tail -5 "$tmp/install.$h")" >"$tmp/install.$h.fail" &
done
wait
for h in A B; do
	[ -e "$tmp/install.$h.fail" ] && fail "$(cat "$tmp/install.$h.fail")"
done

# pair TAG PORT [PREFIX]: server on B, client on A for 30 s, A's rail-0 NIC
# down from 8 s to 13 s; the client's output in $tmp/TAG.A. (30 s: on a slow
# host, 2026-12-02, the probe found the path 4.3 s after the NIC came up and
# the failback took 2.4 s more, past the 22 s the client had)
pair() {
	"$tb" exec B "env -u SHIFT_KV_URL -u SHIFT_KV_NAMESPACE SLURM_JOB_ID=4711 $3 timeout 36 \
		ib_write_bw -d rxe0 -p $2 -x 1 -F --run_infinitely -D 1 --report_gbits 2>&1" \
		>"$tmp/$1.B" 2>&1 &
	bpid=$!
	sleep 3
	"$tb" exec A "env -u SHIFT_KV_URL -u SHIFT_KV_NAMESPACE SLURM_JOB_ID=4711 $3 timeout 30 \
		ib_write_bw -d rxe0 -p $2 -x 1 -F --run_infinitely -D 1 --report_gbits 198.18.0.2 2>&1; \
		echo \"client exit \$?\"" >"$tmp/$1.A" 2>&1 &
	apid=$!
	sleep 8
	"$tb" inject nic-down A 0 >/dev/null
	sleep 5
	"$tb" inject nic-up A 0 >/dev/null
	wait $apid
	wait $bpid
}

# survived TAG: ended by its timeout (124), no error, failover and failback logged
survived() {
	grep -q "client exit 124" "$tmp/$1.A" || fail "$1: client did not run to its end"
	grep -q "Completion with error\|Error occurred" "$tmp/$1.A" && fail "$1: the application saw an error"
	grep -q "failing over to backup QP" "$tmp/$1.A" || fail "$1: no failover logged"
	grep -q "back on the default QP in both directions" "$tmp/$1.A" || fail "$1: no failback logged"
}

pair system 18711 ""
survived system
grep -q "enabled over $lib/shift/real/libibverbs.so.1" "$tmp/system.A" ||
	fail "system: SHIFT did not wrap the diverted library"

for h in A B; do
	"$tb" exec --timeout $dpkg_timeout $h "dpkg -r shift-system >/tmp/dpkg.log 2>&1 ||
		{ tail -5 /tmp/dpkg.log; exit 1; }
		[ \"\$(readlink $lib/libibverbs.so.1)\" = '$host_link' ] || exit 1
		! dpkg-divert --list | grep -q libibverbs" >"$tmp/remove.$h" 2>&1 ||
		echo "removal on $h: distro library not restored $(tail -5 "$tmp/remove.$h")" \
			>"$tmp/remove.$h.fail" &
done
wait
for h in A B; do
	[ -e "$tmp/remove.$h.fail" ] && fail "$(cat "$tmp/remove.$h.fail")"
done
pair removed 18712 ""
grep -q "^shift:" "$tmp/removed.A" && fail "removed: SHIFT still loaded"
grep -q "client exit 124" "$tmp/removed.A" && fail "removed: plain survived the NIC failure (no fault?)"

pair shiftrun 18713 "shift-run --"
survived shiftrun
grep -q "KV store .*reachable (namespace slurm-4711)" "$tmp/shiftrun.A" ||
	fail "shiftrun: no passing setup check for the Slurm job's namespace"
pw=$(sed -n 's/^TB_REDIS_PASSWORD=//p' "$SHIFT_TESTBED_DIR/run/spool/guest.env" 2>/dev/null)
[ -n "$pw" ] || fail "no KV password found in the testbed's guest.env"
[ -n "$pw" ] && grep -q -- "$pw" "$tmp/shiftrun.A" "$tmp/system.A" &&
	fail "the KV password appears in the output"

# this machine's own library was never touched
[ "$(readlink "$lib/libibverbs.so.1")" = "$host_link" ] || fail "the build machine's libibverbs.so.1 changed"
dpkg-divert --list | grep -q libibverbs && fail "the build machine has a libibverbs diversion"

for t in system removed shiftrun; do
	echo "== $t: $(grep -c '^ 65536' "$tmp/$t.A") throughput lines, $(grep -o 'client exit [0-9]*' "$tmp/$t.A")"
	grep "switch_us=\|Completion with error" "$tmp/$t.A" | sed 's/^/   /' | cut -c1-160
done
if [ $fails -ne 0 ]; then
	for t in system removed shiftrun; do echo "---- $t (A)"; cat "$tmp/$t.A"; done
	exit 1
fi
echo "testbed_install: shift-system survives a NIC failure, removal restores plain, shift-run protects"
