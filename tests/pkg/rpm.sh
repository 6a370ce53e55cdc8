#!/bin/sh
# Build the two RPMs with rpmbuild (a local _topdir; --nodeps: this Debian
# host has the build dependencies as Debian packages, not in an rpm
# database), lint them (rpmlint: no errors) and check their contents and
# the switch scripts of shift-system.
#   rpm.sh SOURCE_DIR
set -eu
src=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/shift-rpm.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
ver=$(sed -n 's/^Version: *//p' "$src/rpm/shift.spec")
mkdir -p "$tmp/SOURCES" "$tmp/shift-$ver"
(cd "$src" && git ls-files -co --exclude-standard -z) |
	(cd "$src" && xargs -0 cp --parents -t "$tmp/shift-$ver")
tar -C "$tmp" -czf "$tmp/SOURCES/shift-$ver.tar.gz" "shift-$ver"
rpmbuild -bb --nodeps --define "_topdir $tmp" --define "_smp_mflags -j2" \
	"$src/rpm/shift.spec" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
main=$(ls "$tmp"/RPMS/*/shift-"$ver"-*.rpm)
sys=$(ls "$tmp"/RPMS/*/shift-system-*.rpm)
rpmlint -c "$src/rpm/rpmlint.toml" "$main" "$sys" >"$tmp/lint.log" 2>&1 || true
cat "$tmp/lint.log"
grep -Eq '^[^ ]+: E: ' "$tmp/lint.log" && fail "rpmlint reports errors"
lib=$(rpm --eval '%{_libdir}')
files=$(rpm -qlp "$main")
for f in "$lib/shift/libibverbs.so.1" "$lib/shift/libibverbs.so" /usr/bin/shiftctl \
	/usr/bin/shift-run /etc/shift/shift.conf; do
	echo "$files" | grep -qx "$f" || fail "shift lacks $f"
done
echo "$files" | grep -E '/(test_|shift-bench)' && fail "shift ships test binaries"
rpm -qp --configfiles "$main" | grep -qx /etc/shift/shift.conf || fail "shift.conf not %config"
rpm -qp --requires "$sys" | grep -q '^libibverbs = ' || fail "shift-system not pinned to libibverbs"
s=$(rpm -qp --scripts "$sys")
echo "$s" | grep -q "shift/real/libibverbs.so.1" || fail "no switch into shift/real"
echo "$s" | grep -q "ln -sfn shift/libibverbs.so.1" || fail "no SHIFT link in %post"
[ $fails -eq 0 ] && echo "rpm: built, rpmlint without errors, contents as expected"
exit "$fails"
