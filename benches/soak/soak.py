#!/usr/bin/env python3
"""The soak (docs/security.md, "The soak"): Tollgate for a long run under faults, its memory,
descriptors and Redis memory sampled each minute.

    benches/soak/run.sh [--minutes 30] [--keys 100000] [--addresses 10000] [--out DIR]
    benches/soak/run.sh --saturation-only [--no-cluster]   # the saturating rate alone, with or
                                                           # without `cluster:` (the fleet's cost)

What runs, all on loopback, in a temporary directory:
  - redis-server (no persistence) for `cluster`, restarted at one third and two thirds of the run;
  - the embedded stand-in upstream (`tollgate stand-in`);
  - the gateway (target/release/tollgate) with cluster, state.path, a monthly quota on every
    plan, the ledger, partners, trusted proxies, TOLLGATE_LOG=warn;
  - wrk, `--keys` keys in rotation (a random key per request) from `--addresses` client
    addresses (X-Forwarded-For from a trusted proxy), at half the rate wrk saturates the
    gateway at (measured first, 10 s);
  - a reload every minute (a plan limit toggled), a partner upgrade every second.

Each minute: the gateway's RSS (VmRSS) and open descriptors, Redis's used_memory, and the
requests answered. Written to OUT/soak.csv and drawn to OUT/soak.svg (three panels); OUT is
target/soak by default.

Every key here is a public test key; nothing secret is generated.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BODY = '{"chatId":"1234@c.us","message":"hi"}'
PARTNER_KEY = "soak-partner-key"
CUSTOMERS = 1000  # the first keys are the partner's customers (upgraded in turn)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key(i):
    return f"soak-key-{i:06d}"


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def config(ports, state, keys, basic_limit, shared=True):
    lines = [
        f'listen: "127.0.0.1:{ports["gw"]}"',
        f'admin_listen: "127.0.0.1:{ports["admin"]}"',
        "upstream:",
        f'  base_url: "http://127.0.0.1:{ports["up"]}"',
        "plans:",
        f"  basic: {{ plan_id: 1, requests_per_window: {basic_limit}, allow: all,"
        " quota: { requests: 1000000000, per: month } }",
        "  standard: { plan_id: 2, requests_per_window: 70, allow: all,"
        " quota: { requests: 1000000000, per: month } }",
        "partner_quota: { requests: 1000000000, per: month }",
        "ledger: { retention_days: 30 }",
        "server:",
        '  trusted_proxies: ["127.0.0.1"]',
        "log: { format: text }",
        "shutdown: { drain_seconds: 0, grace_seconds: 0, timeout_seconds: 1 }",
        f"state: {{ path: {state} }}",
    ]
    if shared:
        lines += [
            "cluster:",
            f'  redis_url: "redis://127.0.0.1:{ports["redis"]}/0"',
            '  key_prefix: "soak"',
            "  timeout_ms: 200",
        ]
    lines += [
        "partners:",
        f'  - {{ name: acme, sha256: "{sha(PARTNER_KEY)}" }}',
        "keys:",
    ]
    for i in range(keys):
        plan = "basic" if i % 2 == 0 else "standard"
        partner = ", partner: acme" if i < CUSTOMERS else ""
        lines.append(f'  - {{ name: k{i:06d}, sha256: "{sha(key(i))}", plan: {plan}{partner} }}')
    return "\n".join(lines) + "\n"


LUA = """
local keys, addrs, pause = %d, %d, %d
local body = '%s'
math.randomseed(os.time() + tonumber(tostring({}):sub(8), 16))
request = function()
  local k = math.random(0, keys - 1)
  local a = math.random(0, addrs - 1)
  local headers = {
    ["Authorization"] = string.format("Bearer soak-key-%%06d", k),
    ["Content-Type"] = "application/json",
    ["X-Forwarded-For"] = string.format("10.%%d.%%d.%%d", math.floor(a / 65536),
      math.floor(a / 256) %% 256, a %% 256),
  }
  return wrk.format("POST", "/v2/sendMessage/", headers, body)
end
delay = function() return pause end
"""


def wait_port(port, limit=30):
    end = time.time() + limit
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"nothing listens on {port}")


def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body.encode() if body else None, method=method)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def redis_memory(port):
    try:
        with socket.create_connection(("127.0.0.1", port), 1) as s:
            s.sendall(b"INFO memory\r\n")
            data = b""
            while b"used_memory:" not in data or not data.endswith(b"\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        m = re.search(rb"used_memory:(\d+)", data)
        return int(m.group(1)) if m else 0
    except OSError:
        return 0


def start_redis(port, d):
    return subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", d],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sample(pid, ports):
    with open(f"/proc/{pid}/status") as f:
        rss = int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    _, page = http("GET", f'http://127.0.0.1:{ports["admin"]}/metrics')
    requests = sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("tollgate_requests_total{"))
    return rss, fds, redis_memory(ports["redis"]), requests


def wrk(ports, lua, seconds, conns=32):
    out = subprocess.run(
        ["wrk", "-t2", f"-c{conns}", f"-d{seconds}s", "-s", lua,
         f'http://127.0.0.1:{ports["gw"]}/'],
        capture_output=True, text=True, check=True).stdout
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), out


def svg(rows, path):
    """Three panels (RSS MB, descriptors, Redis MB) against minutes."""
    w, h, pad = 900, 240, 50
    series = [("gateway RSS (MB)", 1, 1 / 1e6), ("gateway open descriptors", 2, 1),
              ("Redis used_memory (MB)", 3, 1 / 1e6)]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h * 3}" '
             'font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h * 3}" fill="white"/>']
    minutes = [r[0] for r in rows]
    x_max = max(minutes) or 1
    for n, (title, col, scale) in enumerate(series):
        top = n * h
        ys = [r[col] * scale for r in rows]
        y_max = max(ys) * 1.2 or 1
        pts = " ".join(
            f"{pad + (m / x_max) * (w - 2 * pad):.1f},"
            f"{top + h - pad + 10 - (y / y_max) * (h - pad - 20):.1f}"
            for m, y in zip(minutes, ys))
        parts += [
            f'<text x="{pad}" y="{top + 18}" font-weight="bold">{title}</text>',
            f'<line x1="{pad}" y1="{top + h - pad + 10}" x2="{w - pad}" y2="{top + h - pad + 10}" stroke="#888"/>',
            f'<line x1="{pad}" y1="{top + 30}" x2="{pad}" y2="{top + h - pad + 10}" stroke="#888"/>',
            f'<text x="{pad - 5}" y="{top + 34}" text-anchor="end">{y_max:.0f}</text>',
            f'<text x="{pad - 5}" y="{top + h - pad + 10}" text-anchor="end">0</text>',
            f'<text x="{w - pad}" y="{top + h - pad + 28}" text-anchor="end">minute {x_max}</text>',
            f'<polyline points="{pts}" fill="none" stroke="#1f77b4" stroke-width="2"/>',
        ]
        for m, y in zip(minutes, ys):
            cx = pad + (m / x_max) * (w - 2 * pad)
            cy = top + h - pad + 10 - (y / y_max) * (h - pad - 20)
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="#1f77b4"/>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=int, default=30)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--addresses", type=int, default=10_000)
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "soak"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "tollgate"))
    ap.add_argument("--no-cluster", action="store_true",
                    help="the same config without `cluster:` (Redis still runs, unused)")
    ap.add_argument("--saturation-only", action="store_true",
                    help="measure the saturating rate (wrk, 10 s, after a 5 s warm-up) and stop")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    d = tempfile.mkdtemp(prefix="tollgate-soak-")
    ports = {n: free_port() for n in ("gw", "admin", "up", "redis")}
    state = os.path.join(d, "state.db")
    cfg = os.path.join(d, "gw.yaml")
    with open(cfg, "w") as f:
        f.write(config(ports, state, a.keys, 40, not a.no_cluster))
    procs = []
    try:
        redis = start_redis(ports["redis"], d)
        procs.append(redis)
        up = subprocess.Popen([a.binary, "stand-in", "--listen", f'127.0.0.1:{ports["up"]}'],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(up)
        wait_port(ports["redis"])
        wait_port(ports["up"])
        log = open(os.path.join(a.out, "gateway.log"), "w")
        gw = subprocess.Popen([a.binary, "run", "--config", cfg], stdout=log, stderr=log,
                              env=dict(os.environ, TOLLGATE_LOG="warn"))
        procs.append(gw)
        wait_port(ports["admin"], 120)
        while http("GET", f'http://127.0.0.1:{ports["admin"]}/readyz')[0] != 200:
            time.sleep(0.2)

        lua = os.path.join(d, "soak.lua")
        with open(lua, "w") as f:
            f.write(LUA % (a.keys, a.addresses, 0, BODY))
        if a.saturation_only:
            wrk(ports, lua, 5)
        saturating, _ = wrk(ports, lua, 10)
        if a.saturation_only:
            print(json.dumps({"keys": a.keys, "cluster": not a.no_cluster,
                              "saturating_rps": round(saturating)}), flush=True)
            return
        conns = 32
        # Each connection waits `pause` ms between requests: about half the saturating rate.
        pause = max(1, round(1000 * conns / (saturating / 2)))
        with open(lua, "w") as f:
            f.write(LUA % (a.keys, a.addresses, pause, BODY))
        print(f"saturating {saturating:.0f} req/s; soak at ~{saturating / 2:.0f} req/s "
              f"({conns} connections, {pause} ms apart)", flush=True)
        load = subprocess.Popen(
            ["wrk", "-t2", f"-c{conns}", f"-d{a.minutes * 60 + 5}s", "-s", lua,
             f'http://127.0.0.1:{ports["gw"]}/'],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs.append(load)

        rows, upgrades, reloads, restarts = [], [0, 0], [0, 0], 0
        start = time.time()
        rss, fds, rmem, req = sample(gw.pid, ports)
        rows.append((0, rss, fds, rmem, req))
        print("minute,rss_bytes,descriptors,redis_bytes,requests", flush=True)
        print(f"0,{rss},{fds},{rmem},{req:.0f}", flush=True)
        second = 0
        while time.time() - start < a.minutes * 60:
            second += 1
            while time.time() < start + second:
                time.sleep(0.05)
            # A partner upgrade every second: a customer in turn, to standard and back.
            customer = second % CUSTOMERS
            plan_id = 2 if (second // CUSTOMERS) % 2 == 0 else 1
            status, _ = http(
                "POST", f'http://127.0.0.1:{ports["gw"]}/v2/service/upgrade',
                json.dumps({"apiKey": key(customer), "planID": plan_id}),
                {"Authorization": f"Bearer {PARTNER_KEY}", "Content-Type": "application/json"})
            upgrades[status == 200] += 1
            if second % 60 == 0:
                minute = second // 60
                with open(cfg, "w") as f:
                    f.write(config(ports, state, a.keys, 40 + minute % 2, not a.no_cluster))
                status, _ = http("POST", f'http://127.0.0.1:{ports["admin"]}/reload')
                reloads[status == 200] += 1
                rss, fds, rmem, req = sample(gw.pid, ports)
                rows.append((minute, rss, fds, rmem, req))
                print(f"{minute},{rss},{fds},{rmem},{req:.0f}", flush=True)
                # Redis restarted (empty: no persistence) after the sample, twice.
                if minute in (a.minutes // 3, 2 * a.minutes // 3) and restarts < 2:
                    redis.kill()
                    redis.wait()
                    redis = start_redis(ports["redis"], d)
                    procs.append(redis)
                    restarts += 1
        out, _ = load.communicate(timeout=60)
        rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
        with open(os.path.join(a.out, "soak.csv"), "w") as f:
            f.write("minute,rss_bytes,descriptors,redis_bytes,requests\n")
            for r in rows:
                f.write(",".join(str(round(v)) for v in r) + "\n")
        svg(rows, os.path.join(a.out, "soak.svg"))
        summary = {
            "minutes": a.minutes, "keys": a.keys, "addresses": a.addresses,
            "saturating_rps": round(saturating), "soak_rps": float(rate.group(1)) if rate else None,
            "upgrades_ok": upgrades[1], "upgrades_failed": upgrades[0],
            "reloads_ok": reloads[1], "reloads_failed": reloads[0], "redis_restarts": restarts,
            "wrk": out.strip().splitlines()[-12:],
        }
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
        print(json.dumps(summary, indent=1))
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
