#!/usr/bin/env python3
"""Redis's own CPU per key for the quota and ledger counts that ride a tick (standard library).

    benches/load/rider_script.py                  # 2,000 keys, 30 rounds, both forms
    benches/load/rider_script.py --keys 10000 --columns 1

Starts a redis-server of its own (as budget_script.py does: pinned to CPU 1 when there are
two, the client to CPU 0) and sends, for `--rounds` rounds, what one replica's tick sends for
`--keys` keys, each with a quota count and `--columns` ledger columns, in two forms:

- commands: a `HINCRBY` for the quota count, a `HINCRBY` per ledger column (field
  `<name>:<column>`), an `HSET` of plan and partner, and the day's `PEXPIREAT`, pipelined;
- scripts: `src/ledger/report.lua` (the quota counts, 500 keys a call) and
  `src/ledger/day.lua` (the ledger, 500 keys a call, the expiry set by the script), by
  `EVALSHA`; once with each row's plan and partner (a key's first report of the day, or a
  minute after the last), once without (unchanged: most ticks).

The commands' HSET is sent every tick, as the gateway sent it before the scripts.

Prints Redis's CPU time (utime + stime) per key for each, and the bytes each sends.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from budget_script import ROOT, cpu_ticks, read_reply, redis_server, resp  # noqa: E402

BATCH = 500


def commands(names, columns):
    out = []
    for n in names:
        out.append(resp("HINCRBY", "p:{meters}:q:1", n, 1))
        for c in columns:
            out.append(resp("HINCRBY", "p:{meters}:l:20000", "%s:%s" % (n, c), 1))
        out.append(resp("HSET", "p:{meters}:l:20000", n + ":plan", "basic", n + ":partner", ""))
    out.append(resp("PEXPIREAT", "p:{meters}:l:20000", 4102444800000))
    return out


def scripts(names, columns, report, day, named):
    out = []
    for at in range(0, len(names), BATCH):
        chunk = names[at:at + BATCH]
        args = ["EVALSHA", report, 1, "p:{meters}:q:1"]
        for n in chunk:
            args += [n, 1]
        out.append(resp(*args))
        args = ["EVALSHA", day, 1, "p:{meters}:l:20000", 4102444800000]
        for n in chunk:
            args += [n, "basic" if named else "", "", len(columns)]
            for c in columns:
                args += [c, 1]
        out.append(resp(*args))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--columns", type=int, default=3)
    a = ap.parse_args()
    columns = ["upstream_2xx", "rate_limited", "invalid_body", "upstream_4xx"][: a.columns]
    names = ["customer-%05d" % i for i in range(a.keys)]
    results = []
    with redis_server() as (redis, conn, f):
        sha = {}
        for name in ("report", "day"):
            with open(os.path.join(ROOT, "src/ledger/%s.lua" % name)) as src:
                conn.sendall(resp("SCRIPT", "LOAD", src.read()))
            sha[name] = read_reply(f).decode()
        forms = [("commands", commands(names, columns)),
                 ("scripts, names", scripts(names, columns, sha["report"], sha["day"], True)),
                 ("scripts", scripts(names, columns, sha["report"], sha["day"], False))]
        for label, calls in forms * 2:
            pipeline = b"".join(calls)
            conn.sendall(resp("FLUSHALL"))
            read_reply(f)
            c0 = cpu_ticks(redis.pid)
            for _ in range(a.rounds):
                conn.sendall(pipeline)
                for _ in calls:
                    read_reply(f)
            c1 = cpu_ticks(redis.pid)
            results.append((label, c1 - c0, len(pipeline)))
    tck = os.sysconf("SC_CLK_TCK")
    print("%d keys, a quota count and %d ledger columns each, %d rounds (each form twice)"
          % (a.keys, a.columns, a.rounds))
    for label, ticks, size in results:
        print("%-15s redis CPU per key %.2f µs, %d bytes a round"
              % (label, ticks / tck * 1e6 / (a.rounds * a.keys), size))


if __name__ == "__main__":
    main()
