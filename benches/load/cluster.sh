#!/usr/bin/env bash
# Shared budgets across replicas: three gateway replicas share per-key rate limits through one
# Redis; the load is paced per key at multiples of its limit and spread over the replicas; the
# fleet's admissions are compared with what one process (GCRA over the same send times) would
# have admitted.
#
#   benches/load/cluster.sh                    # 60 s (6 windows), 30 keys, SPLIT=even (≈ 70 s)
#   SPLIT=skew80 benches/load/cluster.sh       # 80 % of the requests to replica 1, 10 % to each other
#   SPLIT=sticky benches/load/cluster.sh       # each key pinned to one replica
#   DURATION=20 KEYS=15 benches/load/cluster.sh   # shorter, lighter
#   MULTS="0.9 2 5" benches/load/cluster.sh    # another set of load multiples
#
# What it does: builds target/release/tollgate if missing or older than the sources (`cargo
# build --release --locked --bin tollgate`); installs redis-server (apt) if missing; picks free
# loopback ports; starts its own `redis-server` (--save "" --appendonly no), `tollgate stand-in`
# (the upstream: 200 {}) and REPLICAS (3) gateways, each with a generated config (window 10 s;
# plans basic 40, standard 70, pro 150 per window; KEYS plain test keys `load-key-NNN`, a third
# per plan; `cluster:` on that Redis with key_prefix tgload, sync_interval_ms SYNC_MS,
# timeout_ms 100), and waits for /readyz 200 on each; then runs the client,
# benches/load/cluster.py (Python 3, stdlib only), which drives the load and writes the report.
# Every process it started is stopped at exit (SIGTERM, then SIGKILL after 5 s; also on Ctrl-C).
#
# Load: key i runs at MULTS[i mod 3] × its limit (default 0.9×, 2×, 10×), evenly paced with a
# random phase, for DURATION seconds, open loop over keep-alive HTTP/1.1 connections; every
# request `GET /v2/client/getStatus` with `Authorization: Bearer load-key-NNN` (200 admitted,
# 429 limited) to the replica the SPLIT picks.
#
# Report (stdout and $OUT/report.md): per group of keys (by multiple) and in total: sent, fleet
# admitted, one-process admitted, their ratio, the worst sliding-window excess over one process
# (% of the limit), refusals (those of the 0.9× keys must be 0); achieved vs intended request
# rates and the client's lateness; Redis calls per admitted request, keys per sync, sync
# p50/p99 (the replicas' /metrics), Redis INFO commandstats, used_memory, DBSIZE; CPU of every
# process; load average. Exit status 1 if a key below its limit was refused or a request failed.
#
# Knobs (environment): DURATION (60 s), KEYS (30), MULTS ("0.9 2 10"), SPLIT (even | skew80 |
# sticky), SYNC_MS (100), REPLICAS (3), SEED (random), THREADS (gateway worker threads; default
# one per CPU), BIN (the gateway binary), OUT (default target/cluster-results/<timestamp>-<SPLIT>/:
# report.md, results.json, requests.json, machine.txt, logs/).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/benches/load

for arg in "$@"; do
  case $arg in
    -h | --help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

DURATION=${DURATION:-60}
KEYS=${KEYS:-30}
MULTS=${MULTS:-0.9 2 10}
SPLIT=${SPLIT:-even}
SYNC_MS=${SYNC_MS:-100}
REPLICAS=${REPLICAS:-3}
SEED=${SEED:-}
THREADS=${THREADS:-}
BIN=${BIN:-$ROOT/target/release/tollgate}
OUT=${OUT:-$ROOT/target/cluster-results/$(date +%Y%m%d-%H%M%S)-$SPLIT}
case $SPLIT in even | skew80 | sticky) ;; *) echo "SPLIT must be even, skew80 or sticky" >&2; exit 2 ;; esac
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v python3 >/dev/null 2>&1 || die "python3 is needed"
command -v curl >/dev/null 2>&1 || die "curl is needed"
if ! command -v redis-server >/dev/null 2>&1; then
  log "installing redis-server (apt-get)"
  SUDO=()
  [ "$(id -u)" = 0 ] || SUDO=(sudo)
  "${SUDO[@]}" apt-get install -y redis-server >"$OUT/logs/apt.txt" 2>&1 \
    || { "${SUDO[@]}" apt-get update >>"$OUT/logs/apt.txt" 2>&1 \
      && "${SUDO[@]}" apt-get install -y redis-server >>"$OUT/logs/apt.txt" 2>&1; } \
    || die "could not install redis-server (see $OUT/logs/apt.txt)"
fi
if [ "$BIN" = "$ROOT/target/release/tollgate" ]; then
  # Missing, or older than a source file: build (cargo does nothing when it is up to date).
  if [ ! -x "$BIN" ] || [ -n "$(find src crates Cargo.toml Cargo.lock -newer "$BIN" -print -quit)" ]; then
    log "building the release binary (cargo build --release --locked --bin tollgate)"
    cargo build --release --locked --bin tollgate
  fi
else
  [ -x "$BIN" ] || die "no executable at BIN=$BIN"
fi

TMP=$(mktemp -d /tmp/tollgate-cluster.XXXXXX)
PIDS=()
alive() {
  local st
  st=$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}
stop_pid() { # pid: SIGTERM, up to 5 s, then SIGKILL
  local pid=$1
  alive "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  # Last started, first stopped: the gateways (which report to Redis on the way out), then
  # Redis, then the upstream.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}"; done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Free ports on 127.0.0.1 outside the kernel's ephemeral range (as run.sh does).
NPORTS=$((2 + 2 * REPLICAS))
read -r -a PORTS < <(python3 - "$NPORTS" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
try:
    lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
except Exception:
    lo, hi = 32768, 60999
cands = [p for p in range(40000, 50000) if not lo <= p <= hi]
if len(cands) < 100:
    cands = [p for p in range(max(1024, lo - 12000), lo)]
if len(cands) < 100:
    cands = list(range(hi + 1, 65536))
random.shuffle(cands)
ports = []
for p in cands:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    ports.append(p)
    if len(ports) == n:
        break
print(*ports)
EOF
)
[ "${#PORTS[@]}" = "$NPORTS" ] || die "no $NPORTS free ports found"
REDIS_PORT=${PORTS[0]}
UP_PORT=${PORTS[1]}
GW_PORTS=("${PORTS[@]:2:REPLICAS}")
ADMIN_PORTS=("${PORTS[@]:2+REPLICAS:REPLICAS}")

python3 "$HERE/cluster.py" keys --keys "$KEYS" --mults "$MULTS" > "$TMP/keys.yaml"
for ((i = 0; i < REPLICAS; i++)); do
  cat > "$TMP/gw$((i + 1)).yaml" <<EOF
# Generated by benches/load/cluster.sh (replica $((i + 1)) of $REPLICAS). load-key-NNN are PUBLIC TEST KEYS.
listen: "127.0.0.1:${GW_PORTS[i]}"
admin_listen: "127.0.0.1:${ADMIN_PORTS[i]}"
upstream: { base_url: "http://127.0.0.1:$UP_PORT", read_timeout_ms: 5000 }
limits: { window_seconds: 10 }
plans:
  basic: { plan_id: 1, requests_per_window: 40, allow: all }
  standard: { plan_id: 2, requests_per_window: 70, allow: all }
  pro: { plan_id: 3, requests_per_window: 150, allow: all }
keys:
$(cat "$TMP/keys.yaml")
cluster: { redis_url: "redis://127.0.0.1:$REDIS_PORT/0", key_prefix: "tgload", sync_interval_ms: $SYNC_MS, timeout_ms: 100 }
log: { format: text }
shutdown: { drain_seconds: 0, grace_seconds: 0, timeout_seconds: 1 }
EOF
  cp "$TMP/gw$((i + 1)).yaml" "$OUT/logs/"
  "$BIN" check --config "$TMP/gw$((i + 1)).yaml" > "$OUT/logs/tollgate-check-$((i + 1)).txt" 2>&1 \
    || die "generated config refused: see $OUT/logs/tollgate-check-$((i + 1)).txt"
done

PINGORA_ARGS=()
if [ -n "$THREADS" ]; then
  printf -- '---\nversion: 1\nthreads: %s\n' "$THREADS" > "$TMP/pingora.yaml"
  PINGORA_ARGS=(--conf "$TMP/pingora.yaml")
fi

wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  die "nothing listens on 127.0.0.1:$1 after 10 s (see $OUT/logs)"
}

"$BIN" stand-in --listen "127.0.0.1:$UP_PORT" > "$OUT/logs/stand-in.log" 2>&1 &
UP_PID=$!
PIDS+=("$UP_PID")
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" \
  --daemonize no --protected-mode yes > "$OUT/logs/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_port "$UP_PORT"
wait_port "$REDIS_PORT"
GW_PIDS=()
for ((i = 0; i < REPLICAS; i++)); do
  TOLLGATE_LOG=${TOLLGATE_LOG:-warn} "$BIN" run --config "$TMP/gw$((i + 1)).yaml" "${PINGORA_ARGS[@]}" \
    > "$OUT/logs/gateway-$((i + 1)).log" 2>&1 &
  GW_PIDS+=($!)
  PIDS+=($!)
done
for ((i = 0; i < REPLICAS; i++)); do
  ready=0
  for _ in $(seq 300); do
    alive "${GW_PIDS[i]}" || die "replica $((i + 1)) exited (see $OUT/logs/gateway-$((i + 1)).log)"
    if [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:${ADMIN_PORTS[i]}/readyz")" = 200 ]; then
      ready=1
      break
    fi
    sleep 0.1
  done
  [ "$ready" = 1 ] || die "replica $((i + 1)) not ready after 30 s (see $OUT/logs/gateway-$((i + 1)).log)"
done

{
  echo "date: $(date -Is)"
  echo "nproc: $(nproc)"
  echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "kernel: $(uname -r)"
  echo "redis: $(redis-server --version)"
  echo "python: $(python3 --version 2>&1)"
  echo "loadavg before: $(cat /proc/loadavg)"
  echo "binary: $BIN ($(stat -c '%y' "$BIN"), sha256 $(sha256sum "$BIN" | cut -c1-16))"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src crates 2>/dev/null || echo ' (src/crates modified)')"
  echo "run: replicas=$REPLICAS split=$SPLIT duration=$DURATION keys=$KEYS mults=\"$MULTS\" sync_ms=$SYNC_MS threads=${THREADS:-nproc} seed=${SEED:-random}"
} > "$OUT/machine.txt"

join() { local IFS=,; echo "$*"; }
GATEWAYS=$(join "${GW_PORTS[@]/#/127.0.0.1:}")
ADMINS=$(join "${ADMIN_PORTS[@]/#/127.0.0.1:}")
PIDARG="redis=$REDIS_PID,stand-in=$UP_PID"
for ((i = 0; i < REPLICAS; i++)); do PIDARG+=",gw$((i + 1))=${GW_PIDS[i]}"; done
SEED_ARG=()
[ -n "$SEED" ] && SEED_ARG=(--seed "$SEED")

log "redis :$REDIS_PORT, stand-in :$UP_PORT, $REPLICAS replicas on $GATEWAYS (admin $ADMINS); split $SPLIT, $DURATION s, $KEYS keys at ${MULTS}×"
set +e
python3 "$HERE/cluster.py" run --gateways "$GATEWAYS" --admins "$ADMINS" --redis "127.0.0.1:$REDIS_PORT" \
  --duration "$DURATION" --keys "$KEYS" --mults "$MULTS" --split "$SPLIT" --sync-ms "$SYNC_MS" \
  --pids "$PIDARG" --out "$OUT" "${SEED_ARG[@]}"
rc=$?
set -e
echo "loadavg after: $(cat /proc/loadavg)" >> "$OUT/machine.txt"
for ((i = 0; i < REPLICAS; i++)); do
  alive "${GW_PIDS[i]}" || { log "replica $((i + 1)) exited during the run (see $OUT/logs)"; rc=1; }
done
log "results in $OUT (loadavg $(cut -d' ' -f1-3 /proc/loadavg))"
exit "$rc"
