#!/usr/bin/env python3
"""Redis's own CPU per key reported, for the shared budgets' script (standard library only).

    benches/load/budget_script.py                   # the script of the working tree
    benches/load/budget_script.py --rev e671187     # the script of another commit (A/B)
    benches/load/budget_script.py --keys 10000 --rounds 30 --batch 128
    benches/load/budget_script.py --script /tmp/variant.lua  # a variant of it, by file

Starts a redis-server of its own on a free port of 127.0.0.1 (pinned to CPU 1 when there are two,
the client to CPU 0), loads the budget script (src/shared/budget.lua), and sends what one replica's
exchanges send: `--keys` budget names (as the gateway names them: a prefix and 32 hex digits),
`--batch` keys per EVALSHA, every call of a round in one pipeline, one request per key per round
(a hit, or with leases one request asked for), for `--rounds` rounds. Prints Redis's CPU time
(utime + stime from /proc, all its threads) per key reported. Three argument layouts are
understood: the lease script (`ARGV[1]` the horizon, `ARGV[2]` seven little-endian 64-bit
words a key: want, give, debt, interval, limit, floor, early; six before `early`), the packed
view script before it (replica, horizon, recent, then three words a key: hits, interval,
floor), and an older one with three arguments a key.
"""

import argparse
import contextlib
import hashlib
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def script_of(rev):
    """The budget script, from src/shared/budget.lua (or, for a revision from before the file
    existed, from the BUDGET_LUA string of src/cluster/mod.rs)."""
    def read(path):
        if rev:
            return subprocess.run(["git", "-C", ROOT, "show", "%s:%s" % (rev, path)],
                                  capture_output=True, text=True)
        try:
            with open(os.path.join(ROOT, path)) as f:
                return subprocess.CompletedProcess([], 0, f.read(), "")
        except OSError:
            return subprocess.CompletedProcess([], 1, "", "")
    got = read("src/shared/budget.lua")
    if got.returncode == 0:
        return got.stdout
    got = read("src/cluster/mod.rs")
    m = re.search(r'pub const BUDGET_LUA: &str = r"\n(.*?)\n";', got.stdout, re.S)
    if not m:
        sys.exit("no budget script in src/shared/budget.lua or src/cluster/mod.rs")
    return m.group(1)


def resp(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, int):
            a = str(a).encode()
        elif isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def read_reply(f):
    line = f.readline()
    kind = line[:1]
    if kind == b"-":
        raise RuntimeError(line.decode().strip())
    if kind in (b"+", b":"):
        return line
    if kind == b"$":
        n = int(line[1:])
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        return [read_reply(f) for _ in range(int(line[1:]))]
    raise RuntimeError("unexpected reply %r" % line)


def cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


@contextlib.contextmanager
def redis_server():
    """A redis-server of its own on a free port of 127.0.0.1, without persistence (pinned to
    CPU 1 when there are two, the caller to CPU 0), and a connection to it: yields the
    process, the socket and a reader of the socket; stops the server after."""
    two = (os.cpu_count() or 1) >= 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", d]
        if two:
            cmd = ["taskset", "-c", "1"] + cmd
            os.sched_setaffinity(0, {0})
        redis = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(100):
                try:
                    conn = socket.create_connection(("127.0.0.1", port))
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                sys.exit("redis-server did not start")
            with conn:
                yield redis, conn, conn.makefile("rb")
        finally:
            redis.terminate()
            redis.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", help="take BUDGET_LUA from this git revision")
    ap.add_argument("--script", help="take the script from this file (a variant to weigh)")
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    if a.script:
        with open(a.script) as f:
            lua = f.read()
    else:
        lua = script_of(a.rev)
    packed = "struct.unpack" in lua
    leases = "'<I8I8I8I8I8I8'" in lua or "'<I8I8I8I8I8I8I8'" in lua
    # The lease script since `early` (a seventh word: how far ahead of its refill a key may
    # be granted) was added.
    words = 7 if "'<I8I8I8I8I8I8I8'" in lua else 6
    with redis_server() as (redis, conn, f):
        conn.sendall(resp("SCRIPT", "LOAD", lua))
        sha = read_reply(f).decode()
        names = ["bench:b:{%s}" % hashlib.sha256(b"%d" % i).hexdigest()[:32] for i in range(a.keys)]
        calls = []
        for at in range(0, a.keys, a.batch):
            keys = names[at:at + a.batch]
            if leases:
                args = ["EVALSHA", sha, len(keys)] + keys + [10000]
                args.append(struct.pack("<%dQ" % (words * len(keys)),
                                        *([1, 0, 0, 66667, 150, 0, 0][:words] * len(keys))))
                calls.append(resp(*args))
                continue
            args = ["EVALSHA", sha, len(keys)] + keys + ["0123456789abcdef", 10000, 200]
            if packed:
                args.append(struct.pack("<%dQ" % (3 * len(keys)), *([1, 66667, 0] * len(keys))))
            else:
                for _ in keys:
                    args += [1, 66667, 0]
            calls.append(resp(*args))
        pipeline = b"".join(calls)
        t0, c0 = time.time(), cpu_ticks(redis.pid)
        for _ in range(a.rounds):
            conn.sendall(pipeline)
            for _ in calls:
                read_reply(f)
        t1, c1 = time.time(), cpu_ticks(redis.pid)
    tck = os.sysconf("SC_CLK_TCK")
    per_key = (c1 - c0) / tck * 1e6 / (a.rounds * a.keys)
    print("script: %s (%s arguments); %d keys, %d per call, %d rounds in %.2f s"
          % (a.script or a.rev or "working tree", "leases" if leases else "packed" if packed else "per-key", a.keys, a.batch, a.rounds, t1 - t0))
    print("redis CPU per key reported: %.2f µs" % per_key)


if __name__ == "__main__":
    main()
