#!/usr/bin/env python3
"""Structural check of the SHIFT source tree, driven by a rules file.

It enforces three rules over the .c and .h files under the rules' `scan`
folders and prints one line per offence, prefixed with the rule's name:

  size:  a file over `max-file-lines` lines (files listed `generated` are
         exempt); a function body over `max-func-lines` lines. A function is
         a `{` alone at column 0 up to the next `}` at column 0 (the kernel /
         rdma-core style); its name is the identifier before the first `(` of
         the lines just above the `{`. Its length counts the lines from the
         `{` to the `}`, both included.
  layer: a file including ("...", never <...>) a project header of a layer
         its own layer may not depend on; a scanned file in no layer.
  cycle: an include cycle between modules. A module is a path without its
         extension (foo.c and foo.h are one module); module A depends on B
         when a file of A includes a header of B. Every elementary cycle is
         printed as A -> B -> ... -> A, starting at its smallest module.
  state: a write of a listed state field outside the functions allowed to
         write it: `x->f =` / `x.f =` (also in designated initializers),
         compound assignments, ++/--, the field's address as the first
         argument of an __atomic_/__sync_/atomic_ store, exchange, CAS or
         fetch-op builtin, or of memset/memcpy/memmove.

Rules file: one directive a line, `#` starts a comment.
  scan DIR...                 folders (relative to --root) to check
  max-file-lines N            default 600
  max-func-lines N            default 80
  layer NAME PATTERN...       files of a layer. `dir/` is everything under
                              dir; otherwise a glob where `*` stays inside
                              one folder and `**` crosses folders. The first
                              matching `layer` line wins.
  depends NAME [NAME...|*]    layers NAME may include besides its own
                              (`*`: all). A layer without the line: none.
  generated PATH REASON...    a generated file, exempt from `size` (a reason
                              is required)
  state FIELD [FUNC...]       FIELD may be written only in these functions
                              (none listed: nowhere)
  allow size FILE [FUNC]      known offences, accepted: a long file, or a
  allow layer FILE HEADER     long function; a forbidden include; a cycle
  allow cycle MOD -> ... MOD  (modules in order, any rotation, `->` optional);
  allow state FILE FUNC FIELD a state write in FUNC (`-` for file scope).
An `allow` covers every offence with its key (all the writes of FIELD in
FUNC, say). A file in no layer is `allow layer FILE -`.
An `allow` or `generated` line that matches nothing is itself an offence
(stale:), so the lists can only shrink.

Exit status: 0 clean, 1 offences (or stale entries), 2 bad rules file.
"""
import argparse
import os
import re
import sys

DEFAULT_FILE_LINES, DEFAULT_FUNC_LINES = 600, 80
ID = r'[A-Za-z_]\w*'
SUBS = r'(?:\s*\[[^\]\n]*\])*'
CHAIN = ID + SUBS + r'(?:\s*(?:->|\.)\s*' + ID + SUBS + r')*'
ASSIGN_OPS = r'(?:[-+*/%&|^]|<<|>>)?=(?!=)'
WRITERS = (r'\b(?:__atomic_(?:store_n|store|exchange_n|exchange|'
           r'compare_exchange_n|compare_exchange|fetch_\w+|\w+_fetch)|'
           r'__sync_\w+|atomic_(?:store|exchange|compare_exchange_\w+|'
           r'fetch_\w+)(?:_explicit)?|memset|memcpy|memmove)')


class RulesError(Exception):
    pass


# ---------------------------------------------------------------- rules ---
class Rules:
    def __init__(self, path):
        self.path = os.path.basename(path)
        self.scan, self.layers, self.depends = [], [], {}
        self.max_file, self.max_func = DEFAULT_FILE_LINES, DEFAULT_FUNC_LINES
        self.generated = {}     # path -> line number
        self.state = {}         # field -> set of functions
        self.allows = []        # (line number, rule, key)
        with open(path) as f:
            for n, raw in enumerate(f, 1):
                words = raw.split('#', 1)[0].split()
                if words:
                    self.directive(n, words[0], words[1:])
        if not self.scan:
            raise RulesError('%s: no `scan` line' % self.path)

    def directive(self, n, d, args):
        where = '%s:%d' % (self.path, n)
        if d == 'scan' and args:
            self.scan += [a.rstrip('/') for a in args]
        elif d in ('max-file-lines', 'max-func-lines') and len(args) == 1:
            if not args[0].isdigit():
                raise RulesError('%s: %s wants a number' % (where, d))
            setattr(self, 'max_file' if d == 'max-file-lines' else 'max_func',
                    int(args[0]))
        elif d == 'layer' and len(args) >= 2:
            self.layers += [(args[0], glob_re(p)) for p in args[1:]]
        elif d == 'depends' and args:
            self.depends.setdefault(args[0], set()).update(args[1:])
        elif d == 'generated' and len(args) >= 2:
            self.generated[args[0]] = n
        elif d == 'state' and args:
            self.state.setdefault(args[0], set()).update(args[1:])
        elif d == 'allow' and args and args[0] in ('size', 'layer', 'state',
                                                   'cycle'):
            key = tuple(args[1:])
            if args[0] == 'cycle':
                key = canonical_cycle([a for a in key if a != '->'])
            want = {'size': (1, 2), 'layer': (2,), 'state': (3,)}
            if args[0] != 'cycle' and len(key) not in want[args[0]] \
                    or args[0] == 'cycle' and len(key) < 2:
                raise RulesError('%s: bad allow %s arguments' % (where, args[0]))
            self.allows.append((n, args[0], key))
        else:
            raise RulesError('%s: cannot read `%s %s`' % (where, d, ' '.join(args)))

    def layer_of(self, path):
        for name, rx in self.layers:
            if rx.fullmatch(path):
                return name
        return None

    def may_use(self, a, b):
        deps = self.depends.get(a, set())
        return a == b or b in deps or '*' in deps


def glob_re(pattern):
    if pattern.endswith('/'):
        pattern += '**'
    out = ''
    for tok in re.split(r'(\*\*|\*|\?)', pattern):
        out += {'**': '.*', '*': '[^/]*', '?': '[^/]'}.get(tok, re.escape(tok))
    return re.compile(out)


def canonical_cycle(mods):
    """A cycle's modules (without the repeated first) from its smallest."""
    mods = list(mods)
    if len(mods) > 1 and mods[0] == mods[-1]:
        mods.pop()
    i = mods.index(min(mods))
    return tuple(mods[i:] + mods[:i])


# --------------------------------------------------------------- source ---
def strip_c(text, keep_strings):
    """Comments (and unless keep_strings, string/char literals) blanked,
    newlines kept so line numbers still hold."""
    out, i, n = [], 0, len(text)
    while i < n:
        c, nxt = text[i], text[i + 1:i + 2]
        if c == '/' and nxt in ('/', '*'):
            end = text.find('\n', i) if nxt == '/' else text.find('*/', i + 2)
            end = n if end < 0 else (end if nxt == '/' else end + 2)
            out.append(re.sub(r'[^\n]', ' ', text[i:end]))
            i = end
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c and text[j] != '\n':
                j += 2 if text[j] == '\\' else 1
            shut = j < n and text[j] == c       # else unterminated: stop
            j += shut
            out.append(text[i:j] if keep_strings else
                       c + ' ' * (j - i - 1 - shut) + c * shut)
            i = j
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def drop_attributes(s):
    while True:
        m = re.search(r'\b__attribute__\s*\(', s)
        if not m:
            return s
        depth, j = 0, m.end() - 1
        while j < len(s):
            depth += {'(': 1, ')': -1}.get(s[j], 0)
            j += 1
            if depth == 0:
                break
        s = s[:m.start()] + ' ' * (j - m.start()) + s[j:]


def functions(lines):
    """(name, name line, `{` line, `}` line), 1-based, of each function."""
    found, i = [], 0
    while i < len(lines):
        if lines[i].rstrip() != '{':
            i += 1
            continue
        start = i
        while start > 0 and start > i - 12:
            prev = lines[start - 1].strip()
            if not prev or prev.startswith('#') or prev[-1] in ';}{':
                break
            start -= 1
        decl = drop_attributes('\n'.join(lines[start:i]))
        close = next((k for k in range(i + 1, len(lines))
                      if lines[k].startswith('}')), len(lines) - 1)
        paren = decl.find('(')
        if paren > 0 and '=' not in decl[:paren]:
            m = re.match(r'\s*\*\s*(' + ID + r')\s*\(', decl[paren + 1:])
            if m:   # a function returning a function pointer
                name, pos = m.group(1), paren + 1 + m.start(1)
            else:
                m = re.search('(' + ID + r')\s*$', decl[:paren])
                name, pos = (m.group(1), m.start(1)) if m else ('?', paren)
            found.append((name, start + 1 + decl.count('\n', 0, pos),
                          i + 1, close + 1))
        i = close + 1
    return found


def state_writes(code, field):
    f = r'\s*(?:->|\.)\s*' + field + r'\b' + SUBS
    pats = [f + r'\s*(?:' + ASSIGN_OPS + r'|\+\+|--)',
            r'(?:\+\+|--)\s*\(?\s*' + CHAIN + f + r'(?!\s*(?:->|\.|\())',
            WRITERS + r'\s*\(\s*&?\s*\(?\s*' + CHAIN + f + r'\s*\)?\s*,']
    hits = set()
    for p in pats:
        for m in re.finditer(p, code):
            pos = re.search(r'\b' + field + r'\b', code[m.start():]).start()
            hits.add(code.count('\n', 0, m.start() + pos) + 1)
    return sorted(hits)


class Source:
    def __init__(self, root, rel):
        with open(os.path.join(root, rel), errors='replace') as f:
            text = f.read()
        self.rel, self.module = rel, os.path.splitext(rel)[0]
        self.nlines = len(text.splitlines())
        self.code = strip_c(text, keep_strings=False)
        self.funcs = functions(self.code.split('\n'))
        self.includes = []      # (line, "path" as written)
        for n, line in enumerate(strip_c(text, True).split('\n'), 1):
            m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
            if m:
                self.includes.append((n, m.group(1)))

    def function_at(self, line):
        for name, _, open_, close in self.funcs:
            if open_ <= line <= close:
                return name
        return '-'


# --------------------------------------------------------------- checks ---
def check_size(rules, files, report):
    for s in files:
        if s.rel in rules.generated:
            continue
        if s.nlines > rules.max_file:
            report('size', (s.rel,), '%s: %d lines (max %d)'
                   % (s.rel, s.nlines, rules.max_file))
        for name, line, open_, close in s.funcs:
            body = close - open_ + 1
            if body > rules.max_func:
                report('size', (s.rel, name), '%s:%d: function %s is %d lines'
                       ' (max %d)' % (s.rel, line, name, body, rules.max_func))


def resolve(inc, src, by_path):
    for cand in (inc, os.path.normpath(os.path.join(os.path.dirname(src), inc))):
        if cand in by_path:
            return by_path[cand]
    return None


def check_layers(rules, files, by_path, report):
    for s in files:
        a = rules.layer_of(s.rel)
        if a is None:
            report('layer', (s.rel, '-'), '%s: in no layer (add it to a'
                   ' `layer` line)' % s.rel)
            continue
        for line, inc in s.includes:
            h = resolve(inc, s.rel, by_path)
            b = h and rules.layer_of(h.rel)
            if b and not rules.may_use(a, b):
                report('layer', (s.rel, h.rel), '%s:%d: file %s (layer %s)'
                       ' includes %s (layer %s): %s may not depend on %s'
                       % (s.rel, line, s.rel, a, h.rel, b, a, b))


def cycles(graph):
    """Every elementary cycle, each from its smallest module."""
    found = []
    for s in sorted(graph):
        stack = [(s, iter(sorted(graph[s])))]
        path, on_path = [s], {s}
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                on_path.discard(path.pop())
            elif nxt == s:
                found.append(tuple(path))
            elif nxt > s and nxt not in on_path:
                path.append(nxt)
                on_path.add(nxt)
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
    return found


def check_cycles(files, by_path, report):
    graph = {}
    for s in files:
        deps = graph.setdefault(s.module, set())
        for _, inc in s.includes:
            h = resolve(inc, s.rel, by_path)
            if h and h.module != s.module:
                deps.add(h.module)
    for c in cycles(graph):
        report('cycle', c, ' -> '.join(c + (c[0],)))


def check_state(rules, files, report):
    for s in files:
        for field, setters in sorted(rules.state.items()):
            for line in state_writes(s.code, field):
                fn = s.function_at(line)
                if fn not in setters:
                    only = ('only in ' + ', '.join(sorted(setters))
                            if setters else 'in no function')
                    report('state', (s.rel, fn, field), '%s:%d: %s written in %s'
                           ' (allowed %s)' % (s.rel, line, field, fn, only))


# ----------------------------------------------------------------- main ---
def scanned_files(root, rules):
    rels = []
    for d in rules.scan:
        if not os.path.isdir(os.path.join(root, d)):
            raise RulesError('%s: scan folder %s not found' % (rules.path, d))
        for dirpath, dirnames, names in os.walk(os.path.join(root, d)):
            dirnames.sort()
            rels += [os.path.relpath(os.path.join(dirpath, n), root)
                     for n in names if n.endswith(('.c', '.h'))]
    return [Source(root, r) for r in sorted(set(rels))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--root', default='.', help='the source tree')
    ap.add_argument('--rules', required=True, help='the rules file')
    args = ap.parse_args(argv)
    try:
        rules = Rules(args.rules)
        files = scanned_files(args.root, rules)
    except (RulesError, OSError) as e:
        print('rules: %s' % e)
        return 2
    by_path = {s.rel: s for s in files}
    offences, known, used = [], [], set()
    allows = {(rule, key): n for n, rule, key in rules.allows}

    def report(rule, key, text):
        n = allows.get((rule, key))
        if n is None:
            offences.append('%s: %s' % (rule, text))
        else:
            used.add(n)
            known.append('%s: %s  [allowed, %s:%d]' % (rule, text, rules.path, n))

    check_size(rules, files, report)
    check_layers(rules, files, by_path, report)
    check_cycles(files, by_path, report)
    check_state(rules, files, report)
    stale = ['stale: %s:%d: allow %s %s matches no offence: remove it'
             % (rules.path, n, rule, ' '.join(key))
             for n, rule, key in rules.allows if n not in used]
    stale += ['stale: %s:%d: generated %s is not a scanned file: remove it'
              % (rules.path, n, p) for p, n in sorted(rules.generated.items())
              if p not in by_path]
    print('structure: %d files in %s, %d layers, rules %s'
          % (len(files), ' '.join(rules.scan),
             len({n for n, _ in rules.layers}), args.rules))
    if known:
        print('known offences accepted by `allow` (%d):' % len(known))
        for line in known:
            print('  ' + line)
    for line in offences + stale:
        print(line)
    print('structure: %s (%d offences, %d allowed, %d stale entries)'
          % ('FAIL' if offences or stale else 'ok', len(offences), len(known),
             len(stale)))
    return 1 if offences or stale else 0


if __name__ == '__main__':
    sys.exit(main())
