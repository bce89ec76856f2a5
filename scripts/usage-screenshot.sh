#!/usr/bin/env bash
# Regenerate docs/usage.png, the README's picture of the usage page: the cluster demo policy
# (policies/cluster.yaml) against a Redis of its own and the stand-in upstream, on ports of their
# own (the basic plan given a monthly quota), some traffic of every kind, then headless
# Chromium's screenshot of the admin listener's /.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet
T=target/debug/tollgate
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  redis-cli -p 16399 shutdown nosave >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
redis-server --port 16399 --bind 127.0.0.1 --save "" --appendonly no --daemonize yes >/dev/null
sed -e 's/127.0.0.1:8080"/127.0.0.1:18080"/' -e 's/127.0.0.1:9091"/127.0.0.1:19091"/' \
  -e 's/127.0.0.1:8081"/127.0.0.1:18081"/' -e 's/6379/16399/' \
  -e '0,/requests_per_window: 40/s//requests_per_window: 40\n    quota: { requests: 100000, per: month }/' \
  policies/cluster.yaml >"$work/cluster.yaml"
$T stand-in --listen 127.0.0.1:18081 >/dev/null 2>&1 & pids+=($!)
$T run --config "$work/cluster.yaml" --allow-demo-keys >"$work/log" 2>&1 & pids+=($!)
for _ in $(seq 100); do curl -sf 127.0.0.1:19091/readyz >/dev/null && break; sleep 0.1; done

c() { curl -s -o /dev/null -H "Authorization: Bearer $1" -X "$2" -H 'content-type: application/json' ${4:+-d "$4"} "127.0.0.1:18080$3"; }
for _ in $(seq 60); do c demo-burst-key GET /v2/client/getStatus; done
for _ in $(seq 25); do c demo-standard-key GET /v2/client/getStatus; done
for _ in $(seq 12); do c demo-pro-key GET /v2/client/getStatus; done
for _ in $(seq 8); do c demo-basic-key GET /v2/client/getStatus; done
for _ in 1 2 3; do c demo-basic-key POST /v2/settings/webhook/set '{"url":"https://hooks.example.com/t"}'; done
c demo-standard-key POST /v2/settings/webhook/set '{"url":"http://169.254.169.254/latest"}'
for _ in 1 2; do c wrong-key GET /v2/client/getStatus; done
c demo-partner-key POST /v2/service/upgrade '{"apiKey":"demo-basic-key","planID":2}'
chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile" \
  --screenshot=docs/usage.png --window-size=1400,1000 --virtual-time-budget=3000 \
  http://127.0.0.1:19091/ 2>/dev/null
echo "docs/usage.png written"
