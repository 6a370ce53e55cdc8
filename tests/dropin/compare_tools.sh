#!/bin/sh
# The drop-in must be invisible to ordinary verbs tools: ibv_devices and
# ibv_devinfo give the same output and exit code through it, in both loading
# modes and with SHIFT disabled, as with the plain library.
# Usage: compare_tools.sh BUILD_LIB_DIR
set -u
lib=$1
fail=0
for tool in ibv_devices ibv_devinfo "ibv_devinfo -v" "ibv_devinfo -l"; do
	bin=${tool%% *}
	if ! command -v "$bin" >/dev/null 2>&1; then
		echo "FAIL $bin is not installed (apt-get install ibverbs-utils)"
		exit 1
	fi
	ref=$($tool 2>&1); ref_rc=$?
	for mode in ldpath preload ldpath-disabled; do
		case $mode in
		ldpath) out=$(LD_LIBRARY_PATH=$lib $tool 2>&1); rc=$? ;;
		preload) out=$(LD_PRELOAD=$lib/libibverbs.so.1 $tool 2>&1); rc=$? ;;
		ldpath-disabled) out=$(SHIFT_ENABLE=0 LD_LIBRARY_PATH=$lib $tool 2>&1); rc=$? ;;
		esac
		if [ "$out" = "$ref" ] && [ "$rc" = "$ref_rc" ]; then
			echo "ok   $tool ($mode): exit $rc, same output"
		else
			echo "FAIL $tool ($mode): exit $rc vs $ref_rc"
			echo "--- plain:"; echo "$ref"; echo "--- drop-in:"; echo "$out"
			fail=1
		fi
	done
	# the drop-in really was loaded (not silently bypassed)
	if ! LD_LIBRARY_PATH=$lib ldd "$(command -v "$bin")" | grep -q "=> $lib/libibverbs.so.1"; then
		echo "FAIL $bin does not load the drop-in from $lib"
		fail=1
	fi
done
exit $fail
