#!/usr/bin/env bash
# Build and run every test of every crate (unit, integration, golden, property). This is the
# README's test command and what CI runs after its checks (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
BOOTSTRAP_LINT=0 scripts/bootstrap.sh
cargo build --locked --workspace --all-targets
cargo test --locked --workspace --all-targets "$@"
