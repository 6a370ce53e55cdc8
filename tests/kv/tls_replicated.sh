#!/bin/sh
# TLS to a replicated KV store in SHIFT's own client (docs/kv.md, docs/security.md
# "TLS"): every server serves only TLS (client certificates required).
# Checked with `shiftctl check` (AUTH and one GET, routed as SHIFT routes it):
#   1. rediss-cluster:// at a 3-primary Redis Cluster (tls-cluster): the slot
#      map read over TLS, the GET sent to the key's node over TLS; any node
#      as the seed;
#   2. rediss-sentinel:// at a TLS sentinel watching the TLS primary: the
#      sentinel asked over TLS, then the primary it names;
#   3. a CA that did not sign the servers: refused (certificate verify) for
#      both schemes;
#   4. the plaintext schemes to the same TLS ports: fail within the deadline;
#   5. the password appears in no output.
#   tls_replicated.sh BIN_DIR
set -u
. "$(dirname "$0")/tls_lib.sh" "$1"

cli() { redis-cli --tls --cacert jobca.crt --cert client.crt --key client.key -a "$pw" \
	--no-auth-warning "$@"; }
tlsargs="--tls-cert-file $tmp/server.crt --tls-key-file $tmp/server.key
	--tls-ca-cert-file $tmp/jobca.crt --tls-auth-clients yes"

# a port p for a cluster node: p and its bus port p + 10000 free, p <= 55535
cport() { python3 -c '
import random, socket
while True:
    p = random.randint(20000, 45000)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass'; }

# three TLS-only cluster nodes, the cluster bus over TLS too
nodes=
for i in 1 2 3; do
	p=$(cport)
	mkdir "n$i"
	(cd "n$i" && exec redis-server --port 0 --tls-port "$p" --bind 127.0.0.1 $tlsargs \
		--tls-cluster yes --cluster-enabled yes --cluster-node-timeout 2000 \
		--requirepass "$pw" --masterauth "$pw" --save '' --appendonly no \
		--daemonize no >log 2>&1) &
	pids="$pids $!"
	nodes="$nodes 127.0.0.1:$p"
	eval "n$i=$p"
done
for k in 1 2 3; do
	eval "p=\$n$k"
	i=0
	until cli -p "$p" ping >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 100 ] || { echo "FAIL: TLS cluster node $p did not start"; cat "n$k/log"; exit 1; }
		sleep 0.1
	done
done
# shellcheck disable=SC2086
cli --cluster create $nodes --cluster-yes >create.log 2>&1 ||
	{ echo "FAIL: redis-cli --cluster create"; cat create.log; exit 1; }
for p in $n1 $n2 $n3; do
	i=0
	until cli -p "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok"; do
		i=$((i + 1))
		[ $i -lt 200 ] || { echo "FAIL: the TLS cluster is not ok at $p"; exit 1; }
		sleep 0.1
	done
done

# a TLS sentinel watching the TLS primary of tls_lib.sh
sport=$(port)
cat >sentinel.conf <<CONF
port 0
tls-port $sport
bind 127.0.0.1
tls-cert-file $tmp/server.crt
tls-key-file $tmp/server.key
tls-ca-cert-file $tmp/jobca.crt
tls-auth-clients yes
tls-replication yes
sentinel monitor m 127.0.0.1 $tls 1
sentinel auth-pass m $pw
CONF
redis-server sentinel.conf --sentinel >sentinel.log 2>&1 &
pids="$pids $!"
i=0
until redis-cli --tls --cacert jobca.crt --cert client.crt --key client.key -p "$sport" \
	sentinel get-master-addr-by-name m 2>/dev/null | grep -q "^$tls\$"; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "FAIL: the TLS sentinel does not name the primary"; cat sentinel.log; exit 1; }
	sleep 0.1
done

check_ms=1000
cc="$tmp/client.crt $tmp/client.key"

for seed in $n1 $n2 $n3; do
	check "rediss-cluster://:$pw@127.0.0.1:$seed" "$tmp/jobca.crt" $cc
	ok || fail "rediss-cluster:// seeded at $seed: $out"
done
check "rediss-cluster://:$pw@127.0.0.1:$n1,127.0.0.1:$n2" "$tmp/jobca.crt" $cc
ok || fail "rediss-cluster:// with two seeds: $out"
check "rediss-sentinel://:$pw@127.0.0.1:$sport/m" "$tmp/jobca.crt" $cc
ok || fail "rediss-sentinel://: $out"

check "rediss-cluster://:$pw@127.0.0.1:$n1" "$tmp/otherca.crt" $cc
{ [ $rc -ne 0 ] && echo "$out" | grep -q "certificate"; } ||
	fail "a cluster signed by another CA was accepted: $out"
check "rediss-sentinel://:$pw@127.0.0.1:$sport/m" "$tmp/otherca.crt" $cc
{ [ $rc -ne 0 ] && echo "$out" | grep -q "certificate"; } ||
	fail "a sentinel signed by another CA was accepted: $out"

check "redis-cluster://:$pw@127.0.0.1:$n1" "" $cc
[ $rc -ne 0 ] || fail "plaintext redis-cluster:// to a TLS node answered: $out"
[ $ms -lt 4000 ] || fail "plaintext redis-cluster:// to a TLS node took $ms ms (deadline 1000 ms)"
check "redis-sentinel://:$pw@127.0.0.1:$sport/m" "" $cc
[ $rc -ne 0 ] || fail "plaintext redis-sentinel:// to a TLS sentinel answered: $out"
[ $ms -lt 4000 ] || fail "plaintext redis-sentinel:// to a TLS sentinel took $ms ms (deadline 1000 ms)"

echo "$all" | grep -q -- "$pw" && fail "the password appears in the output"
echo "$all" | grep "^FAIL  KV store" | sed "s/^/  expected: /"
[ $fails -eq 0 ] && echo "tls_replicated: rediss-cluster:// (every seed) and rediss-sentinel:// work; another CA and the plaintext schemes are refused"
exit $fails
