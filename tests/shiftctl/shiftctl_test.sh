#!/bin/sh
# shiftctl as a user meets it (issue #20 item 3, #22 item 8): --help; config
# masks the KV password and exits 1 on a bad value naming it; status --json
# is valid JSON whatever a status file holds; a group/world-writable status
# directory is skipped with the reason. Every output is grepped for the
# marker password. Usage: shiftctl_test.sh SHIFTCTL
set -u
ctl=$1
secret=Zq9SecretMarker
tmp=$(mktemp -d)
trap 'chmod -R u+rwx "$tmp"; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export SHIFT_CONFIG=''
for v in $(env | sed -n 's/^\(SHIFT_[A-Z_]*\)=.*/\1/p'); do
	[ "$v" = SHIFT_CONFIG ] || unset "$v"
done

"$ctl" --help >"$tmp/help" 2>&1 || fail "--help exit $?"
grep -q "status \[--json\]" "$tmp/help" || fail "--help text"
grep -q "stats \[--json\]" "$tmp/help" || fail "--help text: stats"

SHIFT_KV_URL="redis://job:$secret@kv.example:6379/1" "$ctl" config >"$tmp/cfg" 2>&1 ||
	fail "config of good values exit $?"
grep -q 'redis://job:\*\*\*@kv.example:6379/1' "$tmp/cfg" || fail "masked URL not shown"

SHIFT_KV_URL="redis://job:$secret@kv.example:6379/1" SHIFT_KV_NAMESPACE='a b' \
	"$ctl" config >"$tmp/bad" 2>&1 && fail "bad namespace accepted"
grep -q "SHIFT_KV_NAMESPACE='a b' from env" "$tmp/bad" || fail "bad value not named"

long=$(printf 'x%.0s' $(seq 1 600))
SHIFT_KV_URL="redis://job:$secret@$long:6379" "$ctl" config >"$tmp/long" 2>&1 &&
	fail "600-byte URL accepted"
grep -q "SHIFT_KV_URL.*too long" "$tmp/long" || fail "long URL reason"

mkdir -m 0700 "$tmp/st"
printf '%s sim0 7 RTS ready sim1 9 RTS 11 default default 0 0 0 0 0 native a "quoted"\\\ttab\n' $$ >"$tmp/st/shift-$$-sim0.status"
"$ctl" status --json "$tmp/st" >"$tmp/json" 2>&1 || fail "status --json exit $?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d[0]["qpn"]==7, d; assert d[0]["wq"]=="native", d; assert d[0]["note"].startswith("a \"quoted\""), d; assert "peer_mrs" not in d[0] and "key_mailbox" not in d[0], d' \
	"$tmp/json" || fail "status --json not valid JSON: $(cat "$tmp/json")"
# (this writer's lines: the peer MR keys read ahead, then the note)
printf '%s sim0 8 RTS ready sim1 9 RTS 11 default default 0 0 0 0 0 mirror mrs=12 -\n' $$ >"$tmp/st/shift-$$-sim1.status"
"$ctl" status --json "$tmp/st" >"$tmp/json2" 2>&1 || fail "status --json exit $?"
python3 -c 'import json,sys; d={r["qpn"]: r for r in json.load(open(sys.argv[1]))}; assert d[8]["peer_mrs"]==12 and d[8]["note"]=="-", d' \
	"$tmp/json2" || fail "status --json peer_mrs: $(cat "$tmp/json2")"
"$ctl" status "$tmp/st" | grep -Eq " mirror +12 - +- +-$" || fail "PEER_MRS column: $("$ctl" status "$tmp/st")"
# (and the key mailboxes of the connection, then the note)
printf '%s sim0 9 RTS ready sim1 9 RTS 11 default default 0 0 0 0 0 mirror mrs=3 mbox=both -\n' $$ >"$tmp/st/shift-$$-sim2.status"
"$ctl" status --json "$tmp/st" >"$tmp/json3" 2>&1 || fail "status --json exit $?"
python3 -c 'import json,sys; d={r["qpn"]: r for r in json.load(open(sys.argv[1]))}; assert d[9]["key_mailbox"]=="both" and d[9]["peer_mrs"]==3 and d[9]["note"]=="-", d' \
	"$tmp/json3" || fail "status --json key_mailbox: $(cat "$tmp/json3")"
"$ctl" status "$tmp/st" | grep -Eq " mirror +3 both +- +-$" || fail "MBOX column: $("$ctl" status "$tmp/st")"
# (and the paths of its records as datagrams)
printf '%s sim0 10 RTS ready sim1 9 RTS 11 default default 0 0 0 0 0 mirror mrs=3 mbox=both dgram=backup -\n' $$ >"$tmp/st/shift-$$-sim3.status"
"$ctl" status --json "$tmp/st" >"$tmp/json4" 2>&1 || fail "status --json exit $?"
python3 -c 'import json,sys; d={r["qpn"]: r for r in json.load(open(sys.argv[1]))}; assert d[10]["datagrams"]=="backup" and d[10]["key_mailbox"]=="both" and d[10]["note"]=="-" and "datagrams" not in d[9], d' \
	"$tmp/json4" || fail "status --json datagrams: $(cat "$tmp/json4")"
"$ctl" status "$tmp/st" | grep -Eq " mirror +3 both +backup +-$" || fail "DGRAM column: $("$ctl" status "$tmp/st")"

# shiftctl stats: the process's counters once, though two of its files
# carry them; a token that is not name=decimal ends what is shown
printf '#stats contexts_attached=2 dgrams_sent=17 mbox_asked=3\n' >>"$tmp/st/shift-$$-sim0.status"
printf '#stats contexts_attached=2 dgrams_sent=17 mbox_asked=3\n' >>"$tmp/st/shift-$$-sim1.status"
"$ctl" stats "$tmp/st" >"$tmp/stats" 2>&1 || fail "stats exit $?"
[ "$(grep -c "^$$ " "$tmp/stats")" = 3 ] || fail "stats not once per process: $(cat "$tmp/stats")"
grep -Eq "^$$ +dgrams_sent +17$" "$tmp/stats" || fail "stats line: $(cat "$tmp/stats")"
"$ctl" stats --json "$tmp/st" >"$tmp/sjson" 2>&1 || fail "stats --json exit $?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d)==1 and d[0]["dgrams_sent"]==17 and d[0]["mbox_asked"]==3, d' \
	"$tmp/sjson" || fail "stats --json: $(cat "$tmp/sjson")"
rm "$tmp/st/shift-$$-sim1.status" "$tmp/st/shift-$$-sim2.status" "$tmp/st/shift-$$-sim3.status"
printf '#stats rkeys_read=5 bad"name=1 dgrams_taken=2\n' >"$tmp/st/shift-$$-sim1.status"
sed -i '/^#stats/d' "$tmp/st/shift-$$-sim0.status"
"$ctl" stats --json "$tmp/st" >"$tmp/sjson2" 2>&1 || fail "stats --json exit $?"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d==[{"pid": int(sys.argv[2]), "rkeys_read": 5}], d' \
	"$tmp/sjson2" $$ || fail "stats --json of a bad token: $(cat "$tmp/sjson2")"
"$ctl" status "$tmp/st" | grep -q "^$$ .*sim0 " || fail "status with a #stats line: $("$ctl" status "$tmp/st")"

chmod 0777 "$tmp/st"
"$ctl" status "$tmp/st" >"$tmp/skip" 2>&1
grep -q "skipped $tmp/st: writable by group or others" "$tmp/skip" || fail "open dir not skipped"
grep -q " sim0 " "$tmp/skip" && fail "open dir read"

if grep -rl "$secret" "$tmp"; then fail "password printed"; fi
echo PASS
