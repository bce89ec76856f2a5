#!/usr/bin/env python3
"""Helpers of benches/load/run.sh (standard library only).

  summary.py --to-ms                      stdin "1.23ms" / "456.00us" / "1.02s" -> "1.230" (ms)
  summary.py --oha FILE --rate Q --setup S --route R --rep N --cpu-ticks T --clk-tck H
                                          oha JSON -> results.csv rows on stdout
  summary.py --csv results.csv --machine machine.txt --out summary.md
                                          medians, ratios and the machine -> markdown
"""

import argparse
import csv
import json
import re
import statistics
import sys
from collections import defaultdict

SETUP_ORDER = ["D", "N1", "N1-log", "H1", "P0", "P0m", "G", "Gq", "Gn", "Ga", "G-log"]
ROUTE_ORDER = ["send_message", "send_group_event"]
ROUTE_TEXT = {
    "send_message": "POST /v2/sendMessage/",
    "send_group_event": "POST /v2/sendGroup (event body)",
}
# The issue's names for the gateway rows.
ROW_NAME = {
    ("G", "send_message"): "G",
    ("G", "send_group_event"): "Gv",
    ("Ga", "send_message"): "Ga",
    ("Ga", "send_group_event"): "Gav",
    ("Gq", "send_message"): "Gq",
    ("Gq", "send_group_event"): "Gqv",
    ("Gn", "send_message"): "Gn",
    ("Gn", "send_group_event"): "Gnv",
    ("G-log", "send_message"): "G-log",
    ("G-log", "send_group_event"): "Gv-log",
}
SUSTAINED = 0.95  # an open-loop rate counts as sustained at >= 95 % of the target


def to_ms(text):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(us|ms|s|m)\s*", text or "")
    if not m:
        return ""
    v, unit = float(m.group(1)), m.group(2)
    return "%.3f" % (v * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}[unit])


def oha_rows(a):
    with open(a.oha) as f:
        doc = json.load(f)
    summ = doc.get("summary", {})
    pct = doc.get("latencyPercentiles") or doc.get("latency_percentiles") or {}
    codes = doc.get("statusCodeDistribution") or {}
    errors = doc.get("errorDistribution") or {}
    ok = sum(n for c, n in codes.items() if str(c).startswith("2"))
    total = sum(codes.values())
    # Requests cut off by -z's deadline (oha without -w) are not failures of the proxy.
    n_err = sum(n for e, n in errors.items() if "deadline" not in e)
    rps = summ.get("requestsPerSec") or 0.0
    q = a.rate
    rows = []

    def add(metric, value):
        rows.append([a.setup, a.route, "%s@%d" % (metric, q), a.rep, value])

    for key, name in (("p50", "p50_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms")):
        v = pct.get(key)
        add(name, "" if v is None else "%.3f" % (v * 1e3))
    add("achieved_rps", "%.1f" % rps)
    add("sustained", 1 if rps >= SUSTAINED * q and n_err == 0 else 0)
    add("non2xx", total - ok)
    add("errors", n_err)
    if total:
        add("cpu_us_per_req", "%.2f" % (a.cpu_ticks * 1e6 / a.clk_tck / total))
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerows(rows)


def load(path):
    data = defaultdict(list)  # (setup, route, metric) -> [values]
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["value"] == "":
                continue
            try:
                data[(r["setup"], r["route"], r["metric"])].append(float(r["value"]))
            except ValueError:
                pass
    return data


def med(data, s, r, m):
    v = data.get((s, r, m))
    return statistics.median(v) if v else None


def paired(data, a, b, r, m, op):
    """Median over repetitions of op(a's value, b's value in the same repetition): setups are
    interleaved within a repetition, so pairing cancels drift between repetitions."""
    x, y = data.get((a, r, m)), data.get((b, r, m))
    if not x or not y or len(x) != len(y):
        return None
    vals = [op(u, v) for u, v in zip(x, y) if v]
    return statistics.median(vals) if vals else None


def fmt(v, digits=0):
    if v is None:
        return "–"
    return ("{:,.%df}" % digits).format(v)


def lat_cell(data, s, r, q):
    vals = [med(data, s, r, "%s@%d" % (m, q)) for m in ("p50_ms", "p99_ms", "p999_ms")]
    if all(v is None for v in vals):
        return "–"
    cell = " / ".join(fmt(v, 2) for v in vals)
    sus = data.get((s, r, "sustained@%d" % q), [])
    if sus and min(sus) < 1:
        ach = med(data, s, r, "achieved_rps@%d" % q)
        cell += " **not sustained** (%s req/s, %d/%d reps)" % (fmt(ach), sum(1 for x in sus if x < 1), len(sus))
    return cell


OTHERS_WARN = 10.0  # % of a CPU used by processes that are not the benchmark's


def others_pair(data, s, r, pc, lc, sfx=""):
    """Shares (%) of CPU pc and of CPU lc that went neither to the proxy, the upstream nor the
    load generator, nor the shared budgets' Redis (other processes, interrupts not charged
    to a process, hypervisor steal): medians over the repetitions, None when not measured. D
    leaves CPU pc idle, so what runs there does not count for D."""
    def one(cpu, ours):
        busy = med(data, s, r, "cpu%s_busy_pct%s" % (cpu, sfx))
        return None if busy is None else max(0.0, busy - ours)

    proxy = med(data, s, r, "proxy_cpu_pct" + sfx) or 0.0
    up = med(data, s, r, "upstream_cpu_pct" + sfx) or 0.0
    lg = med(data, s, r, "loadgen_cpu_pct" + sfx) or 0.0
    redis = med(data, s, r, "redis_cpu_pct" + sfx) or 0.0
    o0 = 0.0 if s == "D" else one(pc, proxy)
    o1 = one(lc, up + lg + redis)
    return o0, o1


def others(data, s, r, pc, lc, sfx=""):
    return max((v for v in others_pair(data, s, r, pc, lc, sfx) if v is not None), default=0.0)


def busy_cell(data, s, r, pc, lc):
    busy0 = med(data, s, r, "cpu%s_busy_pct" % pc)
    busy1 = med(data, s, r, "cpu%s_busy_pct" % lc)
    if busy0 is None or busy1 is None:
        return "–"
    o0, o1 = others_pair(data, s, r, pc, lc)
    return "%s / %s (%s / %s)" % (fmt(busy0), fmt(busy1), "–" if s == "D" else fmt(o0), fmt(o1))


def summarize(a):
    data = load(a.csv)
    machine = {}
    with open(a.machine) as f:
        for line in f:
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                machine[k] = v
    rates = [int(x) for x in machine.get("rates", "5000 20000").split()]
    present = {(s, r) for (s, r, _m) in data}
    out = []
    out.append("# Tollgate load benchmark (%s run)" % machine.get("mode", "?"))
    out.append("")
    out.append(
        "Medians of %s repetition(s) of %s s (warm-up %s s before each), %s keep-alive connections, "
        "%s keys. Proxy under test on CPU 0 with one worker; load generator and upstream nginx on CPU 1."
        % (machine.get("reps"), machine.get("duration_s"), machine.get("warmup_s"), machine.get("conns"), machine.get("keys"))
    )
    out.append("")
    pc, lc = machine.get("proxy_cpu", "0"), machine.get("load_cpu", "1")
    hdr = ["setup", "route", "req/s", "CPU µs/req", "user µs/req", "proxy CPU %", "CPU %s / %s busy %% (others)" % (pc, lc)]
    has_sys = any(m == "syscalls_per_req" for (_s, _r, m) in data)
    if has_sys:
        hdr += ["syscalls / ctx switches per req"]
    hdr += ["p50 / p99 / p99.9 ms @%dk" % (q // 1000) if q % 1000 == 0 else "p50 / p99 / p99.9 ms @%d" % q for q in rates]
    out.append("| " + " | ".join(hdr) + " |")
    out.append("|" + "---|" * len(hdr))
    bad = []
    for s in SETUP_ORDER:
        for r in ROUTE_ORDER:
            if (s, r) not in present:
                continue
            name = ROW_NAME.get((s, r), s)
            cells = [
                name,
                ROUTE_TEXT[r],
                fmt(med(data, s, r, "rps")),
                fmt(med(data, s, r, "cpu_us_per_req"), 1),
                fmt(med(data, s, r, "user_us_per_req"), 1),
                fmt(med(data, s, r, "proxy_cpu_pct"), 0),
                busy_cell(data, s, r, pc, lc),
            ]
            if has_sys:
                sc, cs = med(data, s, r, "syscalls_per_req"), med(data, s, r, "ctxsw_per_req")
                cells.append("–" if sc is None else "%s / %s" % (fmt(sc, 2), fmt(cs, 3)))
            cells += [lat_cell(data, s, r, q) for q in rates]
            out.append("| " + " | ".join(cells) + " |")
            n_bad = sum(sum(v) for (s2, r2, m), v in data.items() if s2 == s and r2 == r and m.split("@")[0] in ("non2xx", "socket_errors", "errors"))
            # Processes other than the benchmark's on either CPU: the numbers are not clean.
            worst = max(others(data, s, r, pc, lc, sfx) for sfx in [""] + ["@%d" % q for q in rates])
            if worst > OTHERS_WARN:
                bad.append(
                    "%s %s: other processes (or the hypervisor's steal) took up to %.0f %% of a benchmark CPU during its runs "
                    "(load average %s at the start): rerun on an idle machine" % (name, ROUTE_TEXT[r], worst, machine.get("loadavg_start", "?"))
                )
            if n_bad:
                bad.append("%s %s: %d non-2xx answers or errors in total (see raw/)" % (name, ROUTE_TEXT[r], n_bad))
    out.append("")

    # Ratios.
    def ratio(x, y):
        return None if x is None or y in (None, 0) else x / y

    def diff(x, y):
        return None if x is None or y is None else x - y

    msg, ev = "send_message", "send_group_event"
    q0 = rates[0] if rates else 5000
    def pair_diff(a, b, r, m="cpu_us_per_req"):
        return paired(data, a, b, r, m, lambda u, v: u - v)

    def pair_ratio(a, b, r, m="rps"):
        return paired(data, a, b, r, m, lambda u, v: u / v)

    lines = [
        # The issue's goals, against the like-for-like baseline (P0m: P0 with Tollgate's allocator).
        ("**G − P0m** CPU/req (sendMessage; goal ≤ +1 µs)", pair_diff("G", "P0m", msg), "µs", 2),
        ("**Ga − P0m** CPU/req (sendMessage, every feature of parts two and three; goal ≤ +1.5 µs)", pair_diff("Ga", "P0m", msg), "µs", 2),
        ("**G-log − G** CPU/req (sendMessage, an access line per request to a file; goal ≤ +1 µs)", pair_diff("G-log", "G", msg), "µs", 2),
        ("Gv − P0m CPU/req (sendGroup event: Gv parses and checks the body)", pair_diff("G", "P0m", ev), "µs", 2),
        ("Gav − P0m CPU/req (sendGroup event, everything on)", pair_diff("Ga", "P0m", ev), "µs", 2),
        ("G − P0m user CPU/req (sendMessage: the proxy's own code, without the kernel)", pair_diff("G", "P0m", msg, "user_us_per_req"), "µs", 2),
        ("Ga − P0m user CPU/req (sendMessage)", pair_diff("Ga", "P0m", msg, "user_us_per_req"), "µs", 2),
        ("G / P0m throughput (sendMessage)", pair_ratio("G", "P0m", msg), "×", 2),
        ("Ga / P0m throughput (sendMessage)", pair_ratio("Ga", "P0m", msg), "×", 2),
        ("P0m − P0 CPU/req (the allocator alone)", pair_diff("P0m", "P0", msg), "µs", 2),
        # The peers.
        ("G − H1 CPU/req (sendMessage: HAProxy with a digest map, ACLs and a stick table)", pair_diff("G", "H1", msg), "µs", 2),
        ("G − N1 CPU/req (sendMessage: nginx with a plain-key map and limit_req)", pair_diff("G", "N1", msg), "µs", 2),
        ("G / H1 throughput (sendMessage)", pair_ratio("G", "H1", msg), "×", 2),
        ("G / N1 throughput (sendMessage)", pair_ratio("G", "N1", msg), "×", 2),
        ("N1-log − N1 CPU/req (nginx, buffered access_log)", pair_diff("N1-log", "N1", msg), "µs", 2),
        ("G-log − N1-log CPU/req (both logging every request)", pair_diff("G-log", "N1-log", msg), "µs", 2),
        # Part by part.
        ("Gq − G CPU/req (quotas and the ledger)", pair_diff("Gq", "G", msg), "µs", 2),
        ("Gn − G CPU/req (part two without shared budgets)", pair_diff("Gn", "G", msg), "µs", 2),
        ("Ga requests per proxy CPU-second / P0m's (sendMessage: 1 / CPU µs per request, whatever the load CPU allowed)", paired(data, "P0m", "Ga", msg, "cpu_us_per_req", lambda u, v: u / v), "×", 2),
        ("p99(G) − p99(D) @%d req/s (sendMessage)" % q0, diff(med(data, "G", msg, "p99_ms@%d" % q0), med(data, "D", msg, "p99_ms@%d" % q0)), "ms", 3),
        ("p99(Gv) − p99(D) @%d req/s (sendGroup event)" % q0, diff(med(data, "G", ev, "p99_ms@%d" % q0), med(data, "D", ev, "p99_ms@%d" % q0)), "ms", 3),
        ("p99(Ga) − p99(D) @%d req/s (sendMessage)" % q0, diff(med(data, "Ga", msg, "p99_ms@%d" % q0), med(data, "D", msg, "p99_ms@%d" % q0)), "ms", 3),
    ]
    # Rows of setups this run did not measure are left out.
    lines = [ln for ln in lines if ln[1] is not None]
    out.append("| comparison | value |")
    out.append("|---|---|")
    for label, v, unit, d in lines:
        out.append("| %s | %s |" % (label, "–" if v is None else "%s %s" % (fmt(v, d), unit)))
    out.append("")
    paces = sorted({m.split("@pace")[1] for (_s, _r, m) in data if m.startswith("cpu_us_per_req@pace")}, key=float)
    if paces:
        out.append("Paced (PACES: each connection waits the pace before each request, one rate for every setup):")
        out.append("")
        out.append("| setup | route | pace | req/s | CPU µs/req | user µs/req | waited for Redis / req |")
        out.append("|---|---|---:|---:|---:|---:|---:|")
        for d in paces:
            x = "@pace" + d
            for s in SETUP_ORDER:
                for r in ROUTE_ORDER:
                    if (s, r, "cpu_us_per_req" + x) not in data:
                        continue
                    w = med(data, s, r, "waited_per_req" + x)
                    out.append("| %s | %s | %s ms | %s | %s | %s | %s |" % (
                        ROW_NAME.get((s, r), s), ROUTE_TEXT[r], d, fmt(med(data, s, r, "rps" + x)),
                        fmt(med(data, s, r, "cpu_us_per_req" + x), 1), fmt(med(data, s, r, "user_us_per_req" + x), 1),
                        "–" if w is None else fmt(w, 4)))
        out.append("")
        out.append("| comparison (paced) | value |")
        out.append("|---|---|")
        for d in paces:
            x = "@pace" + d
            for x1, x2 in (("Ga", "G"), ("Ga", "Gn"), ("Gn", "G"), ("G", "P0m")):
                v = pair_diff(x1, x2, msg, "cpu_us_per_req" + x)
                if v is not None:
                    out.append("| %s − %s CPU/req (sendMessage, paced %s ms) | %s µs |" % (x1, x2, d, fmt(v, 2)))
        out.append("")
    over = [s for s in ("G-overload", "Ga-overload") if (s, msg, "offered_rps") in data]
    if over:
        out.append("Overload (open loop at 1.5× the setup's saturating rate, sendMessage, -c%s):" % machine.get("overload_conns", "?"))
        out.append("")
        out.append("| setup | offered req/s | achieved req/s | p50 / p99 / p99.9 ms | errors / non-2xx | proxy RSS before / after / peak |")
        out.append("|---|---:|---:|---|---|---|")
        for s in over:
            g = lambda m: med(data, s, msg, m)
            mb = lambda m: "–" if g(m) is None else "%.1f MB" % (g(m) / 1024)
            out.append("| %s | %s | %s | %s / %s / %s | %s / %s | %s / %s / %s |" % (
                s.replace("-overload", ""), fmt(g("offered_rps")), fmt(g("achieved_rps@over")),
                fmt(g("p50_ms@over"), 2), fmt(g("p99_ms@over"), 2), fmt(g("p999_ms@over"), 2),
                fmt(g("errors@over")), fmt(g("non2xx@over")),
                mb("rss_before_kb"), mb("rss_after_kb"), mb("rss_peak_kb")))
        out.append("")
    if bad:
        out.append("**Warnings:**")
        out.extend("- " + b for b in bad)
        out.append("")

    out.append("Notes:")
    out.append("- req/s and CPU µs/req: `wrk -t1 -c%s` saturation, keys rotating per request (none is rate limited). "
               "CPU µs/req = (utime+stime of the proxy process, all threads; nginx: master + worker) / requests completed; "
               "user µs/req counts utime alone (the proxy's own code and libraries, without the kernel's TCP work). "
               "proxy CPU %% near 100 means the proxy was the bottleneck; well below means CPU 1 (wrk + upstream) was. "
               "CPU busy %% is everything but idle on the proxy's CPU and on the load CPU (/proc/stat, interrupts included); "
               "(others) is the part of it that was neither the proxy's, the upstream nginx's, the load generator's nor Redis's CPU time "
               "(other processes, hypervisor steal): near 0 on a clean run (– for D, which leaves the proxy CPU idle)." % machine.get("conns"))
    out.append("- Latency: `oha` open loop at a fixed rate%s, -c%s, one fixed key `bench-fixed-key` on the `bench` plan "
               "(requests_per_window 1,000,000, so it is never limited). A rate counts as sustained when oha achieved ≥ %d %% of it without errors."
               % (" with --latency-correction" if machine.get("oha_latency_correction", "no") != "no" else " (no --latency-correction in this oha)", machine.get("conns"), SUSTAINED * 100))
    out.append("- D is the upstream nginx itself, measured directly; it runs on CPU 1 next to the load generator.")
    out.append("- N1 does not check JSON bodies (nginx cannot): on the sendGroup event route it checks only Content-Type and size. "
               "Gv parses and checks the body. N1's key map holds plain keys; Tollgate hashes every presented key (SHA-256).")
    out.append("- H1 is HAProxy (one thread) doing what it can (benches/load/haproxy/policy.cfg): the bearer token hashed with "
               "`sha2(256)` and looked up in a map of digests (as Tollgate holds them), the Basic allow-list by ACL, a per-key "
               "`http_req_rate(10s)` in a stick table against the plan's limit, Content-Type on the event route. Like N1 it "
               "does not normalize paths, check JSON bodies, count quotas or change keys live.")
    out.append("- P0 is the bare Pingora pass-through with the system allocator (glibc); P0m is the same program with "
               "Tollgate's allocator (mimalloc): the goals are measured against P0m, which differs from G only by G's work.")
    out.append("- N1-log is N1 with `access_log … buffer=64k flush=1s` (one line per request, to a file); "
               "G-log is G with TOLLGATE_LOG=info (one access line per request, to a file). Both saturation only.")
    ga_redis = med(data, "Ga", "send_message", "redis_cpu_pct")
    out.append("- Ga is G with every part-two and part-three feature on (benches/load/all.yaml, gen.py's tollgate-p3.yaml): "
               "the edge spelled out, auth-failure blocking, the webhook guard, usage counting, `cluster:` against a "
               "redis-server on the load CPU, `state.path`, the ledger, a monthly quota, an expiry on every key and one key in "
               "ten sent by its rotated `previous` digest. "
               "Its CPU µs/req include the background exchange with Redis."
               + ("" if ga_redis is None else
                  " Redis itself took %s %% of the load CPU during Ga's saturation runs (sendMessage; median), "
                  "CPU time the load generator and the upstream did not have: the proxy may then run below 100 %%."
                  % fmt(ga_redis)))
    out.append("- Gn is Ga without `cluster:`: every part-two feature but shared budgets. Ga − Gn is the price of sharing "
               "budgets through Redis (the background exchange, and Redis itself on the load CPU), Gn − G the rest of part two.")
    if has_sys:
        out.append("- System calls and context switches per request: `perf stat -e raw_syscalls:sys_enter,context-switches` "
                   "on the proxy's process over the saturation run (nginx: master and workers), divided by wrk's count.")
    out.append("- G runs with TOLLGATE_LOG=warn (no access lines).")
    out.append("")
    out.append("Machine:")
    out.append("")
    for k in ("nproc", "cpu", "virtualization", "kernel", "nginx", "haproxy", "wrk", "oha", "rustc", "pingora", "commit",
              "loadavg_start", "loadavg_end", "date"):
        out.append("- %s: %s" % (k, machine.get(k, "?")))
    out.append("")
    with open(a.out, "w") as f:
        f.write("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--to-ms", action="store_true")
    ap.add_argument("--oha")
    ap.add_argument("--rate", type=int)
    ap.add_argument("--setup")
    ap.add_argument("--route")
    ap.add_argument("--rep")
    ap.add_argument("--cpu-ticks", type=int, default=0)
    ap.add_argument("--clk-tck", type=int, default=100)
    ap.add_argument("--csv")
    ap.add_argument("--machine")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.to_ms:
        print(to_ms(sys.stdin.read().strip()))
    elif a.oha:
        oha_rows(a)
    elif a.csv:
        summarize(a)
    else:
        ap.error("nothing to do")


if __name__ == "__main__":
    main()
