"""KV-store faults for the testbed (issue #19): the Redis server that SHIFT
uses runs in guest A (guest-stage2.sh); these actions break it while a job
runs, and restore() puts a clean one back before and after every scenario.

  kv-kill             stop redis-server (it stays down)
  kv-start            start an empty redis-server (no persistence: a restart
                      loses every record)
  kv-del PATTERN...   delete the scenario's keys matching a PATTERN (qp:*)
  kv-garble PATTERN.. overwrite their values with bytes no record parses as
                      (the TTL is kept)
  kv-drip             replace redis-server by a server that accepts commands
                      and answers one byte per second (kvdrip.py)

kv-del and kv-garble fail the injection when no key matches: a fault that
hit nothing would make the scenario pass for the wrong reason.
"""
import os
import shlex

ACTIONS = ("kv-kill", "kv-start", "kv-del", "kv-garble", "kv-drip")
ADDR = "198.19.0.1"
PORT = 6379
HERE = os.path.dirname(os.path.abspath(__file__))
DRIP_PID = "/run/kvdrip.pid"


def _cli(pw):
    return "redis-cli --no-auth-warning -a %s -h %s -p %d" % (shlex.quote(pw), ADDR, PORT)


def _start(pw):
    # the same server as guest-stage2.sh starts: no persistence, so empty
    return ("redis-server --bind %s --port %d --requirepass %s --save '' --appendonly no "
            "--daemonize yes --dir /run --logfile /tb/A/redis.log --pidfile /run/redis.pid"
            % (ADDR, PORT, shlex.quote(pw)))


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


def inject(ga, action, args, ns, pw):
    """Carry out ACTION in guest A (handle GA); return fields for the
    injection record."""
    if action == "kv-kill":
        ga.check(_stop_cmd(pw), 20)
        return {}
    if action == "kv-start":
        ga.check(_start(pw) + " && " + _wait(pw, True), 20)
        return {}
    if action in ("kv-del", "kv-garble"):
        if not args:
            raise ValueError("%s PATTERN..." % action)
        out = ga.check(_each_key(pw, ns, args, action), 30).split()
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
                    DRIP_PID, ready), 30)
        return {}
    raise ValueError("unknown KV action %s" % action)


def restore_cmd(pw):
    """Shell for guest A: no dripping server, a redis-server answering."""
    return ("if [ -f %s ]; then kill $(cat %s) 2>/dev/null; rm -f %s; sleep 0.2; fi; "
            "%s ping 2>/dev/null | grep -q PONG || { %s && %s; }"
            % (DRIP_PID, DRIP_PID, DRIP_PID, _cli(pw), _start(pw), _wait(pw, True)))
