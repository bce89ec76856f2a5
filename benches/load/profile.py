#!/usr/bin/env python3
"""Where one setup's CPU time per request goes beyond another's, by crate and by function.

    profile.py --results OUT/results.csv --route send_message A B [--top 40]

A and B are setups of one `PROFILE=1 benches/load/run.sh` run (for example G and P0m): its
raw/profile-<setup>-<route>.txt is `perf report` of the proxy sampled on `cpu-clock` while
wrk saturated it (user and kernel alike), and results.csv has that run's CPU µs per request
(`profile_cpu_us_per_req`). Each function's share of the samples times the setup's median µs
per request in the measured (unsampled) runs is its µs per request; the table groups them by crate as account.py does (the kernel as
`kernel`, C libraries by name) and prints A − B, then the functions with the largest
differences. Unlike callgrind's instruction counts, this sees the kernel (system calls, TCP,
wake-ups) and the real CPU (SHA extensions, cache misses), at the price of sampling noise:
about ±0.1 µs on a 10 s run here.
"""

import argparse
import collections
import csv
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from account import crate  # noqa: E402


def samples(path):
    """Share (0..1) of the samples per (group, function), from `perf report --stdio`: the
    same function in two binaries (the gateway's and p0m's) is one row."""
    out = collections.Counter()
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s+([\d.]+)%\s+(\S+)\s+\[([.k])\]\s+(.*?)\s*$", line)
            if m:
                dso, where, name = m.groups()[1:]
                out[(group(dso, where, name), name)] += float(m.group(1)) / 100
    return out


def group(dso, where, name):
    """The crate (or `kernel`, or a C library) of a sampled function."""
    if where == "k" or dso.startswith("[kernel"):
        return "kernel"
    if dso.startswith("lib") or dso == "[vdso]":
        return "libc" if dso in ("libc.so.6", "[vdso]") else dso.split(".so")[0]
    return crate(name)


def us_per_request(results, setup, route):
    """The median CPU µs per request of the setup's measured (unprofiled) saturation runs,
    and the profiled run's own (which includes the sampling's cost)."""
    measured, profiled = [], None
    with open(results) as f:
        for row in csv.DictReader(f):
            if (row["setup"], row["route"]) != (setup, route):
                continue
            if row["metric"] == "cpu_us_per_req":
                measured.append(float(row["value"]))
            elif row["metric"] == "profile_cpu_us_per_req":
                profiled = float(row["value"])
    if not measured or profiled is None:
        sys.exit(f"no cpu_us_per_req or profile_cpu_us_per_req for {setup} {route} in {results}")
    return statistics.median(measured), profiled


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--route", default="send_message")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args()
    raw = os.path.join(os.path.dirname(os.path.abspath(args.results)), "raw")
    side = {}
    for s in (args.a, args.b):
        us, profiled = us_per_request(args.results, s, args.route)
        share = samples(os.path.join(raw, f"profile-{s}-{args.route}.txt"))
        side[s] = (us, {k: v * us for k, v in share.items()}, sum(share.values()), profiled)
    (ua, a, ca, pa), (ub, b, cb, pb) = side[args.a], side[args.b]
    print(f"A: {args.a} — {ua:.2f} µs of CPU per request (median of the measured runs; "
          f"{pa:.2f} while sampled; {ca:.0%} of the samples listed); B: {args.b} — {ub:.2f} "
          f"({pb:.2f}; {cb:.0%}); A − B: {ua - ub:+.2f} µs ({args.route})\n")
    by = collections.Counter()
    for k in set(a) | set(b):
        by[k[0]] += a.get(k, 0) - b.get(k, 0)
    print("| crate | A µs | B µs | A − B µs |")
    print("|---|---:|---:|---:|")
    tot_a = collections.Counter()
    tot_b = collections.Counter()
    for k, v in a.items():
        tot_a[k[0]] += v
    for k, v in b.items():
        tot_b[k[0]] += v
    for c, v in sorted(by.items(), key=lambda kv: -abs(kv[1])):
        if abs(v) >= 0.02 or tot_a[c] >= 0.2:
            print(f"| {c} | {tot_a[c]:.2f} | {tot_b[c]:.2f} | {v:+.2f} |")
    print("\n| function | A µs | B µs | A − B µs |")
    print("|---|---:|---:|---:|")
    diffs = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
    for k, v in sorted(diffs.items(), key=lambda kv: -abs(kv[1]))[: args.top]:
        name = k[1] if len(k[1]) <= 100 else k[1][:97] + "..."
        name = name.replace("|", "\\|")
        print(f"| `{name}` ({k[0]}) | {a.get(k, 0):.2f} | {b.get(k, 0):.2f} | {v:+.2f} |")


if __name__ == "__main__":
    sys.exit(main())
