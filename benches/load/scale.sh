#!/usr/bin/env bash
# How memory and reload grow with the keys: configured keys (the key table) and active keys
# (the per-key state a request leaves behind, in the process and in Redis).
#
#   benches/load/scale.sh                       # 1k, 100k and 1M configured keys; 10k and 100k active
#   KEYS_LIST="1000 100000" ACTIVE_LIST="10000" benches/load/scale.sh   # lighter
#
# Part 1, configured keys, for each K in KEYS_LIST: gen.py writes the benchmark's config with K
# keys (sha256 digests, plan pro); the gateway starts (`tollgate run`, one worker thread) and
# the time to /readyz 200 is taken; then its resident memory (VmRSS); then, with the peak reset
# (`echo 5 > /proc/PID/clear_refs`), `POST /reload` of the same file is timed (curl, to the
# answer: the file read, validated and swapped) and the peak during it read (VmHWM). Memory
# per configured key is the slope between the smallest and the largest K.
#
# Part 2, active keys, for each A in ACTIVE_LIST: a gateway with every part-two and part-three
# feature (Ga: all.yaml and tollgate-p3.yaml, `cluster:` against a redis-server this script
# starts) and A keys configured; after a warm-up on one fixed key over the same 32
# connections, wrk sends requests rotating over the A keys until each has been sent at least
# twice; the growth of the gateway's VmRSS and of Redis's `used_memory` (and its DBSIZE),
# divided by A, is the memory each active key costs; with two or more A, the slope between
# the smallest and the largest leaves out what any traffic costs once (a ledger file's first
# pages, the usage view's buffers).
#
# Output: a table on stdout and $OUT/scale.csv (default target/scale/<time>/).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/benches/load
# shellcheck source=benches/load/lib.sh
. "$HERE/lib.sh"

KEYS_LIST=${KEYS_LIST:-"1000 100000 1000000"}
ACTIVE_LIST=${ACTIVE_LIST:-"10000 100000"}
OUT=${OUT:-$ROOT/target/scale/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
need redis-server
need wrk
need curl
release_bin
TMP=$(mktemp -d /tmp/tollgate-scale.XXXXXX)
trap on_exit_cleanup EXIT
trap 'exit 130' INT TERM

read -r D_PORT N1_PORT G_PORT G_ADMIN_PORT R_PORT < <(free_ports 5)
[ -n "${R_PORT:-}" ] || die "no 5 free ports found"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || need nginx

calc() { awk "BEGIN { print $1 }"; }
kb() { awk -v f="$2" '$1 == f":" { print $2 }' "/proc/$1/status"; }
now_ns() { date +%s%N; }
csv=$OUT/scale.csv
echo "part,keys,metric,value" > "$csv"
row() { echo "$1,$2,$3,$4" >> "$csv"; }

gen() { # keys dir
  mkdir -p "$2"
  python3 "$HERE/gen.py" --dir "$2" --keys "$1" --d-port "$D_PORT" --n1-port "$N1_PORT" \
    --g-port "$G_PORT" --g-admin-port "$G_ADMIN_PORT"
}

# The upstream (nginx `return 200 '{}'`), from the first generated directory.
gen 1 "$TMP/up"
"$NGINX" -p "$TMP/up/nginx-d" -c "$TMP/up/nginx-d/nginx.conf" -e "$TMP/up/nginx-d/error.log" \
  -g 'daemon off;' >"$OUT/nginx.out" 2>&1 &
PIDS+=($!)
wait_port "$D_PORT"

start_gateway() { # config log -> GW_PID, GW_START_S
  local t0; t0=$(now_ns)
  TOLLGATE_LOG=warn "$BIN" run --config "$1" --conf "$HERE/pingora.yaml" >"$2" 2>&1 &
  GW_PID=$!
  PIDS+=("$GW_PID")
  local _
  for _ in $(seq 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$G_ADMIN_PORT/readyz")" = 200 ] && break
    alive "$GW_PID" || die "the gateway exited (see $2)"
    sleep 0.05
  done
  GW_START_S=$(awk -v a="$t0" -v b="$(now_ns)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
}
stop_gateway() { stop_pid "$GW_PID" INT; forget "$GW_PID"; }

log "part 1: configured keys ($KEYS_LIST)"
printf '| configured keys | config file | start to ready | RSS | reload | peak RSS during reload |\n|---:|---:|---:|---:|---:|---:|\n'
for k in $KEYS_LIST; do
  d=$TMP/k$k
  gen "$k" "$d"
  start_gateway "$d/tollgate.yaml" "$OUT/gateway-k$k.log"
  sleep 1   # let the start's transient buffers go back (the RSS read is of the settled process)
  rss=$(kb "$GW_PID" VmRSS)
  echo 5 > "/proc/$GW_PID/clear_refs"   # reset VmHWM to the current RSS
  read -r code reload_s < <(curl -s -o "$OUT/reload-k$k.json" -w '%{http_code} %{time_total}\n' \
    --max-time 120 -X POST "http://127.0.0.1:$G_ADMIN_PORT/reload")
  [ "$code" = 200 ] || die "reload at $k keys answered $code: $(cat "$OUT/reload-k$k.json")"
  hwm=$(kb "$GW_PID" VmHWM)
  size=$(stat -c %s "$d/tollgate.yaml")
  stop_gateway
  row configured "$k" start_s "$GW_START_S"
  row configured "$k" rss_kb "$rss"
  row configured "$k" reload_s "$reload_s"
  row configured "$k" reload_peak_kb "$hwm"
  row configured "$k" config_bytes "$size"
  printf '| %s | %.1f MB | %s s | %.1f MB | %.2f s | %.1f MB |\n' "$k" "$(calc "$size / 1e6")" \
    "$GW_START_S" "$(calc "$rss / 1024")" "$reload_s" "$(calc "$hwm / 1024")"
  rm -rf "$d"
done
python3 - "$csv" <<'EOF'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["part"] == "configured" and r["metric"] == "rss_kb"]
if len(rows) >= 2:
    a, b = rows[0], rows[-1]
    per = (int(b["value"]) - int(a["value"])) * 1024 / (int(b["keys"]) - int(a["keys"]))
    print("\nmemory per configured key (RSS slope %s -> %s keys): %.0f bytes" % (a["keys"], b["keys"], per))
EOF

log "part 2: active keys ($ACTIVE_LIST), everything on, cluster against redis-server on 127.0.0.1:$R_PORT"
redis-server --port "$R_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" \
  >"$OUT/redis.out" 2>&1 &
PIDS+=($!)
wait_port "$R_PORT"
rcli() { redis-cli -p "$R_PORT" "$@"; }
need redis-cli redis-tools
printf '\n| active keys | requests sent | gateway RSS growth | per active key | Redis used_memory growth | per active key | Redis keys |\n|---:|---:|---:|---:|---:|---:|---:|\n'
for a in $ACTIVE_LIST; do
  d=$TMP/a$a
  gen "$a" "$d"
  rcli FLUSHALL >/dev/null
  { cat "$d/tollgate-p3.yaml"; sed -e "s|@REDIS_PORT@|$R_PORT|" -e "s|@STATE@|$d/state.db|" \
    "$HERE/all.yaml"; } >"$d/all.yaml"
  start_gateway "$d/all.yaml" "$OUT/gateway-a$a.log"
  # Warm the process on the fixed key with the same 32 connections (their buffers, the
  # allocator's pages, the upstream pool), then read the baseline: what grows after it is the
  # keys' state.
  cat >"$d/warm.lua" <<LUA
wrk.method = "POST"
wrk.path = "/v2/sendMessage/"
wrk.body = '$(cat "$d/body-send_message.json")'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench-fixed-key"
LUA
  wrk -t1 -c32 -d2s -s "$d/warm.lua" "http://127.0.0.1:$G_PORT/" >"$OUT/wrk-warm-a$a.txt"
  sleep 1
  rss0=$(kb "$GW_PID" VmRSS)
  mem0=$(rcli INFO memory | awk -F: '/^used_memory:/ { print $2 + 0 }')
  # Each key at least twice: A / 10,000 s at ~20k req/s, at least 3 s.
  dur=$(((a / 10000) + 3))
  wrk -t1 -c32 -d"${dur}s" -s "$d/wrk-send_message.lua" "http://127.0.0.1:$G_PORT/" >"$OUT/wrk-a$a.txt"
  sent=$(awk '/requests in/ { print $1 }' "$OUT/wrk-a$a.txt")
  [ "$sent" -ge $((2 * a)) ] || log "warning: $sent requests for $a keys: some keys were sent fewer than twice"
  sleep 1
  rss1=$(kb "$GW_PID" VmRSS)
  mem1=$(rcli INFO memory | awk -F: '/^used_memory:/ { print $2 + 0 }')
  dbsize=$(rcli DBSIZE)
  stop_gateway
  row active "$a" requests "$sent"
  row active "$a" gateway_rss_growth_kb "$((rss1 - rss0))"
  row active "$a" redis_used_memory_growth_b "$((mem1 - mem0))"
  row active "$a" redis_keys "$dbsize"
  printf '| %s | %s | %.1f MB | %.0f B | %.1f MB | %.0f B | %s |\n' "$a" "$sent" \
    "$(calc "($rss1 - $rss0) / 1024")" "$(calc "($rss1 - $rss0) * 1024 / $a")" \
    "$(calc "($mem1 - $mem0) / 1e6")" "$(calc "($mem1 - $mem0) / $a")" "$dbsize"
  rm -rf "$d"
done
python3 - "$csv" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def slope(metric, scale):
    pts = sorted((int(r["keys"]), float(r["value"])) for r in rows if r["part"] == "active" and r["metric"] == metric)
    if len(pts) >= 2:
        (a, va), (b, vb) = pts[0], pts[-1]
        return (vb - va) * scale / (b - a), a, b
for metric, scale, what in (("gateway_rss_growth_kb", 1024, "gateway RSS"), ("redis_used_memory_growth_b", 1, "Redis used_memory")):
    s = slope(metric, scale)
    if s:
        print("memory per active key, %s (slope %d -> %d active keys): %.0f bytes" % (what, s[1], s[2], s[0]))
EOF
log "results in $csv"
