#!/usr/bin/env python3
"""Shared rate-limit budgets across replicas: load client and report (benches/load/cluster.sh
runs it; Python 3 stdlib only).

Two commands:

  keys     Print the bench keys as YAML list items for the generated config (`keys:`), so that
           the key table has one source: K keys named k001…, `load-key-001`…, the plans in
           equal thirds (basic, standard, pro), the load multiples cycling over the keys (key i
           gets MULTS[i % len(MULTS)]), so that every group of the default 30 mixes all plans.

  run      Drive the traffic and write the report:
           1. waits until every replica's `tollgate_cluster_replicas` gauge says the whole
              fleet and `tollgate_cluster_store_up` is 1; reads every replica's /metrics and
              resets Redis's statistics (CONFIG RESETSTAT);
           2. for --duration seconds, sends each key's requests evenly paced at its multiple
              of its limit (period W / (m·L), a random phase in [0, period)), open loop: each
              request is its own task on a pool of keep-alive HTTP/1.1 connections per
              replica (a new connection when none is idle), to the replica the split picks:
                even    every request to a replica drawn uniformly at random,
                skew80  80 % to replica 1, 10 % to each of the others (3 replicas),
                sticky  key i always to replica (i + i div len(MULTS)) mod R (so that each
                        group spreads over the replicas);
              it records per request: scheduled time, send time (just before the write), key,
              replica, status (0: no answer), time of the answer;
           3. waits for the answers and two sync intervals, reads /metrics and Redis again;
           4. computes per key: sent, admitted by the fleet (200), admitted by the one-process
              reference (GCRA with T = ceil(W/L) ns, tolerance L·T, replayed over the same send
              times), their ratio, and the worst sliding window excess (see window_excess);
              per group (multiple) and in total; and the fleet's cost in Redis calls;
           5. prints the report (markdown) and writes report.md and results.json (summary)
              and requests.json (every request, columnar per key) to --out.
"""

import argparse
import asyncio
import bisect
import json
import math
import os
import random
import re
import resource
import socket
import statistics
import sys
import time
import urllib.request

PLANS = [("basic", 1, 40), ("standard", 2, 70), ("pro", 3, 150)]
NS = 1_000_000_000


# ---------------------------------------------------------------------------------------------
# Keys


def key_table(n_keys, mults):
    """[(name, secret, plan, limit, mult)] for n_keys keys."""
    table = []
    for i in range(n_keys):
        plan, _, limit = PLANS[min(len(PLANS) - 1, i * len(PLANS) // n_keys)]
        mult = mults[i % len(mults)]
        table.append((f"k{i + 1:03d}", f"load-key-{i + 1:03d}", plan, limit, mult))
    return table


def parse_mults(text):
    mults = [float(m) for m in text.replace(",", " ").split()]
    if not mults or any(m <= 0 for m in mults):
        raise SystemExit(f"MULTS must be positive numbers: {text!r}")
    return mults


# ---------------------------------------------------------------------------------------------
# Metrics and Redis

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(admin):
    """Prometheus text from http://admin/metrics as {(name, frozenset(labels)): value}."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            pass
    return out


def msum(snap, name, **want):
    total = 0.0
    for (n, labels), v in snap.items():
        if n == name and all((k, val) in labels for k, val in want.items()):
            total += v
    return total


def mdelta(before, after, name, **want):
    return msum(after, name, **want) - msum(before, name, **want)


def buckets(before, after, name):
    """[(le, cumulative count)] of a histogram's increase between two scrapes."""
    out = {}
    for (n, labels), v in after.items():
        if n != name + "_bucket":
            continue
        le = dict(labels)["le"]
        le = math.inf if le == "+Inf" else float(le)
        out[le] = out.get(le, 0.0) + v - before.get((n, labels), 0.0)
    return sorted(out.items())


def quantile(q, bks):
    """histogram_quantile as Prometheus does it: linear within the bucket."""
    if not bks or bks[-1][1] <= 0:
        return None
    rank = q * bks[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in bks:
        if c >= rank:
            if le == math.inf:
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return None


def bucket_of(q, bks):
    """(lower, upper] bounds of the bucket holding the q-quantile."""
    if not bks or bks[-1][1] <= 0:
        return None
    rank = q * bks[-1][1]
    prev = 0.0
    for le, c in bks:
        if c >= rank:
            return (prev, le)
        prev = le
    return None


def redis_cmd(addr, *args):
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        msg = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = str(a).encode()
            msg.append(b"$%d\r\n%s\r\n" % (len(b), b))
        s.sendall(b"".join(msg))
        f = s.makefile("rb")

        def read():
            line = f.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = f.read(n + 2)[:-2]
                return data.decode()
            if kind == b"*":
                return [read() for _ in range(int(rest))]
            raise RuntimeError(f"unexpected reply {line!r}")

        return read()


def redis_info(addr, section):
    out = {}
    for line in redis_cmd(addr, "INFO", section).splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            out[k] = v
    return out


def commandstats(addr):
    """{command: {calls, usec, usec_per_call, ...}} from INFO commandstats."""
    out = {}
    for k, v in redis_info(addr, "commandstats").items():
        if k.startswith("cmdstat_"):
            out[k[len("cmdstat_"):]] = {
                a: (float(b) if "." in b else int(b))
                for a, b in (kv.split("=") for kv in v.split(","))
            }
    return out


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ---------------------------------------------------------------------------------------------
# Traffic


class Pool:
    """Keep-alive HTTP/1.1 connections to one replica; a new one whenever none is idle."""

    def __init__(self, host, port):
        self.host, self.port = host, port
        self.idle = []
        self.opened = 0

    async def get(self, fresh=False):
        """A connection, and whether it was reused (kept alive since an earlier answer)."""
        if self.idle and not fresh:
            return self.idle.pop(), True
        self.opened += 1
        return await asyncio.open_connection(self.host, self.port), False

    def put(self, conn):
        self.idle.append(conn)


async def read_answer(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length, chunked, close = 0, False, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif name == b"connection" and b"close" in value.lower():
            close = True
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status, close


class Recorder:
    def __init__(self, n_keys):
        # Per key: scheduled ns, sent ns, replica, status, answered ns.
        self.sched = [[] for _ in range(n_keys)]
        self.sent = [[] for _ in range(n_keys)]
        self.replica = [[] for _ in range(n_keys)]
        self.status = [[] for _ in range(n_keys)]
        self.done = [[] for _ in range(n_keys)]
        self.retries = 0
        self.failures = {}

    def start(self, k, sched, replica):
        i = len(self.sent[k])
        self.sched[k].append(sched)
        self.sent[k].append(0)
        self.replica[k].append(replica)
        self.status[k].append(0)
        self.done[k].append(0)
        return i


async def send(pool, request, rec, k, i):
    """One request; once more on a new connection when a reused one was closed under it (the
    keep-alive race: the server closed it just as this request was written, e.g. after its
    `max_requests_per_connection`)."""
    for attempt in (0, 1):
        try:
            conn, reused = await pool.get(fresh=attempt > 0)
        except OSError as e:
            rec.sent[k][i] = time.monotonic_ns()
            rec.failures[type(e).__name__] = rec.failures.get(type(e).__name__, 0) + 1
            return
        reader, writer = conn
        rec.sent[k][i] = time.monotonic_ns()
        try:
            writer.write(request)
            status, close = await read_answer(reader)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            writer.close()
            unanswered = isinstance(e, (ConnectionError, asyncio.IncompleteReadError)) and (
                not isinstance(e, asyncio.IncompleteReadError) or not e.partial)
            if reused and unanswered and attempt == 0:
                rec.retries += 1
                continue
            rec.failures[type(e).__name__] = rec.failures.get(type(e).__name__, 0) + 1
            return
        rec.status[k][i] = status
        rec.done[k][i] = time.monotonic_ns()
        if close:
            writer.close()
        else:
            pool.put(conn)
        return


def chooser(split, n_replicas, n_mults, rng):
    if split == "even":
        return lambda k: rng.randrange(n_replicas)
    if split == "skew80":
        rest = n_replicas - 1

        def pick(k):
            if rest == 0 or rng.random() < 0.8:
                return 0
            return 1 + rng.randrange(rest)

        return pick
    if split == "sticky":
        # Not k mod R: with R = len(MULTS) every group would land on one replica.
        return lambda k: (k + k // n_mults) % n_replicas
    raise SystemExit(f"unknown SPLIT {split!r}: even, skew80 or sticky")


async def drive(args, table, gateways, rec):
    loop = asyncio.get_running_loop()
    rng = random.Random(args.seed)
    pick = chooser(args.split, len(gateways), len(parse_mults(args.mults)), rng)
    pools = []
    for g in gateways:
        host, port = g.rsplit(":", 1)
        pools.append(Pool(host, int(port)))
    tasks = set()
    requests = [
        (f"GET /v2/client/getStatus HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: tollgate-cluster-bench\r\n"
         f"Authorization: Bearer {secret}\r\n\r\n").encode()
        for (_, secret, _, _, _) in table
    ]
    t0_loop = loop.time() + 0.2
    t0_ns = time.monotonic_ns() + int(0.2 * NS)

    async def key_task(k):
        _, _, _, limit, mult = table[k]
        period = args.window / (mult * limit)
        phase = rng.random() * period
        i = 0
        while True:
            offset = phase + i * period
            if offset >= args.duration:
                break
            delay = t0_loop + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            r = pick(k)
            j = rec.start(k, t0_ns + int(offset * NS), r)
            t = asyncio.ensure_future(send(pools[r], requests[k], rec, k, j))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1

    loads = []

    async def sample_load():
        while True:
            loads.append(loadavg())
            await asyncio.sleep(5)

    sampler = asyncio.ensure_future(sample_load())
    await asyncio.gather(*(key_task(k) for k in range(len(table))))
    end_ns = t0_ns + int(args.duration * NS)
    if tasks:
        await asyncio.wait(set(tasks), timeout=10)
    for t in list(tasks):
        t.cancel()
    sampler.cancel()
    for p in pools:
        for _, w in p.idle:
            w.close()
    return t0_ns, end_ns, [p.opened for p in pools], loads


# ---------------------------------------------------------------------------------------------
# Analysis


def gcra(times, limit, window_s):
    """Admitted flags of one process's GCRA over sorted send times (ns)."""
    T = -(-window_s * NS // limit)
    tol = limit * T
    tat = 0
    out = []
    for now in times:
        nxt = max(tat, now) + T
        if nxt - now <= tol:
            tat = nxt
            out.append(True)
        else:
            out.append(False)
    return out


def count(sorted_times, lo, hi):
    """Elements in [lo, hi)."""
    return bisect.bisect_left(sorted_times, hi) - bisect.bisect_left(sorted_times, lo)


def window_excess(fleet, ref, window_ns, slack_ns, lo, hi):
    """Worst excess of the fleet over one process in a sliding window, and where.

    For a window start s: fleet admissions in [s, s+W), minus one-process admissions in
    [s - slack, s+W) (the slack, one sync interval plus 20 ms, forgives the fleet's lag), minus
    max(0, one-process - fleet admissions in [s-W, s)) (what the fleet left unspent in the
    window before, which GCRA lets it spend now). Evaluated at every start where a term can
    change: each fleet admission f (and f - W + 1 ns, where it enters the window), each
    one-process admission r + slack + 1 ns and r + W + 1 ns (where it leaves a term); starts
    within [lo, hi].
    """
    cands = set()
    for f in fleet:
        cands.add(f)
        cands.add(f - window_ns + 1)
    for r in ref:
        cands.add(r + slack_ns + 1)
        cands.add(r + window_ns + 1)
    best, at = -math.inf, None
    for s in cands:
        if s < lo or s > hi:
            continue
        f_now = count(fleet, s, s + window_ns)
        r_now = count(ref, s - slack_ns, s + window_ns)
        unspent = max(0, count(ref, s - window_ns, s) - count(fleet, s - window_ns, s))
        e = f_now - r_now - unspent
        if e > best:
            best, at = e, s
    if at is None:
        return 0, None
    return best, at


def pct(values, q):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def analyse(args, table, rec, t0_ns, end_ns):
    window_ns = int(args.window * NS)
    slack_ns = int((args.sync_ms + 20) * 1_000_000)
    keys = []
    lateness, latency = [], []
    for k, (name, _, plan, limit, mult) in enumerate(table):
        # A request cancelled before its connection opened has no send time: its schedule.
        times = [t or s for t, s in zip(rec.sent[k], rec.sched[k])]
        order = sorted(range(len(times)), key=lambda i: times[i])
        sent = [times[i] for i in order]
        status = [rec.status[k][i] for i in order]
        ref_ok = gcra(sent, limit, args.window)
        fleet_t = [t for t, s in zip(sent, status) if s == 200]
        ref_t = [t for t, ok in zip(sent, ref_ok) if ok]
        lo = sent[0] if sent else t0_ns
        hi = sent[-1] if sent else end_ns
        worst, at = window_excess(fleet_t, ref_t, window_ns, slack_ns, lo, hi)
        for i in range(len(rec.sent[k])):
            lateness.append(times[i] - rec.sched[k][i])
            if rec.done[k][i]:
                latency.append(rec.done[k][i] - rec.sent[k][i])
        per_replica = {}
        for r, s in zip(rec.replica[k], rec.status[k]):
            d = per_replica.setdefault(r, {"sent": 0, "admitted": 0})
            d["sent"] += 1
            d["admitted"] += s == 200
        keys.append({
            "key": name, "plan": plan, "limit": limit, "mult": mult,
            "intended_rps": mult * limit / args.window,
            "achieved_rps": len(sent) / args.duration,
            "sent": len(sent),
            "fleet": len(fleet_t),
            "one_process": len(ref_t),
            "refused": sum(1 for s in status if s == 429),
            "errors": sum(1 for s in status if s not in (200, 429)),
            "statuses": {str(s): status.count(s) for s in sorted(set(status))},
            "ratio": len(fleet_t) / len(ref_t) if ref_t else None,
            "worst_excess": worst,
            "worst_excess_pct": 100.0 * worst / limit,
            "worst_at_s": None if at is None else (at - t0_ns) / NS,
            "per_replica": {str(r): v for r, v in sorted(per_replica.items())},
        })
    groups = []
    for mult in sorted({k["mult"] for k in keys}):
        g = [k for k in keys if k["mult"] == mult]
        worst = max(g, key=lambda k: k["worst_excess_pct"])
        sent, fleet, ref = (sum(k[f] for k in g) for f in ("sent", "fleet", "one_process"))
        groups.append({
            "mult": mult, "keys": len(g),
            "intended_rps": sum(k["intended_rps"] for k in g),
            "achieved_rps": sent / args.duration,
            "sent": sent, "fleet": fleet, "one_process": ref,
            "ratio": fleet / ref if ref else None,
            "worst_excess_pct": worst["worst_excess_pct"],
            "worst_excess": worst["worst_excess"],
            "worst_key": worst["key"],
            "mean_worst_excess_pct": statistics.mean(k["worst_excess_pct"] for k in g),
            "refused": sum(k["refused"] for k in g),
            "errors": sum(k["errors"] for k in g),
        })
    sent, fleet, ref = (sum(k[f] for k in keys) for f in ("sent", "fleet", "one_process"))
    total = {
        "keys": len(keys),
        "intended_rps": sum(k["intended_rps"] for k in keys),
        "achieved_rps": sent / args.duration,
        "sent": sent, "fleet": fleet, "one_process": ref,
        "ratio": fleet / ref if ref else None,
        "worst_excess_pct": max(k["worst_excess_pct"] for k in keys),
        "refused": sum(k["refused"] for k in keys),
        "errors": sum(k["errors"] for k in keys),
    }
    ms = 1e6
    pacing = {
        "lateness_ms_p50": pct(lateness, 0.5) / ms, "lateness_ms_p99": pct(lateness, 0.99) / ms,
        "lateness_ms_max": max(lateness) / ms,
        "latency_ms_p50": (pct(latency, 0.5) or 0) / ms, "latency_ms_p99": (pct(latency, 0.99) or 0) / ms,
        "latency_ms_max": (max(latency) if latency else 0) / ms,
        "slack_ms": slack_ns / ms,
    }
    return keys, groups, total, pacing


def outcomes(before, after):
    out = {}
    for (n, labels), v in after.items():
        if n == "tollgate_requests_total" and ("route", "client") in labels:
            o = dict(labels)["outcome"]
            out[o] = out.get(o, 0.0) + v - before.get((n, labels), 0.0)
    return out


def cluster_figures(args, before, after, r_stats, r_mem, dbsize):
    calls = sum(mdelta(b, a, "tollgate_cluster_redis_calls_total") for b, a in zip(before, after))
    fwd = sum(mdelta(b, a, "tollgate_requests_total", route="client", outcome="forwarded")
              for b, a in zip(before, after))
    limited = sum(mdelta(b, a, "tollgate_requests_total", route="client", outcome="rate_limited")
                  for b, a in zip(before, after))
    per_replica = []
    all_secs, all_keys = None, None
    for i, (b, a) in enumerate(zip(before, after)):
        secs = buckets(b, a, "tollgate_cluster_sync_seconds")
        kb = buckets(b, a, "tollgate_cluster_sync_keys")
        syncs = mdelta(b, a, "tollgate_cluster_sync_keys_count")
        key_sum = mdelta(b, a, "tollgate_cluster_sync_keys_sum")
        sec_sum = mdelta(b, a, "tollgate_cluster_sync_seconds_sum")
        per_replica.append({
            "replica": i + 1,
            "redis_calls": mdelta(b, a, "tollgate_cluster_redis_calls_total"),
            "forwarded": mdelta(b, a, "tollgate_requests_total", route="client", outcome="forwarded"),
            "outcomes": outcomes(b, a),
            "syncs": syncs,
            "keys_per_sync": key_sum / syncs if syncs else None,
            "sync_p50_s": quantile(0.5, secs), "sync_p99_s": quantile(0.99, secs),
            "sync_mean_s": sec_sum / syncs if syncs else None,
            "sync_errors": mdelta(b, a, "tollgate_cluster_sync_errors_total"),
            "store_up": msum(a, "tollgate_cluster_store_up"),
            "replicas_gauge": msum(a, "tollgate_cluster_replicas"),
        })
        if all_secs is None:
            all_secs, all_keys = secs, kb
        else:
            all_secs = [(le, c + c2) for (le, c), (_, c2) in zip(all_secs, secs)]
            all_keys = [(le, c + c2) for (le, c), (_, c2) in zip(all_keys, kb)]
    syncs = sum(r["syncs"] for r in per_replica)
    key_sum = sum(mdelta(b, a, "tollgate_cluster_sync_keys_sum") for b, a in zip(before, after))
    evalsha = r_stats.get("evalsha", {}).get("calls", 0)
    eval_ = r_stats.get("eval", {}).get("calls", 0)
    return {
        "redis_calls": calls, "forwarded": fwd, "rate_limited": limited,
        "calls_per_admitted": calls / fwd if fwd else None,
        "syncs": syncs,
        "keys_per_sync": key_sum / syncs if syncs else None,
        "sync_p50_s": quantile(0.5, all_secs or []), "sync_p99_s": quantile(0.99, all_secs or []),
        "keys_per_sync_p99_bucket": bucket_of(0.99, all_keys or []),
        "sync_p99_bucket_s": bucket_of(0.99, all_secs or []),
        "per_replica": per_replica,
        "redis": {
            "evalsha_calls": evalsha, "eval_calls": eval_,
            "evalsha_usec_per_call": r_stats.get("evalsha", {}).get("usec_per_call"),
            "commandstats": r_stats,
            "used_memory": int(r_mem.get("used_memory", 0)),
            "used_memory_human": r_mem.get("used_memory_human"),
            "used_memory_dataset": int(r_mem.get("used_memory_dataset", 0) or 0),
            "dbsize": dbsize,
        },
    }


# ---------------------------------------------------------------------------------------------
# Report


def fmt(v, spec):
    return "–" if v is None else format(v, spec)


def render(args, keys, groups, total, pacing, cl, env):
    out = []
    w = out.append
    w(f"# Shared budgets across {len(args.gateways)} replicas: SPLIT={args.split}")
    w("")
    w(f"{env['date']} · {args.duration:g} s ({args.duration / args.window:g} windows of {args.window:g} s) · "
      f"{len(keys)} keys · sync_interval_ms {args.sync_ms} · seed {args.seed} · "
      f"load average before {env['load_before']}, during {', '.join(env['load_during'])}, after {env['load_after']}")
    w("")
    w("## Per group (multiple of each key's limit)")
    w("")
    w("| group | keys | intended req/s | achieved req/s | sent | fleet admitted | one-process admitted "
      "| fleet / one-process | worst window excess (% of L, key) | mean worst excess % | 429 | errors |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for g in groups:
        w(f"| {g['mult']:g}× | {g['keys']} | {g['intended_rps']:.1f} | {g['achieved_rps']:.1f} | {g['sent']} "
          f"| {g['fleet']} | {g['one_process']} | {fmt(g['ratio'], '.4f')} "
          f"| {g['worst_excess_pct']:+.1f} % ({g['worst_excess']:+d}, {g['worst_key']}) "
          f"| {g['mean_worst_excess_pct']:+.1f} % | {g['refused']} | {g['errors']} |")
    t = total
    w(f"| **total** | {t['keys']} | {t['intended_rps']:.1f} | {t['achieved_rps']:.1f} | {t['sent']} | {t['fleet']} "
      f"| {t['one_process']} | {fmt(t['ratio'], '.4f')} | {t['worst_excess_pct']:+.1f} % | | {t['refused']} | {t['errors']} |")
    w("")
    low = [g for g in groups if g["mult"] < 1]
    if low:
        refused = sum(g["refused"] for g in low)
        names = ", ".join(format(g["mult"], "g") + "×" for g in low)
        w(f"**Refusals of keys below their limit ({names}): {refused}** "
          f"({'as it must be' if refused == 0 else 'MUST BE 0'}).")
        w("")
    w("Worst window excess: fleet admissions in [s, s+W) − one-process admissions in "
      f"[s − {pacing['slack_ms']:.0f} ms, s+W) − max(0, one-process − fleet admissions in [s−W, s)), "
      "worst over window starts s at every admission; negative = the fleet never admitted more.")
    w("")
    w("## Pacing of the load generator")
    w("")
    w(f"- achieved {t['achieved_rps']:.1f} of {t['intended_rps']:.1f} req/s intended "
      f"({100 * t['achieved_rps'] / t['intended_rps']:.1f} %); send lateness behind schedule p50 "
      f"{pacing['lateness_ms_p50']:.2f} ms, p99 {pacing['lateness_ms_p99']:.2f} ms, max {pacing['lateness_ms_max']:.1f} ms")
    w(f"- answer latency p50 {pacing['latency_ms_p50']:.2f} ms, p99 {pacing['latency_ms_p99']:.2f} ms, "
      f"max {pacing['latency_ms_max']:.1f} ms; connections opened per replica {env['conns']}; "
      f"requests resent on a new connection after a kept-alive one closed under them: {env['retries']}; "
      f"failures: {env['failures'] or 'none'}")
    w(f"- CPU over the run (% of one CPU): {', '.join(f'{k} {v:.0f}' for k, v in env['cpu'].items())}")
    w("")
    w("## Cost of sharing")
    w("")
    w(f"- Redis calls per admitted request: **{fmt(cl['calls_per_admitted'], '.3f')}** "
      f"({cl['redis_calls']:.0f} script calls / {cl['forwarded']:.0f} forwarded; {cl['rate_limited']:.0f} rate limited)")
    kb = cl["keys_per_sync_p99_bucket"]
    w(f"- keys per sync: mean **{fmt(cl['keys_per_sync'], '.2f')}**, p99 in the bucket "
      f"{'–' if kb is None else f'({kb[0]:g}, {kb[1]:g}]'} ({cl['syncs']:.0f} exchanges; {len(keys)} keys in all)")
    w(f"- sync time: p50 **{fmt(cl['sync_p50_s'] and cl['sync_p50_s'] * 1000, '.2f')} ms**, "
      f"p99 **{fmt(cl['sync_p99_s'] and cl['sync_p99_s'] * 1000, '.2f')} ms** (histogram buckets 0.5, 1, 2.5, 5 … ms, "
      "linear within a bucket as histogram_quantile does)")
    r = cl["redis"]
    w(f"- Redis: evalsha {r['evalsha_calls']} calls ({fmt(r['evalsha_usec_per_call'], '.2f')} µs/call), eval {r['eval_calls']}; "
      f"used_memory {r['used_memory']} B ({r['used_memory_human']}), dataset {r['used_memory_dataset']} B; DBSIZE {r['dbsize']}")
    others = ", ".join(f"{c} {v['calls']}" for c, v in sorted(r["commandstats"].items())
                       if c not in ("evalsha", "eval"))
    w(f"- other commands: {others or 'none'}")
    w("")
    w("| replica | forwarded | 429 | Redis calls | exchanges | keys/sync | sync p50 ms | sync p99 ms | sync errors | store_up | replicas |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for p in cl["per_replica"]:
        w(f"| {p['replica']} | {p['forwarded']:.0f} | {p['outcomes'].get('rate_limited', 0):.0f} | {p['redis_calls']:.0f} "
          f"| {p['syncs']:.0f} | {fmt(p['keys_per_sync'], '.2f')} "
          f"| {fmt(p['sync_p50_s'] and p['sync_p50_s'] * 1000, '.2f')} | {fmt(p['sync_p99_s'] and p['sync_p99_s'] * 1000, '.2f')} "
          f"| {p['sync_errors']:.0f} | {p['store_up']:.0f} | {p['replicas_gauge']:.0f} |")
    w("")
    w("## Per key")
    w("")
    w("| key | plan | L | × | req/s (intended / achieved) | sent | fleet | one-process | ratio | worst excess | at s | 429 | per replica sent/admitted |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for k in keys:
        rep = " ".join(f"{r}:{v['sent']}/{v['admitted']}" for r, v in k["per_replica"].items())
        w(f"| {k['key']} | {k['plan']} | {k['limit']} | {k['mult']:g} | {k['intended_rps']:.1f} / {k['achieved_rps']:.1f} "
          f"| {k['sent']} | {k['fleet']} | {k['one_process']} | {fmt(k['ratio'], '.4f')} "
          f"| {k['worst_excess']:+d} ({k['worst_excess_pct']:+.1f} %) | {fmt(k['worst_at_s'], '.1f')} | {k['refused']} | {rep} |")
    w("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------


def wait_fleet(admins, n, timeout):
    deadline = time.monotonic() + timeout
    while True:
        snaps = []
        try:
            snaps = [scrape(a) for a in admins]
        except OSError:
            pass
        if snaps and all(msum(s, "tollgate_cluster_replicas") == n and msum(s, "tollgate_cluster_store_up") == 1
                         for s in snaps):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def run(args):
    table = key_table(args.keys, parse_mults(args.mults))
    pids = dict(p.split("=", 1) for p in args.pids.split(",") if p) if args.pids else {}
    if not wait_fleet(args.admins, len(args.gateways), 15):
        print("warning: the replicas did not all see the whole fleet with the store up within 15 s",
              file=sys.stderr)
    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": loadavg()}
    before = [scrape(a) for a in args.admins]
    redis_cmd(args.redis, "CONFIG", "RESETSTAT")
    cpu0 = {name: cpu_ticks(pid) for name, pid in pids.items()}
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    wall0 = time.monotonic()
    rec = Recorder(len(table))
    t0_ns, end_ns, conns, loads = asyncio.run(drive(args, table, args.gateways, rec))
    wall = time.monotonic() - wall0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    hz = os.sysconf("SC_CLK_TCK")
    cpu = {"client": 100 * (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / wall}
    for name, pid in pids.items():
        c1 = cpu_ticks(pid)
        if c1 is not None and cpu0[name] is not None:
            cpu[name] = 100 * (c1 - cpu0[name]) / hz / wall
    # Let the last admissions reach the store: two sync intervals and a timeout.
    time.sleep((2 * args.sync_ms + 100) / 1000)
    after = [scrape(a) for a in args.admins]
    r_stats = commandstats(args.redis)
    r_mem = redis_info(args.redis, "memory")
    dbsize = redis_cmd(args.redis, "DBSIZE")
    env.update(load_after=loadavg(), load_during=loads, conns=conns, cpu=cpu,
               retries=rec.retries, failures=rec.failures)

    keys, groups, total, pacing = analyse(args, table, rec, t0_ns, end_ns)
    cl = cluster_figures(args, before, after, r_stats, r_mem, dbsize)
    report = render(args, keys, groups, total, pacing, cl, env)
    print(report)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.md"), "w") as f:
        f.write(report + "\n")
    summary = {
        "params": {k: v for k, v in vars(args).items() if k not in ("func",)},
        "env": env, "groups": groups, "total": total, "pacing": pacing, "cluster": cl, "keys": keys,
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(summary, f, indent=1)
    raw = {
        "t0_ns": t0_ns, "window_s": args.window, "replicas": args.gateways,
        "columns": "per key: scheduled_ns, sent_ns (monotonic, relative to t0_ns), replica (0-based), "
                   "status (0: no answer), answered_ns (0: none)",
        "keys": [{
            "key": name, "plan": plan, "limit": limit, "mult": mult,
            "scheduled_ns": [t - t0_ns for t in rec.sched[k]],
            "sent_ns": [t - t0_ns for t in rec.sent[k]],
            "replica": rec.replica[k], "status": rec.status[k],
            "answered_ns": [t - t0_ns if t else 0 for t in rec.done[k]],
        } for k, (name, _, plan, limit, mult) in enumerate(table)],
    }
    with open(os.path.join(args.out, "requests.json"), "w") as f:
        json.dump(raw, f, separators=(",", ":"))
    low_refused = sum(g["refused"] for g in groups if g["mult"] < 1)
    return 1 if low_refused or total["errors"] else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    k = sub.add_parser("keys", help="print the keys as YAML list items")
    k.add_argument("--keys", type=int, default=30)
    k.add_argument("--mults", default="0.9,2,10")
    r = sub.add_parser("run", help="drive the traffic and report")
    r.add_argument("--gateways", required=True, help="host:port,… of the replicas' listeners")
    r.add_argument("--admins", required=True, help="host:port,… of their admin listeners, same order")
    r.add_argument("--redis", required=True, help="host:port")
    r.add_argument("--duration", type=float, default=60)
    r.add_argument("--keys", type=int, default=30)
    r.add_argument("--mults", default="0.9,2,10")
    r.add_argument("--split", default="even")
    r.add_argument("--window", type=float, default=10)
    r.add_argument("--sync-ms", type=int, default=100)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--pids", default="", help="name=pid,… whose CPU time to report")
    r.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.cmd == "keys":
        for name, secret, plan, limit, mult in key_table(args.keys, parse_mults(args.mults)):
            print(f"  - {{ name: {name}, key: {secret}, plan: {plan} }}  # {mult:g}x of {limit}")
        return 0
    args.gateways = args.gateways.split(",")
    args.admins = args.admins.split(",")
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
