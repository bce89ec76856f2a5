#!/usr/bin/env bash
# The checks a good Rust project runs besides its tests (part of .ci/run):
#
#   1. rustfmt         cargo fmt --check
#   2. clippy          every target of every crate, warnings denied
#   3. rustdoc         the docs build with broken intra-doc links (and every other doc warning) denied
#   4. floors          no file imports from a floor above its own (scripts/floors.sh)
#   5. the core        tollgate-core depends on no Pingora, tokio or network crate, and the release
#                      build of tollgate does not enable tollgate-core's `testing` feature
#   6. cargo deny      advisories (RustSec, offline), licences, bans, sources (deny.toml)
#
# Each tool is installed when missing (scripts/bootstrap.sh). The advisory database is read from a
# local copy: $TOLLGATE_ADVISORY_DB, or ../shared/advisory-db beside the repository, or cargo
# deny's own fetch when the machine can reach GitHub. When none of these is there, the advisory
# check is skipped with a message and the other three cargo-deny checks still run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== lint: %s\n' "$*"; }

step "rustfmt"
cargo fmt --all -- --check

step "clippy (warnings denied)"
cargo clippy --locked --workspace --all-targets -- -D warnings

step "rustdoc (broken intra-doc links denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps --quiet

step "floors: no import goes back up (scripts/floors.sh)"
scripts/floors.sh

step "tollgate-core has no Pingora, tokio or network crate"
forbidden='^(pingora|tokio|mio|socket2|hyper|h2|reqwest|redis|rustls|tokio-rustls|native-tls|openssl|async-trait|futures)(-[a-z0-9-]+)? v'
core_deps=$(cargo tree --locked -p tollgate-core -e normal,build --prefix none)
if grep -E "$forbidden" <<<"$core_deps"; then
  echo "lint: tollgate-core must build without these (it is the pure decision)" >&2
  exit 1
fi
echo "ok: $(sort -u <<<"$core_deps" | wc -l) crates, none of them a network or runtime crate"
# Its tests and benches too: `cargo test -p tollgate-core` builds no Pingora.
core_test_deps=$(cargo tree --locked -p tollgate-core -e normal,build,dev --prefix none)
if grep -E "$forbidden" <<<"$core_test_deps"; then
  echo "lint: tollgate-core's tests and benches must build without these" >&2
  exit 1
fi
echo "ok: its tests and benches neither ($(sort -u <<<"$core_test_deps" | wc -l) crates)"
release_core=$(cargo tree --locked -p tollgate -e no-dev -f '{p} [{f}]' | grep 'tollgate-core' | head -n 1)
if grep -q 'testing' <<<"$release_core"; then
  echo "lint: the release build enables tollgate-core's testing feature: $release_core" >&2
  exit 1
fi
echo "ok: the release build has no test helpers ($release_core)"

step "cargo deny"
# cargo deny reads the metadata of every target platform's crates (windows-sys and the like,
# which a Linux build never downloads); fetch them so that --offline below finds them.
cargo fetch --locked --quiet
db_dir=target/advisory-db
db=$db_dir/advisory-db-3157b0e258782691
snapshot=""
for candidate in "${TOLLGATE_ADVISORY_DB:-}" ../shared/advisory-db; do
  if [ -n "$candidate" ] && [ -f "$candidate/README.md" ] && [ -d "$candidate/crates" ]; then
    snapshot=$candidate
    break
  fi
done
checks=(advisories licenses bans sources)
if [ -n "$snapshot" ]; then
  # cargo-deny reads a database offline only as a git repository at this path.
  rm -rf "$db" && mkdir -p "$db" && cp -r "$snapshot/." "$db"
  git -C "$db" init -q && git -C "$db" add -A &&
    git -C "$db" -c user.name=ci -c user.email=ci@localhost commit -qm snapshot
  echo "advisory database: a copy of $snapshot"
  cargo deny --offline check "${checks[@]}"
elif cargo deny fetch db >/dev/null 2>&1; then
  echo "advisory database: fetched"
  cargo deny check "${checks[@]}"
else
  echo "SKIPPED advisories: no advisory database here (set TOLLGATE_ADVISORY_DB to a copy)" >&2
  cargo deny --offline check licenses bans sources
fi
