#!/usr/bin/env python3
"""In-guest agent of the SHIFT testbed (runs inside hosts A and B).

It serves a spool directory on the writable 9p share: the host drops a
request file  req/<id>.json  (written elsewhere and renamed in, so it is never
seen half written); the agent claims it by renaming it to  jobs/<id>.json  and
answers in the same folder:

  jobs/<id>.out     the job's stdout (a pty, so programs line-buffer)
  jobs/<id>.ts      the same lines, each prefixed "<guest epoch seconds>\t"
  jobs/<id>.err     the job's stderr
  jobs/<id>.started {"pid", "t"}            once the job runs
  jobs/<id>.rc      {"rc", "t_start", "t_end", "timed_out", "killed"}  at exit

Requests: {"op": "run", "cmd": "...", "env": {...}, "timeout": S}
          {"op": "kill", "job": "<id>", "signal": 15}
          {"op": "shutdown"}
A job runs as  /bin/sh -c CMD  in its own session, so a timeout or a kill
reaches all of its processes. The agent never blocks on a job: many jobs
(a server and a client, an injection loop) run at once. It exits, and the
guest powers off, after --idle-timeout seconds without a request and without
running jobs, so a guest whose host-side tool died does not run for ever.
Python 3 standard library only.
"""
import argparse
import json
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import threading
import time
import tty


def write_atomic(path, obj):
    """Write JSON so that a reader sees all of it or nothing."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.rename(tmp, path)


class Job:
    """One running command: its process, its output pump and its deadline."""

    def __init__(self, spool, jid, req):
        self.jid = jid
        self.base = os.path.join(spool, "jobs", jid)
        self.timeout = float(req.get("timeout", 60))
        self.timed_out = False
        self.killed = None
        self.kill_deadline = None
        env = dict(os.environ)
        env.update({k: str(v) for k, v in (req.get("env") or {}).items()})
        master, slave = pty.openpty()
        # raw: no \n -> \r\n translation, no signals from the line discipline
        tty.setraw(slave, termios.TCSANOW)
        self.t_start = time.time()
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", req["cmd"]],
            stdin=subprocess.DEVNULL, stdout=slave,
            stderr=open(self.base + ".err", "wb"),
            env=env, cwd=req.get("cwd") or "/tmp", start_new_session=True,
            close_fds=True)
        os.close(slave)
        self.master = master
        write_atomic(self.base + ".started", {"pid": self.proc.pid, "t": self.t_start})
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self):
        """Copy the pty to .out and, line by line with a timestamp, to .ts."""
        out = open(self.base + ".out", "wb", buffering=0)
        ts = open(self.base + ".ts", "wb", buffering=0)
        partial = b""
        while True:
            try:
                r, _, _ = select.select([self.master], [], [], 0.5)
                if not r:
                    if self.proc.poll() is not None:
                        # the pty stays readable until every holder closed it;
                        # a leftover grandchild must not keep the job alive
                        r, _, _ = select.select([self.master], [], [], 0.2)
                        if not r:
                            break
                    continue
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the last writer closed the pty
                break
            if not data:
                break
            out.write(data)
            now = time.time()
            partial += data
            *lines, partial = partial.split(b"\n")
            for line in lines:
                ts.write(b"%.3f\t%s\n" % (now, line.rstrip(b"\r")))
        if partial:
            ts.write(b"%.3f\t%s\n" % (time.time(), partial.rstrip(b"\r")))
        out.close()
        ts.close()
        os.close(self.master)

    def signal(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def poll(self, now):
        """Enforce the deadline; return True once the job is over and answered."""
        if self.proc.poll() is None:
            if not self.timed_out and now - self.t_start > self.timeout:
                self.timed_out = True
                self.signal(signal.SIGTERM)
                self.kill_deadline = now + 3
            if self.kill_deadline and now > self.kill_deadline:
                self.signal(signal.SIGKILL)
                self.kill_deadline = None
            return False
        # reap what is left of its session (a daemonised helper, say)
        self.signal(signal.SIGKILL)
        self.pump.join(5)
        write_atomic(self.base + ".rc", {
            "rc": self.proc.returncode, "t_start": self.t_start, "t_end": now,
            "timed_out": self.timed_out, "killed": self.killed})
        return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spool", required=True)
    ap.add_argument("--idle-timeout", type=float, default=7200)
    args = ap.parse_args()
    req_dir = os.path.join(args.spool, "req")
    jobs_dir = os.path.join(args.spool, "jobs")
    os.makedirs(req_dir, exist_ok=True)
    os.makedirs(jobs_dir, exist_ok=True)
    jobs = {}
    last_activity = time.time()
    last_alive = 0
    write_atomic(os.path.join(args.spool, "ready"), {"t": time.time(), "pid": os.getpid()})
    while True:
        now = time.time()
        try:
            names = sorted(n for n in os.listdir(req_dir) if n.endswith(".json"))
        except OSError:
            names = []
        for name in names:
            jid = name[:-5]
            dst = os.path.join(jobs_dir, name)
            try:
                os.rename(os.path.join(req_dir, name), dst)
                with open(dst) as f:
                    req = json.load(f)
            except (OSError, ValueError) as e:
                print("agent: bad request %s: %s" % (name, e), file=sys.stderr)
                continue
            last_activity = now
            op = req.get("op", "run")
            if op == "run":
                try:
                    jobs[jid] = Job(args.spool, jid, req)
                except Exception as e:  # answer rather than die
                    write_atomic(os.path.join(jobs_dir, jid + ".rc"), {
                        "rc": 127, "t_start": now, "t_end": now,
                        "timed_out": False, "killed": None, "error": str(e)})
            elif op == "kill":
                job = jobs.get(req.get("job"))
                if job:
                    job.killed = int(req.get("signal", 15))
                    job.signal(job.killed)
                    job.kill_deadline = now + 3
                write_atomic(os.path.join(jobs_dir, jid + ".rc"), {
                    "rc": 0 if job else 1, "t_start": now, "t_end": now,
                    "timed_out": False, "killed": None})
            elif op == "shutdown":
                for job in jobs.values():
                    job.signal(signal.SIGKILL)
                write_atomic(os.path.join(jobs_dir, jid + ".rc"), {
                    "rc": 0, "t_start": now, "t_end": now,
                    "timed_out": False, "killed": None})
                return 0
        for jid in [j for j, job in jobs.items() if job.poll(now)]:
            del jobs[jid]
            last_activity = now
        if now - last_alive > 5:
            write_atomic(os.path.join(args.spool, "alive"), {"t": now, "jobs": len(jobs)})
            last_alive = now
        if not jobs and now - last_activity > args.idle_timeout:
            print("agent: idle for %.0f s, exiting" % args.idle_timeout, file=sys.stderr)
            return 0
        time.sleep(0.05 if jobs else 0.1)


if __name__ == "__main__":
    sys.exit(main())
