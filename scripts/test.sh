#!/usr/bin/env bash
# Build and run every test (unit, integration, golden). This is the README's test command and
# what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
# zlib-ng's cmake build has been seen to fail once under a parallel build; one retry.
cargo build --locked --all-targets || cargo build --locked --all-targets
cargo test --locked --all-targets "$@"
