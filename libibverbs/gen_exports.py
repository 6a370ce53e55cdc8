#!/usr/bin/env python3
"""Generate the drop-in's exported surface from the real libibverbs.

Reads the real library's dynamic symbol table (nm -D --with-symbol-versions)
and writes, into OUTDIR:
  exports.S    one trampoline per exported function (jmp through a slot),
               bound to its versioned name with .symver, a lazy-resolve stub
               per slot, the compat hooks, and storage for data symbols;
  exports.c    the table the drop-in's constructor walks to fill the slots;
  exports.map  the version script: every name in its version node, the
               public nodes chained in order, the private ones standalone.
  exports.txt  the expected "name@[@]version type" list, for the ABI test.
Nothing is hand-listed here: a new rdma-core only needs a rebuild.
Usage: gen_exports.py REAL_LIB INTERCEPT_LIST OUTDIR [ARCH [NM]]
ARCH is x86_64 (default) or aarch64; NM the nm that reads REAL_LIB (a cross
build's own).
"""
import re
import subprocess
import sys
from collections import defaultdict


def read_symbols(real, nm="nm"):
    out = subprocess.run([nm, "-D", "-S", "--with-symbol-versions", "--defined-only", real],
                         capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        f = line.split()
        # "addr size type name@@ver" or "addr type name@@ver" (no size)
        if len(f) == 4:
            _, size, kind, full = f
        elif len(f) == 3:
            _, kind, full = f
            size = "0"
        else:
            continue
        if kind == "A" or "@" not in full:
            continue
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(@@?)([A-Za-z0-9_.]+)", full)
        if not m:
            sys.exit(f"gen_exports: cannot parse symbol {full!r}")
        name, at, ver = m.groups()
        syms.append(dict(name=name, ver=ver, default=(at == "@@"), kind=kind,
                         size=int(size, 16)))
    if not syms:
        sys.exit(f"gen_exports: no versioned symbols in {real}")
    return syms


def read_intercepts(path):
    table = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, fn = line.split()
        table[name] = fn
    return table


# Per-architecture assembly. Every trampoline jumps through its slot; the
# compat hook and the lazy stub first call a C function keeping every
# integer argument register (verbs take no floating-point arguments).
X86_64 = dict(
    jump=lambda slot: [f"\tjmp *{slot}(%rip)"],
    call=lambda fn, arg: (["\tpush %rdi", "\tpush %rsi", "\tpush %rdx", "\tpush %rcx",
                           "\tpush %r8", "\tpush %r9", "\tpush %rax"] +
                          ([f"\tmov ${arg}, %edi"] if arg is not None else []) +
                          [f"\tcall {fn}",
                           "\tpop %rax", "\tpop %r9", "\tpop %r8", "\tpop %rcx",
                           "\tpop %rdx", "\tpop %rsi", "\tpop %rdi"]),
    quad=".quad", func="@function", obj="@object", progbits="@progbits")
# AAPCS64: arguments in x0-x7, the indirect result address in x8; x16 is
# the intra-procedure-call scratch register a veneer may use anyway.
AARCH64 = dict(
    jump=lambda slot: [f"\tadrp x16, {slot}", f"\tldr x16, [x16, :lo12:{slot}]",
                       "\tbr x16"],
    call=lambda fn, arg: (["\tstp x29, x30, [sp, #-96]!", "\tmov x29, sp",
                           "\tstp x0, x1, [sp, #16]", "\tstp x2, x3, [sp, #32]",
                           "\tstp x4, x5, [sp, #48]", "\tstp x6, x7, [sp, #64]",
                           "\tstr x8, [sp, #80]"] +
                          ([f"\tmov w0, #{arg}"] if arg is not None else []) +
                          [f"\tbl {fn}",
                           "\tldr x8, [sp, #80]", "\tldp x6, x7, [sp, #64]",
                           "\tldp x4, x5, [sp, #48]", "\tldp x2, x3, [sp, #32]",
                           "\tldp x0, x1, [sp, #16]", "\tldp x29, x30, [sp], #96"]),
    quad=".xword", func="%function", obj="%object", progbits="%progbits")
ARCHES = {"x86_64": X86_64, "amd64": X86_64, "aarch64": AARCH64, "arm64": AARCH64}


def ident(s):
    return f"{s['name']}__{s['ver'].replace('.', '_')}"


def ver_key(v):
    m = re.fullmatch(r"[A-Z][A-Z0-9]*_(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (1 << 30, 0)


def main():
    real, intercept_path, outdir = sys.argv[1:4]
    arch_name = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else "x86_64"
    nm = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] else "nm"
    if arch_name not in ARCHES:
        sys.exit(f"gen_exports: no trampolines for architecture {arch_name!r}")
    A = ARCHES[arch_name]
    syms = read_symbols(real, nm)
    intercepts = read_intercepts(intercept_path)
    names = {s["name"] for s in syms}
    for name in intercepts:
        if name not in names:
            print(f"gen_exports: note: {name} is not exported by {real}; not intercepted",
                  file=sys.stderr)

    funcs = [s for s in syms if s["kind"] in "TtWi"]
    datas = [s for s in syms if s["kind"] not in "TtWi"]

    asm = ["/* Generated by gen_exports.py from the real libibverbs. Do not edit. */",
           "\t.text"]
    c = ["/* Generated by gen_exports.py from the real libibverbs. Do not edit. */",
         '#include "libibverbs/dropin.h"', ""]
    rows = []
    for i, s in enumerate(funcs):
        sid = ident(s)
        at = "@@" if s["default"] else "@"
        fn = intercepts.get(s["name"])
        if fn == "-":
            # notice only: the front's hook, then the real function
            mode = "SHIFT_EXPORT_COMPAT"
            fn = None
        elif fn and s["default"]:
            mode = "SHIFT_EXPORT_SHIFT"
        elif fn:
            mode = "SHIFT_EXPORT_COMPAT"
        else:
            mode = "SHIFT_EXPORT_FORWARD"
            fn = None
        asm += [
            f"\t.globl shift_tr_{sid}",
            f"\t.type shift_tr_{sid},{A['func']}",
            "\t.p2align 4",
            f"shift_tr_{sid}:",
        ]
        if mode == "SHIFT_EXPORT_COMPAT":
            # tell SHIFT, keeping every argument register, then forward
            asm += A["call"]("shift_compat_enter", i)
        asm += A["jump"](f"shift_pt_{sid}") + [
            f"\t.size shift_tr_{sid}, .-shift_tr_{sid}",
            f"\t.symver shift_tr_{sid}, {s['name']}{at}{s['ver']}",
            # reached only if called before the constructor ran
            f"shift_lz_{sid}:",
        ] + A["call"]("shift_dropin_init", None) + A["jump"](f"shift_pt_{sid}") + [
            "\t.pushsection .data",
            "\t.p2align 3",
            f"\t.globl shift_pt_{sid}",
            f"\t.hidden shift_pt_{sid}",
            f"shift_pt_{sid}:",
            f"\t{A['quad']} shift_lz_{sid}",
            "\t.popsection",
        ]
        c.append(f"extern void *shift_pt_{sid};")
        if fn:
            c.append(f"extern void {fn}(void);")
        rows.append(f'\t{{ "{s["name"]}", "{s["ver"]}", {mode}, &shift_pt_{sid}, '
                    f'{"(void *)" + fn if fn and mode == "SHIFT_EXPORT_SHIFT" else "NULL"} }},')
    for s in datas:
        size = max(s["size"], 1)
        asm += [
            "\t.pushsection .bss",
            "\t.p2align 3",
            f"\t.globl {s['name']}",
            f"\t.type {s['name']},{A['obj']}",
            f"\t.size {s['name']}, {size}",
            f"{s['name']}:",
            f"\t.zero {size}",
            "\t.popsection",
        ]
        c.append(f"extern char {s['name']}[];")
    asm.append(f'\t.section .note.GNU-stack,"",{A["progbits"]}')

    c += ["", "const struct shift_export shift_exports[] = {"] + rows + ["};",
          "const unsigned int shift_exports_count = sizeof(shift_exports) / sizeof(shift_exports[0]);",
          "", "const struct shift_export_data shift_export_datas[] = {"]
    c += [f'\t{{ "{s["name"]}", "{s["ver"]}", {s["name"]}, {max(s["size"], 1)} }},' for s in datas]
    c += ["\t{ NULL, NULL, NULL, 0 },", "};", ""]

    byver = defaultdict(set)
    for s in syms:
        byver[s["ver"]].add(s["name"])
    public = sorted((v for v in byver if ver_key(v)[0] < (1 << 30)), key=ver_key)
    private = sorted(v for v in byver if ver_key(v)[0] >= (1 << 30))
    vm = ["/* Generated by gen_exports.py from the real libibverbs. Do not edit. */"]
    prev = None
    for v in public:
        body = " ".join(f"{n};" for n in sorted(byver[v]))
        local = " local: *;" if prev is None else ""
        vm.append(f"{v} {{ global: {body}{local} }}{' ' + prev if prev else ''};")
        prev = v
    for v in private:
        body = " ".join(f"{n};" for n in sorted(byver[v]))
        local = " local: *;" if not public and v == private[0] else ""
        vm.append(f"{v} {{ global: {body}{local} }};")

    expected = sorted(f"{s['name']}{'@@' if s['default'] else '@'}{s['ver']} "
                      f"{'T' if s['kind'] in 'TtWi' else 'D'}" for s in syms)
    open(f"{outdir}/exports.S", "w").write("\n".join(asm) + "\n")
    open(f"{outdir}/exports.c", "w").write("\n".join(c))
    open(f"{outdir}/exports.map", "w").write("\n".join(vm) + "\n")
    open(f"{outdir}/exports.txt", "w").write("\n".join(expected) + "\n")


if __name__ == "__main__":
    main()
