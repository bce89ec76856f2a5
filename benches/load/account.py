#!/usr/bin/env python3
"""Where one setup's instructions per request go beyond another's, by crate and by function.

    account.py --requests N A.callgrind B.callgrind [--top 40] [--us-per-instr X]

A and B are callgrind dumps of the same N measured requests (benches/load/instructions.sh
leaves them in its OUT directory: callgrind.<setup>.<pid>.1, or per thread .1-<n>: give every
file of a setup, comma-separated). Prints markdown: the difference A − B per request, grouped
by crate (the first path segment of the Rust function name; C functions by their library:
memcpy and friends under `libc`, mimalloc's `mi_*`/`_mi_*` under `mimalloc`), then the
functions with the largest differences. With --us-per-instr (the proxy's user µs per request
divided by its instructions per request, from a load run), each row also gets µs.

Instructions are exact for the code callgrind runs; note that valgrind does not emulate the
SHA extensions, so SHA-256 runs its portable code under it (about 3.5k instructions for one
block, a few hundred with the extensions on the real CPU).
"""

import argparse
import collections
import re
import subprocess
import sys


def functions(paths):
    """Self instructions per function name, summed over the given dump files."""
    out = collections.Counter()
    for path in paths:
        text = subprocess.run(
            ["callgrind_annotate", "--inclusive=no", "--threshold=100", path],
            check=True, capture_output=True, text=True,
        ).stdout
        for line in text.splitlines():
            m = re.match(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(\S.*)$", line)
            if not m or "PROGRAM TOTALS" in line:
                continue
            n = int(m.group(1).replace(",", ""))
            name = m.group(2)
            name = re.sub(r"\s+\[[^\]]*\]$", "", name)  # the object file
            name = re.sub(r"^[^:]*:(?!:)", "", name, count=1) if not name.startswith("<") else name
            out[name] += n
    return out


def crate(name):
    """The crate (or C library) a function belongs to."""
    if re.match(r"^_?_?mi_|^mi_", name):
        return "mimalloc"
    if name.startswith("__") or re.match(r"^(mem|str)[a-z]*", name):
        return "libc"
    # `<A as B>::f`: the implementing type's crate, else the trait's.
    m = re.match(r"^<([A-Za-z_][A-Za-z0-9_]*)::", name) or re.match(r"^<&?(?:mut )?([A-Za-z_][A-Za-z0-9_]*)::", name)
    if m:
        return m.group(1)
    m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)::", name)
    if m:
        return m.group(1)
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, required=True)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--us-per-instr", type=float, default=0.0)
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args()
    a = functions(args.a.split(","))
    b = functions(args.b.split(","))
    n = args.requests
    per = lambda v: v / n
    us = lambda v: "" if not args.us_per_instr else " | %+.2f" % (v * args.us_per_instr)
    head_us = "" if not args.us_per_instr else " | µs"
    ta, tb = sum(a.values()), sum(b.values())
    print("A: %s — %.0f instructions per request; B: %s — %.0f; A − B: %+.0f\n"
          % (args.a, per(ta), args.b, per(tb), per(ta - tb)))
    by = collections.Counter()
    for k in set(a) | set(b):
        by[crate(k)] += a.get(k, 0) - b.get(k, 0)
    print("| crate | A − B instructions per request%s |" % head_us)
    print("|---|---:%s|" % ("|---:" if args.us_per_instr else ""))
    for c, v in sorted(by.items(), key=lambda kv: -abs(kv[1])):
        if abs(per(v)) >= 20:
            print("| %s | %+.0f%s |" % (c, per(v), us(per(v))))
    print("\n| function | A | B | A − B%s |" % head_us)
    print("|---|---:|---:|---:%s|" % ("|---:" if args.us_per_instr else ""))
    diffs = {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b)}
    for k, v in sorted(diffs.items(), key=lambda kv: -abs(kv[1]))[: args.top]:
        name = k if len(k) <= 110 else k[:107] + "..."
        print("| `%s` | %.0f | %.0f | %+.0f%s |" % (name.replace("|", "\\|"), per(a.get(k, 0)), per(b.get(k, 0)), per(v), us(per(v))))


if __name__ == "__main__":
    sys.exit(main())
