#!/usr/bin/env python3
"""The growth plot of benches/load/growth.sh: growth_plot.py OUT_DIR PNG.

Four panels from OUT_DIR/growth.csv, OUT_DIR/scale/scale.csv and OUT_DIR/exchange/exchange.csv
(whichever exist): instructions per request against configured keys; the request path's and
the exchange's instructions per request against active keys; resident memory against
configured keys (at rest and at the peak of a reload); Redis CPU per key call and the
exchange round's time against active keys, one line per fleet size.
"""

import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [r for r in csv.DictReader(line for line in f if not line.startswith("#"))]


def series(data, part, metric):
    pts = sorted((int(r["keys"]), float(r["value"])) for r in data
                 if r["part"] == part and r["metric"] == metric and r["value"])
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    out, png = sys.argv[1], sys.argv[2]
    growth = rows(os.path.join(out, "growth.csv"))
    scale = rows(os.path.join(out, "scale", "scale.csv"))
    exchange = rows(os.path.join(out, "exchange", "exchange.csv"))
    fig, ax = plt.subplots(2, 2, figsize=(12, 8.5))

    a = ax[0][0]
    x, y = series(growth, "configured", "instructions_per_request")
    if x:
        a.plot(x, [v / 1e3 for v in y], "o-", label="G (request path)")
        a.set_ylim(0, max(y) / 1e3 * 1.25)
    a.set_xscale("log")
    a.set_xlabel("configured keys")
    a.set_ylabel("k instructions / request")
    a.set_title("Cost per request vs configured keys (callgrind)")
    a.legend()

    a = ax[0][1]
    for metric, label in (("request_path_instructions", "Ga request path"),
                          ("exchange_instructions", "Ga exchange with Redis (other threads)")):
        x, y = series(growth, "active", metric)
        if x:
            a.plot(x, [v / 1e3 for v in y], "o-", label=label)
    a.set_xscale("log")
    a.set_ylim(bottom=0)
    a.set_xlabel("keys in rotation (each new in its sync interval)")
    a.set_ylabel("k instructions / request")
    a.set_title("Request path and exchange vs active keys (callgrind)")
    a.legend()

    a = ax[1][0]
    for metric, label in (("rss_kb", "RSS at rest"), ("reload_peak_kb", "peak RSS during a reload")):
        x, y = series(scale, "configured", metric)
        if x:
            a.plot(x, [v / 1024 for v in y], "o-", label=label)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("configured keys")
    a.set_ylabel("MB")
    a.set_title("Gateway memory vs configured keys")
    a.legend()

    a = ax[1][1]
    fleets = sorted({int(r["replicas"]) for r in exchange})
    for n in fleets:
        pts = sorted((int(r["active"]), float(r["redis_cpu_us_per_key"]), float(r["round_p50_ms"]))
                     for r in exchange if int(r["replicas"]) == n)
        a.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label="Redis CPU µs per key call, %d replica(s)" % n)
    a.set_xscale("log")
    a.set_ylim(bottom=0)
    a.set_xlabel("active keys per sync interval (each replica)")
    a.set_ylabel("µs of Redis CPU per key call")
    a.set_title("Redis per key call vs active keys and replicas")
    if fleets:
        b = a.twinx()
        for n in fleets:
            pts = sorted((int(r["active"]), float(r["round_p50_ms"])) for r in exchange if int(r["replicas"]) == n)
            b.plot([p[0] for p in pts], [p[1] for p in pts], "x:", label="round p50 ms, %d" % n)
        b.axhline(100, color="grey", lw=0.8)
        b.set_yscale("log")
        b.set_ylabel("exchange round p50, ms (grey: the 100 ms interval)")
        lines = a.get_legend_handles_labels()
        more = b.get_legend_handles_labels()
        a.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
