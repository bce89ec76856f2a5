#!/usr/bin/env python3
"""What parking costs a request: latency of a key's first request (no lease here, it parks and
waits for an urgent exchange with Redis) against a key that keeps its lease (Python 3 stdlib only).

    benches/load/parked.py                      # K = 2000 keys, Redis on loopback
    benches/load/parked.py --delay-ms 1         # every chunk the gateway sends Redis held 1 ms
    TOLLGATE=/path/to/tollgate benches/load/parked.py --keys 500

What it measures, for ONE gateway with `cluster:` on (docs/cluster.md):
  (a) cold: one request for each of K keys in turn, each a key Redis has never seen, on a plan
      of --cold-limit (9) requests per window, too small for credit (a quiet key of a larger
      limit is admitted at once on credit and would not park), so each parks: the request runs
      an urgent exchange at once and waits for its answer (at most timeout_ms), then is
      admitted from the lease the answer brought;
  (b) hot: K requests, back to back, on one key that already holds a lease (warmed up first for
      a few sync intervals at the same pace, so that its lease target covers the pace).
  For each phase: client-side latency p50 / p99 / max and the hot-cold difference (what parking
  adds), requests slower than timeout_ms, statuses other than 200, and from the admin /metrics
  (deltas over the phase): tollgate_cluster_parked_total, the sum / count of
  tollgate_cluster_settle_wait_seconds, exchanges (tollgate_cluster_sync_seconds count), sync
  errors, and tollgate_cluster_redis_calls_total per admitted request (admitted:
  tollgate_requests_total{outcome="forwarded"}; the calls include the heartbeat of every tick,
  ten a second at the 100 ms interval); and the context switches of the gateway's threads
  (/proc/PID/task/*/status) per request, and what a parked request adds to them.

How: starts its own `redis-server` (--save '' --appendonly no), `tollgate stand-in` (the upstream,
200 {}) and the gateway (`tollgate run --config FILE`, binary: TOLLGATE or target/release/tollgate)
on free ports of 127.0.0.1, with a generated config: one plan of --limit (100000) requests per
10 s window (nothing is refused), K keys `parked-key-NNNNN` plus the hot key `parked-hot-key`
(as sha256 digests), `cluster:` on that Redis with sync_interval_ms 100 and timeout_ms 100
(--sync-ms, --timeout-ms). Waits until /readyz answers `ready` and tollgate_cluster_replicas is 1.
Requests are `GET /v2/client/getStatus` with `Authorization: Bearer <key>`, one at a time over a
keep-alive HTTP/1.1 connection (http.client); a `Connection: close` answer is followed by a new
connection, outside the timing.
With --delay-ms D, an asyncio TCP proxy in this script (run as a child process of its own,
`parked.py _proxy ...`, so that it shares no interpreter lock with the client) sits between the
gateway and Redis: each chunk the gateway sends is held D ms before it is forwarded (chunks stay
in order and do not queue behind each other's delay; Redis's answers pass at once), so each round
trip to Redis takes about D ms more; the gateway's redis_url names the proxy. The hold actually
applied is reported (asyncio's timer resolution rounds up to whole ms).
Everything it starts is stopped at the end (SIGTERM, SIGKILL after 5 s), on error and on Ctrl-C
too; the logs go to a temporary directory, removed at the end unless --keep.
"""

import argparse
import asyncio
import glob
import hashlib
import http.client
import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import cluster  # benches/load/cluster.py: its metrics helpers (the script's directory is on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PATH = "/v2/client/getStatus"
HOT_KEY = "parked-hot-key"


def cold_key(i):
    return "parked-key-%05d" % i


# ---------------------------------------------------------------------------------------------
# Ports, processes


def free_ports(n):
    """n free ports on 127.0.0.1, outside the kernel's ephemeral range (as lib.sh picks them)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = map(int, f.read().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    cands = [p for p in range(40000, 50000) if not lo <= p <= hi]
    if len(cands) < 100:
        cands = list(range(max(1024, lo - 12000), lo))
    random.shuffle(cands)
    ports = []
    for p in cands:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
        finally:
            s.close()
        ports.append(p)
        if len(ports) == n:
            return ports
    raise SystemExit("no %d free ports found" % n)


class Procs:
    """Processes started here, stopped in reverse order (SIGTERM, then SIGKILL after 5 s)."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.started = []  # (name, Popen, log file)

    def start(self, name, argv, env=None):
        log = open(os.path.join(self.logdir, name + ".log"), "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        self.started.append((name, p, log))
        return p

    def check_alive(self):
        for name, p, _ in self.started:
            if p.poll() is not None:
                raise RuntimeError("%s exited with %s (log: %s)" % (name, p.returncode, self.log_tail(name)))

    def log_tail(self, name, n=15):
        try:
            with open(os.path.join(self.logdir, name + ".log"), "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n" + "\n".join(lines[-n:])
        except OSError:
            return "(none)"

    def stop_all(self):
        for name, p, log in reversed(self.started):
            if p.poll() is None:
                try:
                    p.terminate()
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    print("%s ignored SIGTERM; killing it" % name, file=sys.stderr)
                    p.kill()
                    p.wait(timeout=5)
                except ProcessLookupError:
                    pass
            log.close()
        self.started = []


def wait_port(port, what, procs, seconds=10):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        procs.check_alive()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s does not listen on 127.0.0.1:%d after %d s" % (what, port, seconds))


# ---------------------------------------------------------------------------------------------
# The delaying proxy (gateway -> Redis chunks held D ms; Redis -> gateway at once)


class DelayProxy:
    """Runs in a child process of this script (`parked.py _proxy ...`), so that its event loop
    shares no interpreter lock with the client's timing; SIGTERM stops it and it writes the
    holds it applied to a file."""

    def __init__(self, listen_port, target_port, delay_s):
        self.listen_port, self.target_port, self.delay = listen_port, target_port, delay_s
        self.holds = []  # seconds each chunk was actually held (bounded sample)
        self.chunks = 0
        self.conns = 0

    def serve(self, stats_path):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        stop = loop.create_future()
        loop.add_signal_handler(signal.SIGTERM, lambda: stop.done() or stop.set_result(None))
        loop.add_signal_handler(signal.SIGINT, lambda: stop.done() or stop.set_result(None))
        server = loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", self.listen_port))
        try:
            loop.run_until_complete(asyncio.wait_for(stop, timeout=24 * 3600))
        except asyncio.TimeoutError:
            pass
        server.close()
        with open(stats_path + ".tmp", "w") as f:
            json.dump({"chunks": self.chunks, "conns": self.conns, "holds": self.holds}, f)
        os.replace(stats_path + ".tmp", stats_path)

    async def _client(self, c_reader, c_writer):
        self.conns += 1
        try:
            r_reader, r_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            c_writer.close()
            return
        loop = asyncio.get_running_loop()
        queue = asyncio.Queue()

        async def up_read():  # gateway -> queue, stamped with when it arrived
            try:
                while True:
                    data = await c_reader.read(65536)
                    if not data:
                        break
                    await queue.put((loop.time(), data))
            finally:
                await queue.put(None)

        async def up_write():  # queue -> Redis, each chunk at its time (in order)
            while True:
                item = await queue.get()
                if item is None:
                    break
                got, data = item
                wait = got + self.delay - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                self.chunks += 1
                if len(self.holds) < 200000:
                    self.holds.append(loop.time() - got)
                r_writer.write(data)
                await r_writer.drain()
            r_writer.close()

        async def down():  # Redis -> gateway, at once
            while True:
                data = await r_reader.read(65536)
                if not data:
                    break
                c_writer.write(data)
                await c_writer.drain()
            c_writer.close()

        parts = [asyncio.ensure_future(x) for x in (up_read(), up_write(), down())]
        try:
            await asyncio.wait(parts, return_when=asyncio.FIRST_COMPLETED)
            # One side ended: let the writer flush what it holds (bounded), then close all.
            await asyncio.wait(parts, timeout=1)
        finally:
            for p in parts:
                p.cancel()
            for w in (c_writer, r_writer):
                try:
                    w.close()
                except Exception:
                    pass


# ---------------------------------------------------------------------------------------------
# Metrics

# The metrics page, read as cluster.py reads it (one parser for both benches).
def scrape(admin_port):
    return cluster.scrape("127.0.0.1:%d" % admin_port)


msum = cluster.msum
delta = cluster.mdelta


def hist_quantile(a, b, name, q):
    """histogram_quantile over the increase between scrapes a and b (linear in the bucket)."""
    return cluster.quantile(q, cluster.buckets(a, b, name))


# ---------------------------------------------------------------------------------------------
# Client


class Client:
    """One keep-alive HTTP/1.1 connection; reconnects (outside the timing) after a close."""

    def __init__(self, port):
        self.port = port
        self.conn = None
        self.reconnects = 0

    def _open(self):
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get(self, key):
        """(status, seconds) of one request."""
        if self.conn is None:
            self._open()
        t0 = time.perf_counter()
        self.conn.request("GET", PATH, headers={"Host": "gw", "Authorization": "Bearer " + key})
        r = self.conn.getresponse()
        r.read()
        took = time.perf_counter() - t0
        if r.will_close:
            self.conn.close()
            self.reconnects += 1
            self._open()
        return r.status, took

    def close(self):
        if self.conn:
            self.conn.close()


def pct(xs, q):
    """Nearest-rank percentile of a sorted list."""
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def summarize(name, lat, statuses, a, b, timeout_s):
    s = sorted(lat)
    admitted = delta(a, b, "tollgate_requests_total", outcome="forwarded")
    calls = delta(a, b, "tollgate_cluster_redis_calls_total")
    return {
        "phase": name,
        "n": len(lat),
        "p50": pct(s, 0.50), "p99": pct(s, 0.99), "max": s[-1], "mean": statistics.fmean(s),
        "slow": sum(1 for x in lat if x > timeout_s),
        "non200": sum(1 for st in statuses if st != 200),
        "admitted": admitted,
        "parked": delta(a, b, "tollgate_cluster_parked_total"),
        "wait_sum": delta(a, b, "tollgate_cluster_settle_wait_seconds_sum"),
        "wait_count": delta(a, b, "tollgate_cluster_settle_wait_seconds_count"),
        "wait_p50": hist_quantile(a, b, "tollgate_cluster_settle_wait_seconds", 0.5),
        "wait_p99": hist_quantile(a, b, "tollgate_cluster_settle_wait_seconds", 0.99),
        "calls": calls,
        "calls_per_admitted": calls / admitted if admitted else float("nan"),
        "exchanges": delta(a, b, "tollgate_cluster_sync_seconds_count"),
        "errors": delta(a, b, "tollgate_cluster_sync_errors_total"),
    }


def switches(pid):
    """Context switches (voluntary and not) of every thread of process `pid` so far."""
    n = 0
    for path in glob.glob("/proc/%d/task/*/status" % pid):
        try:
            with open(path) as f:
                n += sum(int(l.split()[1]) for l in f if l.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))
        except OSError:  # a thread that ended meanwhile
            pass
    return n


def ms(x):
    return "-" if x is None else "%.3f" % (x * 1e3)


# ---------------------------------------------------------------------------------------------
# Main


def config_text(a, gw, admin, up, redis_port, n_keys):
    lines = [
        "# Generated by benches/load/parked.py. parked-key-* and parked-hot-key are PUBLIC TEST KEYS.",
        'listen: "127.0.0.1:%d"' % gw,
        'admin_listen: "127.0.0.1:%d"' % admin,
        'upstream: { base_url: "http://127.0.0.1:%d", read_timeout_ms: 5000 }' % up,
        "limits: { window_seconds: 10 }",
        "plans:",
        "  big: { plan_id: 1, requests_per_window: %d, allow: all }" % a.limit,
        # A limit under 10 per replica gives no credit (docs/cluster.md): each first request parks.
        "  cold: { plan_id: 2, requests_per_window: %d, allow: all }" % a.cold_limit,
        "keys:",
    ]
    for i, key in enumerate([HOT_KEY] + [cold_key(i) for i in range(n_keys)]):
        digest = hashlib.sha256(key.encode()).hexdigest()
        plan = "big" if key == HOT_KEY else "cold"
        lines.append('  - { name: p%05d, sha256: "%s", plan: %s }' % (i, digest, plan))
    lines += [
        'cluster: { redis_url: "redis://127.0.0.1:%d/0", key_prefix: "tgparked", '
        "sync_interval_ms: %d, timeout_ms: %d }" % (redis_port, a.sync_ms, a.timeout_ms),
        "log: { format: text }",
        "shutdown: { drain_seconds: 0, grace_seconds: 0, timeout_seconds: 1 }",
    ]
    return "\n".join(lines) + "\n"


def wait_gateway(admin, procs, seconds=30):
    """Until /readyz answers `ready` and tollgate_cluster_replicas is 1."""
    deadline = time.monotonic() + seconds
    last = "nothing"
    while time.monotonic() < deadline:
        procs.check_alive()
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/readyz" % admin, timeout=1) as r:
                body = r.read().decode().strip()
            if body == "ready":
                reps = msum(scrape(admin), "tollgate_cluster_replicas")
                if reps == 1:
                    return
                last = "ready, tollgate_cluster_replicas %s" % reps
            else:
                last = "readyz %r" % body
        except OSError as e:
            last = repr(e)
        time.sleep(0.1)
    raise RuntimeError("gateway not ready with one replica after %d s (last: %s)" % (seconds, last))


def run(a, tmp, procs, state):
    binary = os.environ.get("TOLLGATE") or os.path.join(ROOT, "target", "release", "tollgate")
    if not os.access(binary, os.X_OK):
        raise SystemExit("no executable gateway at %s (cargo build --release --offline --bin tollgate,"
                         " or set TOLLGATE)" % binary)
    if not shutil.which("redis-server"):
        raise SystemExit("redis-server is needed on the PATH")
    redis_port, up, gw, admin, proxy_port = free_ports(5)
    proxy = None
    gw_redis = redis_port
    procs.start("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no", "--dir", tmp,
                          "--protected-mode", "yes"])
    procs.start("stand-in", [binary, "stand-in", "--listen", "127.0.0.1:%d" % up])
    wait_port(redis_port, "redis-server", procs)
    wait_port(up, "tollgate stand-in", procs)
    if a.delay_ms > 0:
        proxy = os.path.join(tmp, "proxy-stats.json")
        procs.start("proxy", [sys.executable, os.path.abspath(__file__), "_proxy", str(proxy_port),
                              str(redis_port), str(a.delay_ms / 1000.0), proxy])
        wait_port(proxy_port, "the delaying proxy", procs)
        gw_redis = proxy_port
    cfg = os.path.join(tmp, "gateway.yaml")
    with open(cfg, "w") as f:
        f.write(config_text(a, gw, admin, up, gw_redis, a.keys))
    chk = subprocess.run([binary, "check", "--config", cfg], capture_output=True, text=True, timeout=60)
    if chk.returncode != 0:
        raise RuntimeError("generated config refused:\n" + chk.stdout + chk.stderr)
    env = dict(os.environ, TOLLGATE_LOG=os.environ.get("TOLLGATE_LOG", "warn"))
    gateway = procs.start("gateway", [binary, "run", "--config", cfg], env=env)
    wait_gateway(admin, procs)

    print("binary   %s" % binary)
    print("setup    redis :%d%s, stand-in :%d, gateway :%d (admin :%d); %d cold keys; limit %d/10 s;"
          " sync_interval_ms %d, timeout_ms %d; nproc %d, loadavg %s"
          % (redis_port, " via delaying proxy :%d (+%g ms per chunk to Redis)" % (proxy_port, a.delay_ms)
             if proxy else "", up, gw, admin, a.keys, a.limit, a.sync_ms, a.timeout_ms,
             os.cpu_count(), open("/proc/loadavg").read().split()[:3]))
    timeout_s = a.timeout_ms / 1000.0
    client = Client(gw)
    results = []
    try:
        # A throwaway request on the hot key, so that the connection is open and warm.
        client.get(HOT_KEY)
        time.sleep(3 * a.sync_ms / 1000.0)

        # (a) cold: each key's first request parks.
        m0, s0 = scrape(admin), switches(gateway.pid)
        lat, sts = [], []
        for i in range(a.keys):
            st, took = client.get(cold_key(i))
            lat.append(took)
            sts.append(st)
        m1, s1 = scrape(admin), switches(gateway.pid)
        results.append(summarize("cold", lat, sts, m0, m1, timeout_s))
        results[-1]["switches"] = s1 - s0

        # (b) hot: warm the hot key's lease up at the pace of the phase (back to back) for
        # --warm-s seconds (several sync intervals, so that its target covers the pace), then K.
        deadline = time.monotonic() + a.warm_s
        warm = 0
        while time.monotonic() < deadline and warm < 1_000_000:
            client.get(HOT_KEY)
            warm += 1
        m2, s2 = scrape(admin), switches(gateway.pid)
        lat, sts = [], []
        for _ in range(a.keys):
            st, took = client.get(HOT_KEY)
            lat.append(took)
            sts.append(st)
        m3, s3 = scrape(admin), switches(gateway.pid)
        results.append(summarize("hot", lat, sts, m2, m3, timeout_s))
        results[-1]["switches"] = s3 - s2
        procs.check_alive()
    finally:
        client.close()

    print("warm-up  %d requests on the hot key in %.1f s before the hot phase; client reconnects %d"
          % (warm, a.warm_s, client.reconnects))
    print()
    print("| phase | requests | p50 ms | p99 ms | max ms | mean ms | > timeout | non-200 | parked |"
          " settle wait sum ms / count (mean ms) | wait p50 / p99 ms (histogram) | exchanges |"
          " sync errors | Redis calls / admitted |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for r in results:
        mean_wait = r["wait_sum"] / r["wait_count"] if r["wait_count"] else None
        print("| %s | %d | %s | %s | %s | %s | %d | %d | %d | %s / %d (%s) | %s / %s | %d | %d | %.3f (%d / %d) |"
              % (r["phase"], r["n"], ms(r["p50"]), ms(r["p99"]), ms(r["max"]), ms(r["mean"]),
                 r["slow"], r["non200"], r["parked"], ms(r["wait_sum"]), r["wait_count"],
                 ms(mean_wait), ms(r["wait_p50"]), ms(r["wait_p99"]), r["exchanges"], r["errors"],
                 r["calls_per_admitted"], r["calls"], r["admitted"]))
    cold, hot = results
    print()
    print("parking adds (cold - hot): p50 %s ms, p99 %s ms, max %s ms, mean %s ms"
          % (ms(cold["p50"] - hot["p50"]), ms(cold["p99"] - hot["p99"]), ms(cold["max"] - hot["max"]),
             ms(cold["mean"] - hot["mean"])))
    per = lambda r: r["switches"] / r["n"]
    print("context switches of the gateway's threads per request: cold %.2f, hot %.2f; a parked"
          " request adds %.2f" % (per(cold), per(hot), (cold["switches"] - per(hot) * cold["n"])
                                 / max(1, cold["parked"])))
    print("loadavg  %s" % " ".join(open("/proc/loadavg").read().split()[:3]))
    state["proxy_stats"] = proxy
    bad = [r["phase"] for r in results if r["non200"] or r["slow"] or r["errors"]]
    if bad:
        print("NOTE     %s: non-200 answers, requests slower than timeout_ms or sync errors (above)"
              % ", ".join(bad))
    return 1 if any(r["non200"] for r in results) else 0


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "_proxy":  # the delaying proxy's child process
        listen, target, delay, stats = sys.argv[2:]
        DelayProxy(int(listen), int(target), float(delay)).serve(stats)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=2000, help="K: cold keys, and hot requests (2000)")
    ap.add_argument("--delay-ms", type=float, default=0.0,
                    help="hold each chunk the gateway sends Redis this long (a proxy; 0: none)")
    ap.add_argument("--limit", type=int, default=100000, help="the hot key's requests per 10 s window (100000)")
    ap.add_argument("--cold-limit", type=int, default=9,
                    help="the cold keys' requests per 10 s window (9: under 10, no credit, so each parks)")
    ap.add_argument("--sync-ms", type=int, default=100, help="cluster.sync_interval_ms (100)")
    ap.add_argument("--timeout-ms", type=int, default=100, help="cluster.timeout_ms (100)")
    ap.add_argument("--warm-s", type=float, default=0.5,
                    help="seconds of back-to-back warm-up on the hot key (0.5)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, config)")
    a = ap.parse_args()
    if not 1 <= a.keys <= 99999:
        ap.error("--keys must be 1..99999")
    if not 0 <= a.delay_ms <= 1000:
        ap.error("--delay-ms must be 0..1000")
    if not 0 <= a.warm_s <= 60:
        ap.error("--warm-s must be 0..60")

    def on_term(*_):
        raise KeyboardInterrupt()

    # SIGTERM ends the run as Ctrl-C does: through the finally below.
    signal.signal(signal.SIGTERM, on_term)
    tmp = tempfile.mkdtemp(prefix="tollgate-parked.")
    procs = Procs(tmp)
    state = {}
    rc = 1
    try:
        rc = run(a, tmp, procs, state)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
    except Exception as e:
        print("error: %s" % e, file=sys.stderr)
        if procs.started:
            print("gateway log:%s" % procs.log_tail("gateway"), file=sys.stderr)
        rc = 1
    finally:
        procs.stop_all()
        stats = state.get("proxy_stats")
        if stats and os.path.exists(stats):
            with open(stats) as f:
                p = json.load(f)
            h = sorted(p["holds"])
            if h:
                print("proxy    %d chunks to Redis held p50 %s / p99 %s / max %s ms (asked %g ms), %d connections"
                      % (p["chunks"], ms(pct(h, 0.5)), ms(pct(h, 0.99)), ms(h[-1]), a.delay_ms, p["conns"]))
        if a.keep:
            print("logs and config in %s" % tmp, file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
