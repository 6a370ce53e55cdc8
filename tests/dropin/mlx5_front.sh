#!/bin/sh
# The libmlx5.so.1 front: an mlx5dv program behaves as without it and gets
# one "not protected" line per object-creating entry point it calls.
# Usage: mlx5_front.sh LIB_DIR PROG
set -u
lib=$1 prog=$2
plain=$("$prog" 2>&1); prc=$?
out=$(LD_LIBRARY_PATH=$lib "$prog" 2>/tmp/mlx5_front.$$); rc=$?
err=$(cat /tmp/mlx5_front.$$); rm -f /tmp/mlx5_front.$$
lines=$(printf '%s\n' "$err" | grep -c "mlx5dv_create_qp: objects made through mlx5 direct verbs are not protected")
if [ "$rc" -ne "$prc" ] || [ "$out" != "$plain" ] || [ "$lines" -ne 1 ]; then
	echo "FAIL: exit $rc (plain $prc), $lines notice lines (want 1)"
	echo "--- plain:"; echo "$plain"; echo "--- front:"; echo "$out"; echo "$err"
	exit 1
fi
echo "ok: same result as plain ($out); $err"
