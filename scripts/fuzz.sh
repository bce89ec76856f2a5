#!/usr/bin/env bash
# Fuzz Tollgate's attacker-facing parsers (fuzz/, docs/fuzzing.md): build every cargo-fuzz target
# once, replay the committed crash reproducers, then fuzz each target for FUZZ_SECONDS seconds
# from its seeds. Exits non-zero when any target crashes, naming the reproducer it saved.
#
#   scripts/fuzz.sh                          the smoke: 20 s per target (a few minutes in all)
#   FUZZ_SECONDS=3600 scripts/fuzz.sh        the long run: an hour per target
#   FUZZ_TARGETS="webhook_url body_checker" scripts/fuzz.sh     some targets only
#   FUZZ_ARGS="-fork=2 -ignore_crashes=1" scripts/fuzz.sh       more libFuzzer flags
#
# Environment:
#   FUZZ_SECONDS    seconds per target (default 20)
#   FUZZ_TARGETS    space-separated targets (default: all of `cargo fuzz list`)
#   FUZZ_TIMEOUT    seconds one input may take before it counts as a hang (default 10)
#   FUZZ_SANITIZER  address (default, when the toolchain ships its runtime) or none
#   FUZZ_ARGS       extra libFuzzer flags, appended to every run
#
# The toolchain: cargo-fuzz drives rustc with unstable flags (-Zsanitizer, the sanitizer-coverage
# LLVM passes, --cfg fuzzing), which a stable rustc refuses unless RUSTC_BOOTSTRAP=1 lets it use
# them. The project's machines and CI have the stable toolchain and cannot download a nightly, so
# the script sets RUSTC_BOOTSTRAP=1 for cargo-fuzz's builds and runs, and for nothing else. The address
# sanitizer needs no nightly either: its runtime (librustc-stable_rt.asan.a) ships in the stable
# toolchain's sysroot, and cargo-fuzz links it; the standard library itself is not instrumented
# (that would need -Zbuild-std and the rust-src component), which for Rust code costs little: the
# unsafe code worth watching (serde_json, serde_yaml's libyaml port, url, hashbrown) is in crates
# that are built instrumented. Where the runtime is missing, the script falls back to
# `--sanitizer none` (panics, hangs and out-of-memory are still caught) and says so.
#
# Layout: fuzz/seeds/<target>/ (committed seeds), fuzz/corpus/<target>/ (what fuzzing adds;
# ignored by git, grows across runs on one machine), fuzz/regressions/<target>/ (committed
# reproducers of crashes found before: replayed first, every run), fuzz/dicts/<target>.dict
# (libFuzzer dictionaries), fuzz/artifacts/<target>/ (where a crash is saved; ignored).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "fuzz: $*" >&2; }

seconds=${FUZZ_SECONDS:-20}
timeout=${FUZZ_TIMEOUT:-10}
extra=()
read -r -a extra <<<"${FUZZ_ARGS:-}"

command -v cargo >/dev/null 2>&1 || { say "cargo (Rust) is required"; exit 1; }
if ! cargo fuzz --version >/dev/null 2>&1; then
  say "installing cargo-fuzz (cargo install, about a minute)"
  cargo install cargo-fuzz --locked
fi
command -v c++ >/dev/null 2>&1 || say "warning: no C++ compiler; libfuzzer-sys builds libFuzzer with one"

# Unstable rustc flags on the stable toolchain: see the header.
export RUSTC_BOOTSTRAP=1

host=$(rustc -vV | sed -n 's/^host: //p')
asan_rt="$(rustc --print sysroot)/lib/rustlib/$host/lib/librustc-stable_rt.asan.a"
sanitizer=${FUZZ_SANITIZER:-}
if [ -z "$sanitizer" ]; then
  if [ -f "$asan_rt" ]; then
    sanitizer=address
  else
    sanitizer=none
    say "no address-sanitizer runtime in this toolchain ($asan_rt): fuzzing without a sanitizer"
  fi
fi

targets=${FUZZ_TARGETS:-$(cargo fuzz list | tr '\n' ' ')}
# One build for every target; each `cargo fuzz run` below then finds it up to date.
build=(--sanitizer "$sanitizer")
say "building ${targets} (sanitizer: $sanitizer)"
cargo fuzz build "${build[@]}"

logs=fuzz/target/logs
mkdir -p "$logs"
passed=0
failed=()
for t in $targets; do
  corpus=fuzz/corpus/$t
  seeds=fuzz/seeds/$t
  regressions=fuzz/regressions/$t
  mkdir -p "$corpus" "$seeds"
  dirs=("$corpus" "$seeds")
  # Reproducers of earlier crashes are loaded (and so run) before any fuzzing.
  [ -d "$regressions" ] && dirs+=("$regressions")
  args=(-max_total_time="$seconds" -timeout="$timeout" -print_final_stats=1)
  [ -f "fuzz/dicts/$t.dict" ] && args+=(-dict="fuzz/dicts/$t.dict")
  say "$t: ${seconds}s from $(find "${dirs[@]}" -type f | wc -l) inputs"
  start=$(date +%s)
  if cargo fuzz run "${build[@]}" "$t" "${dirs[@]}" -- "${args[@]}" "${extra[@]}" \
    >"$logs/$t.log" 2>&1; then
    passed=$((passed + 1))
    # The last status line: executions, coverage, corpus.
    summary=$(grep -E '^#[0-9]+' "$logs/$t.log" | tail -n 1 || true)
    say "$t: ok in $(($(date +%s) - start))s: $summary"
  else
    failed+=("$t")
    # The panic or sanitizer report, and the saved input.
    grep -E -A 12 "panicked at|ERROR: (libFuzzer|AddressSanitizer)|SUMMARY" "$logs/$t.log" | head -n 40 >&2 || true
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$logs/$t.log" | tail -n 1)
    say "$t: CRASHED; reproducer: ${artifact:-(none saved; see $logs/$t.log)}"
    say "$t: replay with: RUSTC_BOOTSTRAP=1 cargo fuzz run $t ${artifact:-<file>}"
  fi
done

echo "fuzz: ${passed} passed, ${#failed[@]} failed"
if ((${#failed[@]})); then
  say "crashed: ${failed[*]} (full logs in $logs/)"
  exit 1
fi
