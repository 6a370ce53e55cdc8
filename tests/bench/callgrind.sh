#!/bin/sh
# Instructions SHIFT adds to the Default-state data path, measured with
# callgrind (repeatable instruction counts, not timings) on the simulated
# RNIC: per ibv_post_send (one SGE), ibv_post_recv (one SGE) and ibv_poll_cq
# (returning one completion), and for the extended verbs per one-WR
# ibv_wr_start .. ibv_wr_complete batch (expost) and per ibv_start_poll ..
# ibv_end_poll session returning one completion (expoll). NCCL's shapes
# (issue #21): recv0 (post_recv with num_sge = 0), chainN (one post_send of
# N WRs; counts are per WR), inline32 (32-byte inline send; the copy is in
# plain's count too), pollN (ibv_poll_cq(cq, 4, wc) returning N; per call).
# With --check, fail if a budget (issue #21's) is exceeded;
# with --ceiling, fail if a count exceeds its regression ceiling (what main
# measures, plus 2: the counts are repeatable, so a change that adds work
# to the Default path shows here, in ctest, not in a timed test).
# Usage: callgrind.sh BENCH_BINARY [--check | --ceiling]
set -eu
bin=$1
check=${2:-}
n=2000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

total() {
	callgrind_annotate "$1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}'
}

# measure PLAIN_FLAG PATH_FLAG SHAPES: one table section. PATH_FLAG is the
# bench option selecting the measured path (--shift: the mirror path,
# --native: native WQE access on the simulator's mlx5 mode), PLAIN_FLAG its
# baseline (--plain, --plain-mlx5: the same provider work without SHIFT).
# SHAPES: "op:per:budget:ceiling ..." (per = WRs per call, the divisor).
measure() {
	base=$1
	path=$2
	shift 2
	printf '%-9s %12s %12s %10s %8s %8s   (%s)\n' shape plain/unit shift/unit added budget ceiling "$path"
	for spec in "$@"; do
		IFS=: read -r op per b c <<-SPEC
		$spec
		SPEC
		for mode in plain shift; do
			flag=$base
			[ $mode = shift ] && flag=$path
			valgrind --tool=callgrind --collect-atstart=no \
				--callgrind-out-file="$tmp/$op.$mode" \
				"$bin" $flag $op $n >/dev/null 2>"$tmp/$op.$mode.log" ||
				{ cat "$tmp/$op.$mode.log"; exit 1; }
		done
		p=$(total "$tmp/$op.plain")
		s=$(total "$tmp/$op.shift")
		d=$((n * per))
		added=$(awk -v p="$p" -v s="$s" -v d=$d 'BEGIN { printf "%.1f", (s - p) / d }')
		printf '%-9s %12.1f %12.1f %10s %8s %8s\n' $op \
			"$(awk -v p="$p" -v d=$d 'BEGIN{print p/d}')" \
			"$(awk -v s="$s" -v d=$d 'BEGIN{print s/d}')" "$added" "$b" "$c"
		if [ "$check" = --check ] && awk -v a="$added" -v b="$b" 'BEGIN { exit !(a > b) }'; then
			echo "FAIL: $op adds $added instructions (budget $b)"
			status=1
		fi
		if [ "$check" = --ceiling ] && awk -v a="$added" -v c="$c" 'BEGIN { exit !(a > c) }'; then
			echo "FAIL: $op adds $added instructions (regression ceiling $c)"
			status=1
		fi
	done
}

# Mirror path (Default state). Budgets: issue #21 (poll: 15 per call plus
# 5 per extra completion); ceilings: main's counts plus 2.
measure --plain --shift \
	send:1:40:51 recv:1:28:38 poll:1:15:20 expost:1:125:119 expoll:1:80:78 \
	recv0:1:28:38 chain2:2:40:59 chain4:4:40:48 \
	chain8:8:40:43 inline32:1:40:79 sge4:1:40:86 recv4:1:28:81 \
	poll2:1:20:39 poll4:1:30:49
# Native path (Default state): the common shapes take the mirror's fast
# paths (a one-SGE WR is cheaper copied than its WQE index read); inline,
# multi-SGE and atomic WRs record wr_id, opcode, flags and WQE index only.
# Budgets: issue #21's (10 per WR, poll as above).
measure --plain-mlx5 --native \
	send:1:10:52 recv:1:10:39 poll:1:15:20 recv0:1:10:39 chain2:2:10:60 \
	chain4:4:10:49 chain8:8:10:43 inline32:1:10:73 sge4:1:10:71 recv4:1:10:73 \
	poll2:1:20:39 poll4:1:30:49
exit $status
