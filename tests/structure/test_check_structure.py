#!/usr/bin/env python3
"""Self-test of check_structure.py: it must be able to fail.

Each test builds a small throwaway tree in the target layer layout (a clean
one that passes, then the clean one with one offence added), runs the check
on it and asserts the exit status and the offender named in its report.
"""
import os
import subprocess
import sys
import tempfile
import unittest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     'check_structure.py')

RULES = """\
scan shift providers kv libibverbs
max-file-lines 600
max-func-lines 80
layer base      shift/base/
layer kv        kv/
layer dp        shift/dp/
layer providers providers/
layer shadow    shift/shadow/
layer fo        shift/fo/
layer front     shift/* libibverbs/
depends kv        base
depends dp        base
depends providers base dp
depends shadow    base kv dp providers
depends fo        base kv dp providers shadow
depends front     *
state send_state shift_dqp_set_send_state
"""


def func(name, lines, body='\tx++;'):
    """A function of `lines` lines, `{` and `}` included."""
    return ('static void\n%s(int x)\n{\n' % name
            + (body + '\n') * (lines - 2) + '}\n')


CLEAN = {
    'shift/base/log.h': '#include <stdio.h>\nvoid shift_log(const char *m);\n',
    'shift/base/log.c': '#include "shift/base/log.h"\n'
                        '/* #include "shift/fo/failover.h" (a comment) */\n'
                        'void\nshift_log(const char *m)\n{\n'
                        '\tputs("#include \\"kv/kv.h\\"");\n\tputs(m);\n}\n',
    'kv/kv.h': '#include "shift/base/log.h"\nint kv_get(void);\n',
    'kv/kv.c': '#include "kv/kv.h"\nint\nkv_get(void)\n{\n\treturn 0;\n}\n',
    'shift/dp/dqp.h':
        '#include "shift/base/log.h"\n'
        'struct shift_dqp { int send_state; int other; };\n'
        'static inline void\n'
        'shift_dqp_set_send_state(struct shift_dqp *d, int st)\n{\n'
        '\t__atomic_store_n(&d->send_state, st, __ATOMIC_RELEASE);\n'
        '\td->send_state = st;\n\td->send_state++;\n}\n',
    'shift/dp/dqp.c':
        '#include "shift/dp/dqp.h"\n'
        'int\nshift_dqp_ready(struct shift_dqp *d, struct shift_dqp *e)\n{\n'
        '\td->other = 1;\n'
        '\tif (d->send_state == 0 || d->send_state != 1 || d->send_state <= 2)\n'
        '\t\treturn __atomic_load_n(&d->send_state, __ATOMIC_ACQUIRE);\n'
        '\tmemcpy(e, &d->send_state, sizeof(int));\n'
        '\treturn e->send_state >= 3;\n}\n'
        + func('exactly_eighty', 80),
    'providers/quirks.c': '#include "providers/quirks.h"\n'
                          '#include "shift/dp/dqp.h"\n',
    'providers/quirks.h': '#include "shift/base/log.h"\n',
    'shift/shadow/shadow.h': '#include "kv/kv.h"\n',
    'shift/shadow/shadow.c': '#include "shift/shadow/shadow.h"\n'
                             '#include "providers/quirks.h"\n',
    'shift/fo/failover.h': 'void shift_failover(void);\n',
    'shift/fo/failover.c': '#include "shift/fo/failover.h"\n'
                           '#include "shift/shadow/shadow.h"\n'
                           + '/* filler */\n' * 598,      # 600 lines
    'shift/verbs.c': ''.join('#include "%s"\n' % h for h in (
        'shift/base/log.h', 'kv/kv.h', 'shift/dp/dqp.h', 'providers/quirks.h',
        'shift/shadow/shadow.h', 'shift/fo/failover.h')) + '#include <verbs.h>\n',
    'libibverbs/dropin.c': '#include "shift/fo/failover.h"\n',
}


def line_of(text, needle):
    return text.split('\n').index(next(l for l in text.split('\n')
                                       if needle in l)) + 1


class CheckStructure(unittest.TestCase):
    def run_check(self, extra=None, rules=RULES, drop=()):
        files = {k: v for k, v in CLEAN.items() if k not in drop}
        files.update(extra or {})
        with tempfile.TemporaryDirectory() as root:
            for rel, text in files.items():
                os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
                with open(os.path.join(root, rel), 'w') as f:
                    f.write(text)
            with open(os.path.join(root, 'rules.conf'), 'w') as f:
                f.write(rules)
            p = subprocess.run([sys.executable, CHECK, '--root', root,
                                '--rules', os.path.join(root, 'rules.conf')],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               universal_newlines=True)
        print('\n--- %s (exit %d)\n%s' % (self.id(), p.returncode, p.stdout))
        return p.returncode, p.stdout.splitlines()

    def offences(self, lines, prefix):
        return [l for l in lines if l.startswith(prefix + ':')]

    def assertFails(self, extra, rule, *expected, rules=RULES, drop=()):
        rc, out = self.run_check(extra, rules, drop)
        self.assertEqual(rc, 1, out)
        got = self.offences(out, rule)
        for e in expected:
            self.assertIn('%s: %s' % (rule, e), got)
        return got

    def test_clean_tree_passes(self):
        rc, out = self.run_check()
        self.assertEqual(rc, 0, out)
        self.assertIn('ok', out[-1])

    # -- size
    def test_file_of_700_lines(self):
        self.assertFails({'shift/fo/big.c': 'int x;\n' * 700}, 'size',
                         'shift/fo/big.c: 700 lines (max 600)')

    def test_function_of_90_lines(self):
        text = '#include "shift/dp/dqp.h"\n\n' + func('long_one', 90)
        self.assertFails({'shift/dp/long.c': text}, 'size',
                         'shift/dp/long.c:4: function long_one is 90 lines (max 80)')

    def test_function_name_after_attribute_and_multiline_params(self):
        text = ('static __attribute__((noinline, cold)) int\nodd_one(int a,\n'
                '\t\tint b)\n{\n' + '\ta++;\n' * 81 + '}\n'
                'static int (*fp_of(int s))(int)\n{\n' + '\ts++;\n' * 81 + '}\n')
        self.assertFails({'shift/dp/odd.c': text}, 'size',
                         'shift/dp/odd.c:2: function odd_one is 83 lines (max 80)',
                         'shift/dp/odd.c:87: function fp_of is 83 lines (max 80)')

    def test_generated_file_exempt_and_stale_generated(self):
        big = {'shift/gen.c': func('generated_fn', 700)}
        rc, out = self.run_check(big, RULES + 'generated shift/gen.c from a script\n')
        self.assertEqual(rc, 0, out)
        self.assertFails({}, 'stale', rules=RULES + 'generated shift/gen.c a script\n')

    # -- layer
    def test_dp_includes_kv(self):
        text = CLEAN['shift/dp/dqp.c'] + '#include "kv/kv.h"\n'
        n = line_of(text, 'kv/kv.h')
        self.assertFails({'shift/dp/dqp.c': text}, 'layer',
                         'shift/dp/dqp.c:%d: file shift/dp/dqp.c (layer dp) includes'
                         ' kv/kv.h (layer kv): dp may not depend on kv' % n)

    def test_base_includes_front_and_front_is_top_level_only(self):
        self.assertFails({'shift/base/clock.c': '#include "shift/verbs.h"\n',
                          'shift/verbs.h': ''}, 'layer',
                         'shift/base/clock.c:1: file shift/base/clock.c (layer base)'
                         ' includes shift/verbs.h (layer front): base may not depend'
                         ' on front')

    def test_file_in_no_layer(self):
        self.assertFails({'shift/misc/x.c': ''}, 'layer',
                         'shift/misc/x.c: in no layer (add it to a `layer` line)')

    # -- cycle
    def test_two_module_cycle(self):
        self.assertFails({'shift/shadow/chan.c': '#include "shift/shadow/ring.h"\n',
                          'shift/shadow/chan.h': '',
                          'shift/shadow/ring.c': '#include "shift/shadow/chan.h"\n',
                          'shift/shadow/ring.h': ''}, 'cycle',
                         'shift/shadow/chan -> shift/shadow/ring -> shift/shadow/chan')

    def test_every_cycle_reported(self):
        got = self.assertFails({'kv/a.h': '#include "kv/b.h"\n',
                                'kv/b.h': '#include "kv/c.h"\n',
                                'kv/c.h': '#include "kv/a.h"\n#include "kv/b.h"\n'},
                               'cycle', 'kv/a -> kv/b -> kv/c -> kv/a',
                               'kv/b -> kv/c -> kv/b')
        self.assertEqual(len(got), 2, got)

    # -- state
    def state_case(self, stmt, fn='bad_writer'):
        text = ('#include "shift/dp/dqp.h"\nvoid\n%s(struct shift_dqp *d)\n{\n'
                '\t%s\n}\n' % (fn, stmt))
        self.assertFails({'shift/fo/writer.c': text}, 'state',
                         'shift/fo/writer.c:5: send_state written in %s (allowed only'
                         ' in shift_dqp_set_send_state)' % fn)

    def test_state_written_by_assignment(self):
        self.state_case('d->send_state = 3;')

    def test_state_written_by_increment(self):
        self.state_case('d->send_state++;')
        self.state_case('++d->send_state;', 'pre_increment')

    def test_state_written_by_atomic_store(self):
        self.state_case('__atomic_store_n(&d->send_state, 2, __ATOMIC_RELEASE);')

    def test_state_other_writes(self):
        for i, stmt in enumerate(('d->send_state |= 1;', 'd[0].send_state -= 1;',
                                  '__atomic_fetch_add(&d->send_state, 1, 0);',
                                  '__atomic_compare_exchange_n(&(d->send_state), &x,'
                                  ' 1, 0, 0, 0);', 'memset(&d->send_state, 0, 4);',
                                  'struct shift_dqp e = { .send_state = 1 };')):
            self.state_case(stmt, 'writer_%d' % i)

    # -- allowances
    def test_allow_accepts_and_stale_allow_fails(self):
        bad = {'shift/fo/big.c': 'int x;\n' * 700}
        rc, out = self.run_check(bad, RULES + 'allow size shift/fo/big.c\n')
        self.assertEqual(rc, 0, out)
        self.assertTrue(any('[allowed' in l and 'big.c' in l for l in out), out)
        self.assertFails({}, 'stale', 'rules.conf:18: allow size shift/fo/big.c'
                         ' matches no offence: remove it',
                         rules=RULES + 'allow size shift/fo/big.c\n')

    def test_allow_cycle_any_rotation(self):
        cyc = {'kv/a.h': '#include "kv/b.h"\n', 'kv/b.h': '#include "kv/a.h"\n'}
        rc, out = self.run_check(cyc, RULES + 'allow cycle kv/b -> kv/a -> kv/b\n')
        self.assertEqual(rc, 0, out)

    def test_flat_layout_rules(self):
        """Today's flat layout: shift/ is front but for a few mapped files."""
        flat = RULES.replace('layer base      shift/base/',
                             'layer base      shift/base/ shift/log.*')
        rc, out = self.run_check({'shift/log.h': '', 'shift/log.c':
                                  '#include "shift/log.h"\n'}, flat)
        self.assertEqual(rc, 0, out)
        self.assertFails({'shift/log.h': '', 'shift/log.c':
                          '#include "shift/verbs.h"\n', 'shift/verbs.h': ''},
                         'layer', 'shift/log.c:1: file shift/log.c (layer base)'
                         ' includes shift/verbs.h (layer front): base may not'
                         ' depend on front', rules=flat)

    def test_bad_rules_file(self):
        rc, out = self.run_check(rules=RULES + 'frobnicate x\n')
        self.assertEqual(rc, 2, out)


if __name__ == '__main__':
    unittest.main(verbosity=2)
