#!/bin/sh
# shift-run in the build tree (no RDMA needed): namespace derivation from each
# launcher's job id and its precedence, errors, the environment it sets, and
# the setup check against a live redis-server and an unreachable one.
#   shift_run.sh BUILD_BIN_DIR BUILD_LIB_DIR
set -u
bin=$1 lib=$2
run=$bin/shift-run
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect NAME WANT-NS [env assignments...]: namespace chosen with --no-check
expect() {
	name=$1 want=$2; shift 2
	got=$(env -i PATH="$PATH" "$@" "$run" --no-check -- sh -c 'echo "$SHIFT_KV_NAMESPACE"' 2>&1)
	[ "$got" = "$want" ] || fail "$name: namespace '$got', want '$want'"
}
expect slurm slurm-42 SLURM_JOB_ID=42
expect torch torch-abc TORCHELASTIC_RUN_ID=abc
expect pmix pmix-job.7 PMIX_NAMESPACE=job.7
expect ompi ompi-99 OMPI_MCA_ess_base_jobid=99
expect k8s k8s-train-x JOB_NAME=train-x
expect slurm-first slurm-1 SLURM_JOB_ID=1 TORCHELASTIC_RUN_ID=t JOB_NAME=j
expect torch-before-mpi torch-t TORCHELASTIC_RUN_ID=t PMIX_NAMESPACE=p
expect sanitized slurm-a_b_c SLURM_JOB_ID='a/b c'
expect env-ns given SHIFT_KV_NAMESPACE=given SLURM_JOB_ID=1
long=$(printf 'x%.0s' $(seq 1 100))
got=$(env -i PATH="$PATH" JOB_NAME="$long" "$run" --no-check -- sh -c 'echo "$SHIFT_KV_NAMESPACE"')
[ ${#got} -eq 64 ] || fail "long job name: namespace of ${#got} characters, want 64"

# options win over the job id and set the environment
out=$(env -i PATH="$PATH" SLURM_JOB_ID=5 LD_LIBRARY_PATH=/old "$run" --no-check -n mine \
	-b rxe0:rxe1 --kv-url=redis://10.1.2.3:7000 -- \
	sh -c 'echo "$SHIFT_KV_NAMESPACE|$SHIFT_BACKUP|$SHIFT_KV_URL|$LD_LIBRARY_PATH"')
[ "$out" = "mine|rxe0:rxe1|redis://10.1.2.3:7000|$lib:/old" ] || fail "environment: '$out'"

# errors: exit 2 with a reason, the command never runs
err() {
	name=$1; shift
	msg=$(env -i PATH="$PATH" "$@" 2>&1 >/dev/null)
	rc=$?
	[ $rc -eq 2 ] || fail "$name: exit $rc, want 2"
	[ -n "$msg" ] || fail "$name: no message"
}
err no-namespace "$run" --no-check -- touch /tmp/shift-run-ran.$$
err bad-namespace "$run" --no-check -n 'a b' -- touch /tmp/shift-run-ran.$$
err no-command SLURM_JOB_ID=1 "$run" --no-check
err unknown-option SLURM_JOB_ID=1 "$run" --bogus -- true
err missing-value "$run" -n
[ ! -e /tmp/shift-run-ran.$$ ] || { rm -f /tmp/shift-run-ran.$$; fail "a failed shift-run ran the command"; }

# the check: a fake KV (redis-server on a free port), then a dead one
port=$((20000 + $$ % 20000))
pw=pw-marker-$$
redis-server --port $port --requirepass "$pw" --save '' --appendonly no --daemonize no >/dev/null 2>&1 &
rpid=$!
i=0
while ! redis-cli --no-auth-warning -a "$pw" -p $port ping >/dev/null 2>&1 && [ $i -lt 50 ]; do
	sleep 0.1; i=$((i + 1)); done
out=$(env -i PATH="$PATH" HOME=/nonexistent SLURM_JOB_ID=1 "$run" -k "redis://:$pw@127.0.0.1:$port" \
	-- echo started 2>&1)
echo "$out" | grep -q '^ok  *KV store' || fail "check with live KV: $out"
echo "$out" | tail -1 | grep -qx started || fail "command not started after a passing check: $out"
# the password never appears in the report
echo "$out" | grep -q "$pw" && fail "the check printed the KV password: $out"
kill $rpid; wait $rpid 2>/dev/null
out=$(env -i PATH="$PATH" HOME=/nonexistent SLURM_JOB_ID=1 "$run" -k "redis://:$pw@127.0.0.1:$port" \
	-- echo started 2>&1)
rc=$?
echo "$out" | grep -q "$pw" && fail "the failed check printed the KV password: $out"
[ $rc -eq 1 ] || fail "check with dead KV: exit $rc, want 1"
echo "$out" | grep -q 'FAIL  KV store' || fail "check with dead KV: no FAIL line: $out"
echo "$out" | grep -q started && fail "command started after a failed check"
out=$(env -i PATH="$PATH" HOME=/nonexistent SLURM_JOB_ID=1 "$run" -k redis://127.0.0.1:$port \
	-b nosuchdev0:nosuchdev1 -- true 2>&1)
echo "$out" | grep -q "no RDMA device 'nosuchdev0'" || fail "backup check: $out"

[ $fails -eq 0 ] && echo "shift_run: all passed"
exit $fails
