#!/usr/bin/env bash
# The house's floors (part of scripts/lint.sh): a file may import only from its own floor or
# the floors below it. Each row: a path, and the modules of the crate that code under that
# path must not import (a `crate::<module>` in a line that is not a comment). Every module of
# both crates has a row. The floors are written in src/lib.rs and crates/core/src/lib.rs; this
# keeps them. Then scripts/cycles.py: no loop between files or rooms, within a floor too.
#
#   scripts/floors.sh            check; exit 1 naming every import that goes back up, and
#                                every loop
set -euo pipefail
cd "$(dirname "$0")/.."

# path                                  forbidden modules (alternatives of a regex)
rules=(
  # The core: clock, digest, path, the refusal codes and outcomes at the bottom; config, the
  # meters (quotas, the ledger's counts) and limit above them (a key's rate state holds its
  # meter: limit may name metering, never the other way); policy, then the usage counts, on
  # top; the test helpers beside everything.
  "crates/core/src/clock.rs             config|limit|metering|policy|usage|testing|path|digest|refusal|outcome"
  "crates/core/src/digest.rs            config|limit|metering|policy|usage|testing|path|clock|refusal|outcome"
  "crates/core/src/outcome.rs           config|limit|metering|policy|usage|testing|path|digest|clock|refusal"
  "crates/core/src/sync.rs              config|limit|metering|policy|usage|testing|path|digest|clock|refusal|outcome"
  "crates/core/src/refusal.rs           config|limit|metering|policy|usage|testing|path|digest|clock"
  "crates/core/src/path.rs              config|limit|metering|policy|usage|testing"
  "crates/core/src/config               policy|limit|metering|usage|testing"
  "crates/core/src/limit                policy|config|usage|testing"
  "crates/core/src/metering             limit|policy|usage|testing"
  "crates/core/src/policy               usage|testing"
  "crates/core/src/usage.rs             testing"
  "crates/core/src/testing.rs           nothing"
  # The adapter: the runtime is the ground; the Redis room above it; the rooms that keep state
  # and the edge above that; the proxy and the admin listener above those; the server is the
  # roof; the commands stand on it.
  "src/runtime                          fleet_store|traces|shared|state|ledger|keys|edge|proxy|admin|server|cli|demo|top"
  "src/fleet_store                      traces|shared|state|ledger|keys|edge|proxy|admin|server|cli|demo|top"
  "src/traces                           fleet_store|shared|state|ledger|keys|edge|proxy|admin|server|cli|demo|top"
  "src/state                            fleet_store|traces|shared|ledger|keys|edge|proxy|admin|server|cli|demo|top"
  "src/shared                           traces|state|ledger|keys|edge|proxy|admin|server|cli|demo|top"
  "src/ledger                           traces|keys|edge|proxy|admin|server|cli|demo|top"
  "src/keys                             traces|shared|ledger|edge|proxy|admin|server|cli|demo|top"
  "src/edge                             fleet_store|traces|shared|state|ledger|keys|proxy|admin|server|cli|demo|top"
  "src/proxy                            admin|server|cli|demo|top"
  "src/admin                            proxy|server|cli|demo|top"
  "src/server.rs                        cli|demo|top"
  "src/demo.rs                          cli|top"
  "src/top.rs                           proxy|server|cli|demo"
  "src/cli                              nothing"
)

bad=0
for rule in "${rules[@]}"; do
  read -r path forbidden <<<"$rule"
  [ -e "$path" ] || { echo "floors: no $path (update scripts/floors.sh)" >&2; exit 1; }
  # Code lines only: not `//`, `//!`, `///` comments, nor a file's unit tests (from its
  # `#[cfg(test)]` on, or a whole `*_tests.rs` or `tests.rs` module: tests may build what they
  # test with the helpers above it).
  hits=$(grep -rnHE "crate::(($forbidden)\b|\{[^}]*\b($forbidden)\b)" "$path" --include='*.rs' --exclude='*_tests.rs' --exclude='tests.rs' |
    grep -vE '^[^:]+:[0-9]+:\s*//' | while IFS=: read -r file line text; do
      tests=$(grep -n -m1 '^#\[cfg(test)\]' "$file" | cut -d: -f1)
      if [ -z "$tests" ] || [ "$line" -lt "$tests" ]; then echo "$file:$line:$text"; fi
    done || true)
  if [ -n "$hits" ]; then
    echo "floors: $path imports from a floor above it (may not use: ${forbidden//|/, }):" >&2
    echo "$hits" >&2
    bad=1
  fi
done
if [ "$bad" = 1 ]; then
  exit 1
fi
echo "ok: ${#rules[@]} floors, no import goes back up"
python3 scripts/cycles.py
