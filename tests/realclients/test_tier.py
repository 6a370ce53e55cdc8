#!/usr/bin/env python3
"""Self-test of the realclients tier's logic (no testbed): the verdict
(expected / unexpected / stale / intermittent), the per-part difference
rules, the choice of part b's trigger test, crash detection, the report, and
the suite runner's _get_ip_mac replacement and outcome mapping."""
import json
import os
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("SHIFT_BUILD_DIR", tempfile.mkdtemp(prefix="rc-selftest-"))

import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402


def load(name, path):
    loader = importlib.machinery.SourceFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


tier = load("rc_tier", os.path.join(HERE, "tier"))
runner = load("rc_runner", os.path.join(HERE, "suite_runner.py"))
report = tier.report


def suite(**outcomes):
    return {"tests": {k.replace("_", "."): {"outcome": v, "msg": "", "t_start": i, "t_end": i + 1}
                      for i, (k, v) in enumerate(outcomes.items())},
            "shadowed_qps": 3, "complete": True, "job_rc": {"rc": 0}}


class Verdict(unittest.TestCase):
    def test_unexpected_expected_stale_intermittent(self):
        exp = [{"part": "a", "modes": ["shift-preload"], "test": "t.x", "reason": "r", "waits_for": "w"},
               {"part": "a", "modes": ["shift-preload"], "test": "t.gone", "reason": "r", "waits_for": "w"},
               {"part": "a", "modes": ["shift-preload"], "test": "t.flaky", "reason": "r", "waits_for": "w",
                "intermittent": True},
               {"part": "c", "modes": ["shift-ldpath"], "test": "c_*", "reason": "r", "waits_for": "w"}]
        diffs = [{"part": "a", "mode": "shift-preload", "test": "t.x", "plain": "pass", "got": "error"},
                 {"part": "a", "mode": "shift-ldpath", "test": "t.x", "plain": "pass", "got": "error"}]
        covered = {("a", "shift-preload"), ("a", "shift-ldpath")}
        matched, unexpected, stale, absent = tier.judge(diffs, exp, covered)
        self.assertEqual([d["mode"] for d in matched], ["shift-preload"])
        self.assertEqual([d["mode"] for d in unexpected], ["shift-ldpath"])  # not listed for ldpath
        self.assertEqual([e["test"] for e in stale], ["t.gone"])              # part c not covered: not stale
        self.assertEqual([e["test"] for e in absent], ["t.flaky"])

    def test_got_constraint(self):
        exp = [{"part": "a", "modes": ["shift-preload"], "test": "t.*", "got": ["error"], "reason": "r",
                "waits_for": "w"}]
        diffs = [{"part": "a", "mode": "shift-preload", "test": "t.x", "plain": "pass", "got": "hang"}]
        matched, unexpected, stale, _ = tier.judge(diffs, exp, {("a", "shift-preload")})
        self.assertEqual(len(unexpected), 1)  # a hang is not the listed error
        self.assertEqual(len(stale), 1)


    def test_detail_constraint(self):
        exp = [{"part": "b", "modes": ["shift-preload"], "test": "*", "detail": "*Network is unreachable*",
                "reason": "r", "waits_for": "w", "intermittent": True}]
        diffs = [{"part": "b", "mode": "shift-preload", "test": "t.x", "plain": "pass", "got": "error",
                  "detail": "Failed to modify QP state to RTR. Errno: 101, Network is unreachable"},
                 {"part": "b", "mode": "shift-preload", "test": "t.y", "plain": "pass", "got": "error",
                  "detail": "Got timeout on polling (1 CQEs remaining)"}]
        matched, unexpected, stale, absent = tier.judge(diffs, exp, {("b", "shift-preload")})
        self.assertEqual([d["test"] for d in matched], ["t.x"])
        self.assertEqual([d["test"] for d in unexpected], ["t.y"])
        self.assertEqual(stale + absent, [])


class Rules(unittest.TestCase):
    def test_part_a_any_change(self):
        plain = suite(t_a="pass", t_b="skip", t_c="error")
        shift = suite(t_a="pass", t_b="pass", t_c="error")
        d = tier.suite_diffs("a", "shift-preload", plain, shift)
        self.assertEqual([x["test"] for x in d], ["t.b"])

    def test_part_b_pass_must_pass_no_hang(self):
        plain = suite(t_a="pass", t_b="error", t_c="skip", t_d="pass")
        shift = suite(t_a="pass", t_b="hang", t_c="skip", t_d="fail")
        d = tier.suite_diffs("b", "shift-ldpath", plain, shift)
        self.assertEqual(sorted(x["test"] for x in d), ["t.b", "t.d"])

    def test_part_b_setup_in_window_tolerated_and_counted(self):
        plain = suite(t_a="pass", t_b="pass", t_c="pass", t_d="pass")
        shift = suite(t_a="error", t_b="error", t_c="error", t_d="pass")
        shift["tests"]["t.a"]["msg"] = "Failed to modify QP state to RTR. Errno: 101, Network is unreachable"
        shift["tests"]["t.b"]["msg"] = "Got timeout on polling (1 CQEs remaining)"   # not setup: a difference
        shift["tests"]["t.c"]["msg"] = "Failed to create AH. Errno: 101, Network is unreachable"
        shift["fault"] = {"tests_in_window": ["t.a", "t.b"]}                          # t.c: outside the window
        tol = []
        d = tier.suite_diffs("b", "shift-preload", plain, shift, tol)
        self.assertEqual(sorted(x["test"] for x in d), ["t.b", "t.c"])
        self.assertEqual([x["test"] for x in tol], ["t.a"])

    def test_shift_not_in_path(self):
        plain = suite(t_a="pass")
        shift = suite(t_a="pass")
        shift["shadowed_qps"] = 0
        d = tier.suite_diffs("a", "shift-ldpath", plain, shift)
        self.assertEqual([x["test"] for x in d], ["<SHIFT in path>"])

    def test_trigger_is_the_test_running_at_half_time(self):
        plain = {"tests": {"t1": {"t_start": 0, "t_end": 1}, "t2": {"t_start": 1, "t_end": 8},
                           "t3": {"t_start": 8, "t_end": 10}}}
        self.assertEqual(tier.trigger_of(plain), "t2")

    def test_crash_rcs(self):
        self.assertTrue(tier.crashed(-11))
        self.assertTrue(tier.crashed(139))
        self.assertTrue(tier.crashed(134))
        self.assertFalse(tier.crashed(-15))   # the runner's SIGTERM at a timeout
        self.assertFalse(tier.crashed(1))
        self.assertFalse(tier.crashed(None))

    def test_client_runs(self):
        ok = {"run": 1, "rc": {"client": 0, "server": 0}, "timed_out": False, "pass_shift_criteria": True,
              "crash": False, "shift_log": [], "failover_logged": True}
        bad = dict(ok, run=2, rc={"client": 1, "server": 0}, pass_shift_criteria=False)
        self.assertEqual(tier.client_diffs("c", "x", "shift-preload", [ok, ok], []), [])
        d = tier.client_diffs("c", "x", "shift-preload", [ok, bad], [dict(ok, rc={"client": 1, "server": 1})])
        self.assertEqual(d[0]["got"], "1/2 runs failed")
        self.assertEqual(d[0]["plain"], "0/1 rc 0")
        # part c: a run without a failover did not test anything
        missed = dict(ok, run=3, failover_logged=False)
        d = tier.client_diffs("c", "x", "shift-preload", [ok, missed], [])
        self.assertIn("NO FAILOVER", d[0]["detail"])
        self.assertEqual(tier.client_diffs("d", "x", "shift-preload", [ok, missed], []), [])


    def test_first_frames_of_the_crashing_thread(self):
        bt = "\n".join([
            "== /tmp/core.rdma_server.1",
            "Program terminated with signal SIGSEGV, Segmentation fault.",
            "#0  0x00007f in ibv_reg_mr_iova2 () from /usr/lib/libibverbs.so.1",
            "Thread 2 (Thread 0x1 (LWP 2)):",
            "#0  __GI___lll_lock_wake (futex=0x5) at ./nptl/lowlevellock.c:64",
            "Thread 1 (Thread 0x2 (LWP 3)):",
            "#0  0x00007f in ibv_reg_mr_iova2 () from /usr/lib/libibverbs.so.1",
            "#1  0x00007e in replay_mr (m=0x5) at /w/shift/shadow/replay.c:122",
            "#2  shift_rnic_pass (r=r@entry=0x5) at /w/shift/shadow/replay.c:258"])
        self.assertEqual(tier.first_frames({"backtraces": {"B": bt}}),
                         " [SIGSEGV: ibv_reg_mr_iova2 < replay_mr replay.c:122 < shift_rnic_pass replay.c:258]")


class Report(unittest.TestCase):
    def test_doc_renders(self):
        plain = suite(t_a="pass", t_b="skip")
        r = {"command": "tier", "commit": "x", "started": "now", "duration": 1, "timeout": 60,
             "suite": {"a": {"plain": dict(plain, counts={"pass": 1, "skip": 1}, duration=1)}},
             "differences": [], "expected_matched": [], "unexpected": [], "stale": [],
             "expected_list": []}
        with tempfile.NamedTemporaryFile("r", suffix=".md") as f:
            report.write_doc(r, f.name)
            text = f.read()
        self.assertIn("| `t.a` | pass |", text)
        self.assertIn("Verdict:", text)


class Runner(unittest.TestCase):
    def test_get_ip_mac_replacement(self):
        calls = []

        class Case:
            def __init__(self):
                self.args = []

            @staticmethod
            def get_ip_mac_address(ifname):
                calls.append(ifname)
                return "198.18.0.1", "52:54:00:00:0a:00"

            def _get_ip_mac(self, dev, port, idx):  # the suite's: no device/net/ on rxe
                self.args.append([dev, port, idx, None, None])
        base = types.SimpleNamespace(RDMATestCase=Case)
        runner.patch_get_ip_mac(base)
        real_exists, real_open = os.path.exists, open
        with tempfile.TemporaryDirectory() as d:
            ndev = os.path.join(d, "1")
            with real_open(ndev, "w") as f:
                f.write("eth0\n")
            runner.os.path.exists = lambda p: False if p.startswith("/sys/class/infiniband") else real_exists(p)
            import builtins
            builtins.open = lambda p, *a, **k: real_open(ndev if "gid_attrs/ndevs" in str(p) else p, *a, **k)
            try:
                c = Case()
                c._get_ip_mac("rxe0", 1, 1)
            finally:
                builtins.open = real_open
                runner.os.path.exists = real_exists
        self.assertEqual(calls, ["eth0"])
        self.assertEqual(c.args, [["rxe0", 1, 1, "198.18.0.1", "52:54:00:00:0a:00"]])

    def test_outcomes(self):
        import unittest as u

        class T(u.TestCase):
            def test_p(self):
                pass

            def test_f(self):
                self.fail("no")

            def test_e(self):
                raise RuntimeError("boom")

            def test_s(self):
                self.skipTest("why")
        got = {}
        for name in ("test_p", "test_f", "test_e", "test_s"):
            res = u.TestResult()
            T(name)(res)
            got[name] = runner.outcome_of(res)
        self.assertEqual(got["test_p"], ("pass", ""))
        self.assertEqual(got["test_f"][0], "fail")
        self.assertEqual(got["test_e"], ("error", "RuntimeError: boom"))
        self.assertEqual(got["test_s"], ("skip", "why"))

    def test_captured_stdout_includes_forked_children(self):
        with runner.CapturedStdout() as cap:
            pid = os.fork()
            if pid == 0:
                os.write(1, b"Player passive got: child says\n")
                os._exit(0)
            os.waitpid(pid, 0)
            print("parent says", flush=True)
        self.assertIn("Player passive got: child says", cap.text)
        self.assertIn("parent says", cap.text)

    def test_expected_list_is_valid(self):
        entries = tier.load_expected(tier.EXPECTED)
        for e in entries:
            self.assertIn(e["part"], ("a", "b", "c", "d"))
            self.assertTrue(set(e["modes"]) <= {"shift-ldpath", "shift-preload"}, e)
            self.assertTrue(e["reason"].strip() and e["waits_for"].strip(), e)
        json.dumps(entries)


if __name__ == "__main__":
    unittest.main()
