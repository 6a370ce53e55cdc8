#!/usr/bin/env python3
"""Offline check of scripts/testbed's perftest parsing against real output
captured in the testbed (perftest 4.5, Debian 12). Python 3 stdlib only."""
import os
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader

TESTBED = os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "scripts", "testbed")

# ib_write_lat -d rxe0 -x 1 -F -n 300 (client, guest A): one blank between
# "#bytes" and "#iterations", tabs between the values
LAT = (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]"
       "   99% percentile[usec]   99.9% percentile[usec] \n"
       " 2       300          204.23         7104.10      355.49   \t       681.97      \t705.63 \t\t3967.65 \t\t7104.10\n")
BW = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
      " 65536      927              0.00               0.16   \t\t   0.000308\n")
# ib_write_bw --run_infinitely (a CI run, 2026-11-27): an interval whose WRs
# completed while its rates read 0 (the guest's emulated clock)
BW0 = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
       " 65536      201           0.000000            0.000000            0.000000\n"
       " 65536      0             0.000000            0.000000            0.000000\n")


def main():
    loader = SourceFileLoader("shift_testbed", TESTBED)
    tb = module_from_spec(spec_from_loader("shift_testbed", loader))
    loader.exec_module(tb)
    bad = []
    _, rows = tb.parse_perftest(LAT)
    want = {"#bytes": 2, "#iterations": 300, "t_min[usec]": 204.23, "t_max[usec]": 7104.10,
            "t_typical[usec]": 355.49, "t_avg[usec]": 681.97, "t_stdev[usec]": 705.63,
            "99% percentile[usec]": 3967.65, "99.9% percentile[usec]": 7104.10}
    if rows != [want]:
        bad.append("latency row %r, want %r" % (rows, want))
    _, rows = tb.parse_perftest(BW)
    want = {"#bytes": 65536, "#iterations": 927, "BW peak[Gb/sec]": 0.0, "BW average[Gb/sec]": 0.16,
            "MsgRate[Mpps]": 0.000308}
    if rows != [want]:
        bad.append("bandwidth row %r, want %r" % (rows, want))
    ts = "".join("%d.5\t%s" % (100 + i, l + "\n") for i, l in enumerate(BW.splitlines()))
    pts = tb.parse_throughput(ts, 0.5)
    if pts != [{"t": 101.0, "bw": 0.16, "unit": "Gb/sec", "iters": 927}]:
        bad.append("throughput %r" % pts)
    ts = "".join("%d.5\t%s" % (100 + i, l + "\n") for i, l in enumerate(BW0.splitlines()))
    pts = tb.parse_throughput(ts, 0.5)
    if [tb.flowed(p) for p in pts] != [True, False]:
        bad.append("flowed() on %r: WRs counted with rates of 0 are traffic, none is not" % pts)
    # double_fault_write_nic_a (2026-11-28): the backup NIC down at 8.2 s
    # (2.1 s for its `ip link set`), the default one at 10.3 s, up again
    # at 14.1 s and 20.1 s: traffic flows until the second is down
    inj = [{"action": "nic-down", "t": 8.157}, {"action": "nic-down", "t": 10.281},
           {"action": "nic-up", "t": 14.122}, {"action": "nic-up", "t": 20.146}]
    win = tb.stall_window(inj)
    if not win or abs(win[0] - 13.281) > 1e-9 or win[1] != 14.122:
        bad.append("stall_window %r, want (13.281, 14.122)" % (win,))
    if tb.stall_window(inj[:2]) is not None:
        bad.append("stall_window without a repair: %r" % (tb.stall_window(inj[:2]),))
    # SHIFT's failover-timing lines: with the switch's phases (2026-11-29),
    # and without (an older SHIFT's), after a local port event
    log = ("shift: info: 2026-11-29T11:55:56.150Z hostA[249] rxe0: port 1 left ACTIVE (async event)\n"
           "shift: info: 2026-11-29T11:55:56.197Z hostA[249] rxe0 QP 20: failover-timing dev=rxe0 qp=20 "
           "switch_us=16634 fallback_us=31196 start_us=3026 wait_us=8889 retx_us=4918 post_us=3100 "
           "held_us=700\n"
           "shift: info: 2026-11-29T11:55:57.000Z hostA[249] rxe0 QP 21: failover-timing dev=rxe0 qp=21 "
           "switch_us=100 fallback_us=200\n"
           "shift: info: 2026-11-29T11:55:58.000Z hostA[249] rxe0 QP 22: failover-timing dev=rxe0 qp=22 "
           "switch_us=9000 fallback_us=9500 start_us=2000 wait_us=3000 retx_us=4000 post_us=1000 "
           "held_us=0 react_us=600 stop_us=700 err_us=300 drain_us=800 rrecv_us=90 by=pass\n"
           "shift: info: 2026-11-29T11:55:59.000Z hostA[249] rxe0 QP 23: failover-timing dev=rxe0 qp=23 "
           "switch_us=7000 fallback_us=7500 start_us=2500 wait_us=2000 retx_us=3000 post_us=900 "
           "held_us=0 react_us=0 stop_us=500 err_us=200 drain_us=400 rrecv_us=80 cpu_us=1200 "
           "preempted=3 yields=64 sleeps=2 by=pass\n")
    t0 = tb.log_time("2026-11-29T11:55:56.000")
    fos = tb.parse_failover_timing(log, 0.0, t0, "client", "A")
    want = [{"role": "client", "host": "A", "t": 0.197, "dev": "rxe0", "qp": 20, "switch_us": 16634,
             "fallback_us": 31196, "start_us": 3026, "wait_us": 8889, "retx_us": 4918, "post_us": 3100,
             "held_us": 700, "port_gap_ms": 47.0},
            {"role": "client", "host": "A", "t": 1.0, "dev": "rxe0", "qp": 21, "switch_us": 100,
             "fallback_us": 200, "port_gap_ms": 850.0},
            {"role": "client", "host": "A", "t": 2.0, "dev": "rxe0", "qp": 22, "switch_us": 9000,
             "fallback_us": 9500, "start_us": 2000, "wait_us": 3000, "retx_us": 4000, "post_us": 1000,
             "held_us": 0, "react_us": 600, "stop_us": 700, "err_us": 300, "drain_us": 800, "rrecv_us": 90,
             "by": "pass", "port_gap_ms": 1850.0},
            {"role": "client", "host": "A", "t": 3.0, "dev": "rxe0", "qp": 23, "switch_us": 7000,
             "fallback_us": 7500, "start_us": 2500, "wait_us": 2000, "retx_us": 3000, "post_us": 900,
             "held_us": 0, "react_us": 0, "stop_us": 500, "err_us": 200, "drain_us": 400, "rrecv_us": 80,
             "cpu_us": 1200, "preempted": 3, "yields": 64, "sleeps": 2, "by": "pass", "port_gap_ms": 2850.0}]
    if fos != want:
        bad.append("parse_failover_timing %r, want %r" % (fos, want))
    ph = tb.phase_summary(fos)
    if ph["n"] != 3 or ph["wait_us"]["p50"] != 3000 or ph["post_us"]["max"] != 3100:
        bad.append("phase_summary %r" % ph)
    sb = ph.get("start_by_pass")
    if not sb or sb["n"] != 2 or sb["stop_us"]["max"] != 700 or sb["rrecv_us"]["max"] != 90 \
            or "start_by_poll" in ph or sb.get("cpu_us", {}).get("max") != 1200 \
            or sb["preempted"]["p50"] != 3 or sb["sleeps"]["max"] != 2:
        bad.append("phase_summary's starts by pass %r" % ph)
    # the switch less the provider's post (where logged), and a process's
    # first failover apart from its later ones (by time, not log order)
    nop = tb.spread([f["switch_us"] - f["post_us"] for f in fos if "post_us" in f])
    if nop["n"] != 3 or nop["p50"] != 8000 or nop["max"] != 13534:
        bad.append("switch less post %r" % nop)
    order = tb.switch_by_order(list(reversed(fos)))
    if order["first"]["n"] != 1 or order["first"]["p50"] != 16634 or order["later"]["n"] != 3 \
            or order["later"]["max"] != 9000:
        bad.append("switch_by_order %r" % order)
    other = tb.switch_by_order([dict(f, role="server") if f["qp"] == 23 else f for f in fos])
    if other["first"]["n"] != 2 or other["later"]["n"] != 2:
        bad.append("switch_by_order, two processes %r" % other)
    for b in bad:
        print("FAIL:", b)
    print("parse_perftest: %s" % ("FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
