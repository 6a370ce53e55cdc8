#!/usr/bin/env python3
"""ib_write_lat through SHIFT vs plain, interleaved in one testbed session.

Runs PAIRS pairs of ib_write_lat (server on B, client on A, rail 0, GID 1,
-n ITERS, 2-byte messages): one with the distro's libibverbs ("plain") and one
with LD_LIBRARY_PATH=<build>/lib ("shift"), alternating which goes first
(ABBA...), so slow drift of the TCG host hits both alike. One warm-up run of
each is made first and kept out of the statistics.

Per run it keeps perftest's client result row (t_typical is the median of that
run's iterations) and, from the client's -H histogram, the 10/25/50/90th
percentiles of its iterations (p50 equals t_typical). Host contention (other
users of the 2 cores preempting a guest's vCPU) only adds latency, so the low
percentiles show the cost of the path itself better than the median does.
For each statistic it reports, per library, the median over runs, the ratio
SHIFT/plain of those medians, the paired ratios (shift/plain within a pair),
the run-to-run spread, and a percentile-bootstrap 95% interval of the ratio
of medians (runs resampled within each library), so the reader can see whether
a 2% difference is resolvable at all. The verdict is on t_typical: within
TOLERANCE if the interval's top is <= 1+TOLERANCE, slower if its bottom is
above, otherwise not resolvable.

Noise controls (all off by default):
  --pin             pin every thread of guest A's QEMU to host CPU 0 and B's to
                    CPU 1 for the whole benchmark (new threads are pinned before
                    each run), restoring each thread's previous affinity after
                    it, also on an error or ^C; the JSON records it ("pinning").
  --io-fifo         run each QEMU's main-loop thread (network, 9p) as SCHED_FIFO
                    1 for the benchmark, restoring its policy after it; the
                    JSON records it ("io_fifo").
  --wait-idle CORES before each pair wait (at most 120 s) until the host's CPU
                    use outside the two QEMUs, over one second, is below CORES.
  --verdict-stat S  judge on S (t_typical, p10, p25, t_min) instead of t_typical.
Every run also records the host's CPU accounting over the client's run
("host": steal, CPU used by the two QEMUs and by everything else), so drift can
be told apart from host contention afterwards.

Usage (host, as root, testbed up):
  SHIFT_TESTBED_DIR=... SHIFT_BUILD_DIR=... tests/bench/write_lat.py \
      [--pairs 7] [--iters 5000] [--size 2] [--port 18690] [--out FILE] \
      [--pin] [--io-fifo] [--wait-idle CORES] [--verdict-stat t_typical]
  tests/bench/write_lat.py --analyze FILE [--verdict-stat S]   (statistics of a saved result again)
Exit status 1 if any run failed (no verdict then), else 0 whatever the ratio.
It takes the testbed's run lock for its whole duration. Python 3 stdlib only.
"""
import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import time
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader

QUANTILES = (10, 25, 50, 90)
VERDICT_STATS = ("t_typical", "p10", "p25", "t_min")
PIN_CPUS = {"A": 0, "B": 1}
CLK_TCK = os.sysconf("SC_CLK_TCK")
HERE = os.path.dirname(os.path.realpath(__file__))
TESTBED = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "testbed")


def load_testbed():
    loader = SourceFileLoader("shift_testbed", TESTBED)
    mod = module_from_spec(spec_from_loader("shift_testbed", loader))
    loader.exec_module(mod)
    return mod


def guest_qemu_pids(tb):
    """{host: pid} of the guests' QEMU processes: the pids scripts/testbed
    recorded (checked against their command line), else the processes whose
    command line carries -name shift-testbed-H."""
    pids = {}
    for h in tb.HOSTS:
        pid = tb.qemu_pid(h) if hasattr(tb, "qemu_pid") else None
        if not pid:
            for d in os.listdir("/proc"):
                if not d.isdigit():
                    continue
                try:
                    with open("/proc/%s/cmdline" % d, "rb") as f:
                        argv = f.read().split(b"\0")
                except OSError:
                    continue
                if argv and b"qemu-system" in argv[0] and ("shift-testbed-" + h).encode() in argv:
                    pid = int(d)
                    break
        if not pid:
            raise tb.TestbedError("no QEMU process found for guest %s" % h)
        pids[h] = pid
    return pids


class Pinning:
    """Pins every thread of each guest's QEMU to one host CPU while active and
    gives each thread its previous affinity back on exit (error and ^C
    included). repin() also pins threads that appeared since (QEMU starts
    worker threads on demand; they inherit the creator's mask, but that is not
    counted on); those get their process's previous mask back on exit."""

    def __init__(self, pids, cpus):
        self.pids, self.cpus = pids, cpus
        self.saved = {}      # tid -> its affinity before it was pinned
        self.proc_mask = {}  # pid -> the main thread's affinity before it was pinned
        self.started = False
        self.late = 0        # threads first seen after the initial pinning

    @staticmethod
    def tids(pid):
        try:
            return [int(t) for t in os.listdir("/proc/%d/task" % pid)]
        except OSError:
            return []

    def repin(self):
        for h, pid in self.pids.items():
            cpu = {self.cpus[h]}
            for tid in self.tids(pid):
                try:
                    if tid not in self.saved:
                        prev = os.sched_getaffinity(tid)
                        if self.started:
                            self.late += 1
                            prev = self.proc_mask.get(pid, prev)
                        elif tid == pid:
                            self.proc_mask[pid] = prev
                        self.saved[tid] = prev
                    if os.sched_getaffinity(tid) != cpu:
                        os.sched_setaffinity(tid, cpu)
                except ProcessLookupError:  # the thread ended meanwhile
                    self.saved.pop(tid, None)
        self.started = True

    def __enter__(self):
        try:
            self.repin()
        except BaseException:
            self.restore()
            raise
        return self

    def __exit__(self, *exc):
        self.restore()

    def restore(self):
        bad = []
        for tid, prev in self.saved.items():
            try:
                os.sched_setaffinity(tid, prev)
            except ProcessLookupError:
                pass
            except OSError as e:
                bad.append("%d: %s" % (tid, e))
        # threads born after the last repin() inherited a pinned mask
        for pid, prev in self.proc_mask.items():
            for tid in self.tids(pid):
                if tid not in self.saved:
                    try:
                        os.sched_setaffinity(tid, prev)
                    except OSError:
                        pass
        if bad:
            sys.stderr.write("write_lat: could not restore the affinity of threads %s\n" % ", ".join(bad))

    def record(self):
        rec = {h: {"pid": pid, "cpu": self.cpus[h], "threads": len(self.tids(pid)),
                   "previous_affinity": sorted(self.proc_mask.get(pid, ()))}
               for h, pid in self.pids.items()}
        rec["threads_pinned_late"] = self.late
        return rec


class IoThreadFifo:
    """Runs each QEMU's main-loop thread (tid == pid: the socket netdev, the
    virtio-net bottom halves, 9p) as SCHED_FIFO 1 while active, so a packet
    that arrives while the host CPU runs a busy-polling TCG vCPU is handled at
    once rather than when the vCPU thread's slice ends; threads it creates
    meanwhile start as SCHED_OTHER (SCHED_RESET_ON_FORK). Restores each
    thread's policy on exit (error and ^C included)."""

    def __init__(self, pids):
        self.pids, self.saved = pids, {}

    def __enter__(self):
        try:
            for pid in self.pids.values():
                self.saved[pid] = (os.sched_getscheduler(pid), os.sched_getparam(pid))
                os.sched_setscheduler(pid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(1))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for pid, (policy, param) in self.saved.items():
            try:
                os.sched_setscheduler(pid, policy, param)
            except ProcessLookupError:
                pass
            except OSError as e:
                sys.stderr.write("write_lat: could not restore the policy of thread %d: %s\n" % (pid, e))

    def record(self):
        return {h: {"tid": pid, "policy": "SCHED_FIFO", "priority": 1,
                    "previous_policy": self.saved[pid][0]} for h, pid in self.pids.items()}


def cpu_snapshot(pids):
    """Host CPU accounting: /proc/stat's total busy and steal, and each QEMU's utime+stime (ticks)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    q = {}
    for h, pid in pids.items():
        try:
            with open("/proc/%d/stat" % pid) as f:
                st = f.read().rsplit(")", 1)[1].split()
            q[h] = int(st[11]) + int(st[12])
        except (OSError, IndexError, ValueError):
            q[h] = 0
    return {"t": time.time(), "busy": user + nice + system + irq + softirq, "steal": steal, "qemu": q}


def cpu_delta(a, b):
    qemu = {h: (b["qemu"][h] - a["qemu"][h]) / CLK_TCK for h in a["qemu"]}
    busy = (b["busy"] - a["busy"]) / CLK_TCK
    return {"wall_s": round(b["t"] - a["t"], 3), "steal_s": round((b["steal"] - a["steal"]) / CLK_TCK, 2),
            "qemu_cpu_s": {h: round(x, 2) for h, x in qemu.items()},
            "other_cpu_s": round(busy - sum(qemu.values()), 2)}


def wait_idle(pids, cores, limit=120):
    """Wait until the CPU used outside the QEMUs over 1 s is below CORES; returns (waited s, last load)."""
    t0 = time.time()
    while True:
        a = cpu_snapshot(pids)
        time.sleep(1)
        d = cpu_delta(a, cpu_snapshot(pids))
        load = d["other_cpu_s"] / max(d["wall_s"], 1e-3)
        if load < cores or time.time() - t0 > limit:
            return round(time.time() - t0, 1), round(load, 2)


def one_run(tb, g, lib, args, seq, pids=None):
    """One server (B) + client (A) pair; returns the client's result row and timings."""
    mode = "plain" if lib == "plain" else "shift-ldpath"
    env = tb.kv_env(tb.kv_namespace("bench_write_lat", "%s.%d" % (lib, seq), time.time()))
    env.update(tb.mode_env(mode))
    common = "ib_write_lat -d %s -p %d -x 1 -F -n %d -s %d" % (args.device, args.port, args.iters, args.size)
    timeout = 60 + args.iters * 0.01
    t0 = time.time()
    sj = g["B"].submit(common, env, timeout)
    rc, out, err = g["B"].run(tb.READY_CMD["tcp"] % args.port, 60)
    if rc != 0:
        g["B"].kill(sj, signal.SIGKILL)
        raise tb.TestbedError("server did not listen on %d: %s%s" % (args.port, out, err))
    t1 = time.time()
    c0 = cpu_snapshot(pids) if pids else None
    cj = g["A"].submit(common + " -H " + args.server_ip, env, timeout)
    crc = g["A"].wait(cj, timeout + 20)
    t2 = time.time()
    c1 = cpu_snapshot(pids) if pids else None
    end = time.time() + 10
    while time.time() < end and g["B"].done(sj) is None:
        time.sleep(0.05)
    if g["B"].done(sj) is None:
        g["B"].kill(sj, signal.SIGTERM)
    src = g["B"].wait(sj, 30)
    cout = g["A"].output(cj)
    _, rows = tb.parse_perftest(cout)
    rec = {"lib": lib, "seq": seq, "client_rc": crc["rc"], "server_rc": src["rc"],
           "t_host_start": round(t0, 3), "client_wall_s": round(t2 - t1, 3)}
    if pids:
        rec["host"] = cpu_delta(c0, c1)
    if crc["rc"] != 0 or src["rc"] != 0 or len(rows) != 1:
        rec["error"] = "client rc %s, server rc %s, %d result rows" % (crc["rc"], src["rc"], len(rows))
        rec["client_tail"] = (cout + g["A"].output(cj, "err"))[-1500:]
        return rec
    rec["row"] = dict(rows[0])
    # -H: every iteration's latency, sorted ("#, usec" then "i, value")
    lat = sorted(float(m.group(1)) for m in re.finditer(r"^\d+, ([\d.]+)\s*$", cout, re.M))
    if lat:
        for q in QUANTILES:
            rec["row"]["p%d" % q] = lat[min(len(lat) - 1, int(q / 100 * len(lat)))]
        rec["histogram_n"] = len(lat)
    return rec


def boot_ratio_ci(plain, shift, n=10000, seed=1):
    """Percentile bootstrap 95% interval of median(shift)/median(plain), runs
    resampled with replacement within each library."""
    rnd = random.Random(seed)
    rs = sorted(statistics.median(rnd.choices(shift, k=len(shift))) /
                statistics.median(rnd.choices(plain, k=len(plain))) for _ in range(n))
    return rs[int(0.025 * n)], rs[int(0.975 * n) - 1]


def boot_paired_ci(ratios, n=10000, seed=2):
    """Percentile bootstrap 95% interval of the median paired ratio, pairs
    resampled with replacement (the interleaving cancels drift between pairs)."""
    rnd = random.Random(seed)
    rs = sorted(statistics.median(rnd.choices(ratios, k=len(ratios))) for _ in range(n))
    return rs[int(0.025 * n)], rs[int(0.975 * n) - 1]


def summarize(runs, key):
    p = [r["row"][key] for r in runs if r["lib"] == "plain" and "row" in r and not r.get("warmup")]
    s = [r["row"][key] for r in runs if r["lib"] == "shift" and "row" in r and not r.get("warmup")]
    if len(p) < 2 or len(s) < 2:
        return None
    mp, ms = statistics.median(p), statistics.median(s)
    pairs = {}
    for r in runs:
        if "row" in r and not r.get("warmup"):
            pairs.setdefault(r["pair"], {})[r["lib"]] = r["row"][key]
    pr = sorted(v["shift"] / v["plain"] for v in pairs.values() if len(v) == 2)
    lo, hi = boot_ratio_ci(p, s)
    plo, phi = boot_paired_ci(pr) if len(pr) >= 2 else (None, None)

    def spread(x):
        m = statistics.median(x)
        return {"min": min(x), "max": max(x), "range_pct_of_median": round(100 * (max(x) - min(x)) / m, 1),
                "stdev_pct_of_mean": round(100 * statistics.stdev(x) / statistics.mean(x), 1)}
    return {"plain": p, "shift": s, "median_plain": mp, "median_shift": ms,
            "ratio_of_medians": round(ms / mp, 4),
            "paired_ratios": [round(x, 4) for x in pr],
            "median_paired_ratio": round(statistics.median(pr), 4) if pr else None,
            "bootstrap95_ratio": [round(lo, 4), round(hi, 4)],
            "bootstrap95_paired": [round(plo, 4), round(phi, 4)] if pr and len(pr) >= 2 else None,
            "spread_plain": spread(p), "spread_shift": spread(s),
            # pairs a +-tol 95% interval of the paired ratio would take at this noise (normal approx. on logs)
            "sd_log_paired_ratio": round(statistics.stdev(math.log(x) for x in pr), 4) if len(pr) >= 2 else None}


def verdict(sm, tol, stat="t_typical"):
    lo, hi = sm["bootstrap95_paired"]
    on = "" if stat == "t_typical" else " of %s" % stat
    if hi <= 1 + tol:
        return "SHIFT within %.0f%% of plain (95%% interval of the paired ratio%s %.3f..%.3f)" % (
            100 * tol, on, lo, hi)
    if lo > 1 + tol:
        return "SHIFT slower than plain by more than %.0f%% (95%% interval%s %.3f..%.3f)" % (100 * tol, on, lo, hi)
    return ("not resolvable: the 95%% interval of the paired ratio%s, %.3f..%.3f, is wider than the %.0f%% "
            "being asked about" % (on, lo, hi, 100 * tol))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--size", type=int, default=2)
    ap.add_argument("--port", type=int, default=18690)
    ap.add_argument("--device", default="rxe0")
    ap.add_argument("--server-ip", default="198.18.0.2")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--tolerance", type=float, default=0.02)
    ap.add_argument("--out", help="JSON file (default TESTBED_DIR/results/bench_write_lat.json)")
    ap.add_argument("--analyze", metavar="FILE", help="recompute the statistics of a saved result; no runs")
    ap.add_argument("--pin", action="store_true",
                    help="pin all threads of A's QEMU to host CPU 0 and B's to CPU 1 during the benchmark")
    ap.add_argument("--io-fifo", action="store_true",
                    help="run each QEMU's main-loop thread as SCHED_FIFO 1 during the benchmark")
    ap.add_argument("--wait-idle", type=float, metavar="CORES",
                    help="before each pair, wait (<= 120 s) until host CPU use outside the QEMUs is < CORES")
    ap.add_argument("--verdict-stat", choices=VERDICT_STATS, default="t_typical",
                    help="statistic whose paired ratio the verdict is on (default t_typical)")
    args = ap.parse_args()
    if args.analyze:
        return reanalyze(args.analyze, args.tolerance, args.verdict_stat)
    tb = load_testbed()
    if not tb.running():
        sys.exit("testbed is down: scripts/testbed up")
    out = args.out or os.path.join(tb.RESULTS, "bench_write_lat.json")
    runs = []
    t_start = time.time()
    pinning = io_fifo = None
    with tb.Lock(600):
        g = tb.guests()
        tb.dropin_check(g, "shift-ldpath")
        tb.reset_faults(g)
        try:
            pids = guest_qemu_pids(tb)
        except tb.TestbedError:
            if args.pin or args.io_fifo or args.wait_idle is not None:
                raise
            pids = {}  # no host CPU accounting then
        with Pinning(pids, PIN_CPUS) if args.pin else contextlib.nullcontext() as pin, \
                IoThreadFifo(pids) if args.io_fifo else contextlib.nullcontext() as fifo:
            if fifo:
                io_fifo = fifo.record()
                print("SCHED_FIFO 1: main-loop threads %s" % ", ".join(
                    "%s %d" % (h, pid) for h, pid in pids.items()), flush=True)
            if pin:
                pinning = pin.record()
                print("pinned: %s" % ", ".join("%s pid %d (%d threads) -> CPU %d" % (
                    h, pinning[h]["pid"], pinning[h]["threads"], pinning[h]["cpu"]) for h in pids), flush=True)
            order = []
            if not args.no_warmup:
                order += [("plain", -1), ("shift", -1)]
            for i in range(args.pairs):
                libs = ("plain", "shift") if i % 2 == 0 else ("shift", "plain")
                order += [(lib, i) for lib in libs]
            for seq, (lib, pair) in enumerate(order):
                idle = None
                if args.wait_idle is not None and (seq == 0 or order[seq - 1][1] != pair):
                    idle = wait_idle(pids, args.wait_idle)
                if pin:
                    pin.repin()
                rec = one_run(tb, g, lib, args, seq, pids)
                rec["pair"] = pair
                if idle:
                    rec["idle_wait_s"], rec["idle_load_before"] = idle
                if pair < 0:
                    rec["warmup"] = True
                runs.append(rec)
                row = rec.get("row")
                print("%-6s pair %2s%s  t_typical %8.2f us  t_avg %8.2f us  t_min %7.2f  p10 %7.2f  p25 %7.2f  (%.1f s)%s%s" % (
                    lib, pair if pair >= 0 else "-", " warm-up" if pair < 0 else "",
                    row["t_typical[usec]"] if row else float("nan"), row["t_avg[usec]"] if row else float("nan"),
                    row["t_min[usec]"] if row else float("nan"),
                    row.get("p10", float("nan")) if row else float("nan"),
                    row.get("p25", float("nan")) if row else float("nan"), rec["client_wall_s"],
                    "  host: steal %.2f s, other %.2f s" % (rec["host"]["steal_s"], rec["host"]["other_cpu_s"])
                    if "host" in rec else "",
                    "" if row else "  ERROR " + rec["error"]), flush=True)
            if pin:
                pinning = pin.record()
    res = {"bench": "ib_write_lat plain vs SHIFT (LD_LIBRARY_PATH), interleaved",
           "cmd": "ib_write_lat -d %s -p %d -x 1 -F -n %d -s %d [%s]" % (
               args.device, args.port, args.iters, args.size, args.server_ip),
           "dropin": tb.DROPIN, "pairs": args.pairs, "iters": args.iters, "size": args.size,
           "pinning": pinning or False, "io_fifo": io_fifo or False, "wait_idle": args.wait_idle,
           "t_start": round(t_start, 3), "duration_s": round(time.time() - t_start, 1), "runs": runs}
    return report(res, out, args.tolerance, tb.write_json, args.verdict_stat)


def report(res, out, tol, write_json, verdict_stat="t_typical"):
    """Statistics of res["runs"] into RES, written to OUT, printed."""
    runs = res["runs"]
    res["errors"] = [r for r in runs if "error" in r]
    res["tolerance"] = tol
    res["t_typical"] = summarize(runs, "t_typical[usec]")
    res["t_avg"] = summarize(runs, "t_avg[usec]")
    res["t_min"] = summarize(runs, "t_min[usec]")
    for q in QUANTILES:
        res["p%d" % q] = summarize(runs, "p%d" % q)
    for key in ["t_typical", "t_min"] + ["p%d" % q for q in QUANTILES]:
        sm = res[key]
        if sm and sm["sd_log_paired_ratio"] is not None:
            sm["pairs_needed"] = math.ceil((1.96 * sm["sd_log_paired_ratio"] / tol) ** 2)
    tt = res[verdict_stat]
    res["verdict_stat"] = verdict_stat
    res["verdict"] = verdict(tt, tol, verdict_stat) if tt and tt["bootstrap95_paired"] and not res["errors"] else \
        "no verdict: %d failed runs" % len(res["errors"])
    write_json(out, res)
    for key in ("t_typical", "t_avg", "t_min") + tuple("p%d" % q for q in QUANTILES):
        sm = res.get(key)
        if not sm:
            continue
        bp = sm["bootstrap95_paired"] or [float("nan")] * 2
        print("%-9s median plain %8.2f us  shift %8.2f us  ratio %.4f (boot95 %.3f..%.3f)  paired ratios: "
              "median %.4f boot95 %.3f..%.3f range %.3f..%.3f  run spread plain %.0f%% shift %.0f%%%s" % (
                  key, sm["median_plain"], sm["median_shift"], sm["ratio_of_medians"],
                  sm["bootstrap95_ratio"][0], sm["bootstrap95_ratio"][1], sm["median_paired_ratio"],
                  bp[0], bp[1], sm["paired_ratios"][0], sm["paired_ratios"][-1],
                  sm["spread_plain"]["range_pct_of_median"], sm["spread_shift"]["range_pct_of_median"],
                  "  pairs for +-%.0f%%: %s" % (100 * tol, sm["pairs_needed"]) if "pairs_needed" in sm else ""))
    print("verdict (%s): %s" % (verdict_stat, res["verdict"]))
    print("wrote %s" % out)
    return 0 if not res["errors"] else 1


def reanalyze(path, tol, verdict_stat="t_typical"):
    """Recompute the statistics of a saved result (its runs) in place."""
    with open(path) as f:
        res = json.load(f)

    def write_json(p, obj):
        with open(p + ".tmp", "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
        os.replace(p + ".tmp", p)
    return report(res, path, tol, write_json, verdict_stat)

if __name__ == "__main__":
    sys.exit(main())
