#!/bin/sh
# Instructions SHIFT adds to the Default-state data path, measured with
# callgrind (repeatable instruction counts, not timings) on the simulated
# RNIC: per ibv_post_send (one SGE), ibv_post_recv (one SGE) and ibv_poll_cq
# (returning one completion), and for the extended verbs per one-WR
# ibv_wr_start .. ibv_wr_complete batch (expost) and per ibv_start_poll ..
# ibv_end_poll session returning one completion (expoll). With --check,
# fail if a budget is exceeded;
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
budget_send=40 budget_recv=25 budget_poll=15 budget_expost=125 budget_expoll=80
ceiling_send=51 ceiling_recv=38 ceiling_poll=17 ceiling_expost=119 ceiling_expoll=78
status=0
printf '%-6s %12s %12s %10s %8s %8s\n' verb plain/call shift/call added budget ceiling
for op in send recv poll expost expoll; do
	for mode in plain shift; do
		valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$tmp/$op.$mode" \
			"$bin" --$mode $op $n >/dev/null 2>"$tmp/$op.$mode.log" ||
			{ cat "$tmp/$op.$mode.log"; exit 1; }
	done
	p=$(callgrind_annotate "$tmp/$op.plain" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
	s=$(callgrind_annotate "$tmp/$op.shift" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",","",$1); print $1}')
	eval b=\$budget_$op
	eval c=\$ceiling_$op
	added=$(awk -v p="$p" -v s="$s" -v n=$n 'BEGIN { printf "%.1f", (s - p) / n }')
	printf '%-6s %12.1f %12.1f %10s %8s %8s\n' $op "$(awk -v p="$p" -v n=$n 'BEGIN{print p/n}')" \
		"$(awk -v s="$s" -v n=$n 'BEGIN{print s/n}')" "$added" "$b" "$c"
	if [ "$check" = --check ] && awk -v a="$added" -v b="$b" 'BEGIN { exit !(a > b) }'; then
		echo "FAIL: $op adds $added instructions (budget $b)"
		status=1
	fi
	if [ "$check" = --ceiling ] && awk -v a="$added" -v c="$c" 'BEGIN { exit !(a > c) }'; then
		echo "FAIL: $op adds $added instructions (regression ceiling $c)"
		status=1
	fi
done
exit $status
