"""A forger on the testbed (issue #20): someone who can write the job's KV
namespace but does not hold its secret. Runs in guest B, next to the
receiver: it registers 1 MiB of its own memory on the backup NIC (rxe1)
and, every 300 ms, overwrites each of the job's `mr:` and `qp:` records
with one that sends the job's backup traffic its way (its own rkey, a QPN
of its own choosing), in a valid format, in turn without the MAC envelope,
inside one with a wrong MAC, and as a genuine record of the job moved from
another key (replayed: its MAC is right, for that other key). It touches READY_FILE once it
has planted its first record. On SIGTERM it writes its report:
how many records it planted, and how many bytes of its memory changed
(anything but 0 means data reached it).

Usage: kvforge.py ADDR PORT NAMESPACE READY_FILE REPORT_FILE
(the store's password in the environment, REDISCLI_AUTH)
"""
import json
import os
import signal
import socket
import sys
import time

import pyverbs.device
import pyverbs.enums as e
import pyverbs.mr
import pyverbs.pd

VERSION = "shift1"        # shift/shadow/exchange.h: SHIFT_EXCHANGE_VERSION
SIZE = 1 << 20
GID = "00000000000000000000ffffc6120102"  # 198.18.1.2: B's rail 1 (rxe1)


class Resp:
    """A minimal Redis client: one connection, commands as argument lists."""

    def __init__(self, addr, port):
        self.s = socket.create_connection((addr, port), timeout=5)
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                raise OSError("redis closed the connection")
            self.buf += d
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise OSError(rest.decode(errors="replace"))
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.s.recv(65536)
            v, self.buf = self.buf[:n], self.buf[n + 2:]
            return v
        if kind == b"*":
            return [self._reply() for _ in range(int(rest))]
        raise OSError("bad reply %r" % line)

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self._reply()


def say(what):
    print("%.3f kvforge: %s" % (time.time(), what), flush=True)


def main():
    addr, port, ns, ready, report = sys.argv[1:6]
    pw = os.environ.get("REDISCLI_AUTH", "")
    say("started")
    ctx = pyverbs.device.Context(name="rxe1")
    pd = pyverbs.pd.PD(ctx)
    mr = pyverbs.mr.MR(pd, SIZE, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                       e.IBV_ACCESS_REMOTE_READ)
    mr.write(b"\0" * SIZE, SIZE)
    say("memory registered")
    r = Resp(addr, int(port))
    r.cmd("AUTH", pw)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    planted, mine, keys, first = 0, {}, set(), None
    forms = {"plain": 0, "bad_mac": 0, "replayed": 0}
    turn = {}
    legit = {b"mr": {}, b"qp": {}}  # the job's own records, as first seen
    records = {b"mr": "%s mr rkey=%d" % (VERSION, mr.rkey),
               b"qp": "%s qp gid=%s qpn=%d psn=4242 mtu=3" % (VERSION, GID, 0xabcd)}
    while not stop:
        for kind in (b"mr", b"qp"):
            for k in r.cmd("KEYS", "shift:%s:%s:*" % (ns, kind.decode())) or []:
                cur = r.cmd("GET", k)
                if cur is not None and cur != mine.get(k):
                    legit[kind].setdefault(k, cur)
                # each round the next of: a record of its own without the
                # MAC envelope, one with a wrong MAC, and a genuine record
                # of the job (its MAC right for its own key) moved here
                other = [v for o, v in legit[kind].items() if o != k]
                turn[k] = turn.get(k, len(turn)) + 1
                form = ("plain", "bad_mac", "replayed")[turn[k] % 3]
                if form == "replayed" and not other:
                    form = "plain"
                if form == "plain":
                    v = records[kind].encode()
                elif form == "bad_mac":
                    v = ("m1:%s:%s" % (os.urandom(32).hex(), records[kind])).encode()
                else:
                    v = other[turn[k] % len(other)]
                r.cmd("SET", k, v, "KEEPTTL")
                mine[k] = v
                keys.add(k)
                forms[form] += 1
                planted += 1
                if not first:
                    first = time.time()
                    say("first record planted")
                    open(ready, "w").close()
        time.sleep(0.3)
    data = mr.read(SIZE, 0)
    changed = SIZE - data.count(0)
    with open(report + ".tmp", "w") as f:
        json.dump({"planted": planted, "forms": forms, "keys": len(keys), "rkey": mr.rkey,
                   "first_planted": first, "changed_bytes": changed}, f)
    os.rename(report + ".tmp", report)


if __name__ == "__main__":
    main()
