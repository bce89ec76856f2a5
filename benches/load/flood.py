#!/usr/bin/env python3
"""Connection-flood client for Tollgate (benches/load/flood.sh runs it; stdlib only).

Two modes:

  flood      One client address (--source, 127.0.0.1) opens --conns connections (20,000) and
             sends one keyless request on each (`GET /v2/client/x`, no Authorization: a 401 on a
             kept-alive connection), then keeps every connection the gateway did not close open
             and idle. A second client (--second-source, 127.0.0.2) then makes one authenticated
             request, which must be answered 200 within --probe-timeout seconds. Reported: how
             many connections were answered and how many the gateway closed at once, the
             gateway's `tollgate_connections` gauge and refused counter (admin /metrics), its RSS
             (/proc/PID/status VmRSS, VmHWM) before the flood, at the peak and after the idle
             timeout has closed the idle connections. Exit status 1 when the second client was
             not served.

  idle       Memory per idle kept-alive connection: open --conns connections in --steps steps,
             one answered request each, all left idle; after each step the gateway's RSS and its
             gauge are read. Reported: (RSS with N idle - RSS before) / N, the least-squares
             slope of RSS over the open connections (the gauge), and the RSS left once all are
             closed again (what the allocator keeps).

The sockets are spread over worker processes when one process may not open them all
(RLIMIT_NOFILE); each worker drives its share with one epoll selector, at most --window
connections in flight (connecting, handshaking or waiting for the answer) at a time overall.
"""

import argparse
import errno
import json
import math
import multiprocessing as mp
import os
import resource
import selectors
import socket
import ssl
import sys
import time
import urllib.request
from multiprocessing.connection import wait as mp_wait

IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)

# Connection states.
CONNECTING, HANDSHAKE, SENDING, READING, HELD = range(5)


def now():
    return time.monotonic()


def request_bytes(host, path, key=None):
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "User-Agent: tollgate-flood"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def parse_answer(buf):
    """(status, keep_alive, complete) of an HTTP/1.1 answer in buf, or None if the head is
    not complete yet."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].decode("latin-1").split("\r\n")
    try:
        status = int(head[0].split(" ", 2)[1])
    except (IndexError, ValueError):
        return (0, False, True)
    length, close, chunked = 0, False, False
    for line in head[1:]:
        name, _, value = line.partition(":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == "content-length":
            length = int(value or 0)
        elif name == "connection" and "close" in value:
            close = True
        elif name == "transfer-encoding" and "chunked" in value:
            chunked = True
    body = buf[end + 4:]
    if chunked:
        complete = body.endswith(b"0\r\n\r\n")
    else:
        complete = len(body) >= length
    return (status, not close, complete)


def tls_context(h2=False):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"] if h2 else ["http/1.1"])
    return ctx


def h2_frame(kind, flags, stream, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def h2_string(s):
    b = s.encode()
    return bytes([len(b)]) + b  # HPACK string literal, no Huffman, under 127 bytes


def h2_request(host, path):
    """The client preface, an empty SETTINGS and one GET on stream 1 (HPACK: :method GET and
    :scheme https from the static table, :path and :authority as literals without indexing)."""
    block = b"\x82\x87" + b"\x04" + h2_string(path) + b"\x01" + h2_string(host)
    block += b"\x00" + h2_string("user-agent") + h2_string("tollgate-flood")
    return (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0)
            + h2_frame(1, 0x5, 1, block))


def h2_answer(c):
    """Read the frames in c.buf: (answered, lost). SETTINGS are acknowledged; the answer is
    complete when a frame of stream 1 ends it."""
    answered = False
    while len(c.buf) >= 9:
        n = int.from_bytes(c.buf[:3], "big")
        if len(c.buf) < 9 + n:
            break
        kind, flags = c.buf[3], c.buf[4]
        stream = int.from_bytes(c.buf[5:9], "big") & 0x7FFFFFFF
        c.buf = c.buf[9 + n:]
        if kind == 4 and not flags & 1:
            try:
                c.sock.send(h2_frame(4, 1, 0))
            except (ssl.SSLError, OSError):
                return False, True
        elif kind == 7:
            return False, True
        elif stream == 1 and kind in (0, 1) and flags & 1:
            answered = True
    return answered, False


class Conn:
    __slots__ = ("sock", "state", "buf", "t0", "t_answer", "got_bytes")

    def __init__(self, sock, t0):
        self.sock = sock
        self.state = CONNECTING
        self.buf = b""
        self.t0 = t0
        self.t_answer = 0.0
        self.got_bytes = False


class Worker:
    """One process's share of the connections, driven by commands from the parent."""

    def __init__(self, args, pipe, window):
        self.args = args
        self.pipe = pipe
        self.window = window
        self.addr = (args.host, args.port)
        if args.h2:
            self.req = h2_request(f"{args.host}:{args.port}", args.path)
        else:
            self.req = request_bytes(f"{args.host}:{args.port}", args.path)
        self.ctx = tls_context(args.h2) if args.tls or args.h2 else None
        self.sel = selectors.DefaultSelector()
        self.sel.register(pipe.fileno(), selectors.EVENT_READ, None)
        self.inflight = {}  # fd -> Conn, not yet answered or closed
        self.held = {}  # fd -> Conn, answered and idle
        self.to_open = 0
        self.stats = dict(
            started=0,
            answered=0,
            answered_close=0,  # answered with Connection: close
            closed_at_once=0,  # closed (EOF or reset) before any byte of an answer
            closed_mid_answer=0,
            connect_errors=0,
            timeouts=0,
            held_closed_by_server=0,
        )
        self.statuses = {}
        self.close_after = []  # seconds from answer to the server's close, held connections

    # --- connections -------------------------------------------------------------------
    def start_one(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        if self.args.source:
            s.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
            s.bind((self.args.source, 0))
        self.stats["started"] += 1
        err = s.connect_ex(self.addr)
        if err not in (0, errno.EINPROGRESS):
            self.stats["connect_errors"] += 1
            s.close()
            return
        c = Conn(s, now())
        self.inflight[s.fileno()] = c
        self.sel.register(s, selectors.EVENT_WRITE, c)

    def finish(self, c, outcome):
        fd = c.sock.fileno()
        self.inflight.pop(fd, None)
        self.held.pop(fd, None)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if outcome:
            self.stats[outcome] += 1

    def lost(self, c):
        """The server closed (or reset) c."""
        if c.state == HELD:
            self.close_after.append(now() - c.t_answer)
            self.finish(c, "held_closed_by_server")
        elif c.got_bytes:
            self.finish(c, "closed_mid_answer")
        else:
            self.finish(c, "closed_at_once")

    def send_request(self, c):
        try:
            c.sock.send(self.req)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            c.state = SENDING
            self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
            return
        except OSError:
            self.lost(c)
            return
        c.state = READING
        self.sel.modify(c.sock, selectors.EVENT_READ, c)

    def handshake(self, c):
        try:
            c.sock.do_handshake()
        except ssl.SSLWantReadError:
            self.sel.modify(c.sock, selectors.EVENT_READ, c)
            return
        except ssl.SSLWantWriteError:
            self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
            return
        except (ssl.SSLError, OSError):
            self.lost(c)
            return
        self.send_request(c)

    def on_event(self, c, mask):
        if c.state == CONNECTING:
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                if err in (errno.ECONNRESET, errno.EPIPE):
                    self.lost(c)
                else:
                    self.finish(c, "connect_errors")
                return
            if self.ctx is not None:
                self.sel.unregister(c.sock)
                del self.inflight[c.sock.fileno()]
                c.sock = self.ctx.wrap_socket(
                    c.sock, server_hostname="localhost", do_handshake_on_connect=False
                )
                self.inflight[c.sock.fileno()] = c
                self.sel.register(c.sock, selectors.EVENT_WRITE, c)
                c.state = HANDSHAKE
                self.handshake(c)
            else:
                self.send_request(c)
        elif c.state == HANDSHAKE:
            self.handshake(c)
        elif c.state == SENDING:
            self.send_request(c)
        elif c.state == READING:
            self.read_answer(c)
        else:  # HELD: anything readable is the server closing (or an unexpected byte)
            self.read_held(c)

    def recv(self, c):
        """Bytes read, b'' on EOF, None when nothing is there yet."""
        try:
            data = c.sock.recv(65536)
            if self.ctx is not None:
                while c.sock.pending():
                    data += c.sock.recv(65536)
            return data
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return None
        except (ssl.SSLError, OSError):
            return b""

    def read_answer(self, c):
        data = self.recv(c)
        if data is None:
            return
        if not data:
            self.lost(c)
            return
        c.got_bytes = True
        c.buf += data
        if self.args.h2:
            answered, gone = h2_answer(c)
            if gone:
                self.lost(c)
            elif answered:
                self.statuses["h2"] = self.statuses.get("h2", 0) + 1
                self.stats["answered"] += 1
                c.state, c.buf, c.t_answer = HELD, b"", now()
                del self.inflight[c.sock.fileno()]
                self.held[c.sock.fileno()] = c
            return
        a = parse_answer(c.buf)
        if a is None or not a[2]:
            return
        status, keep_alive, _ = a
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if not keep_alive:
            self.finish(c, "answered_close")
            return
        self.stats["answered"] += 1
        c.state, c.buf, c.t_answer = HELD, b"", now()
        del self.inflight[c.sock.fileno()]
        self.held[c.sock.fileno()] = c

    def read_held(self, c):
        data = self.recv(c)
        if data == b"":
            self.lost(c)

    def expire(self):
        t = now()
        for c in [c for c in self.inflight.values() if t - c.t0 > self.args.conn_timeout]:
            self.finish(c, "timeouts")

    # --- the loop ------------------------------------------------------------------------
    def report(self):
        return dict(self.stats, statuses=self.statuses, held_open=len(self.held),
                    inflight=len(self.inflight), close_after=self.close_after)

    def command(self, msg):
        op = msg[0]
        if op == "open":
            self.to_open += msg[1]
            self.opening = True
        elif op == "close":
            for c in list(self.held.values()):
                self.finish(c, None)
            self.pipe.send(("closed", self.report()))
        elif op == "status":
            self.pipe.send(("status", self.report()))
        elif op == "exit":
            return False
        return True

    def run(self):
        self.opening = False
        last_expire = now()
        while True:
            while self.to_open > 0 and len(self.inflight) < self.window:
                self.to_open -= 1
                self.start_one()
            if self.opening and self.to_open == 0 and not self.inflight:
                self.opening = False
                self.pipe.send(("opened", self.report()))
            for key, mask in self.sel.select(timeout=0.2):
                if key.data is None:
                    try:
                        msg = self.pipe.recv()
                    except EOFError:
                        return
                    if not self.command(msg):
                        return
                else:
                    self.on_event(key.data, mask)
            t = now()
            if t - last_expire > 0.5:
                last_expire = t
                self.expire()


def worker_main(args, pipe, window):
    try:
        Worker(args, pipe, window).run()
    except KeyboardInterrupt:
        pass


# --- the parent: gateway measurements ----------------------------------------------------
def proc_status(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "Threads"):
                out[k] = int(v.split()[0])  # kB (Threads: a count)
    return out


def metrics(admin):
    """tollgate_connections{listener} and tollgate_connections_refused_total{reason}."""
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(("tollgate_connections{", "tollgate_connections_refused_total{")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def gauge(m, tls):
    return int(m.get(f'tollgate_connections{{listener="{"tls" if tls else "http"}"}}', 0))


def refused(m):
    return {
        r: int(m.get(f'tollgate_connections_refused_total{{reason="{r}"}}', 0))
        for r in ("max_connections", "max_connections_per_ip")
    }


def probe(args):
    """One authenticated request from the second client: (status, seconds, error)."""
    t0 = now()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(args.probe_timeout)
    try:
        s.setsockopt(socket.SOL_IP, IP_BIND_ADDRESS_NO_PORT, 1)
        s.bind((args.second_source, 0))
        s.connect((args.host, args.port))
        if args.tls:
            s = tls_context().wrap_socket(s, server_hostname="localhost")
        s.sendall(request_bytes(f"{args.host}:{args.port}", args.probe_path, args.key))
        buf = b""
        while True:
            remaining = args.probe_timeout - (now() - t0)
            if remaining <= 0:
                raise socket.timeout("timed out")
            s.settimeout(remaining)
            data = s.recv(65536)
            if not data:
                return (None, now() - t0, "closed before the answer")
            buf += data
            a = parse_answer(buf)
            if a and a[2]:
                return (a[0], now() - t0, None)
    except OSError as e:
        return (None, now() - t0, f"{type(e).__name__}: {e}")
    finally:
        s.close()


def kib(kb):
    return f"{kb / 1024:.1f} MiB"


class Pool:
    def __init__(self, args):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        per_proc = max(256, soft - 128)
        n = args.procs or max(1, math.ceil(args.conns / per_proc))
        self.window = max(1, math.ceil(args.window / n))
        self.pipes, self.procs = [], []
        ctx = mp.get_context("fork")
        for _ in range(n):
            a, b = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(args, b, self.window), daemon=True)
            p.start()
            b.close()
            self.pipes.append(a)
            self.procs.append(p)
        self.nofile = soft

    def shares(self, total):
        n = len(self.pipes)
        return [total // n + (1 if i < total % n else 0) for i in range(n)]

    def send_all(self, msg_for):
        for i, p in enumerate(self.pipes):
            p.send(msg_for(i))

    def collect(self, kind, timeout=None, tick=None):
        """The reports of `kind` from every worker; tick() is called while waiting."""
        got = {}
        deadline = None if timeout is None else now() + timeout
        while len(got) < len(self.pipes):
            left = 0.2 if deadline is None else max(0.0, min(0.2, deadline - now()))
            for p in mp_wait([p for p in self.pipes if p not in got], timeout=left):
                msg = p.recv()
                if msg[0] == kind:
                    got[p] = msg[1]
            if tick:
                tick()
            if deadline is not None and now() >= deadline:
                break
        return merge(list(got.values()))

    def open(self, total, tick=None):
        shares = self.shares(total)
        self.send_all(lambda i: ("open", shares[i]))
        return self.collect("opened", tick=tick)

    def status(self):
        self.send_all(lambda i: ("status",))
        return self.collect("status", timeout=10)

    def close_all(self):
        self.send_all(lambda i: ("close",))
        return self.collect("closed", timeout=30)

    def stop(self):
        for p in self.pipes:
            try:
                p.send(("exit",))
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


def merge(reports):
    out = {}
    for r in reports:
        for k, v in r.items():
            if k == "statuses":
                s = out.setdefault("statuses", {})
                for code, n in v.items():
                    s[code] = s.get(code, 0) + n
            elif k == "close_after":
                out.setdefault("close_after", []).extend(v)
            else:
                out[k] = out.get(k, 0) + v
    return out


def settle(args, pid, want_gauge, timeout=10.0):
    """Wait until the gateway's gauge reaches want_gauge (or stops moving), then return
    (metrics, status) read after a short pause."""
    t0, last, same = now(), None, 0
    while now() - t0 < timeout:
        m = metrics(args.admin)
        g = gauge(m, args.tls)
        if g == want_gauge:
            break
        same = same + 1 if g == last else 0
        if same >= 5:
            break
        last = g
        time.sleep(0.2)
    time.sleep(args.settle)
    return metrics(args.admin), proc_status(pid)


def flood(args):
    pid = args.pid
    out = {"mode": "flood", "conns": args.conns}
    m0, st0 = metrics(args.admin), proc_status(pid)
    out["before"] = {"gauge": gauge(m0, args.tls), "refused": refused(m0), **st0}
    print(f"before: gauge {gauge(m0, args.tls)}, RSS {kib(st0['VmRSS'])} (HWM {kib(st0['VmHWM'])})",
          flush=True)
    pool = Pool(args)
    print(f"flood: {args.conns} connections from {args.source}, {len(pool.procs)} process(es), "
          f"{pool.window} in flight each, RLIMIT_NOFILE {pool.nofile}", flush=True)
    t0 = now()
    peak = {"gauge": 0, "VmRSS": 0}
    during = {}

    def tick():
        try:
            g = gauge(metrics(args.admin), args.tls)
            rss = proc_status(pid)["VmRSS"]
        except OSError:
            return
        peak["gauge"] = max(peak["gauge"], g)
        peak["VmRSS"] = max(peak["VmRSS"], rss)
        if not during and now() - t0 > 1.0:
            st, secs, err = probe(args)
            during.update(status=st, seconds=round(secs, 4), error=err, at=round(now() - t0, 2))

    r = pool.open(args.conns, tick=tick)
    flood_secs = now() - t0
    m1, st1 = settle(args, pid, r.get("held_open", 0))
    peak["gauge"] = max(peak["gauge"], gauge(m1, args.tls))
    peak["VmRSS"] = max(peak["VmRSS"], st1["VmRSS"])
    out["flood"] = dict(r, seconds=round(flood_secs, 2))
    out["flood"].pop("close_after", None)
    out["during_flood_probe"] = during
    out["peak"] = {"gauge_now": gauge(m1, args.tls), "gauge_max_seen": peak["gauge"],
                   "refused": refused(m1), "VmRSS_max_seen": peak["VmRSS"], **st1}
    ref = {k: v - out["before"]["refused"][k] for k, v in refused(m1).items()}
    print(f"flood done in {flood_secs:.1f} s: answered and kept open {r['answered']}, "
          f"closed at once {r['closed_at_once']}, answered with close {r['answered_close']}, "
          f"closed mid-answer {r['closed_mid_answer']}, connect errors {r['connect_errors']}, "
          f"timeouts {r['timeouts']}; statuses {r['statuses']}", flush=True)
    print(f"peak: gauge {gauge(m1, args.tls)} (max seen {peak['gauge']}), refused +{ref}, "
          f"RSS {kib(st1['VmRSS'])} (max seen {kib(peak['VmRSS'])}, HWM {kib(st1['VmHWM'])})",
          flush=True)
    if during:
        print(f"second client during the flood (t={during['at']} s): status {during['status']} "
              f"in {during['seconds'] * 1000:.1f} ms {during['error'] or ''}", flush=True)

    st, secs, err = probe(args)
    served = st == 200
    out["second_client"] = {"source": args.second_source, "status": st,
                            "seconds": round(secs, 4), "error": err, "served": served}
    print(f"second client ({args.second_source}) after the flood: "
          f"{'SERVED' if served else 'NOT SERVED'}: status {st} in {secs * 1000:.1f} ms"
          f"{' (' + err + ')' if err else ''}", flush=True)

    # The idle timeout closes the held connections.
    wait_until = now() + args.idle + args.idle_slack
    held = r.get("held_open", 0)
    print(f"waiting for the idle timeout ({args.idle} s) to close {held} idle connections...",
          flush=True)
    s = pool.status()
    while s.get("held_open", 0) > 0 and now() < wait_until:
        time.sleep(1)
        s = pool.status()
    m2, st2 = settle(args, pid, 0, timeout=5)
    ca = sorted(s.get("close_after", []))
    out["after_idle"] = {"gauge": gauge(m2, args.tls), "refused": refused(m2),
                         "held_still_open": s.get("held_open", 0),
                         "closed_by_server": s.get("held_closed_by_server", 0),
                         "close_after_s": {"min": round(ca[0], 2), "max": round(ca[-1], 2)}
                         if ca else None, **st2}
    print(f"after the idle timeout: {s.get('held_closed_by_server', 0)} closed by the gateway"
          + (f" {ca[0]:.1f}-{ca[-1]:.1f} s after their answer" if ca else "")
          + f", {s.get('held_open', 0)} still open; gauge {gauge(m2, args.tls)}; "
          f"RSS {kib(st2['VmRSS'])} (HWM {kib(st2['VmHWM'])})", flush=True)
    pool.stop()
    return out, served


def fit(points):
    """Least-squares slope and intercept of (x, y) points."""
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    if sxx == 0:
        return 0.0, my
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx
    return slope, my - slope * mx


def idle_round(args, pool, pid, label):
    m0, st0 = settle(args, pid, 0, timeout=10)
    g0 = gauge(m0, args.tls)
    points = [(g0, st0["VmRSS"])]
    print(f"{label}: before: gauge {g0}, RSS {st0['VmRSS']} kB", flush=True)
    step = math.ceil(args.conns / args.steps)
    opened, r = 0, {}
    while opened < args.conns:
        k = min(step, args.conns - opened)
        r = pool.open(k)
        opened += k
        held = pool.status().get("held_open", 0)
        m, st = settle(args, pid, held)
        g = gauge(m, args.tls)
        points.append((g, st["VmRSS"]))
        print(f"{label}: {opened} opened, {held} held by the client, gauge {g}, "
              f"RSS {st['VmRSS']} kB (HWM {st['VmHWM']} kB)", flush=True)
    slope, _ = fit(points)
    (g_first, rss_first), (g_last, rss_last) = points[0], points[-1]
    per = (rss_last - rss_first) * 1024 / max(1, g_last - g_first)
    res = {"points_gauge_rss_kb": points, "bytes_per_conn": round(per),
           "bytes_per_conn_slope": round(slope * 1024), "statuses": r.get("statuses"),
           "n": g_last - g_first}
    print(f"{label}: {g_last - g_first} idle connections: (RSS_N - RSS_0)/N = {per:.0f} B, "
          f"slope {slope * 1024:.0f} B per connection", flush=True)
    return res


def idle(args):
    pid = args.pid
    out = {"mode": "idle", "conns": args.conns, "tls": args.tls}
    # Warm-up: a few connections with one request each, closed, so that one-time
    # allocations (thread-local caches, the first task of each worker) are not counted.
    pool = Pool(args)
    pool.open(min(64, args.conns))
    pool.close_all()
    out["idle"] = idle_round(args, pool, pid, "idle")
    pool.close_all()
    time.sleep(2)
    m, st = settle(args, pid, 0)
    out["after_close"] = st
    print(f"after closing all (3 s): gauge {gauge(m, args.tls)}, RSS {st['VmRSS']} kB "
          f"(HWM {st['VmHWM']} kB): what the allocator keeps", flush=True)
    pool.stop()
    return out, True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["flood", "idle"], default="flood")
    ap.add_argument("--target", required=True, help="HOST:PORT of the gateway listener")
    ap.add_argument("--admin", required=True, help="HOST:PORT of the admin listener")
    ap.add_argument("--pid", type=int, required=True, help="the gateway's pid (RSS)")
    ap.add_argument("--conns", type=int, default=20000)
    ap.add_argument("--window", type=int, default=512, help="connections in flight, all workers")
    ap.add_argument("--procs", type=int, default=0, help="worker processes (0: as RLIMIT_NOFILE needs)")
    ap.add_argument("--source", default="127.0.0.1", help="the flooding client's address")
    ap.add_argument("--second-source", default="127.0.0.2")
    ap.add_argument("--path", default="/v2/client/x", help="the keyless request's path")
    ap.add_argument("--probe-path", default="/v2/client/getState")
    ap.add_argument("--key", default="flood-key", help="the second client's key")
    ap.add_argument("--probe-timeout", type=float, default=5.0)
    ap.add_argument("--conn-timeout", type=float, default=20.0,
                    help="a connection with no answer after this long counts as a timeout")
    ap.add_argument("--idle", type=float, default=60, help="the gateway's idle_timeout_seconds")
    ap.add_argument("--idle-slack", type=float, default=15)
    ap.add_argument("--steps", type=int, default=5, help="idle mode: steps to N")
    ap.add_argument("--settle", type=float, default=1.0, help="pause before reading RSS (s)")
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--h2", action="store_true", help="HTTP/2 over TLS (ALPN h2); implies --tls")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    args.tls = args.tls or args.h2
    host, _, port = args.target.rpartition(":")
    args.host, args.port = host, int(port)

    out, ok = (flood if args.mode == "flood" else idle)(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
