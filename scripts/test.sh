#!/usr/bin/env bash
# Build and run every test of every crate (unit, integration, golden, property). This is the
# README's test command and what CI runs after its checks (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
BOOTSTRAP_LINT=0 scripts/bootstrap.sh
# The admin API's OpenAPI document is checked by a real validator (below): installed from PyPI
# when missing; a failed install fails the run.
if ! python3 -c 'import openapi_spec_validator' 2>/dev/null; then
    python3 -m pip install --quiet openapi-spec-validator \
        || { echo "test.sh: cannot install openapi-spec-validator from PyPI" >&2; exit 1; }
fi
# The wire test `openapi::the_admin_listener_serves_its_openapi_document` writes the document
# the admin listener served here (cargo's CARGO_TARGET_TMPDIR).
openapi="${CARGO_TARGET_DIR:-target}/tmp/openapi.json"
rm -f "$openapi"
cargo build --locked --workspace --all-targets
cargo test --locked --workspace --all-targets "$@"
if [[ -f "$openapi" ]]; then
    python3 -m openapi_spec_validator "$openapi"
elif [[ $# -eq 0 ]]; then
    echo "test.sh: the OpenAPI wire test wrote no $openapi" >&2
    exit 1
else
    echo "test.sh: $openapi not written (the tests were filtered); not validated" >&2
fi
