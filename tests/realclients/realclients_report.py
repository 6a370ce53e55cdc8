"""Summary and markdown tables of a realclients tier run (tests/realclients/tier).

write_doc(results, path) writes docs/realclients.md from results.json, so the
document always says what a run measured and which command produced it.
"""
import os
import time

MODES = ("plain", "shift-ldpath", "shift-preload")
SHORT = {"pass": "pass", "fail": "FAIL", "error": "ERROR", "skip": "skip", "hang": "HANG",
         "crash": "CRASH", "no-end": "NO-END", "xfail": "xfail", "xpass": "XPASS", "absent": "-"}


def summary(r):
    lines = ["realclients: %d differences: %d expected, %d UNEXPECTED, %d STALE expected entries%s"
             % (len(r.get("differences", [])), len(r.get("expected_matched", [])),
                len(r.get("unexpected", [])), len(r.get("stale", [])),
                (", %d intermittent entries absent" % len(r["intermittent_absent"]))
                if r.get("intermittent_absent") else "")]
    tol = r.get("setup_in_window", [])
    if tol:
        lines.append("  part b setup failures inside the NIC-down window (as plain): %s"
                     % ", ".join("%s %d" % (m, sum(1 for x in tol if x["mode"] == m))
                                 for m in MODES if any(x["mode"] == m for x in tol)))
    for d in r.get("unexpected", []):
        lines.append("  UNEXPECTED %s [%s] %s: plain %s, got %s  %s"
                     % (d["part"], d["mode"], d["test"], d["plain"], d["got"], d.get("detail", "")[:300]))
    for e in r.get("stale", []):
        lines.append("  STALE (no longer differs: remove it from the list) %s [%s] %s"
                     % (e["part"], e["mode"], e["test"]))
    for p in r.get("problems", []):
        lines.append("  PROBLEM %s" % p.strip().splitlines()[-1][:300] if p.strip() else "")
    return "\n".join(lines)


def cell(t):
    if not t:
        return "-"
    return SHORT.get(t.get("outcome"), t.get("outcome", "?"))


def counts_line(res):
    c = res.get("counts", {})
    return ", ".join("%s %d" % (k, c[k]) for k in sorted(c))


def suite_section(r, out):
    a = r.get("suite", {}).get("a", {})
    if not a:
        return
    modes = [m for m in MODES if m in a]
    out.append("## Part a: rdma-core v44.0's test suite, no fault\n")
    out.append("Guest A, `--dev rxe0 --port 1 --gid 1`, per-test timeout %g s, rdma_cm tests enabled "
               "(`tests/realclients/suite_runner.py`). A SHIFT mode must give every test the outcome "
               "plain gives it.\n" % r.get("timeout", 60))
    out.append("| mode | outcomes (of %d tests) | QPs SHIFT shadowed | wall time |" % len(a[modes[0]]["tests"]))
    out.append("|---|---|---|---|")
    for m in modes:
        out.append("| %s | %s | %s | %.0f s |" % (m, counts_line(a[m]), a[m].get("shadowed_qps", "-"),
                                                  r.get("timings", {}).get("a", {}).get(m, a[m]["duration"])))
    out.append("")
    ids = sorted(set().union(*[set(a[m]["tests"]) for m in modes]))
    ran = [t for t in ids if any(a[m]["tests"].get(t, {}).get("outcome") != "skip" for m in modes)]
    out.append("Every test that did not skip in every mode (%d of %d; the other %d skip in all modes, "
               "reasons below):\n" % (len(ran), len(ids), len(ids) - len(ran)))
    out.append("| test | " + " | ".join(modes) + " |")
    out.append("|---|" + "---|" * len(modes))
    for t in ran:
        out.append("| `%s` | %s |" % (t.replace("tests.", "", 1), " | ".join(cell(a[m]["tests"].get(t)) for m in modes)))
    out.append("")
    msgs = [(t, a["plain"]["tests"][t]) for t in ran if a["plain"]["tests"][t].get("outcome") not in ("pass", "skip")]
    if msgs:
        out.append("Plain's own failures (soft-RoCE, not SHIFT):\n")
        for t, x in msgs:
            out.append("- `%s`: %s — %s" % (t.replace("tests.", "", 1), x["outcome"], x.get("msg", "")))
        out.append("")
    reasons = {}
    for t in ids:
        x = a["plain"]["tests"].get(t, {})
        if x.get("outcome") == "skip":
            reasons[x.get("msg", "")] = reasons.get(x.get("msg", ""), 0) + 1
    out.append("Skip reasons in plain (soft-RoCE lacks the feature or the hardware):\n")
    out.append("| tests | reason |")
    out.append("|---|---|")
    for msg, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        out.append("| %d | %s |" % (n, msg.replace("|", "/")))
    out.append("")


def fault_section(r, out):
    b = r.get("suite", {}).get("b", {})
    a = r.get("suite", {}).get("a", {})
    if not b:
        return
    modes = [m for m in MODES if m in b]
    out.append("## Part b: the same suite, A's rail-0 NIC down for 10 s in the middle\n")
    out.append("`nic-down A 0` when `%s` starts (the test plain runs at half of its suite's time), "
               "`nic-up A 0` 10 s later. Through SHIFT no test may hang or crash and every test that "
               "passes in plain (part a) must pass.\n" % r.get("b_trigger"))
    out.append("| mode | outcomes | fault window (s from suite start) | tests run in the window | failovers logged | wall time |")
    out.append("|---|---|---|---|---|---|")
    for m in modes:
        f = b[m].get("fault", {})
        w = f.get("window")
        out.append("| %s | %s | %s | %d | %s | %.0f s |" % (
            m, counts_line(b[m]), "%.1f-%.1f" % tuple(w) if w else "-", len(f.get("tests_in_window", [])),
            b[m].get("failovers", "-"), r.get("timings", {}).get("b", {}).get(m, b[m]["duration"])))
    out.append("")
    show = set()
    for m in modes:
        show |= set(b[m].get("fault", {}).get("tests_in_window", []))
        show |= {t for t, x in b[m]["tests"].items()
                 if x.get("outcome") != a.get("plain", {}).get("tests", {}).get(t, {}).get("outcome")}
    tol = r.get("setup_in_window", [])
    out.append("Setup failures inside the fault window (the test starts creating or connecting while "
               "the NIC is down: `Errno: 101`, rdma_cm `UNREACHABLE`, an exception on the rdma_cm side; "
               "SHIFT protects established RC connections, setup on a dead NIC fails as in plain). "
               "Tolerated through SHIFT only for tests that pass in plain without the fault:\n")
    out.append("| mode | setup failures in the window | tests |")
    out.append("|---|---|---|")
    for m in modes:
        ts = sorted(x["test"].replace("tests.", "", 1) for x in tol if x["mode"] == m)
        out.append("| %s | %d | %s |" % (m, len(ts), ", ".join("`%s`" % t for t in ts) or "-"))
    out.append("")
    out.append("Tests in a fault window or whose outcome differs from plain without fault:\n")
    out.append("| test | plain, no fault | " + " | ".join("%s + fault" % m for m in modes) + " |")
    out.append("|---|---|" + "---|" * len(modes))
    for t in sorted(show):
        row = [cell(a.get("plain", {}).get("tests", {}).get(t))]
        for m in modes:
            x = b[m]["tests"].get(t)
            inw = t in b[m].get("fault", {}).get("tests_in_window", [])
            row.append(cell(x) + (" (in window)" if inw else ""))
        out.append("| `%s` | %s |" % (t.replace("tests.", "", 1), " | ".join(row)))
    out.append("")


def clients_section(r, out):
    cl = r.get("clients", {})
    for part, title in (("c", "Part c: real clients with A's rail-0 NIC down for a few seconds in the middle"),
                        ("d", "Part d: rdma_server / rdma_client, no fault")):
        if part not in cl:
            continue
        out.append("## %s\n" % title)
        if part == "c":
            out.append("Each run: server on B, client on A over rail 0, `nic-down A 0` shortly after traffic "
                       "starts, `nic-up A 0` 3-4 s later (each scenario's schedule: tests/realclients/scenarios/c_*.json; every client pinned to rxe0, the NIC that fails). Through SHIFT "
                       "both ends must exit 0 and finish their work in every run. Cells: runs with both "
                       "ends rc 0 / runs; then the (client, server) rc of each run; F = SHIFT logged a "
                       "failover.\n")
        else:
            out.append("Cells: runs with both ends rc 0 / runs, crashes (a role ended by SIGSEGV, SIGABRT, ...).\n")
        modes = [m for m in MODES if any(m in v for v in cl[part].values())]
        out.append("| client | " + " | ".join(modes) + " |")
        out.append("|---|" + "---|" * len(modes))
        for name, per in sorted(cl[part].items()):
            row = []
            for m in modes:
                runs = per.get(m, [])
                ok = sum(1 for x in runs if all(v == 0 for v in x["rc"].values()))
                if part == "c":
                    det = " ".join("(%s,%s)%s%s" % (x["rc"]["client"], x["rc"]["server"],
                                                    "T" if x["timed_out"] else "", "F" if x["failover_logged"] else "")
                                   for x in runs)
                    row.append("%d/%d: %s" % (ok, len(runs), det))
                else:
                    row.append("%d/%d, %d crashes" % (ok, len(runs), sum(1 for x in runs if x["crash"])))
            out.append("| %s | %s |" % (name, " | ".join(row)))
        out.append("")
        out.append("Wall time: " + ", ".join("%s %.0f s" % (m, r.get("timings", {}).get(part, {}).get(m, 0))
                                            for m in modes) + "\n")


def diff_section(r, out):
    out.append("## SHIFT vs plain: every difference of this run\n")
    exp = r.get("expected_list", [])
    rows = [(d, "expected (#%d)" % d["expected_entry"]) for d in r.get("expected_matched", [])] + \
           [(d, "**UNEXPECTED**") for d in r.get("unexpected", [])]
    if not rows:
        out.append("None.\n")
    else:
        out.append("| part | mode | test | plain | SHIFT | status | detail |")
        out.append("|---|---|---|---|---|---|---|")
        for d, st in sorted(rows, key=lambda x: (x[0]["part"], x[0]["test"], x[0]["mode"])):
            out.append("| %s | %s | `%s` | %s | %s | %s | %s |" % (
                d["part"], d["mode"], d["test"].replace("tests.", "", 1), d["plain"], d["got"], st,
                d.get("detail", "").replace("|", "/").replace("\n", " ")[:300]))
        out.append("")
    if exp:
        out.append("The expected-difference list (tests/realclients/expected_differences.json):\n")
        out.append("| # | part | modes | test | reason | waits for |")
        out.append("|---|---|---|---|---|---|")
        for k, e in enumerate(exp):
            out.append("| %d | %s | %s | `%s` | %s | %s |" % (k, e["part"], ", ".join(e["modes"]), e["test"],
                                                            e["reason"], e["waits_for"]))
        out.append("")
    if r.get("stale"):
        out.append("Stale entries (listed, but no longer differ: remove them): " + ", ".join(
            "#%d %s [%s]" % (e["entry"], e["test"], e["mode"]) for e in r["stale"]) + "\n")
    if r.get("intermittent_absent"):
        out.append("Intermittent entries not seen in this run: " + ", ".join(
            "#%d %s [%s]" % (e["entry"], e["test"], e["mode"]) for e in r["intermittent_absent"]) + "\n")


def write_doc(r, path):
    out = ["# Real clients through SHIFT (the `realclients` tier)\n",
           "<!-- generated by tests/realclients/tier from %s; do not edit by hand -->\n"
           % os.path.join("$SHIFT_TESTBED_DIR", "realclients", "results.json"),
           "Software nobody on this project wrote, on the two-host soft-RoCE testbed (docs/testbed.md), "
           "with the distro's libibverbs (plain) and through SHIFT (shift-ldpath = `LD_LIBRARY_PATH`, "
           "shift-preload = `LD_PRELOAD`). `ctest -L realclients` (run by `scripts/test`, so by CI) runs "
           "`tests/realclients/tier --ci`. See tests/realclients/tier's header for what each part requires.\n",
           "This run: `%s` on commit %s, started %s, %.0f s in all%s%s.\n" % (
               r.get("command"), r.get("commit"), r.get("started"), r.get("duration", 0),
               (", %d testbed reboot(s): %s" % (len(r["reboots"]), "; ".join(x["why"] for x in r["reboots"])))
               if r.get("reboots") else "",
               (", rxe0 re-created %d time(s) (rdma_cm broken after a fault run)" % len(r["relinks"]))
               if r.get("relinks") else "")]
    out.append("How to run:\n")
    out.append("    ctest --test-dir build -L realclients --output-on-failure    # what CI runs (scripts/test)")
    out.append("    tests/realclients/tier --ci --doc docs/realclients.md          # the same, and rewrite this file")
    out.append("    scripts/testbed up; tests/realclients/tier --parts a,d --modes plain,shift-preload   # a subset, testbed kept up")
    out.append("    tests/realclients/tier --render build/testbed/realclients/results.json --doc docs/realclients.md\n")
    out.append("Outcome words: pass, FAIL, ERROR (the test's own verdicts), skip, HANG (no end within the per-test "
               "timeout: killed, backtraces in the log), CRASH (the test process or a process it forked died "
               "by a signal). Results and logs: `$SHIFT_TESTBED_DIR/realclients/` (results.json, logs/).\n")
    t = r.get("timings", {})
    if t:
        out.append("Wall time per part and mode, as measured in this run:\n")
        out.append("| part | " + " | ".join(MODES) + " |")
        out.append("|---|---|---|---|")
        for p in sorted(t):
            out.append("| %s | %s |" % (p, " | ".join("%.0f s" % t[p][m] if m in t[p] else "-" for m in MODES)))
        out.append("")
    out.append(summary(r).replace("realclients: ", "Verdict: ", 1).split("\n")[0] + "\n")
    suite_section(r, out)
    fault_section(r, out)
    clients_section(r, out)
    diff_section(r, out)
    with open(path, "w") as f:
        f.write("\n".join(out).rstrip() + "\n")
