#!/bin/sh
# Build the Debian packages from a copy of the source tree (never in it),
# lint them (lintian --fail-on error) and check what they contain: shift has
# the library in /usr/lib/<triplet>/shift, the tools, man pages and the
# conffile; shift-system has only the soname link, is pinned to the installed
# libibverbs1, and diverts both of the distribution's files into shift/real
# in preinst and gives them back in postrm.
#   deb.sh SOURCE_DIR
set -eu
src=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/shift-deb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/shift"
# the tracked files as committed or changed, without any build tree
(cd "$src" && git ls-files -co --exclude-standard -z) |
	(cd "$src" && xargs -0 cp --parents -t "$tmp/shift")
cd "$tmp/shift"
dpkg-buildpackage -us -uc -b -j2 >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
cd "$tmp"
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
deb=$(ls shift_*_"$arch".deb)
sys=$(ls shift-system_*_"$arch".deb)
changes=$(ls shift_*.changes)
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

lintian --fail-on error "$changes" || fail "lintian reports errors"

dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|' >files.shift
for f in /usr/lib/$ma/shift/libibverbs.so.1 /usr/lib/$ma/shift/libibverbs.so \
	/usr/bin/shiftctl /usr/bin/shift-run /etc/shift/shift.conf \
	/usr/share/man/man7/shift.7.gz /usr/share/man/man1/shiftctl.1.gz \
	/usr/share/man/man1/shift-run.1.gz /usr/share/man/man5/shift.conf.5.gz; do
	grep -qx "$f" files.shift || fail "shift lacks $f"
done
grep -E '/(test_|shift-bench|shift-nccl-check)' files.shift && fail "shift ships test binaries"
grep -qx "/usr/lib/$ma/libibverbs.so.1" files.shift && fail "shift replaces the system library"
dpkg-deb -e "$deb" ctl.shift
grep -qx /etc/shift/shift.conf ctl.shift/conffiles || fail "shift.conf is not a conffile"

dpkg-deb -c "$sys" | grep -q "\./usr/lib/$ma/libibverbs.so.1 -> shift/libibverbs.so.1" ||
	fail "shift-system lacks the link libibverbs.so.1 -> shift/libibverbs.so.1"
dpkg-deb -e "$sys" ctl.sys
ver=$(dpkg-query -W -f='${Version}' "libibverbs1:$arch")
real=$(basename "$(readlink -f "/usr/lib/$ma/libibverbs.so.1")")
dpkg-deb -f "$sys" Depends | grep -q "libibverbs1 (= $ver)" || fail "shift-system not pinned to libibverbs1 $ver"
for f in libibverbs.so.1 "$real"; do
	grep -q "for f in libibverbs.so.1 $real;" ctl.sys/preinst || fail "preinst does not divert $f"
	grep -q "for f in libibverbs.so.1 $real;" ctl.sys/postrm || fail "postrm does not restore $f"
done
grep -q -- "--divert \"\$dir/shift/real/\$f\" --add" ctl.sys/preinst || fail "preinst: no diversion into shift/real"
grep -q -- "--remove" ctl.sys/postrm || fail "postrm: diversions not removed"
grep -q "dir=/usr/lib/$ma\$" ctl.sys/preinst || fail "preinst: wrong library directory"

[ $fails -eq 0 ] && echo "deb: built, lintian clean, contents as expected"
exit "$fails"
