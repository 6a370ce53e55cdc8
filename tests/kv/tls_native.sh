#!/bin/sh
# TLS to Redis in SHIFT's own client (rediss://, kv/kv_tls.c; docs/security.md,
# "TLS"): redis-server serves only TLS (--tls-port, client certificates
# required). Checked with `shiftctl check` (one KV round trip with AUTH):
#   1. rediss:// with the job's CA and a client certificate: the store answers,
#      by IP and by name (the certificate names both);
#   2. a CA that did not sign the server: refused (certificate verify), fails;
#   3. a host the certificate does not name: refused, fails;
#   4. no client certificate: refused by Redis, fails;
#   5. plaintext redis:// to the TLS port, and rediss:// to a plaintext
#      server: fail within the command deadline;
#   6. a certificate without its key: SHIFT refuses the setting, one line;
#   7. the password appears in no output.
#   tls_native.sh BIN_DIR
set -u
. "$(dirname "$0")/tls_lib.sh" "$1"

plain=$(port)
redis-server --port "$plain" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
	>plain.log 2>&1 &
pids="$pids $!"

good="$tmp/jobca.crt $tmp/client.crt $tmp/client.key"

check "rediss://:$pw@127.0.0.1:$tls" $good
ok || fail "rediss:// by IP: $out"
check "rediss://:$pw@localhost:$tls" $good
ok || fail "rediss:// by name: $out"

check "rediss://:$pw@127.0.0.1:$tls" "$tmp/otherca.crt" "$tmp/client.crt" "$tmp/client.key"
{ [ $rc -ne 0 ] && echo "$out" | grep -q "certificate"; } ||
	fail "a server signed by another CA was accepted: $out"

# (the server listens on 127.0.0.2 too, which its certificate does not name)
check "rediss://:$pw@127.0.0.2:$tls" $good
{ [ $rc -ne 0 ] && echo "$out" | grep -q "certificate"; } ||
	fail "a host the certificate does not name was accepted: $out"

check "rediss://:$pw@127.0.0.1:$tls" "$tmp/jobca.crt" "" ""
[ $rc -ne 0 ] || fail "no client certificate reached the store: $out"

check "redis://:$pw@127.0.0.1:$tls" "" "" ""
[ $rc -ne 0 ] || fail "plaintext to the TLS port answered: $out"
[ $ms -lt 3000 ] || fail "plaintext to the TLS port took $ms ms (deadline 500 ms)"
check "rediss://127.0.0.1:$plain" $good
[ $rc -ne 0 ] || fail "rediss:// to a plaintext server answered: $out"
[ $ms -lt 3000 ] || fail "rediss:// to a plaintext server took $ms ms (deadline 500 ms)"

check "rediss://:$pw@127.0.0.1:$tls" "$tmp/jobca.crt" "$tmp/client.crt" ""
{ [ $rc -ne 0 ] && echo "$out" | grep -q "SHIFT_KV_TLS_KEY"; } ||
	fail "a certificate without its key was not refused by name: $out"

echo "$all" | grep -q -- "$pw" && fail "the password appears in the output"
echo "$all" | grep "^FAIL  KV store" | sed "s/^/  expected: /"
[ $fails -eq 0 ] && echo "tls_native: rediss:// works; another CA, a host the certificate does not name, no client certificate, plaintext either way and a half client certificate are refused"
exit $fails
