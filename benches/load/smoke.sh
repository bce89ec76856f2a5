#!/usr/bin/env bash
# Load smoke (not run in CI): 10 s of wrk through the gateway and the same straight to the
# upstream (the stand-in), req/s and p99 side by side.
#   benches/load/smoke.sh            # defaults: 10 s, 2 threads, 64 connections
#   DURATION=30s CONNS=128 benches/load/smoke.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
# shellcheck source=benches/load/lib.sh
. "$ROOT/benches/load/lib.sh"
DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
scripts/bootstrap.sh
need wrk
release_bin
trap on_exit_cleanup EXIT
"$BIN" stand-in --listen 127.0.0.1:18081 >/dev/null 2>&1 &
PIDS+=($!)
TOLLGATE_LOG=warn "$BIN" run --config benches/load/smoke.yaml >/dev/null 2>&1 &
PIDS+=($!)
wait_port 18081
wait_port 18080

run() { # name url [extra wrk args]
  local name=$1 url=$2; shift 2
  wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "$@" "$url" > "/tmp/tollgate-smoke-$name.txt"
  local rps p99
  rps=$(awk '/Requests\/sec/ {print $2}' "/tmp/tollgate-smoke-$name.txt")
  p99=$(awk '$1=="99%" {print $2}' "/tmp/tollgate-smoke-$name.txt")
  printf '%-28s %12s req/s   p99 %s\n' "$name" "$rps" "$p99"
}
echo "wrk -t$THREADS -c$CONNS -d$DURATION on $(nproc) cores; gateway and stand-in on the same machine"
run direct http://127.0.0.1:18081/v2/client/getState
run gateway http://127.0.0.1:18080/v2/client/getState -H 'Authorization: Bearer load-test-key'
