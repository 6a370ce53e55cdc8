#!/bin/sh
# TLS to Redis through a per-host terminator (docs/security.md, "TLS"):
# redis-server serves only TLS (--tls-port, client certificates required),
# stunnel on the host accepts SHIFT's plaintext on 127.0.0.1 and speaks TLS
# to it, verifying the server against the job's CA and presenting the
# host's client certificate. Checked with `shiftctl check` (one KV round
# trip with AUTH, the library's own client):
#   1. through the terminator: the store answers;
#   2. plaintext straight to the TLS port: fails within the command deadline;
#   3. a terminator that trusts another CA: refused, fails;
#   4. a terminator without a client certificate: refused by Redis, fails;
#   5. the password appears in no output.
#   tls_stunnel.sh BIN_DIR
set -u
. "$(dirname "$0")/tls_lib.sh" "$1"

# terminator NAME CAFILE [CERT]: stunnel client on a free port; echoes it
terminator() {
	p=$(port)
	{
		printf 'foreground = yes\npid =\n[redis]\nclient = yes\n'
		printf 'accept = 127.0.0.1:%s\nconnect = 127.0.0.1:%s\n' "$p" "$tls"
		printf 'CAfile = %s\nverifyChain = yes\ncheckHost = localhost\n' "$tmp/$2"
		[ -n "${3:-}" ] && printf 'cert = %s.crt\nkey = %s.key\n' "$tmp/$3" "$tmp/$3"
	} >"$1.conf"
	stunnel "$1.conf" >"$1.log" 2>&1 &
	echo $! >"$1.pid"
	i=0
	until python3 -c "import socket; socket.create_connection(('127.0.0.1',$p),1)" 2>/dev/null; do
		i=$((i + 1)); [ $i -lt 50 ] || break; sleep 0.1
	done
	echo "$p"
}
check() { # check PORT: shiftctl check's output; its exit status in $rc
	out=$(env -i PATH="$PATH" SHIFT_CONFIG= SHIFT_KV_URL="redis://:$pw@127.0.0.1:$1" \
		SHIFT_KV_NAMESPACE=tls SHIFT_KV_TIMEOUT_MS=500 "$bin/shiftctl" check 2>&1)
	rc=$?
	all="$all
$out"
}
all=

good=$(terminator good jobca.crt client)
check "$good"
[ $rc -eq 0 ] && echo "$out" | grep -q "^ok  *KV store" || fail "through the terminator: $out"

t0=$(date +%s%N)
check "$tls"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
[ $rc -ne 0 ] && echo "$out" | grep -q "^FAIL  KV store" || fail "plaintext to the TLS port answered: $out"
[ $ms -lt 3000 ] || fail "plaintext to the TLS port took $ms ms (deadline 500 ms)"

wrong=$(terminator wrong otherca.crt client)
check "$wrong"
[ $rc -ne 0 ] || fail "a terminator trusting another CA reached the store: $out"
grep -qi "certificate verify failed\|verification failed\|CERT: Verification error\|Rejected" wrong.log ||
	fail "stunnel did not refuse the server's certificate: $(tail -3 wrong.log)"

nocert=$(terminator nocert jobca.crt)
check "$nocert"
[ $rc -ne 0 ] || fail "a terminator without a client certificate reached the store: $out"

echo "$all" | grep -q -- "$pw" && fail "the password appears in the output"
[ $fails -eq 0 ] && echo "tls_stunnel: TLS through stunnel works; plaintext, a wrong CA and no client certificate are refused (plaintext in ${ms} ms)"
exit $fails
