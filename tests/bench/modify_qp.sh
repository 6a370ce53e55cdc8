#!/bin/sh
# modify_qp RTR/RTS through SHIFT vs plain, on a real device: alternates the
# two (ROUNDS each) in one run and prints the medians and their ratio.
# Usage (inside a testbed guest): modify_qp.sh BUILD_DIR [DEVICE [ROUNDS]]
set -eu
build=$1 dev=${2:-rxe0} rounds=${3:-7}
bin=$build/bin/shift-bench-modify-qp
out=$(mktemp)
for i in $(seq "$rounds"); do
	echo "plain $("$bin" "$dev" 1 64)" >>"$out"
	echo "shift $(SHIFT_KV_URL=${SHIFT_KV_URL:-redis://127.0.0.1:1} LD_LIBRARY_PATH=$build/lib "$bin" "$dev" 1 64 2>/dev/null)" >>"$out"
done
awk '
function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
{ split($2, r, "="); split($3, s, "="); if ($1 == "plain") { pr[++np] = r[2]; ps[np] = s[2] } else { sr[++ns] = r[2]; ss[ns] = s[2] } }
END { a = median(pr, np); b = median(sr, ns); c = median(ps, np); d = median(ss, ns)
	printf "RTR: plain %.1f us, SHIFT %.1f us, ratio %.2f\nRTS: plain %.1f us, SHIFT %.1f us, ratio %.2f\n", a, b, b / a, c, d, d / c }' "$out"
rm -f "$out"
