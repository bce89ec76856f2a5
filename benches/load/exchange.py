#!/usr/bin/env python3
"""What the shared budgets' exchange costs Redis as keys and replicas grow (issue 28).

    exchange.py --redis-port P --redis-pid PID [--active "1000 10000 100000"] [--replicas "1 3 10"]
                [--interval-ms 100] [--rounds 20] [--out results.csv]

Drives a real redis-server (started by exchange.sh) with exactly the calls a fleet of
gateways makes each sync interval when A keys were active in it on every replica (the worst
case: every active key has something to say at every tick on every replica): each replica
sends its A keys to `budget.lua` (src/shared/budget.lua, loaded with SCRIPT LOAD), 128 keys
per EVALSHA with the packed arguments the gateway sends (want 1, a 150-per-10-s key), every
call of the exchange in one pipeline, one connection per replica, the replicas' pipelines in
flight together; and the heartbeat script once per replica. A round is one interval's
exchanges of every replica; rounds start every interval, or at once when the last one took
longer (then Redis is past its knee: it cannot serve that many keys per interval).

Per (A, R) it reports: Redis CPU per key call (utime + stime of the redis-server process,
/proc/PID/stat, over the rounds, divided by the key calls: R × A × rounds), the round's wall
time p50 / max against the interval, Redis's used_memory and DBSIZE after. And, once, the
cost of the same key calls one key per EVALSHA (as a Redis Cluster gets them: one slot per
call) against 128 per call.

Standard library only. The client's own CPU is not Redis's: exchange.sh pins them to
different CPUs.
"""

import argparse
import os
import socket
import statistics
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BUDGET_LUA = os.path.join(HERE, "..", "..", "src", "shared", "budget.lua")
HEARTBEAT_LUA = os.path.join(HERE, "..", "..", "src", "shared", "heartbeat.lua")
BATCH = 128
CLK_TCK = os.sysconf("SC_CLK_TCK")


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.at = 0

    def _need(self, n):
        while len(self.buf) - self.at < n:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise SystemExit("redis closed the connection")
            self.buf = self.buf[self.at:] + chunk
            self.at = 0

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n", self.at)
            if i >= 0:
                line = self.buf[self.at:i]
                self.at = i + 2
                return line
            self._need(len(self.buf) - self.at + 1)

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise SystemExit("redis error: %s" % rest.decode())
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            self._need(n + 2)
            v = self.buf[self.at:self.at + n]
            self.at += n + 2
            return v
        if kind == b"*":
            return [self.reply() for _ in range(int(rest))]
        raise SystemExit("unexpected reply %r" % line)

    def call(self, *args):
        self.s.sendall(resp(*args))
        return self.reply()


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def info_field(conn, section, field):
    text = conn.call("INFO", section).decode()
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    return 0


def exchange_bytes(sha, beat_sha, replica, keys, per_call):
    """One replica's exchange: the heartbeat and every budget call, as one pipeline."""
    interval_us = 10_000_000 // 150  # a 150-per-10-s key
    args = struct.pack("<6Q", 1, 0, 0, interval_us, 150, 0)
    parts = [resp("EVALSHA", beat_sha, 1, "tgx:fleet", "replica-%d" % replica, 30000)]
    for at in range(0, len(keys), per_call):
        chunk = keys[at:at + per_call]
        parts.append(resp("EVALSHA", sha, len(chunk), *chunk, 20000, args * len(chunk)))
    return b"".join(parts), 1 + (len(keys) + per_call - 1) // per_call


def run(conns, sha, beat_sha, replicas, active, per_call, interval, rounds, redis_pid):
    keys = ["tgx:b:{%032x}" % i for i in range(active)]
    payloads = [exchange_bytes(sha, beat_sha, r, keys, per_call) for r in range(replicas)]
    walls = []
    t0 = cpu_ticks(redis_pid)
    started = time.monotonic()
    for n in range(rounds):
        due = started + n * interval
        now = time.monotonic()
        if now < due:
            time.sleep(due - now)
        begin = time.monotonic()
        for c, (payload, _) in zip(conns, payloads):
            c.s.sendall(payload)
        for c, (_, replies) in zip(conns, payloads):
            for _ in range(replies):
                c.reply()
        walls.append(time.monotonic() - begin)
    ticks = cpu_ticks(redis_pid) - t0
    calls = replicas * active * rounds
    return {
        "redis_cpu_us_per_key": ticks / CLK_TCK * 1e6 / calls,
        "round_p50_ms": statistics.median(walls) * 1e3,
        "round_max_ms": max(walls) * 1e3,
        "redis_cpu_pct": ticks / CLK_TCK / (time.monotonic() - started) * 100,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-port", type=int, required=True)
    ap.add_argument("--redis-pid", type=int, required=True)
    ap.add_argument("--active", default="1000 10000 100000")
    ap.add_argument("--replicas", default="1 3 10")
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    admin = Conn(a.redis_port)
    sha = admin.call("SCRIPT", "LOAD", open(BUDGET_LUA).read()).decode()
    beat_sha = admin.call("SCRIPT", "LOAD", open(HEARTBEAT_LUA).read()).decode()
    interval = a.interval_ms / 1e3
    rows = []
    print("| active keys per interval | replicas | key calls per interval | Redis CPU per key call | "
          "Redis CPU | round p50 / max (interval %d ms) | used_memory | keys in Redis |" % a.interval_ms)
    print("|---:|---:|---:|---:|---:|---|---:|---:|")
    for active in [int(x) for x in a.active.split()]:
        for replicas in [int(x) for x in a.replicas.split()]:
            admin.call("FLUSHALL")
            conns = [Conn(a.redis_port) for _ in range(replicas)]
            # One round first (unmeasured): the keys exist, as in a steady fleet.
            run(conns, sha, beat_sha, replicas, active, BATCH, 0, 1, a.redis_pid)
            r = run(conns, sha, beat_sha, replicas, active, BATCH, interval, a.rounds, a.redis_pid)
            mem = info_field(admin, "memory", "used_memory")
            dbsize = int(admin.call("DBSIZE"))
            for c in conns:
                c.s.close()
            rows.append((active, replicas, r, mem, dbsize))
            late = "" if r["round_max_ms"] <= a.interval_ms else " **past the interval**"
            print("| %d | %d | %d | %.2f µs | %.0f %% | %.1f / %.1f ms%s | %.1f MB | %d |" % (
                active, replicas, active * replicas, r["redis_cpu_us_per_key"], r["redis_cpu_pct"],
                r["round_p50_ms"], r["round_max_ms"], late, mem / 1e6, dbsize))
            sys.stdout.flush()
    # One key per call (a Redis Cluster's calls) against 128 per call, same keys.
    admin.call("FLUSHALL")
    conns = [Conn(a.redis_port)]
    run(conns, sha, beat_sha, 1, 10000, 1, 0, 1, a.redis_pid)
    one = run(conns, sha, beat_sha, 1, 10000, 1, 0, 5, a.redis_pid)
    batched = run(conns, sha, beat_sha, 1, 10000, BATCH, 0, 5, a.redis_pid)
    print("\nRedis CPU per key call, 10,000 keys: %.2f µs one key per EVALSHA (a Redis Cluster's calls), "
          "%.2f µs 128 per call (a single Redis's)" % (one["redis_cpu_us_per_key"], batched["redis_cpu_us_per_key"]))
    if a.out:
        with open(a.out, "w") as f:
            f.write("active,replicas,redis_cpu_us_per_key,redis_cpu_pct,round_p50_ms,round_max_ms,used_memory,dbsize\n")
            for active, replicas, r, mem, dbsize in rows:
                f.write("%d,%d,%.3f,%.1f,%.2f,%.2f,%d,%d\n" % (
                    active, replicas, r["redis_cpu_us_per_key"], r["redis_cpu_pct"], r["round_p50_ms"],
                    r["round_max_ms"], mem, dbsize))
            f.write("#one_key_per_call_us,%.3f\n#batched_us,%.3f\n" % (one["redis_cpu_us_per_key"], batched["redis_cpu_us_per_key"]))


if __name__ == "__main__":
    main()
