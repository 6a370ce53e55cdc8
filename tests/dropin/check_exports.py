#!/usr/bin/env python3
"""Check that the drop-in exports exactly the real libibverbs' surface.

Compares `nm -D --with-symbol-versions --defined-only` of both libraries:
every (name, @/@@ version, kind) of one must be in the other, in both
directions, including the version definitions themselves. Weak and strong
text symbols count as the same kind (both are functions to a caller).
Usage: check_exports.py REAL_LIB DROPIN_LIB
       check_exports.py --self-test REAL_LIB DROPIN_LIB  (proves a missing or
       extra entry is detected)
"""
import subprocess
import sys


def surface(lib):
    out = subprocess.run(["nm", "-D", "--with-symbol-versions", "--defined-only", lib],
                         capture_output=True, text=True, check=True).stdout
    entries = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 3:
            continue
        kind, name = f[-2], f[-1]
        kind = {"W": "T", "t": "T", "i": "T", "V": "D", "b": "B", "d": "D"}.get(kind, kind)
        entries.add(f"{name} {kind}")
    return entries


def compare(real, ours):
    missing, extra = sorted(real - ours), sorted(ours - real)
    for e in missing:
        print(f"missing from the drop-in: {e}")
    for e in extra:
        print(f"not in the real library:  {e}")
    return not missing and not extra


def main():
    args = sys.argv[1:]
    self_test = args and args[0] == "--self-test"
    if self_test:
        args = args[1:]
    real, ours = surface(args[0]), surface(args[1])
    if self_test:
        one = sorted(real)[len(real) // 2]
        ok = (not compare(real, ours - {one}) and not compare(real, ours | {"bogus@@IBVERBS_1.1 T"})
              and not compare(real, (ours - {one}) | {one.replace("@@", "@") + "x"}))
        print("self-test:", "detects differences" if ok else "FAILED to detect a difference")
        return 0 if ok else 1
    ok = compare(real, ours)
    print(f"{len(real)} entries in the real library, {len(ours)} in the drop-in: "
          f"{'identical' if ok else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
