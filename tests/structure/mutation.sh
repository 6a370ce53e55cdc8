#!/usr/bin/env bash
# Mutation test of the data-path state machine (shift/dp/state.c, its
# setters in shift/dp/dqp.c): shows
# the suite goes red when the state setters or the transition table are
# broken. The state of a protected QP is written only by
# shift_dqp_set_send_state() and shift_dqp_set_recv_state(); each mutant
# below breaks one of them, or the table they check against, in a copy of
# the source tree (never in the tree itself), rebuilds the copy and runs
# the unit tests of the state machine and two short fault campaigns. Every
# mutant must be killed (at least one check fails), and the unmutated copy
# must pass every check, so this test cannot be red for nothing.
#
# usage: mutation.sh SOURCE_DIR SCRATCH_DIR
#   SCRATCH_DIR is emptied and gets the copy (SCRATCH_DIR/src, built in
#   SCRATCH_DIR/src/build) and one log per check (SCRATCH_DIR/logs).
# ctest runs it as `state_mutation` (label sim, tests/structure).
set -u

die() {
	echo "mutation.sh: $*" >&2
	exit 1
}

[ $# -eq 2 ] || die "usage: mutation.sh SOURCE_DIR SCRATCH_DIR"
src=$(cd "$1" && pwd) || die "no source dir $1"
mkdir -p "$2" || die "cannot create $2"
scratch=$(cd "$2" && pwd)
case "$scratch/" in
"$src/") die "the scratch dir must not be the source dir" ;;
esac
copy=$scratch/src
logs=$scratch/logs
bin=$copy/build/bin
jobs=${SHIFT_MUTATION_JOBS:-2}
per_check_timeout=${SHIFT_MUTATION_TIMEOUT:-10} # s per check; unmutated, each takes < 1 s

# The checks see no SHIFT_* setting of the caller's (SHIFT_PROBE_MS=0 would
# turn failback off, and with it half the state machine).
for v in $(env | sed -n 's/^\(SHIFT_[A-Za-z0-9_]*\)=.*/\1/p'); do
	unset "$v"
done

# --- the copy -----------------------------------------------------------
rm -rf "$copy" "$logs" || die "cannot empty $scratch"
mkdir -p "$copy" "$logs" || die "cannot create $copy"
# Build trees (a CMakeCache.txt) and the scratch dir stay out of the copy,
# wherever they are.
case "$scratch/" in
"$src"/*) inner=${scratch#"$src"/}/ ;;
*) inner="" ;;
esac
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	# tracked and untracked-but-not-ignored files, as they are in the
	# work tree (files deleted from it are skipped)
	(cd "$src" && git ls-files --cached --others --exclude-standard) >"$scratch/files" ||
		die "git ls-files failed in $src"
	sed -n 's|CMakeCache\.txt$||p' "$scratch/files" >"$scratch/builds"
	[ -z "$inner" ] || echo "$inner" >>"$scratch/builds"
	awk 'NR == FNR { if ($0 != "") cut[n++] = $0; next }
	     { for (i = 0; i < n; i++) if (index($0, cut[i]) == 1) next; print }' \
		"$scratch/builds" "$scratch/files" >"$scratch/copied"
	(cd "$src" && tar -T "$scratch/copied" --ignore-failed-read -cf - 2>/dev/null) |
		tar -C "$copy" -xf - || die "cannot copy $src (git ls-files | tar)"
else
	(cd "$src" && tar --exclude-tag-all=CMakeCache.txt --exclude='./.git' \
		${inner:+--exclude="./${inner%/}"} -cf - .) |
		tar -C "$copy" -xf - || die "cannot copy $src"
fi
[ -f "$copy/shift/dp/state.c" ] || die "$copy/shift/dp/state.c missing after the copy"

# Pristine copies of the files the mutants change, to restore between them.
mutated_files="shift/dp/state.c shift/dp/dqp.c"
mkdir -p "$scratch/pristine"
for f in $mutated_files; do
	mkdir -p "$scratch/pristine/$(dirname "$f")"
	cp -p "$copy/$f" "$scratch/pristine/$f" || die "cannot save $f"
done
restore() {
	for f in $mutated_files; do
		cp "$scratch/pristine/$f" "$copy/$f" || die "cannot restore $f"
	done
}

# --- build --------------------------------------------------------------
targets="shift-campaign test_failover test_dqp test_channel"
cmake -S "$copy" -B "$copy/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	>"$logs/configure.log" 2>&1 || {
	tail -20 "$logs/configure.log" >&2
	die "configuring the copy failed (log: $logs/configure.log)"
}
build() { # name
	# shellcheck disable=SC2086
	cmake --build "$copy/build" -j"$jobs" --target $targets >"$logs/build-$1.log" 2>&1 || {
		tail -30 "$logs/build-$1.log" >&2
		die "building $1 failed (log: $logs/build-$1.log)"
	}
}

# --- checks -------------------------------------------------------------
# The unit tests of the state machine, and short campaigns through SHIFT:
# nccl (one-sided writes), with and without faults of the backup NIC, and
# sendrecv with backup faults (two-sided: receives posted while failed
# over). A check fails on a non-zero exit (a campaign exits 1 on a
# violation or an illegal state change), on a timeout (a hang is a failure
# in ctest too), or on a campaign summary with app-visible errors,
# violations or unfinished connections. run_checks NAME sets $failed to the
# checks that failed, ", "-separated (empty: all passed).
campaign_ok() { # log: the summary line is there and shows no harm
	grep -q '^campaign: ' "$1" &&
		! grep -Eq '^campaign: .*(app_errors|violations|unfinished)=[1-9]' "$1"
}
check() { # prefix name command...
	local log=$logs/$1-${2// /_}.log rc name=$2
	shift 2
	timeout "$per_check_timeout" "$@" >"$log" 2>&1
	rc=$?
	# a mutant can log a great deal: keep both ends of a long log
	if [ "$(wc -c <"$log")" -gt 4000000 ]; then
		{ head -c 1000000 "$log"; echo; echo "[... cut ...]"; tail -c 1000000 "$log"; } >"$log.cut"
		mv "$log.cut" "$log"
	fi
	if [ $rc -eq 124 ]; then
		failed="$failed, $name (timed out after $per_check_timeout s)"
	elif [ $rc -ne 0 ]; then
		failed="$failed, $name"
	elif [ "${name%% *}" = shift-campaign ] && ! campaign_ok "$log"; then
		failed="$failed, $name"
	fi
}
run_checks() { # prefix
	local t
	failed=""
	for t in test_failover test_dqp test_channel; do
		check "$1" $t "$bin/$t"
	done
	check "$1" "shift-campaign nccl" \
		"$bin/shift-campaign" --schedules 300 --seed 1 --workload nccl --shift
	check "$1" "shift-campaign nccl --backup-faults" \
		"$bin/shift-campaign" --schedules 300 --seed 1 --workload nccl --shift --backup-faults
	check "$1" "shift-campaign sendrecv --backup-faults" \
		"$bin/shift-campaign" --schedules 300 --seed 1 --workload sendrecv --shift --backup-faults
	failed=${failed#, }
}

# --- mutants ------------------------------------------------------------
# Each one: id, what it breaks, the file, a sed script, and how many lines
# of the file the script must change (else the script fails: a mutation
# that no longer applies must not pass as a killed mutant).
mutant_list() {
	mutant a "send setter does not store" shift/dp/dqp.c \
		'/__atomic_store_n(&d->send_state, to, __ATOMIC_RELEASE);/d' 1
	mutant b "send setter does not reset the fast-path bounds" shift/dp/dqp.c \
		'/^[[:space:]]*d->[sr]q_limit = 0;[[:space:]]*$/d' 2
	mutant b-sq "send setter does not reset the send fast path's bound" shift/dp/dqp.c \
		'/^[[:space:]]*d->sq_limit = 0;[[:space:]]*$/d' 1
	mutant b-rq "send setter does not reset the receive fast path's bound" shift/dp/dqp.c \
		'/^[[:space:]]*d->rq_limit = 0;[[:space:]]*$/d' 1
	mutant c "table: WaitSignaled may not go to WaitDrained" shift/dp/state.c \
		's/\[SHIFT_SEND_WAIT_SIGNALED\] = TO(SHIFT_SEND_WAIT_DRAINED) | /[SHIFT_SEND_WAIT_SIGNALED] = /' 1
	mutant c2 "table: WaitDrained may not go to Default" shift/dp/state.c \
		's/\[SHIFT_SEND_WAIT_DRAINED\] = TO(SHIFT_SEND_DEFAULT) | /[SHIFT_SEND_WAIT_DRAINED] = /' 1
	mutant d "receive setter does not store" shift/dp/dqp.c \
		'/__atomic_store_n(&d->recv_state, to, __ATOMIC_RELEASE);/d' 1
	mutant e "table: receive Fallback may not go back to Default" shift/dp/state.c \
		's/\[SHIFT_RECV_FALLBACK\] = TO(SHIFT_RECV_DEFAULT),/[SHIFT_RECV_FALLBACK] = 0,/' 1
	mutant f "episode table: a wait for the peer's backup may not end" shift/dp/state.c \
		's/\[SHIFT_EP_WAIT_PEER\] = TO(SHIFT_EP_RUNNING),/[SHIFT_EP_WAIT_PEER] = 0,/' 1
	mutant g "episode setter does not store" shift/dp/dqp.c \
		'/^[[:space:]]*d->ep_wait = to;[[:space:]]*$/d' 1
}

mutate() { # file sed-script expected-changed-lines
	local f=$copy/$1 n
	sed -i -e "$2" "$f" || die "sed failed on $1"
	if cmp -s "$f" "$scratch/pristine/$1"; then
		return 1
	fi
	# lines removed or replaced: the sed must change exactly what it means to
	n=$(diff "$scratch/pristine/$1" "$f" | grep -c '^<')
	[ "$n" -eq "$3" ] || die "mutation changed $n lines of $1, not $3: $2"
}

start=$(date +%s)
build pristine
run_checks pristine
if [ -n "$failed" ]; then
	for l in "$logs"/pristine-*.log; do
		echo "--- $l" >&2
		tail -5 "$l" >&2
	done
	die "the unmutated copy fails: $failed (logs: $logs)"
fi
echo "pristine: passes test_failover, test_dqp, test_channel, shift-campaign (nccl; nccl, sendrecv --backup-faults)"

survivors=""
count=0
mutant() { # id what file sed-script lines
	local id=$1 what=$2
	count=$((count + 1))
	restore
	# the mutated file must be newer than the objects built from the
	# previous one, even on a file system with 1 s timestamps
	sleep 1
	mutate "$3" "$4" "$5" || die "mutation did not apply: mutant $id ($what): $4"
	build "mutant-$id"
	run_checks "mutant-$id"
	if [ -n "$failed" ]; then
		echo "mutant $id ($what): killed by $failed"
	else
		echo "mutant $id ($what): SURVIVED"
		survivors="$survivors $id"
	fi
}
mutant_list
restore
echo "mutation: $count mutants in $(($(date +%s) - start)) s (logs: $logs)"
for id in $survivors; do
	echo "mutant $id survived"
done
[ -z "$survivors" ] || exit 1
exit 0
