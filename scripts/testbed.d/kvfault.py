"""KV-store faults for the testbed (issue #19): the Redis server that SHIFT
uses runs in guest A (guest-stage2.sh); these actions break it while a job
runs, and restore_cmd() (in the runner's reset) puts a clean one back before and after every scenario.

  kv-kill             stop redis-server (it stays down)
  kv-start            start an empty redis-server (no persistence: a restart
                      loses every record)
  kv-del PATTERN...   delete the scenario's keys matching a PATTERN (qp:*)
  kv-garble PATTERN.. overwrite their values with bytes no record parses as
                      (the TTL is kept)
  kv-drip             replace redis-server by a server that accepts commands
                      and answers one byte per second (kvdrip.py)
  kv-forge            start a forger in guest B (kvforge.py): it keeps the
                      job's mr: and qp: records pointing at its own memory
  kv-forge-end        stop it; the injection fails if it planted nothing or
                      if any byte of its memory changed

  kv-cluster-kill-owner TAG
                      (scenarios with "kv": "cluster") kill the Redis Cluster
                      primary serving hash tag TAG's slot (SIGKILL); its
                      replica takes over after the node timeout

  kv-sentinel-kill-primary
                      (scenarios with "kv": "sentinel") kill the primary the
                      sentinel names (SIGKILL); the sentinel promotes the
                      replica after 1 s

Scenarios with "kv": "sentinel" run against Redis Sentinel in guest A
(sentinel_up, made anew for each run: a primary on port 7100, its replica
on 7101, one sentinel on 26379 watching them, quorum 1).
Scenarios with "kv": "cluster" run against a Redis Cluster in guest A
(cluster_up: three primaries on ports 7000-7002, a replica of each on
7003-7005, node timeout 1 s, the testbed's password), created on first use
and kept for the next such scenario while it says cluster_state:ok.

kv-del and kv-garble fail the injection when no key matches: a fault that
hit nothing would make the scenario pass for the wrong reason.
"""
import os
import shlex

ACTIONS = ("kv-kill", "kv-start", "kv-del", "kv-garble", "kv-drip", "kv-forge", "kv-forge-end",
           "kv-cluster-kill-owner", "kv-sentinel-kill-primary")
ADDR = "198.19.0.1"
PORT = 6379
HERE = os.path.dirname(os.path.abspath(__file__))
DRIP_PID = "/run/kvdrip.pid"
FORGE_PID = "/run/kvforge.pid"
FORGE_REPORT = "/run/kvforge.json"


# The password never appears in a command's text (an error message quotes
# the command): the commands read it from their environment (_env), which
# redis-cli takes as REDISCLI_AUTH.
def _env(pw):
    return {"REDISCLI_AUTH": pw, "TB_REDIS_PW": pw}


def _cli(_pw=None):
    return "redis-cli -h %s -p %d" % (ADDR, PORT)


def _start(_pw=None):
    # the same server as guest-stage2.sh starts: no persistence, so empty
    return ("redis-server --bind %s --port %d --requirepass \"$TB_REDIS_PW\" --save '' "
            "--appendonly no --daemonize yes --dir /run --logfile /tb/A/redis.log "
            "--pidfile /run/redis.pid" % (ADDR, PORT))


def _wait(pw, up):
    """Shell, ends the script: wait up to 5 s until the server answers PING
    (up) or no longer does."""
    test = "%s ping 2>/dev/null | grep -q PONG" % _cli(pw)
    return ("for i in $(seq 50); do %s %s exit 0; sleep 0.1; done; "
            "echo 'redis still %s after 5 s' >&2; exit 1"
            % (test, "&&" if up else "||", "down" if up else "up"))


def _stop_cmd(pw):
    return ("kill $(cat /run/redis.pid 2>/dev/null) 2>/dev/null; rm -f /run/redis.pid; "
            + _wait(pw, False))


# one round trip for all keys (a redis-cli per key costs ~0.5 s in a TCG guest)
_LUA = {
    "kv-del": "redis.call('DEL', k)",
    "kv-garble": "redis.call('SET', k, '\\001garbled\\255 record', 'KEEPTTL')",
}


def _each_key(pw, ns, patterns, action):
    """Shell: ACTION on every key of NS matching one of PATTERNS, in one Lua
    script; prints how many keys it touched."""
    lua = ("local n = 0 for _, p in ipairs(ARGV) do for _, k in ipairs(redis.call('KEYS', p)) do "
           "%s n = n + 1 end end return n" % _LUA[action])
    return "%s EVAL %s 0 %s" % (_cli(pw), shlex.quote(lua), " ".join(
        shlex.quote("shift:%s:%s" % (ns, p)) for p in patterns))


def _background(script, args, pidfile, ready):
    """Shell: start SCRIPT (in this directory) detached; wait up to 60 s for
    its READY file (the forger's first record needs the job's own, and
    pyverbs' import: over 20 s in a TCG guest on a slow host)."""
    return ("rm -f %s; setsid /usr/bin/python3 %s %s >%s.log 2>&1 < /dev/null & echo $! > %s; "
            "for i in $(seq 600); do [ -f %s ] && exit 0; kill -0 $(cat %s) 2>/dev/null || break; "
            "sleep 0.1; done; echo '%s not ready:' >&2; cat %s.log >&2; exit 1"
            % (ready, os.path.join(HERE, script), " ".join(shlex.quote(str(a)) for a in args),
               pidfile, pidfile, ready, pidfile, script, pidfile))


def _forge_end(gb):
    import json
    out = gb.check("[ -f %s ] || { echo 'no forger running' >&2; exit 1; }; kill -TERM $(cat %s); "
                   "for i in $(seq 100); do [ -f %s ] && break; sleep 0.1; done; rm -f %s; cat %s"
                   % (FORGE_PID, FORGE_PID, FORGE_REPORT, FORGE_PID, FORGE_REPORT), 30)
    rep = json.loads(out.strip().splitlines()[-1])
    if not rep.get("planted"):
        raise ValueError("kv-forge: the forger planted no record")
    unused = [f for f, n in rep.get("forms", {}).items() if not n]
    if unused:
        raise ValueError("kv-forge: the forger never planted %s" % ", ".join(unused))
    if rep.get("changed_bytes"):
        raise ValueError("kv-forge: %d bytes reached the forger's memory" % rep["changed_bytes"])
    return {"forger": rep}


CLUSTER_PORTS = tuple(range(7000, 7006))
CLUSTER_DIR = "/run/kvc"


def cluster_url(pw):
    """SHIFT_KV_URL of the cluster: its three first nodes as seeds."""
    return "redis-cluster://:%s@%s" % (pw, ",".join("%s:%d" % (ADDR, p) for p in CLUSTER_PORTS[:3]))


def _cluster_ok(port):
    return "redis-cli -h %s -p %d cluster info 2>/dev/null | grep -q cluster_state:ok" % (ADDR, port)


def cluster_up(g, pw):
    """Guest A: a Redis Cluster answering with every slot served (made anew
    unless the one there still is)."""
    starts = " && ".join(
        "redis-server --bind %s --port %d --requirepass \"$TB_REDIS_PW\" --masterauth \"$TB_REDIS_PW\" "
        "--save '' --appendonly no --daemonize yes --dir %s --cluster-enabled yes "
        "--cluster-config-file nodes-%d.conf --cluster-node-timeout 1000 "
        "--logfile /tb/A/redis-%d.log --pidfile %s/%d.pid" % (ADDR, p, CLUSTER_DIR, p, p, CLUSTER_DIR, p)
        for p in CLUSTER_PORTS)
    nodes = " ".join("%s:%d" % (ADDR, p) for p in CLUSTER_PORTS)
    up = " && ".join("redis-cli -h %s -p %d ping 2>/dev/null | grep -q PONG" % (ADDR, p)
                     for p in CLUSTER_PORTS)
    g["A"].check(
        "if %s; then exit 0; fi; "
        "for f in %s/*.pid; do [ -f $f ] && kill -9 $(cat $f) 2>/dev/null; done; "
        "rm -rf %s; mkdir -p %s && %s || exit 1; "
        "for i in $(seq 100); do %s && break; sleep 0.1; done; "
        "redis-cli --cluster create %s --cluster-replicas 1 --cluster-yes >%s/create.log 2>&1 || "
        "{ cat %s/create.log >&2; exit 1; }; "
        "for i in $(seq 300); do %s && exit 0; sleep 0.1; done; "
        "echo 'cluster not ok after 30 s' >&2; exit 1"
        % (_cluster_ok(CLUSTER_PORTS[0]), CLUSTER_DIR, CLUSTER_DIR, CLUSTER_DIR, starts, up, nodes,
           CLUSTER_DIR, CLUSTER_DIR, " && ".join(_cluster_ok(p) for p in CLUSTER_PORTS[:3])),
        90, _env(pw))


SENTINEL_PORTS = (7100, 7101)
SENTINEL_PORT = 26379
SENTINEL_DIR = "/run/kvs"


def sentinel_url(pw):
    """SHIFT_KV_URL through the sentinel (master name m)."""
    return "redis-sentinel://:%s@%s:%d/m" % (pw, ADDR, SENTINEL_PORT)


def sentinel_up(g, pw):
    """Guest A: a fresh primary, replica and sentinel (anything an earlier
    run left is killed first)."""
    srv = ("redis-server --bind %s --port %%d --requirepass \"$TB_REDIS_PW\" --masterauth "
           "\"$TB_REDIS_PW\" --save '' --appendonly no --daemonize yes --dir %s "
           "--logfile /tb/A/redis-%%d.log --pidfile %s/%%d.pid" % (ADDR, SENTINEL_DIR, SENTINEL_DIR))
    p, r = SENTINEL_PORTS
    conf = ("port %d\nbind %s\ndir %s\ndaemonize yes\npidfile %s/sentinel.pid\n"
            "logfile /tb/A/sentinel.log\nsentinel monitor m %s %d 1\n"
            "sentinel down-after-milliseconds m 1000\nsentinel failover-timeout m 5000\n"
            % (SENTINEL_PORT, ADDR, SENTINEL_DIR, SENTINEL_DIR, ADDR, p))
    g["A"].check(
        "for f in %s/*.pid; do [ -f $f ] && kill -9 $(cat $f) 2>/dev/null; done; "
        "rm -rf %s; mkdir -p %s && %s && %s --replicaof %s %d || exit 1; "
        "printf '%s' > %s/sentinel.conf && "
        "echo \"sentinel auth-pass m $TB_REDIS_PW\" >> %s/sentinel.conf && "
        "redis-server %s/sentinel.conf --sentinel || exit 1; "
        "for i in $(seq 300); do redis-cli -h %s -p %d info replication 2>/dev/null | "
        "grep -q master_link_status:up && redis-cli -h %s -p %d sentinel replicas m 2>/dev/null | "
        "grep -q %d && exit 0; sleep 0.1; done; echo 'sentinel setup not ready after 30 s' >&2; exit 1"
        % (SENTINEL_DIR, SENTINEL_DIR, SENTINEL_DIR, srv % (p, p, p), srv % (r, r, r), ADDR, p,
           conf, SENTINEL_DIR, SENTINEL_DIR, SENTINEL_DIR, ADDR, r, ADDR, SENTINEL_PORT, r),
        60, _env(pw))


def _kill_primary(ga, pw):
    """SIGKILL the primary the sentinel names."""
    out = ga.check("redis-cli --no-auth-warning -h %s -p %d sentinel get-master-addr-by-name m"
                   % (ADDR, SENTINEL_PORT), 20, {})
    port = int(out.split()[-1].strip('"'))
    ga.check("kill -9 $(cat %s/%d.pid)" % (SENTINEL_DIR, port), 20)
    return {"killed_port": port}


def _crc16(data):
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
    return crc


def _kill_owner(ga, tag, pw):
    """SIGKILL the primary serving TAG's slot; return the injection's fields."""
    slot = _crc16(tag.encode()) % 16384
    out = ""
    for p in CLUSTER_PORTS:  # any live node tells the map
        rc, out, _ = ga.run("redis-cli -h %s -p %d cluster nodes" % (ADDR, p), 20, _env(pw))
        if rc == 0 and "master" in out:
            break
    for line in out.splitlines():
        f = line.split()
        if len(f) < 9 or "master" not in f[2].split(",") or "fail" in f[2].split(","):
            continue
        for r in f[8:]:
            if r.startswith("["):
                continue
            lo, _, hi = r.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                port = int(f[1].split("@")[0].rsplit(":", 1)[1])
                ga.check("kill -9 $(cat %s/%d.pid)" % (CLUSTER_DIR, port), 20)
                return {"slot": slot, "killed_port": port}
    raise ValueError("kv-cluster-kill-owner %s: no primary serves slot %d" % (tag, slot))


def inject(g, action, args, ns, pw):
    """Carry out ACTION in guest A (the KV store's) or B (the forger's);
    return fields for the injection record."""
    ga, gb = g["A"], g["B"]
    if action == "kv-forge":
        gb.check("rm -f %s; " % FORGE_REPORT + _background(
            "kvforge.py", [ADDR, PORT, ns, "/run/kvforge.ready", FORGE_REPORT],
            FORGE_PID, "/run/kvforge.ready"), 90, _env(pw))
        return {}
    if action == "kv-forge-end":
        return _forge_end(gb)
    if action == "kv-cluster-kill-owner":
        if len(args) != 1:
            raise ValueError("kv-cluster-kill-owner TAG")
        return _kill_owner(ga, args[0], pw)
    if action == "kv-sentinel-kill-primary":
        return _kill_primary(ga, pw)
    if action == "kv-kill":
        ga.check(_stop_cmd(pw), 20, _env(pw))
        return {}
    if action == "kv-start":
        ga.check(_start(pw) + " && " + _wait(pw, True), 20, _env(pw))
        return {}
    if action in ("kv-del", "kv-garble"):
        if not args:
            raise ValueError("%s PATTERN..." % action)
        out = ga.check(_each_key(pw, ns, args, action), 30, _env(pw)).split()
        n = int(out[-1]) if out and out[-1].isdigit() else 0
        if n == 0:
            raise ValueError("%s %s: no key of namespace %s matched" % (action, " ".join(args), ns))
        return {"keys": n}
    if action == "kv-drip":
        ready = "/run/kvdrip.ready"
        ga.check("%s; rm -f %s; setsid python3 %s %s %d %s >/dev/null 2>&1 < /dev/null & "
                 "echo $! > %s; for i in $(seq 50); do [ -f %s ] && exit 0; sleep 0.1; done; "
                 "echo 'kvdrip not listening after 5 s' >&2; exit 1"
                 % (_stop_cmd(pw), ready, os.path.join(HERE, "kvdrip.py"), ADDR, PORT, ready,
                    DRIP_PID, ready), 30, _env(pw))
        return {}
    raise ValueError("unknown KV action %s" % action)


def restore_forger_cmd():
    """Shell for guest B: no forger left running."""
    return ("if [ -f %s ]; then kill -TERM $(cat %s) 2>/dev/null; rm -f %s; fi; true"
            % (FORGE_PID, FORGE_PID, FORGE_PID))


def restore_cmd():
    """Shell for guest A, to run with env(password) and go on after it: no
    dripping server left, a redis-server answering (started empty if none
    does). Part of the runner's reset, so it costs no round trip of its
    own."""
    up = "%s ping 2>/dev/null | grep -q PONG" % _cli()
    return ("if [ -f %s ]; then kill $(cat %s) 2>/dev/null; rm -f %s; sleep 0.2; fi; "
            "if ! %s; then %s; for i in $(seq 50); do %s && break; sleep 0.1; done; fi"
            % (DRIP_PID, DRIP_PID, DRIP_PID, up, _start(), up))


def env(pw):
    """The environment the KV actions' commands read the password from."""
    return _env(pw)
