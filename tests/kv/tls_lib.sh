# Shared by the TLS tests (sourced): a temporary directory cleaned at exit,
# fail(), port(), a job CA and another CA, server and client certificates
# for localhost/127.0.0.1 from the job CA, and a redis-server that serves
# only TLS on $tls (client certificates required, password $pw), on
# 127.0.0.1 and on 127.0.0.2, which the certificates do not name.
#   . tls_lib.sh BIN_DIR   (sets bin, tmp, tls, pw, fails; cwd is $tmp)
bin=$(cd "$1" && pwd)
tmp=$(mktemp -d /tmp/shift-tls.XXXXXX)
pids=
# (terminator runs in a command substitution: its stunnel pids go to files)
cleanup() {
	for p in $pids $(cat "$tmp"/*.pid 2>/dev/null); do kill "$p" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
for t in redis-server stunnel openssl; do
	command -v $t >/dev/null || { echo "FAIL: $t not installed (scripts/deps installs it)"; exit 1; }
done
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cd "$tmp"
ca() { openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.crt" -days 2 \
	-subj "/CN=$1" >/dev/null 2>&1; }
leaf() { # leaf NAME CA
	openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "/CN=localhost" \
		>/dev/null 2>&1 &&
	printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >"$1.ext" &&
	openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -out "$1.crt" \
		-days 2 -extfile "$1.ext" >/dev/null 2>&1
}
ca jobca && ca otherca && leaf server jobca && leaf client jobca || { echo "FAIL: openssl"; exit 1; }
pw=tls-pw-marker-$$
tls=$(port)
redis-server --port 0 --tls-port "$tls" --bind 127.0.0.1 127.0.0.2 --tls-cert-file server.crt \
	--tls-key-file server.key --tls-ca-cert-file jobca.crt --tls-auth-clients yes \
	--requirepass "$pw" --save '' --appendonly no --daemonize no >redis.log 2>&1 &
pids="$pids $!"
i=0
until redis-cli --tls --cacert jobca.crt --cert client.crt --key client.key -p "$tls" -a "$pw" \
	--no-auth-warning ping >/dev/null 2>&1; do
	i=$((i + 1)); [ $i -lt 100 ] || { echo "FAIL: TLS redis-server did not start"; cat redis.log; exit 1; }
	sleep 0.1
done

# check URL CA CERT KEY: `shiftctl check` through SHIFT's own TLS client
# (command deadline $check_ms, default 500 ms): its output in $out (and
# appended to $all), its exit status in $rc, its time in $ms; ok: it passed
check_ms=500
all=
check() {
	t0=$(date +%s%N)
	out=$(env -i PATH="$PATH" SHIFT_CONFIG= SHIFT_KV_URL="$1" SHIFT_KV_TLS_CA="$2" \
		SHIFT_KV_TLS_CERT="$3" SHIFT_KV_TLS_KEY="$4" SHIFT_KV_NAMESPACE=tls \
		SHIFT_KV_TIMEOUT_MS=$check_ms "$bin/shiftctl" check 2>&1)
	rc=$?
	ms=$(( ($(date +%s%N) - t0) / 1000000 ))
	all="$all
$out"
}
ok() { [ $rc -eq 0 ] && echo "$out" | grep -q "^ok  *KV store"; }
