#!/usr/bin/env python3
"""No application verb reaches the KV store (issue #19, item 1).

Builds the function-level call graph of SHIFT's static libraries from their
machine code (objdump -dr: direct calls and jumps, relocations, and local
calls resolved by the assembler) and walks it from every entry point an
application thread runs through: the data path's ops (post, poll, notify),
the failover layer's upcalls, and the control verbs an application calls
while traffic runs (modify/query QP and SRQ, the completion channel). No
path may reach a KV command (shift_kv_get, _put, _mget, ...) or hiredis;
a path found is printed, caller by caller.

Indirect calls through the upcall table (shift/verbs.c, `upcalls`) are
entered as roots of their own; other indirect calls go to the provider
below, which SHIFT does not analyse. As a control, the background pass must
reach the KV store: if it did not, the graph would be missing edges and a
clean result would mean nothing.

usage: kv_free_datapath.py LIB.a... [--verbose]
"""
import re
import subprocess
import sys
from collections import defaultdict, deque

HDR = re.compile(r'^([0-9a-f]+) <([^>]+)>:$')
SEC = re.compile(r'^Disassembly of section (\S+):$')
MEMBER = re.compile(r'^(\S+):\s+file format ')
CALL = re.compile(r'\s(?:call|jmp|j[a-z]+)\s+([0-9a-f]+) <([^>+]+)(\+0x[0-9a-f]+)?>')
RELOC = re.compile(r'R_\w+\s+([^\s+-]+)([+-]0x[0-9a-f]+)?$')

ROOTS = [
    # dp/attach.c: the context's ops once SHIFT has it
    'shift_dp_post_send', 'shift_dp_post_recv', 'shift_dp_post_srq_recv',
    'shift_dp_poll_slow', 'shift_dp_req_notify_cq',
    # shift/verbs.c: the data path's upcalls into fo/ and shadow/
    'shift_poll_slow', 'shift_failover_post_refused', 'shift_post_send_fallback',
    'shift_post_recv_fallback', 'shift_chan_arm_backup',
    # verbs an application calls while its traffic runs
    'shift_ibv_get_cq_event', 'shift_ibv_ack_cq_events', 'shift_ibv_modify_qp',
    'shift_ibv_query_qp', 'shift_ibv_modify_srq', 'shift_ibv_query_srq',
]
ROOT_PATTERNS = [
    re.compile(r'^shift_poll_cq_\w+$'),   # dp/poll.c: the per-slot fast polls
]
ROOT_OBJECTS = ['qpex', 'qpex_build', 'cqex']  # extended verbs: every op
KV = re.compile(r'^shift_kv_(get|get_buf|put|mget|delete|delete_own|wait|open|open_from_env)$')
CONTROL = 'shift_failover_background'


def objects(lib):
    """(member, objdump text) of each object of an archive."""
    out = subprocess.run(['objdump', '-dr', '--no-show-raw-insn', lib],
                         capture_output=True, text=True, check=True).stdout
    cur, lines = None, []
    for line in out.splitlines():
        m = MEMBER.match(line)
        if m:
            if cur:
                yield cur, lines
            cur, lines = m.group(1), []
        elif cur:
            lines.append(line)
    if cur:
        yield cur, lines


def parse(lines):
    """Functions (section, address, name) and each one's edges. A call or
    jump whose target the assembler left to the linker carries a relocation
    on the next line: objdump shows it aimed at the start of its own section
    (a wrong name), so only the relocation counts for it."""
    funcs, edges, sec, cur, pending = [], defaultdict(set), None, None, None

    def commit():
        if pending and cur:
            edges[cur].add(('sym', pending))

    for line in lines:
        m = SEC.match(line)
        if m:
            commit()
            pending, sec = None, m.group(1)
            continue
        m = HDR.match(line)
        if m:
            commit()
            pending, cur = None, m.group(2)
            funcs.append((sec, int(m.group(1), 16), cur))
            continue
        if cur is None:
            continue
        m = RELOC.search(line)
        if m:
            pending = None
            sym, add = m.group(1), m.group(2)
            if sym.startswith('.text'):
                edges[cur].add(('sec', sym, (int(add, 16) if add else 0) + 4))
            elif not sym.startswith('.'):
                edges[cur].add(('sym', sym))
            continue
        commit()
        pending = None
        m = CALL.search(line)
        if m and m.group(2) != cur:
            pending = m.group(2)
    commit()
    return funcs, edges


def graph(libs):
    nodes, glob, per = {}, {}, []
    for lib in libs:
        for k, (member, lines) in enumerate(objects(lib)):
            oid = '%s#%d:%s' % (lib.rsplit('/', 1)[-1], k, member)
            funcs, edges = parse(lines)
            per.append((oid, member, funcs, edges))
            for sec, _, n in funcs:
                pass
    # globals: defined in exactly one object (nm per archive member)
    for lib in libs:
        out = subprocess.run(['nm', '--defined-only', lib], capture_output=True,
                             text=True, check=True).stdout
        k, member = -1, None
        for line in out.splitlines():
            if line.endswith(':') and not line.startswith(' '):
                k, member = k + 1, line[:-1]
                continue
            p = line.split()
            if len(p) == 3 and p[1] in 'TW' and member:
                glob[p[2]] = '%s#%d:%s:%s' % (lib.rsplit('/', 1)[-1], k, member, p[2])
    for oid, member, funcs, edges in per:
        names = {f[2] for f in funcs}
        bysec = defaultdict(list)
        for s, a, n in funcs:
            bysec[s].append((a, n))

        def at(s, off):
            best = None
            for a, n in sorted(bysec.get(s, [])):
                if a <= off:
                    best = n
            return best

        for s, a, n in funcs:
            q = oid + ':' + n
            out = nodes.setdefault(q, set())
            for e in edges.get(n, ()):
                if e[0] == 'sec':
                    t = at(e[1], e[2])
                    if t:
                        out.add(oid + ':' + t)
                    continue
                t = e[1]
                base = t.split('.')[0]
                if t in names:
                    out.add(oid + ':' + t)
                elif base in names and base != t:
                    out.add(oid + ':' + base)
                elif t in glob:
                    out.add(glob[t])
                else:
                    out.add('ext:' + t)
            if '.' in n and n.split('.')[0] in names:  # .cold/.part clones
                nodes.setdefault(oid + ':' + n.split('.')[0], set()).add(q)
    return nodes


def fname(q):
    return q.rsplit(':', 1)[-1]


def is_sink(q):
    n = fname(q)
    return bool(KV.match(n)) or (q.startswith('ext:') and
                                  (n.startswith('redis') or n.startswith('hiredis')))


def walk(nodes, roots):
    """{(caller, KV sink): path} for every function reachable from roots
    that calls a KV command."""
    prev = {r: None for r in roots}
    dq, hits = deque(roots), {}
    while dq:
        n = dq.popleft()
        for c in sorted(nodes.get(n, ())):
            if is_sink(c):
                path, x = [fname(c)], n
                while x:
                    path.append(fname(x))
                    x = prev[x]
                hits[(n, c)] = path[::-1]
            elif c not in prev:
                prev[c] = n
                dq.append(c)
    return hits


def main(argv):
    libs = [a for a in argv if not a.startswith('--')]
    nodes = graph(libs)
    roots, found = [], set()
    for q in nodes:
        n, oid = fname(q), q.rsplit(':', 1)[0]
        member = oid.rsplit(':', 1)[-1].split('.')[0]
        if n in ROOTS or any(p.match(n) for p in ROOT_PATTERNS) or \
                member in ROOT_OBJECTS:
            roots.append(q)
            found.add(n)
    missing = [r for r in ROOTS if r not in found]
    if missing:
        print('kv_free_datapath: entry points not found (renamed?): %s' % ', '.join(missing))
        return 2
    control = walk(nodes, [q for q in nodes if fname(q) == CONTROL])
    if not control:
        print('kv_free_datapath: the control failed: %s reaches no KV command, so the '
              'call graph is missing edges' % CONTROL)
        return 2
    hits = walk(nodes, roots)
    print('kv_free_datapath: %d functions, %d entry points; control: %s reaches %s' %
          (len(nodes), len(roots), CONTROL, ', '.join(sorted({fname(h[1]) for h in control}))))
    for sink, path in sorted(hits.items()):
        print('  KV I/O on an application thread: ' + ' -> '.join(path))
    if hits:
        print('kv_free_datapath: FAILED: %d KV commands reachable from application verbs'
              % len(hits))
        return 1
    print('kv_free_datapath: no KV command reachable from any application verb')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
