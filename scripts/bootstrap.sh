#!/usr/bin/env bash
# Install what a fresh Debian/Ubuntu machine lacks to build, test and check Tollgate:
#   cmake and a C compiler   Pingora's zlib-ng build
#   redis-server             tests/it/cluster/ starts its own on a free port (shared budgets)
#   redis-sentinel           tests/it/faults.rs starts its own Sentinel (a failover under load)
#   faketime                 tests/it/faults.rs steps a gateway's wall clock (libfaketime)
#   chromium                 tests/it/usage.rs renders the usage page in a headless browser
#   rustfmt, clippy          rustup components (.ci/run checks formatting and lints always)
#   cargo-deny               cargo install (advisories, licences, bans, sources)
# Safe to run repeatedly; does nothing when everything is present. BOOTSTRAP_LINT=0 skips the
# lint tools (scripts/demo.sh and scripts/test.sh need only the build tools); BOOTSTRAP_TESTS=0
# skips what only the tests need (redis-server; scripts/demo.sh).
set -euo pipefail

say() { echo "bootstrap: $*" >&2; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

apt_install() {
  say "installing $*"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v git >/dev/null 2>&1 || need+=(git)
if [ "${BOOTSTRAP_TESTS:-1}" = 1 ]; then
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
  [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || need+=(faketime)
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
    need+=(chromium)
fi
if ((${#need[@]})); then
  apt_install "${need[@]}"
fi
command -v cargo >/dev/null 2>&1 || { say "cargo (Rust) is required: https://rustup.rs"; exit 1; }

if [ "${BOOTSTRAP_LINT:-1}" = 1 ]; then
  for component in rustfmt clippy; do
    tool=$([ "$component" = rustfmt ] && echo fmt || echo clippy)
    if ! cargo "$tool" --version >/dev/null 2>&1; then
      say "adding the $component component"
      rustup component add "$component" || { say "cannot install $component"; exit 1; }
    fi
  done
  if ! cargo deny --version >/dev/null 2>&1; then
    say "installing cargo-deny (cargo install, a few minutes)"
    cargo install --locked cargo-deny
  fi
fi
