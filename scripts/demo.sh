#!/usr/bin/env bash
# Build Tollgate (release) and start `tollgate demo`: the gateway on 127.0.0.1:8080 with
# policies/demo.yaml, in front of an embedded stand-in upstream on 127.0.0.1:8081.
# It prints curl lines that show a pass, a 401, a 403, a 400 and a 429. Ctrl-C stops it.
#
# The build is the release one (`cargo build --release --locked --bin tollgate`), the binary
# the load scripts, the upgrade script and the deploy docs use too (target/release/tollgate),
# so the demo's build is not thrown away. On a fresh machine it takes about ten minutes on two cores: a line
# says so first, then cargo shows its progress bar. Later runs rebuild only what changed.
# Arguments go to `tollgate demo` (--port, --upstream-port, --admin-port).
set -euo pipefail
cd "$(dirname "$0")/.."
BOOTSTRAP_LINT=0 BOOTSTRAP_TESTS=0 scripts/bootstrap.sh
echo "building tollgate (release; the first build takes about ten minutes on two cores)…" >&2
cargo build --release --locked --bin tollgate
exec target/release/tollgate demo "$@"
