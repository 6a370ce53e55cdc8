#!/usr/bin/env python3
"""tests/realclients/suite_runner.py: run rdma-core's own Python test suite
(an unmodified copy, /work/shared/real-clients/rdma-core-v44.0-tests) inside
a testbed guest, one outcome per test, every test bounded by a timeout.

  suite_runner.py --out FILE.jsonl [--suite DIR] [--dev rxe0] [--port 1]
                  [--gid 1] [--timeout 60] [--only ID ...] [--list]

Two things differ from the suite's own tests/run_tests.py, neither touching
the suite's files:

- RDMATestCase._get_ip_mac is replaced at import. The suite finds a device's
  IP address through /sys/class/infiniband/DEV/device/net/, which soft-RoCE
  devices lack, so every rdma_cm test would skip. The replacement reads the
  netdev of the GID from /sys/class/infiniband/DEV/ports/P/gid_attrs/ndevs/IDX
  (rxe has it) and then asks `ip` for its address and MAC exactly as the
  suite does; a device that has device/net/ keeps the suite's own lookup.
- A driver process runs the tests in a worker process and watches it: a test
  that runs longer than --timeout is a "hang" (the worker's Python stacks and
  a gdb backtrace of every thread go to stderr, then its process group is
  killed), a worker that dies inside a test is a "crash" (its signal), and a
  worker that dies after its last test is a crash "at exit". The driver then
  starts a new worker at the next test, so one hang or crash costs one test.
  A segfault the kernel logs (/dev/kmsg) while a test runs, in the worker or
  a process it forked (the rdma_cm tests fork both sides), makes that test a
  "crash" too: the suite itself ignores children killed by a signal.
- Diagnostics only (outcomes unchanged): a test's stdout, with its forked
  processes', is collected per test, and the rdma_cm sides' "Player ... got:"
  lines are added to the test's message; when the suite terminates a forked
  process it found stuck, a gdb backtrace of that process goes to stderr first.

Output, one JSON object a line, flushed as it happens (the host follows it):
  {"ev": "start", "i", "id", "t"}
  {"ev": "end", "i", "id", "outcome", "dur", "msg", "t"}   outcome: pass,
      fail, error, skip, xfail, xpass, hang, crash
  {"ev": "done", "t", "counts", "worker_exits"}
stderr carries "=== realclients: start ID" / "=== realclients: end ID OUTCOME"
around each test, so library log lines can be matched to tests.
Python 3 standard library only (plus pyverbs, which the suite needs).
"""
import argparse
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

SUITE = "/work/shared/real-clients/rdma-core-v44.0-tests"
KMSG_CRASH = re.compile(r"segfault at|general protection|traps?:|Unable to handle|invalid opcode")


# ------------------------------------------------------------------ worker

def load_suite(args):
    """Import the suite as run_tests.py does; return the 'tests' package."""
    tdir = os.path.join(args.suite, "tests")
    sys.path.insert(0, tdir)
    argv = ["run_tests.py", "--dev", args.dev, "--port", str(args.port)]
    if args.gid is not None:
        argv += ["--gid", str(args.gid)]
    saved, sys.argv = sys.argv, argv
    from args_parser import parser  # the suite's own module
    parser.parse_args()
    sys.argv = saved
    import importlib.machinery
    import importlib.util
    init = os.path.join(tdir, "__init__.py")
    loader = importlib.machinery.SourceFileLoader("tests", init)
    spec = importlib.util.spec_from_file_location("tests", init, loader=loader,
                                                  submodule_search_locations=[tdir])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tests"] = mod
    # tests/base.py must be patched before any test runs, but after it is
    # imported: import it first, patch, then let __init__ import the rest
    import tests.base as base  # noqa: E402  (resolves through the spec above)
    patch_get_ip_mac(base)
    loader.exec_module(mod)
    return mod


def patch_get_ip_mac(base):
    orig = base.RDMATestCase._get_ip_mac

    def _get_ip_mac(self, dev, port, idx):
        if os.path.exists("/sys/class/infiniband/{}/device/net/".format(dev)):
            return orig(self, dev, port, idx)
        ndev = "/sys/class/infiniband/{}/ports/{}/gid_attrs/ndevs/{}".format(
            dev, port, 0 if idx is None else idx)
        try:
            with open(ndev) as f:
                net_name = f.read().strip()
            ip_addr, mac_addr = self.get_ip_mac_address(net_name)
        except (OSError, KeyError, IndexError, subprocess.CalledProcessError):
            self.args.append([dev, port, idx, None, None])
        else:
            self.args.append([dev, port, idx, ip_addr, mac_addr])
    base.RDMATestCase._get_ip_mac = _get_ip_mac


def backtrace_before_terminate():
    """Diagnostics only: when the suite kills a forked test process it found
    stuck (the rdma_cm tests do after 15 s), print that process's gdb
    backtrace first. The kill itself, and so the outcome, are unchanged."""
    import multiprocessing.process as mpp
    orig = mpp.BaseProcess.terminate

    def terminate(self):
        if self.pid and self.is_alive():
            print("=== realclients: the suite terminates its stuck child %d" % self.pid,
                  file=sys.stderr, flush=True)
            backtrace(self.pid, python_stacks=False)
        return orig(self)
    mpp.BaseProcess.terminate = terminate


def flatten(suite):
    for t in suite:
        if hasattr(t, "__iter__"):
            yield from flatten(t)
        else:
            yield t


def all_tests(mod):
    import unittest
    return list(flatten(unittest.TestLoader().loadTestsFromModule(mod)))


def outcome_of(result):
    """(outcome, message) of a TestResult holding exactly one test."""
    def last(tb):
        lines = [l for l in tb.strip().splitlines() if l.strip()]
        return lines[-1][:300] if lines else ""
    if result.errors:
        return "error", last(result.errors[0][1])
    if result.failures:
        return "fail", last(result.failures[0][1])
    if result.skipped:
        return "skip", str(result.skipped[0][1])[:300]
    if result.expectedFailures:
        return "xfail", last(result.expectedFailures[0][1])
    if result.unexpectedSuccesses:
        return "xpass", ""
    return "pass", ""


PLAYER = re.compile(r"^Player (active|passive) got: ")


class CapturedStdout:
    """fd 1 of the worker, and of every process a test forks, goes to a file
    for the test's duration (so the rdma_cm sides' messages belong to their
    test), then is copied to the real stdout."""

    def __enter__(self):
        import tempfile
        sys.stdout.flush()
        self.f = tempfile.TemporaryFile()
        self.saved = os.dup(1)
        os.dup2(self.f.fileno(), 1)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        os.dup2(self.saved, 1)
        os.close(self.saved)
        self.f.seek(0)
        data = self.f.read()
        self.f.close()
        os.write(1, data)
        self.text = data.decode(errors="replace")
        return False


def worker(args):
    import faulthandler
    import unittest
    faulthandler.enable()                      # a segfault prints the Python stack
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the driver's "where are you"
    ev = os.fdopen(args.event_fd, "w", buffering=1)
    backtrace_before_terminate()
    mod = load_suite(args)
    tests = all_tests(mod)
    if args.list:
        for t in tests:
            print(t.id())
        return 0
    wanted = set(args.only or [])
    for i, t in enumerate(tests):
        if i < args.start or (wanted and t.id() not in wanted):
            continue
        ev.write(json.dumps({"ev": "start", "i": i, "id": t.id(), "t": time.time()}) + "\n")
        print("=== realclients: start %s" % t.id(), file=sys.stderr, flush=True)
        t0 = time.monotonic()
        res = unittest.TestResult()
        with CapturedStdout() as cap:
            t(res)
        outcome, msg = outcome_of(res)
        players = [l.strip() for l in cap.text.splitlines() if PLAYER.match(l)]
        if players:  # what the forked rdma_cm sides raised: the test only says "Exception in ..."
            msg = (msg + " | " + " | ".join(players))[:600]
        print("=== realclients: end %s %s" % (t.id(), outcome), file=sys.stderr, flush=True)
        ev.write(json.dumps({"ev": "end", "i": i, "id": t.id(), "outcome": outcome,
                             "dur": round(time.monotonic() - t0, 3), "msg": msg,
                             "t": time.time()}) + "\n")
    ev.write(json.dumps({"ev": "last"}) + "\n")
    return 0


# ------------------------------------------------------------------ driver

class Kmsg:
    """Kernel log lines (segfaults and other traps) from now on."""

    def __init__(self):
        try:
            self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
            os.lseek(self.fd, 0, os.SEEK_END)
        except OSError:
            self.fd = None

    def read(self):
        out = []
        while self.fd is not None:
            try:
                rec = os.read(self.fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:  # EPIPE: overwritten records; go on
                continue
            if not rec:
                break
            msg = rec.split(";", 1)[-1].split("\n")[0]
            if KMSG_CRASH.search(msg):
                out.append(msg.strip())
        return out


def pdeathsig():
    """In the worker: die with the driver (prctl PR_SET_PDEATHSIG, SIGKILL)."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def backtrace(pid, python_stacks=True):
    """Python stacks (faulthandler, SIGUSR1) and a gdb backtrace of PID, to stderr."""
    if python_stacks:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return
        time.sleep(1)
    try:
        out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=60, text=True).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        out = "gdb: %s" % e
    keep = [l for l in out.splitlines() if l.startswith(("Thread ", "#"))]
    print("=== realclients: gdb backtrace of %d\n%s" % (pid, "\n".join(keep)),
          file=sys.stderr, flush=True)


def run_worker(args, start, emit, kmsg):
    """One worker from test index START; return (next start or None, exit record)."""
    r, w = os.pipe()
    argv = [sys.executable, os.path.realpath(__file__), "--worker", "--event-fd", str(w),
            "--start", str(start), "--suite", args.suite, "--dev", args.dev,
            "--port", str(args.port)]
    if args.gid is not None:
        argv += ["--gid", str(args.gid)]
    for o in args.only or []:
        argv += ["--only", o]
    p = subprocess.Popen(argv, pass_fds=(w,), start_new_session=True, preexec_fn=pdeathsig,
                         stdin=subprocess.DEVNULL)
    os.close(w)
    buf, cur, finished, hung = b"", None, False, False
    crashes = []
    while True:
        rd, _, _ = select.select([r], [], [], 0.2)
        data = os.read(r, 65536) if rd else None
        if data:
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                e = json.loads(line)
                if e["ev"] == "start":
                    cur = dict(e, t_mono=time.monotonic())
                    crashes = []
                    emit(e)
                elif e["ev"] == "end":
                    crashes += kmsg.read()
                    if crashes:
                        e["msg"] = "kernel: %s | %s" % ("; ".join(crashes)[:300], e["msg"])
                        e["outcome"] = "crash"
                    emit(e)
                    cur = None
                elif e["ev"] == "last":
                    finished = True
        crashes += kmsg.read()
        if data == b"":  # the worker closed its end: it has exited
            break
        if cur and time.monotonic() - cur["t_mono"] > args.timeout:
            backtrace(p.pid)
            hung = True
            os.killpg(p.pid, signal.SIGKILL)
    os.close(r)
    rc = p.wait()
    try:
        os.killpg(p.pid, signal.SIGKILL)  # what the worker forked and left
    except ProcessLookupError:
        pass
    exit_rec = {"start": start, "rc": rc}
    if cur:  # died inside a test
        crashes += kmsg.read()
        if hung:
            outcome, msg = "hang", "no end after %s s" % args.timeout
        else:
            outcome = "crash"
            msg = "worker %s" % (("killed by %s" % signal.Signals(-rc).name) if rc < 0 else "exit %d" % rc)
        if crashes:
            msg += " | kernel: " + "; ".join(crashes)[:300]
        emit({"ev": "end", "i": cur["i"], "id": cur["id"], "outcome": outcome,
              "dur": round(time.monotonic() - cur["t_mono"], 3), "msg": msg, "t": time.time()})
        return cur["i"] + 1, exit_rec
    if finished and rc != 0:
        # every test ended, then the process failed: a crash at exit
        emit({"ev": "end", "i": -1, "id": "<worker exit>", "outcome": "crash",
              "dur": 0, "msg": "worker %s after its last test" % (
                  ("killed by %s" % signal.Signals(-rc).name) if rc < 0 else "exit %d" % rc),
              "t": time.time()})
    if not finished and not cur and rc != 0:
        raise SystemExit("suite_runner: the worker failed before any test (rc %d)" % rc)
    return None, exit_rec


def driver(args):
    out = open(args.out, "w", buffering=1)
    counts = {}

    def emit(e):
        if e["ev"] == "end":
            counts[e["outcome"]] = counts.get(e["outcome"], 0) + 1
        out.write(json.dumps(e) + "\n")
    kmsg = Kmsg()
    start, exits = 0, []
    while start is not None:
        start, rec = run_worker(args, start, emit, kmsg)
        exits.append(rec)
    emit({"ev": "done", "t": time.time(), "counts": counts, "worker_exits": exits})
    print("suite_runner: %s" % " ".join("%s=%d" % kv for kv in sorted(counts.items())), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default=SUITE)
    ap.add_argument("--dev", default="rxe0")
    ap.add_argument("--port", type=int, default=1)
    ap.add_argument("--gid", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--out")
    ap.add_argument("--only", action="append")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--event-fd", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.list:
        args.event_fd = os.open(os.devnull, os.O_WRONLY)
        return worker(args)
    if args.worker:
        return worker(args)
    if not args.out:
        ap.error("--out is required")
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
