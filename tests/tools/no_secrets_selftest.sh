#!/bin/sh
# tests/tools/no_secrets.sh finds a recorded secret in an output, and only
# there: a log that holds one fails it, a job request (input) does not.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/testbed/logs/s1" "$t/testbed/run/spool/A/jobs" "$t/Testing/Temporary"
echo "Zq9notAsecret0001" > "$t/testbed/secrets"
echo "shift: info: started" > "$t/testbed/logs/s1/client.err"
echo '{"env": {"SHIFT_KV_URL": "redis://:Zq9notAsecret0001@h:6379"}}' > "$t/testbed/run/spool/A/jobs/1.json"
echo "ok" > "$t/Testing/Temporary/LastTest.log"
"$here/no_secrets.sh" "$t" >/dev/null || { echo "FAIL: clean outputs refused"; exit 1; }
echo "redis-cli -a Zq9notAsecret0001 ping" >> "$t/testbed/run/spool/A/stage2.log"
if out=$("$here/no_secrets.sh" "$t"); then
	echo "FAIL: a secret in stage2.log not found"; exit 1
fi
case $out in *Zq9notAsecret0001*) echo "FAIL: the report prints the secret"; exit 1 ;; esac
case $out in *stage2.log*) ;; *) echo "FAIL: the report does not name the file"; exit 1 ;; esac
echo "no_secrets_selftest: ok"
