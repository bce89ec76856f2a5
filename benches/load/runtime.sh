#!/usr/bin/env bash
# The runtime, chosen by measurement: the gateway (G) and bare Pingora with Tollgate's allocator
# (P0m) under each set of Pingora runtime settings, side by side, in alternating rounds.
#
#   benches/load/runtime.sh                 # every variant, 3 rounds (≈ 30 min)
#   ROUNDS=1 DURATION=3 benches/load/runtime.sh   # a quick look
#   VARIANTS="t1-steal t1-nosteal" benches/load/runtime.sh
#
# Each variant is a Pingora settings file (written to $OUT/conf/<variant>.yaml) given to both
# proxies: G as `--conf`, P0m as its fourth argument (benches/load/p0.rs), so that the two
# always run the same runtime. A round runs benches/load/run.sh once per variant (SETUPS="P0m
# G", the send_message route, REPS=1: one saturation run with wrk, then oha at 5,000 and 20,000
# req/s); rounds alternate the variants, so that a slow minute of the machine falls on all of
# them. Threads: 1 (the proxy pinned to CPU 0, wrk and the upstream nginx on CPU 1, as run.sh
# does) or 2 (the proxy on CPUs 0 and 1, the load on CPU 1 too).
#
# Variants (name: settings):
#   t1-steal        threads 1, work_stealing true          (Pingora's default runtime, 1 thread)
#   t1-nosteal      threads 1, work_stealing false
#   t1-nosteal-p16  threads 1, work_stealing false, upstream_keepalive_pool_size 16 (< the 64
#                   client connections: upstream connections are opened and closed)
#   t1-nosteal-l2   threads 1, work_stealing false, listener_tasks_per_fd 2
#   t2-steal        threads 2, work_stealing true          (Pingora's default on this machine)
#   t2-nosteal      threads 2, work_stealing false
#   t2-steal-c4     threads 2, work_stealing true,  4 client connections (few: how they spread)
#   t2-nosteal-c4   threads 2, work_stealing false, 4 client connections
#
# Output: $OUT (default target/runtime-results/<timestamp>/): results.csv (every round's rows,
# with a `variant` column), summary.md (medians per variant and setup: req/s, CPU µs a
# request, user µs, p99 at 5k and 20k req/s, the busiest two threads' CPU), and each round's
# run.sh output under runs/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/benches/load

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-6}
WARMUP=${WARMUP:-2}
VARIANTS=${VARIANTS:-"t1-steal t1-nosteal t1-nosteal-p16 t1-nosteal-l2 t2-steal t2-nosteal t2-steal-c4 t2-nosteal-c4"}
OUT=${OUT:-$ROOT/target/runtime-results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/conf" "$OUT/runs"
OUT=$(cd "$OUT" && pwd)

# variant -> "threads stealing pool listeners conns"
settings() {
  case $1 in
    t1-steal) echo "1 true 128 1 64" ;;
    t1-nosteal) echo "1 false 128 1 64" ;;
    t1-nosteal-p16) echo "1 false 16 1 64" ;;
    t1-nosteal-l2) echo "1 false 128 2 64" ;;
    t2-steal) echo "2 true 128 1 64" ;;
    t2-nosteal) echo "2 false 128 1 64" ;;
    t2-steal-c4) echo "2 true 128 1 4" ;;
    t2-nosteal-c4) echo "2 false 128 1 4" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

for v in $VARIANTS; do
  read -r threads stealing pool listeners _ < <(settings "$v")
  cat > "$OUT/conf/$v.yaml" <<EOF
# benches/load/runtime.sh, variant $v
---
version: 1
threads: $threads
work_stealing: $stealing
upstream_keepalive_pool_size: $pool
listener_tasks_per_fd: $listeners
pid_file: /tmp/tollgate-bench.pid
upgrade_sock: /tmp/tollgate-bench-upgrade.sock
EOF
done

echo "variant,setup,route,metric,rep,value" > "$OUT/results.csv"
for round in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    read -r threads _ _ _ conns < <(settings "$v")
    cpus=0; [ "$threads" = 2 ] && cpus=0,1
    echo "[$(date +%H:%M:%S)] round $round: $v" >&2
    dir="$OUT/runs/$v-$round"
    conf="$OUT/conf/$v.yaml"
    OUT=$dir SETUPS="P0m G" LOG_SETUPS="" OVERLOAD_SETUPS="" ROUTES=send_message REPS=1 \
      DURATION=$DURATION WARMUP=$WARMUP CONNS=$conns PROXY_CPU=$cpus \
      PINGORA_CONF="$conf" KEYS="${KEYS:-3000}" \
      "$HERE/run.sh" > "$dir.log" 2>&1 || { echo "run.sh failed for $v: see $dir.log" >&2; exit 1; }
    tail -n +2 "$dir/results.csv" | awk -F, -v v="$v" -v k="$round" 'BEGIN { OFS = "," } { $4 = k; print v, $0 }' >> "$OUT/results.csv"
  done
done

python3 - "$OUT/results.csv" "$VARIANTS" > "$OUT/summary.md" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
variants = sys.argv[2].split()
def med(v, s, m):
    xs = [float(r["value"]) for r in rows if r["variant"] == v and r["setup"] == s and r["metric"] == m and r["value"]]
    return statistics.median(xs) if xs else None
def all_(v, s, m):
    return [r["value"] for r in rows if r["variant"] == v and r["setup"] == s and r["metric"] == m]
def f(x, d=1):
    return "–" if x is None else f"{x:,.{d}f}"
print("| variant | setup | req/s (each round) | CPU µs a request (each round) | median CPU µs | user µs | p99 @ 5k ms | p99 @ 20k ms | busiest threads, % of a CPU |")
print("|---|---|---|---|---|---|---|---|---|")
for v in variants:
    for s in ("P0m", "G"):
        rps = ", ".join(f"{float(x)/1000:.1f}k" for x in all_(v, s, "rps"))
        cpu = ", ".join(x for x in all_(v, s, "cpu_us_per_req"))
        t = [med(v, s, f"thread{i}_cpu_pct") for i in (1, 2)]
        print(f"| {v} | {s} | {rps} | {cpu} | {f(med(v, s, 'cpu_us_per_req'), 2)} | {f(med(v, s, 'user_us_per_req'), 2)} "
              f"| {f(med(v, s, 'p99_ms@5000'), 2)} | {f(med(v, s, 'p99_ms@20000'), 2)} | {f(t[0], 0)}, {f(t[1], 0)} |")
PY
cat "$OUT/summary.md"
echo "results: $OUT" >&2
