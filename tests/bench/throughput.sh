#!/bin/sh
# Simulator throughput, SHIFT / plain (issue #21 item 5), Default state, in
# one run of this script: for each workload (write, sendrecv) and 1 and 2
# application threads, the modes run alternately ROUNDS times and the
# median operations per second of each are compared. Two baselines:
#   plain       the application alone
#   plain+idle  the same plus one idle connected QP pair per pair (the
#               simulator's scheduler looks at every QP at each step, so
#               SHIFT's backup QPs cost the host there, not on a real NIC)
# and two SHIFT paths: mirror (--shift) and native (--native, on the
# simulator's mlx5 mode, against the mlx5-mode baselines).
# Wall clock is noisy on these machines; the instruction ratio (callgrind,
# one thread, exact) is printed too, and --check fails if it is below the
# issue's targets (0.90 mirror, 0.95 native, against plain+idle): a ctest
# that cannot pass or fail by the machine's load.
# Usage: throughput.sh BENCH_BINARY [--check] [ROUNDS]
set -eu
bin=$1
check=${2:-}
rounds=${3:-5}
[ "$check" = --check ] || rounds=${2:-5}
case $rounds in --check) rounds=5 ;; esac
ops=200000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

median() {
	sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

ratio() {
	awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'
}

if [ "$check" != --check ]; then
	printf '%-9s %3s %12s %12s %12s %12s %12s   %s\n' workload thr plain plain+idle mirror \
		mlx5+idle native "mirror/plain mirror/idle native/idle"
	for op in write sendrecv; do
		for thr in 1 2; do
			n=$((ops / thr))
			: >"$tmp/p"; : >"$tmp/pi"; : >"$tmp/s"; : >"$tmp/mi"; : >"$tmp/n"
			r=0
			while [ $r -lt "$rounds" ]; do
				"$bin" --plain $op $thr $n | awk '{print $2}' >>"$tmp/p"
				"$bin" --plain $op $thr $n --idle-pairs | awk '{print $2}' >>"$tmp/pi"
				"$bin" --shift $op $thr $n | awk '{print $2}' >>"$tmp/s"
				"$bin" --plain-mlx5 $op $thr $n --idle-pairs | awk '{print $2}' >>"$tmp/mi"
				"$bin" --native $op $thr $n | awk '{print $2}' >>"$tmp/n"
				r=$((r + 1))
			done
			p=$(median <"$tmp/p"); pi=$(median <"$tmp/pi"); s=$(median <"$tmp/s")
			mi=$(median <"$tmp/mi"); nv=$(median <"$tmp/n")
			printf '%-9s %3s %12s %12s %12s %12s %12s   %s %s %s\n' $op $thr "$p" "$pi" "$s" \
				"$mi" "$nv" "$(ratio "$s" "$p")" "$(ratio "$s" "$pi")" "$(ratio "$nv" "$mi")"
		done
	done
fi

# instructions per operation, one thread (exact)
ir() {
	valgrind --tool=callgrind --callgrind-out-file="$tmp/cg" "$bin" "$@" >/dev/null 2>&1
	callgrind_annotate "$tmp/cg" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}'
}
printf '%-9s %14s %14s %14s %14s   %s\n' workload plain+idle/Ir mirror/Ir mlx5+idle/Ir \
	native/Ir "mirror native (throughput ratios from instructions)"
for op in write sendrecv; do
	pi=$(ir --plain $op 1 20000 --idle-pairs)
	s=$(ir --shift $op 1 20000)
	mi=$(ir --plain-mlx5 $op 1 20000 --idle-pairs)
	nv=$(ir --native $op 1 20000)
	rs=$(ratio "$pi" "$s")
	rn=$(ratio "$mi" "$nv")
	printf '%-9s %14s %14s %14s %14s   %s %s\n' $op "$pi" "$s" "$mi" "$nv" "$rs" "$rn"
	if [ "$check" = --check ]; then
		awk -v r="$rs" 'BEGIN { exit !(r < 0.90) }' && { echo "FAIL: $op mirror $rs < 0.90"; status=1; }
		awk -v r="$rn" 'BEGIN { exit !(r < 0.95) }' && { echo "FAIL: $op native $rn < 0.95"; status=1; }
	fi
done
exit $status
