#!/bin/sh
# modify_qp RTR/RTS through SHIFT vs plain, on a real device: alternates the
# two (ROUNDS each) in one run and prints the medians over the rounds of
# each run's mean and median per call, and their ratios.
# Usage (inside a testbed guest): modify_qp.sh BUILD_DIR [DEVICE [ROUNDS [NQP]]]
set -eu
build=$1 dev=${2:-rxe0} rounds=${3:-7} nqp=${4:-64}
bin=$build/bin/shift-bench-modify-qp
out=$(mktemp)
for i in $(seq "$rounds"); do
	echo "plain $("$bin" "$dev" 1 "$nqp")" >>"$out"
	echo "shift $(SHIFT_KV_URL=${SHIFT_KV_URL:-redis://127.0.0.1:1} LD_LIBRARY_PATH=$build/lib "$bin" "$dev" 1 "$nqp" 2>/dev/null)" >>"$out"
done
awk '
function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ m = $1; k = ++cnt[m]; for (f = 2; f <= NF; f++) { split($f, kv, "="); v[m, kv[1], k] = kv[2] } }
function med(m, key,   a, i) { for (i = 1; i <= cnt[m]; i++) a[i] = v[m, key, i]; return median(a, cnt[m]) }
END { n = split("rtr_us rts_us rtr_cpu_us rts_cpu_us rtr_med_us rts_med_us rtr_cpu_med_us rts_cpu_med_us setup_us setup_cpu_us", keys, " ")
	split("RTR wall, mean per call|RTS wall, mean per call|RTR thread CPU, mean per call|RTS thread CPU, mean per call|RTR wall, median per call|RTS wall, median per call|RTR thread CPU, median per call|RTS thread CPU, median per call|created and connected, wall, mean per QP|created and connected, thread CPU, mean per QP", names, "|")
	for (i = 1; i <= n; i++) { a = med("plain", keys[i]); b = med("shift", keys[i])
		printf "%s: plain %.1f us, SHIFT %.1f us, ratio %.2f\n", names[i], a, b, b / a }}' "$out"
rm -f "$out"
