#!/usr/bin/env python3
"""Plot benches/load results: plot.py results.csv benchmarks.png

Left: saturation throughput (req/s) per setup, one bar per route. Right: p99 latency per
setup at each fixed rate (log scale), one bar per route and rate; a hatched bar is a rate the
setup did not sustain. Bars are medians over the repetitions, whiskers min..max.
"""

import csv
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SETUP_ORDER = ["D", "N1", "N1-log", "H1", "P0", "P0m", "G", "Gq", "Gn", "Ga", "G-log"]
ROUTES = [("send_message", "sendMessage"), ("send_group_event", "sendGroup event")]
NAMES = {
    ("G", "send_group_event"): "Gv",
    ("Gq", "send_group_event"): "Gqv",
    ("Gn", "send_group_event"): "Gnv",
    ("Ga", "send_group_event"): "Gav",
    ("G-log", "send_group_event"): "Gv-log",
}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py results.csv out.png")
    data = defaultdict(list)
    with open(sys.argv[1]) as f:
        for r in csv.DictReader(f):
            try:
                data[(r["setup"], r["route"], r["metric"])].append(float(r["value"]))
            except ValueError:
                pass
    setups = [s for s in SETUP_ORDER if any(k[0] == s for k in data)]
    rates = sorted({int(m.split("@")[1]) for (_s, _r, m) in data if m.startswith("p99_ms@") and m.split("@")[1].isdigit()})

    def stat(s, r, m):
        v = data.get((s, r, m))
        if not v:
            return None
        med = statistics.median(v)
        return med, med - min(v), max(v) - med

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    x = list(range(len(setups)))

    # Throughput.
    w = 0.8 / len(ROUTES)
    for i, (route, label) in enumerate(ROUTES):
        xs, ys, lo, hi = [], [], [], []
        for j, s in enumerate(setups):
            st = stat(s, route, "rps")
            if st:
                xs.append(j - 0.4 + w * (i + 0.5))
                ys.append(st[0])
                lo.append(st[1])
                hi.append(st[2])
        bars = ax1.bar(xs, ys, w, yerr=[lo, hi], capsize=3, label=label)
        ax1.bar_label(bars, labels=["%.0fk" % (y / 1000) for y in ys], fontsize=7, padding=2)
    ax1.set_xticks(x)
    ax1.set_xticklabels(setups)
    ax1.set_ylabel("req/s (wrk saturation, 1 proxy core)")
    ax1.set_title("Throughput")
    ax1.legend(fontsize=8)
    ax1.grid(axis="y", alpha=0.3)

    # p99 at the fixed rates.
    series = [(route, label, q) for route, label in ROUTES for q in rates]
    w = 0.8 / max(1, len(series))
    for i, (route, label, q) in enumerate(series):
        xs, ys, lo, hi, hatch = [], [], [], [], []
        for j, s in enumerate(setups):
            st = stat(s, route, "p99_ms@%d" % q)
            if st:
                xs.append(j - 0.4 + w * (i + 0.5))
                ys.append(st[0])
                lo.append(st[1])
                hi.append(st[2])
                sus = data.get((s, route, "sustained@%d" % q), [1])
                hatch.append(min(sus) < 1)
        if not xs:
            continue
        bars = ax2.bar(xs, ys, w, yerr=[lo, hi], capsize=2, label="%s @%dk/s" % (label, q // 1000))
        for b, h in zip(bars, hatch):
            if h:
                b.set_hatch("//")
    ax2.set_xticks(x)
    ax2.set_xticklabels(setups)
    ax2.set_yscale("log")
    ax2.set_ylabel("p99 latency, ms (oha open loop; log scale)")
    ax2.set_title("p99 at fixed rates (hatched: rate not sustained)")
    ax2.legend(fontsize=8)
    ax2.grid(axis="y", alpha=0.3, which="both")

    fig.suptitle("Tollgate vs HAProxy, nginx and bare Pingora (D: upstream direct; P0m: P0 with mimalloc; G/Gv: Tollgate)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
