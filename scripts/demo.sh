#!/usr/bin/env bash
# Build Tollgate and start `tollgate demo`: the gateway on 127.0.0.1:8080 with
# policies/demo.yaml, in front of an embedded stand-in upstream on 127.0.0.1:8081.
# It prints curl lines that show a pass, a 401, a 403, a 400 and a 429. Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
BOOTSTRAP_LINT=0 BOOTSTRAP_TESTS=0 scripts/bootstrap.sh
cargo build --locked --quiet
exec target/debug/tollgate demo "$@"
