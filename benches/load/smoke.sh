#!/usr/bin/env bash
# Load smoke (not run in CI): 10 s of wrk through the gateway and the same straight to the
# upstream (the stand-in), req/s and p99 side by side.
#   benches/load/smoke.sh            # defaults: 10 s, 2 threads, 64 connections
#   DURATION=30s CONNS=128 benches/load/smoke.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
scripts/bootstrap.sh
if ! command -v wrk >/dev/null 2>&1; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq wrk >/dev/null
fi
cargo build --locked --release --quiet
bin=target/release/tollgate
$bin stand-in --listen 127.0.0.1:18081 >/dev/null 2>&1 &
up=$!
TOLLGATE_LOG=warn $bin run --config benches/load/smoke.yaml >/dev/null 2>&1 &
gw=$!
trap 'kill $up $gw 2>/dev/null || true' EXIT
for port in 18081 18080; do
  for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done

run() { # name url [extra wrk args]
  local name=$1 url=$2; shift 2
  wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$@" "$url" > /tmp/tollgate-smoke-$name.txt
  local rps p99
  rps=$(awk '/Requests\/sec/ {print $2}' /tmp/tollgate-smoke-$name.txt)
  p99=$(awk '$1=="99%" {print $2}' /tmp/tollgate-smoke-$name.txt)
  printf '%-28s %12s req/s   p99 %s\n' "$name" "$rps" "$p99"
}
echo "wrk -t$THREADS -c$CONNS -d$DURATION on $(nproc) cores; gateway and stand-in on the same machine"
run direct http://127.0.0.1:18081/v2/client/getState
run gateway http://127.0.0.1:18080/v2/client/getState -H 'Authorization: Bearer load-test-key'
