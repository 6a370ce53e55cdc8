#!/bin/sh
# No secret in any output (issue #20): every Redis password a testbed boot
# used (BUILD/testbed/secrets, written by scripts/testbed) must appear in no
# test output or log: ctest's logs, the scenarios' logs and results, the
# real-client tier's outputs, the guests' boot and Redis logs and every job's
# stdout/stderr. Job requests (their environment carries the store's URL,
# as an application's does) and the testbed's own state are inputs, not
# output, and are not searched. Prints which files hold one, never the
# secret itself.
# Usage: tests/tools/no_secrets.sh [BUILD_DIR]
set -eu
build=${1:-build}
secrets=$build/testbed/secrets
if [ ! -s "$secrets" ]; then
	echo "no_secrets: no testbed boot recorded ($secrets): nothing to check"
	exit 0
fi
set --
for p in "$build/Testing" "$build/testbed/logs" "$build/testbed/results" \
	"$build/testbed/realclients" "$build/testbed/run"; do
	[ -e "$p" ] && set -- "$@" "$p"
done
[ $# -gt 0 ] || { echo "no_secrets: no output to check"; exit 0; }
hits=$(grep -rlF -f "$secrets" \
	--exclude='*.json' --exclude=guest.env --exclude=secrets "$@" 2>/dev/null || true)
# (results are JSON files: searched, apart from the job requests excluded above)
jhits=$(grep -rlF -f "$secrets" --include='*.json' "$build/testbed/results" 2>/dev/null || true)
if [ -n "$hits$jhits" ]; then
	echo "no_secrets: a testbed password appears in:"
	printf '%s\n' $hits $jhits | sed 's/^/  /'
	exit 1
fi
echo "no_secrets: $(wc -l < "$secrets") testbed password(s) in no output under $*"
