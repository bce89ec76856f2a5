#!/usr/bin/env python3
"""Creates a second through the admin API (`POST /api/keys`), on one replica.

Starts the release binary (target/release/tollgate) on free loopback ports with the keys kept
in memory, at `state.path`, in a Redis this script starts, or in both (a fleet's replica that
keeps its own copy; `--store memory|disk|redis|both`),
then posts new keys from `--clients` connections (keep-alive) for `--seconds`, and prints
creates a second, the p50/p99/max of a create, and the gateway's RSS per issued key.

With `--keys N` it creates N keys whatever the time; with `--restart` it then stops the gateway
(SIGTERM), starts it again on the same store and prints how long the start took until the last
key created authenticates on the main listener (the issued keys are in force), and the RSS per
key after that start (at once, and 15 s later: `settled_`). The keys are put in force in their
digests' order, so the last key created may authenticate before others are in force: with
`--log F`, `in_force_s` is when the gateway logged that all of them are, from its start.

With `--dir D` the store (and the config) are kept in D after the run; `--start-only` then
times only a start on what an earlier run left in D (no keys created), so that a start at a
million keys can be measured again and again without creating them each time, with the CPU
the gateway has used by the time the last key authenticates (`gateway_cpu_s`) and, with a
Redis, the Redis's CPU over the start (`redis_cpu_s`); `--idle S`
then says how much CPU the gateway spends, with no request, over S seconds. With
`--store redis` (or `both`) the run waits, after the last create, until the set's compact copy
in Redis is of use to a start (`copy_wait_s`, `copy_behind`: docs/cluster.md, "The compact
copy"), and the Redis's data is saved in D too (`redis.rdb`), and a start-only
run starts a Redis on it and waits until it has loaded before it times the gateway's start.
Loading it reads the file through the kernel's page cache, which on a small guest may let go
of `state.db`'s pages: with `--store both --start-only --redis-down` no Redis is started (the
replica's cluster store does not answer) and the start from the copy at `state.path` is timed
alone, the file in the page cache after the first run.

    python3 benches/load/issue.py --store disk --seconds 10
    python3 benches/load/issue.py --store disk --keys 1000000 --restart
    python3 benches/load/issue.py --store disk --keys 1000000 --dir /tmp/m1
    python3 benches/load/issue.py --store disk --dir /tmp/m1 --start-only [--idle 30]
    python3 benches/load/issue.py --store redis --keys 1000000 --dir /tmp/r1
    python3 benches/load/issue.py --store redis --dir /tmp/r1 --start-only
    python3 benches/load/issue.py --store both --keys 1000000 --dir /tmp/b1
    python3 benches/load/issue.py --store both --dir /tmp/b1 --start-only [--redis-down]
"""
import argparse
import datetime
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, limit=30):
    end = time.time() + limit
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on {port} after {limit} s")


def redis_call(port, *words):
    """One command to the Redis on `port`: the first line of its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        cmd = b"*%d\r\n" % len(words) + b"".join(
            b"$%d\r\n%s\r\n" % (len(w.encode()), w.encode()) for w in words)
        s.sendall(cmd)
        return s.makefile("rb").readline().decode().strip()


def wait_loaded(port, limit=600):
    """Wait until the Redis on `port` has loaded its data (PING answers, not -LOADING)."""
    end = time.time() + limit
    while time.time() < end:
        if redis_call(port, "PING") == "+PONG":
            return
        time.sleep(0.05)
    sys.exit(f"the Redis on {port} did not load its data within {limit} s")


def redis_value(port, *words):
    """One command to the Redis on `port`: its answer, a bulk string (None for nil) or an
    integer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"*%d\r\n" % len(words) + b"".join(
            b"$%d\r\n%s\r\n" % (len(w.encode()), w.encode()) for w in words))
        f = s.makefile("rb")
        line = f.readline().decode().strip()
        if line.startswith(":"):
            return int(line[1:])
        if line.startswith("$"):
            return None if line == "$-1" else f.readline().decode().strip()
        sys.exit(f"redis answered {line}")


def wait_copy(port, limit=180):
    """Wait until the set's compact copy in the Redis on `port` is of use to a start (the
    log names at most half a delta's fields since it; a replica writes it again when more
    have changed, at most once a minute): how long that took and how far behind it is."""
    t0 = time.time()
    while time.time() - t0 < limit:
        version = redis_value(port, "HGET", "{issue:ov}:compact", "version")
        if version is not None:
            behind = redis_value(port, "ZCOUNT", "{issue:ov}:log", f"({version}", "+inf")
            if behind <= 5000:
                return {"copy_wait_s": round(time.time() - t0, 1), "copy_behind": behind}
        time.sleep(0.5)
    return {"copy_wait_s": None}


def stop_all(*procs):
    """Terminate each process given (None: none) and wait for it."""
    for p in procs:
        if p:
            p.terminate()
            p.wait()


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# Seconds after a start is ready before its RSS is read again: memory the start freed (a
# million records read in batches, the vector they were gathered in) goes back to the system
# when the allocator purges it, some seconds later (mimalloc: within 15 s here).
SETTLE_S = 15


def cpu_s(pid):
    """The CPU time (user and system) the process `pid` has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The line a start logs once every key kept is in force: from `state.path`, from the copy of
# the fleet's set kept there (`--store both`), or from the cluster's Redis (its first whole
# read).
IN_FORCE_LINES = ("the changes kept at state.path put in force",
                  "the copy of the cluster's overrides kept at state.path put in force",
                  "the cluster store's overrides read whole")


def in_force_s(log, since, within):
    """Seconds from `since` (wall clock) to the first line of `IN_FORCE_LINES` the gateway
    logged in the file `log` after it; None when none comes within `within` seconds."""
    end = time.time() + within
    while time.time() < end:
        with open(log, errors="replace") as f:
            for line in f:
                if not any(m in line for m in IN_FORCE_LINES):
                    continue
                stamp = line.split(" ", 1)[0].rstrip("Z")
                at = datetime.datetime.fromisoformat(stamp).replace(
                    tzinfo=datetime.timezone.utc).timestamp()
                if at >= since:
                    return round(at - since, 2)
        time.sleep(0.05)
    return None


def time_start(start, listen, secret, within):
    """Start the gateway and time it until `secret` (the last key created) authenticates on
    the main listener: the upstream (port 9) is closed, so the answer is then a 502, not a
    401. At most `within` seconds (then the time is None). The keys are put in force in their
    digests' order, so that key may be in force before others: `in_force_s` (from the log)
    says when all are."""
    t0 = time.perf_counter()
    gw = start()
    wait_port(listen, 600)
    while time.perf_counter() - t0 < within:
        conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=10)
        conn.request("POST", "/v2/sendMessage/", '{"chatId":"1@c.us","message":"hi"}',
                     {"Authorization": "Bearer " + secret, "Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        if status != 401:
            return gw, round(time.perf_counter() - t0, 2)
        time.sleep(0.01)
    return gw, None


def ready_s(admin, since, within):
    """Seconds from `since` (wall clock) until the admin listener's `/readyz` is seen to
    answer 200 (a replica that keeps no copy of its own is `starting` until its first read of
    the fleet's set is in force), polled from when it is called (after the last key created
    authenticates: a start ready before that is timed then); None when it does not answer 200
    within `within` seconds."""
    while time.time() - since < within:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
            conn.request("GET", "/readyz")
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return round(time.time() - since, 2)
        except OSError:
            pass
        time.sleep(0.01)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", choices=["memory", "disk", "redis", "both"], default="memory")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--binary", default=os.path.join(ROOT, "target/release/tollgate"))
    ap.add_argument("--keys", type=int, default=0, help="create this many keys (no time limit)")
    ap.add_argument("--restart", action="store_true",
                    help="then restart the gateway and time its start until the keys are in force")
    ap.add_argument("--log", help="append the gateway's log (at info) to this file: a "
                    "whole read of the cluster's set logs its fields and times")
    ap.add_argument("--ready-within", type=float, default=120,
                    help="give up waiting for the restarted gateway after this many seconds")
    ap.add_argument("--names", default="c",
                    help="the keys' names start with this (another than an earlier run's, to "
                    "create more keys in its --dir)")
    ap.add_argument("--idle", type=float, default=0,
                    help="with --start-only: then the CPU the gateway spends over this many "
                    "seconds with no request (its background work at this many keys)")
    ap.add_argument("--dir", help="keep the store and config in this directory (not removed)")
    ap.add_argument("--start-only", action="store_true",
                    help="with --dir: only time a start on what an earlier run left there")
    ap.add_argument("--redis-down", action="store_true",
                    help="with --store both --start-only: start no Redis (the start from the "
                    "copy at state.path alone)")
    args = ap.parse_args()
    if args.redis_down and not (args.start_only and args.store == "both"):
        sys.exit("--redis-down is for --store both --start-only")
    if args.start_only and not args.dir:
        sys.exit("--start-only needs --dir, the directory of an earlier run")
    if args.start_only and args.store == "memory":
        sys.exit("--start-only reads a store kept in --dir: --store disk, redis or both")
    if args.dir:
        os.makedirs(args.dir, exist_ok=True)
    work = os.path.abspath(args.dir) if args.dir else tempfile.mkdtemp(prefix="tg-issue-")
    listen, admin = free_port(), free_port()
    extra = ""
    redis = None
    if args.store in ("disk", "both"):
        extra = f"state: {{ path: \"{work}/state.db\" }}\n"
    if args.redis_down:
        extra += f"cluster: {{ redis_url: \"redis://127.0.0.1:{free_port()}\", key_prefix: \"issue\" }}\n"
    elif args.store in ("redis", "both"):
        rport = free_port()
        # Saved only when asked (at the end of a --dir run): the run's own writes are not
        # slowed by snapshots.
        redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no", "--dir", work,
                                  "--dbfilename", "redis.rdb"], stdout=subprocess.DEVNULL)
        wait_port(rport)
        wait_loaded(rport)
        extra += f"cluster: {{ redis_url: \"redis://127.0.0.1:{rport}\", key_prefix: \"issue\" }}\n"
    config = f"""listen: "127.0.0.1:{listen}"
admin_listen: "127.0.0.1:{admin}"
upstream: {{ base_url: "http://127.0.0.1:9" }}
plans:
  basic: {{ plan_id: 1, requests_per_window: 40, allow: all }}
{extra}"""
    path = os.path.join(work, "gw.yaml")
    with open(path, "w") as f:
        f.write(config)
    # The gateway's log level: TOLLGATE_LOG from the environment when set (e.g. to see a
    # start's debug lines), else info with --log, warn without.
    env = dict(os.environ)
    env.setdefault("TOLLGATE_LOG", "info" if args.log else "warn")
    log = open(args.log, "ab") if args.log else subprocess.DEVNULL

    def start():
        return subprocess.Popen([args.binary, "run", "--config", path], env=env,
                                stdout=log, stderr=log)

    if args.start_only:
        with open(os.path.join(work, "last.json")) as f:
            last = json.load(f)
        since = time.time()
        redis_cpu = cpu_s(redis.pid) if redis else None
        gw, ready = time_start(start, listen, last["secret"], args.ready_within)
        try:
            # CPU spent by the time the last key authenticates: the gateway's, and the Redis's
            # over the start (on a small guest the two share the CPUs).
            cpu_at_ready = {"gateway_cpu_s": round(cpu_s(gw.pid), 2)}
            if redis:
                cpu_at_ready["redis_cpu_s"] = round(cpu_s(redis.pid) - redis_cpu, 2)
            per_key = lambda: round(rss_kb(gw.pid) * 1024 / last["keys"])
            ready_at = ready_s(admin, since, args.ready_within)
            in_force = in_force_s(args.log, since, args.ready_within) if args.log else None
            at_ready = per_key()
            time.sleep(SETTLE_S)
            out = {"store": args.store, "keys": last["keys"], "restart_ready_s": ready,
                   "readyz_s": ready_at, "in_force_s": in_force, "rss_bytes_per_key_with_base": at_ready,
                   "settled_rss_bytes_per_key_with_base": per_key(), **cpu_at_ready}
            if args.idle:
                before = cpu_s(gw.pid)
                time.sleep(args.idle)
                out["idle_cpu_ms_per_s"] = round((cpu_s(gw.pid) - before) * 1000 / args.idle, 2)
            print(json.dumps(out))
        finally:
            stop_all(gw, redis)
        return
    gw = start()
    try:
        wait_port(admin)
        base_rss = rss_kb(gw.pid)
        done, lat, errors = [0], [], []
        lock = threading.Lock()
        stop = time.time() + (10 ** 9 if args.keys else args.seconds)
        per_client = -(-args.keys // args.clients) if args.keys else None
        last = {}

        def client(c):
            conn = http.client.HTTPConnection("127.0.0.1", admin, timeout=10)
            i = 0
            mine = []
            while time.time() < stop and (per_client is None or i < per_client):
                body = json.dumps({"name": f"{args.names}{c}-{i:08d}", "plan": "basic"})
                t = time.perf_counter()
                conn.request("POST", "/api/keys", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                answer = r.read()
                mine.append(time.perf_counter() - t)
                if r.status != 201:
                    errors.append(r.status)
                elif c == 0:
                    last["secret"] = json.loads(answer)["key"]
                i += 1
            with lock:
                done[0] += len(mine) - 0
                lat.extend(mine)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.time() - t0
        lat.sort()
        n = len(lat) - len(errors)
        rss = rss_kb(gw.pid)
        out = {
            "store": args.store,
            "clients": args.clients,
            "creates": n,
            "errors": len(errors),
            "creates_per_s": round(n / took),
            "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
            "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2) if lat else None,
            "max_ms": round(lat[-1] * 1000, 2) if lat else None,
            "over_1s": sum(1 for x in lat if x > 1),
            "rss_bytes_per_key": round((rss - base_rss) * 1024 / n) if n else None,
        }
        if redis:
            out.update(wait_copy(rport))
        if args.dir and "secret" in last:
            with open(os.path.join(work, "last.json"), "w") as f:
                json.dump({"secret": last["secret"], "keys": n}, f)
            if redis:
                redis_call(rport, "SAVE")
        if args.restart and "secret" in last:
            gw.terminate()
            gw.wait()
            since = time.time()
            gw, ready = time_start(start, listen, last["secret"], args.ready_within)
            out["restart_ready_s"] = ready
            if args.log:
                out["in_force_s"] = in_force_s(args.log, since, args.ready_within)
            out["restart_rss_bytes_per_key"] = round((rss_kb(gw.pid) - base_rss) * 1024 / n)
            time.sleep(SETTLE_S)
            out["settled_rss_bytes_per_key"] = round((rss_kb(gw.pid) - base_rss) * 1024 / n)
        print(json.dumps(out))
    finally:
        stop_all(gw, redis)
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
