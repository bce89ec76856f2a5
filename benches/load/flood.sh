#!/usr/bin/env bash
# Connection flood: one client address opens CONNS connections (default 20,000), sends one
# keyless request on each (401, keep-alive) and goes idle; then a second client address makes
# one authenticated request, which must be answered 200 within a few seconds.
#
#   benches/load/flood.sh                  # full: 20,000 connections, idle_timeout 60 s (≈ 65 s)
#   benches/load/flood.sh --quick          # the same flood with IDLE=10 (≈ 15 s)
#   PER_IP=0 benches/load/flood.sh --quick # no per-address cap: max_connections alone
#   benches/load/flood.sh --idle-only      # memory per idle connection: N=5,000 (CONNS), no caps
#   benches/load/flood.sh --idle-only --tls   # the same on a TLS listener (self-signed, ALPN h1)
#   benches/load/flood.sh --idle-only --h2    # the same over HTTP/2 (TLS, ALPN h2; one stream each)
#   BIN=/path/to/tollgate benches/load/flood.sh --idle-only   # another build of the gateway
#
# What it does: builds target/release/tollgate if missing or older than the sources (`cargo
# build --release --locked --bin tollgate`); picks free loopback ports; starts `tollgate stand-in`
# (the upstream: 200 {}) and the gateway with a generated config (plan `flood` with `allow: all` and 1,000,000
# requests per window, the plain test key `flood-key`; `server:` idle_timeout_seconds=IDLE,
# max_connections=MAX_CONNECTIONS, max_connections_per_ip=PER_IP, the rest defaults;
# auth_failures off), the gateway from a subshell with RLIMIT_NOFILE raised to its hard limit;
# then runs the client, benches/load/flood.py (Python 3, stdlib only), which reads the
# gateway's RSS (/proc/PID/status VmRSS, VmHWM) and its metrics (admin /metrics:
# tollgate_connections{listener}, tollgate_connections_refused_total{reason}).
#
# Flood mode reports: connections answered (kept open) vs closed at once; the gauge and the
# refused counter; the second client's status and latency (also one probe during the flood);
# RSS before the flood, at the peak and after the idle timeout closed the idle connections.
# Exit status 1 if the second client was not served.
# Idle mode (--idle-only) reports (RSS with N idle − RSS before) / N and the slope of RSS over
# the open connections in 5 steps, and the RSS left after the client closed them all.
#
# Knobs (environment): CONNS (20000; --idle-only: 5000), MAX_CONNECTIONS (10000; --idle-only:
# CONNS + 1000), PER_IP (256; --idle-only: 0 = no cap), IDLE (60; --quick: 10; --idle-only:
# 600), WINDOW (512 connections in flight), THREADS (gateway worker threads; default: one per
# CPU), BIN (the gateway binary), OUT (default target/flood-results/<timestamp>/: report.txt,
# results.json, machine.txt, logs/).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/benches/load
# shellcheck source=benches/load/lib.sh
. "$HERE/lib.sh"

MODE=flood
QUICK=0
TLS=0
H2=0
for arg in "$@"; do
  case $arg in
    --quick) QUICK=1 ;;
    --idle-only) MODE=idle ;;
    --tls) TLS=1 ;;
    --h2) TLS=1; H2=1 ;;
    -h | --help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

if [ "$MODE" = idle ]; then
  CONNS=${CONNS:-5000}
  MAX_CONNECTIONS=${MAX_CONNECTIONS:-$((CONNS + 1000))}
  PER_IP=${PER_IP:-0}
  IDLE=${IDLE:-600}
else
  CONNS=${CONNS:-20000}
  MAX_CONNECTIONS=${MAX_CONNECTIONS:-10000}
  PER_IP=${PER_IP:-256}
  if [ "$QUICK" = 1 ]; then IDLE=${IDLE:-10}; else IDLE=${IDLE:-60}; fi
fi
WINDOW=${WINDOW:-512}
THREADS=${THREADS:-}
OUT=${OUT:-$ROOT/target/flood-results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)

command -v python3 >/dev/null 2>&1 || die "python3 is needed"
command -v curl >/dev/null 2>&1 || die "curl is needed"
if [ "$TLS" = 1 ]; then command -v openssl >/dev/null 2>&1 || die "openssl is needed for --tls"; fi
release_bin

# File descriptors: this shell (and so the client) and the gateway get the hard limit.
HARD=$(ulimit -Hn)
[ "$HARD" = unlimited ] && HARD=1048576
ulimit -n "$HARD"
if [ $((MAX_CONNECTIONS + 512)) -gt "$HARD" ]; then
  log "warning: RLIMIT_NOFILE hard limit $HARD is below max_connections + 512; the gateway may run out of descriptors"
fi

TMP=$(mktemp -d /tmp/tollgate-flood.XXXXXX)
trap on_exit_cleanup EXIT
trap 'exit 130' INT TERM

# Free ports on 127.0.0.1 outside the kernel's ephemeral range (lib.sh): the flood
# itself takes up to CONNS ephemeral ports.
read -r UP_PORT GW_PORT ADMIN_PORT TLS_PORT < <(free_ports 4)
[ -n "${TLS_PORT:-}" ] || die "no 4 free ports found"

TLS_BLOCK=""
TARGET_PORT=$GW_PORT
if [ "$TLS" = 1 ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" 2>"$OUT/logs/openssl.txt" \
    || die "openssl failed: see $OUT/logs/openssl.txt"
  TLS_BLOCK="tls: { listen: \"127.0.0.1:$TLS_PORT\", cert_file: \"$TMP/cert.pem\", key_file: \"$TMP/key.pem\" }"
  TARGET_PORT=$TLS_PORT
fi

cat > "$TMP/flood.yaml" <<EOF
# Generated by benches/load/flood.sh. flood-key is a PUBLIC TEST KEY.
listen: "127.0.0.1:$GW_PORT"
admin_listen: "127.0.0.1:$ADMIN_PORT"
$TLS_BLOCK
upstream: { base_url: "http://127.0.0.1:$UP_PORT", read_timeout_ms: 5000 }
server:
  idle_timeout_seconds: $IDLE
  max_connections: $MAX_CONNECTIONS
  max_connections_per_ip: $PER_IP
plans:
  flood: { plan_id: 9, requests_per_window: 1000000, allow: all }
keys:
  - { name: flood, key: flood-key, plan: flood }
log: { format: text }
shutdown: { drain_seconds: 0, grace_seconds: 0, timeout_seconds: 1 }
EOF
cp "$TMP/flood.yaml" "$OUT/logs/flood.yaml"
"$BIN" check --config "$TMP/flood.yaml" > "$OUT/logs/tollgate-check.txt" 2>&1 \
  || die "generated config refused: see $OUT/logs/tollgate-check.txt"

PINGORA_ARGS=()
if [ -n "$THREADS" ]; then
  printf -- '---\nversion: 1\nthreads: %s\n' "$THREADS" > "$TMP/pingora.yaml"
  PINGORA_ARGS=(--conf "$TMP/pingora.yaml")
fi

"$BIN" stand-in --listen "127.0.0.1:$UP_PORT" > "$OUT/logs/stand-in.log" 2>&1 &
PIDS+=($!)
( ulimit -n "$HARD"; TOLLGATE_LOG=${TOLLGATE_LOG:-warn} exec "$BIN" run --config "$TMP/flood.yaml" "${PINGORA_ARGS[@]}" ) \
  > "$OUT/logs/gateway.log" 2>&1 &
GW_PID=$!
PIDS+=("$GW_PID")
wait_port "$UP_PORT"
wait_port "$ADMIN_PORT"
for _ in $(seq 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$ADMIN_PORT/readyz")" = 200 ] && break
  sleep 0.1
done
wait_port "$TARGET_PORT"
[ "$(awk '/Max open files/ {print $4}' "/proc/$GW_PID/limits")" -ge "$HARD" ] \
  || log "warning: the gateway's RLIMIT_NOFILE is below $HARD"

{
  echo "date: $(date -Is)"
  echo "nproc: $(nproc)"
  echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "kernel: $(uname -r)"
  echo "loadavg before: $(cat /proc/loadavg)"
  echo "binary: $BIN ($(stat -c '%y' "$BIN"))"
  echo "mode: $MODE tls=$TLS h2=$H2 conns=$CONNS max_connections=$MAX_CONNECTIONS per_ip=$PER_IP idle=$IDLE window=$WINDOW threads=${THREADS:-nproc}"
  echo "RLIMIT_NOFILE: $HARD"
} > "$OUT/machine.txt"

TLS_ARG=()
[ "$TLS" = 1 ] && TLS_ARG=(--tls)
[ "$H2" = 1 ] && TLS_ARG=(--h2)
log "gateway pid $GW_PID on 127.0.0.1:$TARGET_PORT ($( [ "$TLS" = 1 ] && echo TLS || echo plain)), admin :$ADMIN_PORT; mode $MODE, $CONNS connections"
set +e
python3 "$HERE/flood.py" --mode "$MODE" --target "127.0.0.1:$TARGET_PORT" \
  --admin "127.0.0.1:$ADMIN_PORT" --pid "$GW_PID" --conns "$CONNS" --window "$WINDOW" \
  --idle "$IDLE" --json "$OUT/results.json" "${TLS_ARG[@]}" | tee "$OUT/report.txt"
rc=${PIPESTATUS[0]}
set -e
echo "loadavg after: $(cat /proc/loadavg)" >> "$OUT/machine.txt"
alive "$GW_PID" || { log "the gateway exited during the run (see $OUT/logs/gateway.log)"; rc=1; }
log "results in $OUT (loadavg $(cut -d' ' -f1-3 /proc/loadavg))"
exit "$rc"
