#!/usr/bin/env bash
# Zero-downtime upgrade under load, end to end, on loopback:
#   1. start the stand-in upstream and Tollgate ("old"), with a Pingora --conf naming the
#      upgrade socket;
#   2. run wrk against Tollgate (keep-alive, several connections) for DURATION seconds;
#   3. halfway, start a second Tollgate ("new") with --upgrade, wait until it listens on the
#      upgrade socket, and send SIGQUIT to the old one: the listening sockets move over;
#   4. wait for the old process to exit, let wrk finish, and count failed requests
#      (socket errors + non-2xx answers). Exits 1 unless that count is 0.
#
# Usage: scripts/upgrade-under-load.sh [DURATION_SECONDS]   (default 12)
# Env:   TOLLGATE_BIN (default: target/release/tollgate, built if missing),
#        PORT_BASE (default 38080: gateway PORT_BASE, upstream +1, admin +2)
set -euo pipefail
cd "$(dirname "$0")/.."

duration=${1:-12}
base=${PORT_BASE:-38080}
gw_port=$base upstream_port=$((base + 1)) admin_port=$((base + 2))

scripts/bootstrap.sh
if ! command -v wrk >/dev/null 2>&1; then
  echo "installing wrk" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi
bin=${TOLLGATE_BIN:-target/release/tollgate}
if [ ! -x "$bin" ]; then
  cargo build --release --locked --quiet
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/gateway.yaml" <<EOF
listen: "127.0.0.1:$gw_port"
admin_listen: "127.0.0.1:$admin_port"
upstream: { base_url: "http://127.0.0.1:$upstream_port" }
plans:
  load: { plan_id: 9, requests_per_window: 1000000, allow: all }
keys:
  - { name: load, key: upgrade-test-key, plan: load }
shutdown: { grace_seconds: 2, timeout_seconds: 2 }
EOF
cat >"$work/pingora.yaml" <<EOF
---
version: 1
threads: 2
upgrade_sock: $work/upgrade.sock
pid_file: $work/tollgate.pid
EOF
cat >"$work/post.lua" <<'EOF'
wrk.method = "POST"
wrk.headers["Authorization"] = "Bearer upgrade-test-key"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"chatId":"1234@c.us","message":"hi"}'
EOF

wait_ready() {
  for _ in $(seq 200); do
    if curl -fsS "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1; then return 0; fi
    sleep 0.05
  done
  echo "tollgate never became ready" >&2
  return 1
}

"$bin" stand-in --listen "127.0.0.1:$upstream_port" >"$work/upstream.log" 2>&1 &
pids+=($!)
run=("$bin" run --config "$work/gateway.yaml" --conf "$work/pingora.yaml")
TOLLGATE_LOG=warn "${run[@]}" 2>"$work/old.log" &
old=$!
pids+=("$old")
wait_ready

wrk -t2 -c32 -d"${duration}s" -s "$work/post.lua" "http://127.0.0.1:$gw_port/v2/sendMessage/" \
  >"$work/wrk.txt" 2>&1 &
wrk_pid=$!

sleep $((duration / 3))
echo "upgrade: starting the new process with --upgrade" >&2
TOLLGATE_LOG=warn "${run[@]}" --upgrade 2>"$work/new.log" &
new=$!
pids+=("$new")
for _ in $(seq 100); do [ -S "$work/upgrade.sock" ] && break; sleep 0.05; done
echo "upgrade: SIGQUIT to the old process ($old)" >&2
kill -QUIT "$old"
if ! wait "$old"; then
  echo "the old process exited with an error" >&2
  cat "$work/old.log" >&2
  exit 1
fi
echo "upgrade: the old process has exited; the new one ($new) serves" >&2
wait "$wrk_pid"
curl -fsS "http://127.0.0.1:$admin_port/readyz" >/dev/null

cat "$work/wrk.txt"
requests=$(awk '/requests in/ {print $1}' "$work/wrk.txt")
socket_errors=$(awk -F'[ ,]+' '/Socket errors/ {print $4 + $6 + $8 + $10}' "$work/wrk.txt")
non2xx=$(awk '/Non-2xx/ {print $NF}' "$work/wrk.txt")
failed=$(( ${socket_errors:-0} + ${non2xx:-0} ))
echo "upgrade under load: ${requests} requests, ${failed} failed (socket errors ${socket_errors:-0}, non-2xx ${non2xx:-0})"
[ "$failed" -eq 0 ]
