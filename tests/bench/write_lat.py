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

Usage (host, as root, testbed up):
  SHIFT_TESTBED_DIR=... SHIFT_BUILD_DIR=... tests/bench/write_lat.py \
      [--pairs 7] [--iters 5000] [--size 2] [--port 18690] [--out FILE]
  tests/bench/write_lat.py --analyze FILE    (statistics of a saved result again)
Exit status 1 if any run failed (no verdict then), else 0 whatever the ratio.
It takes the testbed's run lock for its whole duration. Python 3 stdlib only.
"""
import argparse
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
HERE = os.path.dirname(os.path.realpath(__file__))
TESTBED = os.path.join(os.path.dirname(os.path.dirname(HERE)), "scripts", "testbed")


def load_testbed():
    loader = SourceFileLoader("shift_testbed", TESTBED)
    mod = module_from_spec(spec_from_loader("shift_testbed", loader))
    loader.exec_module(mod)
    return mod


def one_run(tb, g, lib, args, seq):
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
    cj = g["A"].submit(common + " -H " + args.server_ip, env, timeout)
    crc = g["A"].wait(cj, timeout + 20)
    t2 = time.time()
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


def verdict(sm, tol):
    lo, hi = sm["bootstrap95_paired"]
    if hi <= 1 + tol:
        return "SHIFT within %.0f%% of plain (95%% interval of the paired ratio %.3f..%.3f)" % (100 * tol, lo, hi)
    if lo > 1 + tol:
        return "SHIFT slower than plain by more than %.0f%% (95%% interval %.3f..%.3f)" % (100 * tol, lo, hi)
    return ("not resolvable: the 95%% interval of the paired ratio, %.3f..%.3f, is wider than the %.0f%% "
            "being asked about" % (lo, hi, 100 * tol))


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
    args = ap.parse_args()
    if args.analyze:
        return reanalyze(args.analyze, args.tolerance)
    tb = load_testbed()
    if not tb.running():
        sys.exit("testbed is down: scripts/testbed up")
    out = args.out or os.path.join(tb.RESULTS, "bench_write_lat.json")
    runs = []
    t_start = time.time()
    with tb.Lock(600):
        g = tb.guests()
        tb.dropin_check(g, "shift-ldpath")
        tb.reset_faults(g)
        order = []
        if not args.no_warmup:
            order += [("plain", -1), ("shift", -1)]
        for i in range(args.pairs):
            libs = ("plain", "shift") if i % 2 == 0 else ("shift", "plain")
            order += [(lib, i) for lib in libs]
        for seq, (lib, pair) in enumerate(order):
            rec = one_run(tb, g, lib, args, seq)
            rec["pair"] = pair
            if pair < 0:
                rec["warmup"] = True
            runs.append(rec)
            row = rec.get("row")
            print("%-6s pair %2s%s  t_typical %8.2f us  t_avg %8.2f us  t_min %7.2f  p10 %7.2f  p25 %7.2f  (%.1f s)%s" % (
                lib, pair if pair >= 0 else "-", " warm-up" if pair < 0 else "",
                row["t_typical[usec]"] if row else float("nan"), row["t_avg[usec]"] if row else float("nan"),
                row["t_min[usec]"] if row else float("nan"),
                row.get("p10", float("nan")) if row else float("nan"),
                row.get("p25", float("nan")) if row else float("nan"), rec["client_wall_s"],
                "" if row else "  ERROR " + rec["error"]), flush=True)
    res = {"bench": "ib_write_lat plain vs SHIFT (LD_LIBRARY_PATH), interleaved",
           "cmd": "ib_write_lat -d %s -p %d -x 1 -F -n %d -s %d [%s]" % (
               args.device, args.port, args.iters, args.size, args.server_ip),
           "dropin": tb.DROPIN, "pairs": args.pairs, "iters": args.iters, "size": args.size,
           "t_start": round(t_start, 3), "duration_s": round(time.time() - t_start, 1), "runs": runs}
    return report(res, out, args.tolerance, tb.write_json)


def report(res, out, tol, write_json):
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
    tt = res["t_typical"]
    res["verdict"] = verdict(tt, tol) if tt and tt["bootstrap95_paired"] and not res["errors"] else \
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
    print("verdict (t_typical): %s" % res["verdict"])
    print("wrote %s" % out)
    return 0 if not res["errors"] else 1


def reanalyze(path, tol):
    """Recompute the statistics of a saved result (its runs) in place."""
    with open(path) as f:
        res = json.load(f)

    def write_json(p, obj):
        with open(p + ".tmp", "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
        os.replace(p + ".tmp", p)
    return report(res, path, tol, write_json)

if __name__ == "__main__":
    sys.exit(main())
