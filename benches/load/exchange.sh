#!/usr/bin/env bash
# What the shared budgets' exchange costs Redis as active keys and replicas grow: starts its
# own redis-server on a free port (pinned to CPU 1, no persistence) and runs exchange.py
# (pinned to CPU 0) against it; see exchange.py for what is sent and measured.
#
#   benches/load/exchange.sh                                  # 1k, 10k, 100k keys × 1, 3, 10 replicas
#   ACTIVE="1000 10000" REPLICAS="1 3" ROUNDS=10 benches/load/exchange.sh
#
# Output: a table on stdout and $OUT/exchange.csv (default target/exchange/<time>/).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/benches/load
# shellcheck source=benches/load/lib.sh
. "$HERE/lib.sh"
ACTIVE=${ACTIVE:-"1000 10000 100000"}
REPLICAS=${REPLICAS:-"1 3 10"}
ROUNDS=${ROUNDS:-20}
INTERVAL_MS=${INTERVAL_MS:-100}
OUT=${OUT:-$ROOT/target/exchange/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
need redis-server
TMP=$(mktemp -d /tmp/tollgate-exchange.XXXXXX)
trap on_exit_cleanup EXIT
trap 'exit 130' INT TERM
read -r R_PORT < <(free_ports 1)
taskset -c 1 redis-server --port "$R_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$TMP" >"$OUT/redis.out" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_port "$R_PORT"
log "redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$R_PORT (CPU 1); client on CPU 0"
taskset -c 0 python3 "$HERE/exchange.py" --redis-port "$R_PORT" --redis-pid "$REDIS_PID" \
  --active "$ACTIVE" --replicas "$REPLICAS" --rounds "$ROUNDS" --interval-ms "$INTERVAL_MS" \
  --out "$OUT/exchange.csv" | tee "$OUT/exchange.md"
