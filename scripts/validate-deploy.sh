#!/usr/bin/env bash
# Validate deploy/ with the real tools, where they can be had:
#
#   scripts/check-image.sh                             (always: cargo and python3 only)
#   promtool check config / check rules / test rules   (Debian package: prometheus)
#   systemd-analyze verify + security --offline        (Debian package: systemd)
#   ShellCheck on the deployment scripts               (Debian package: shellcheck)
#
# Missing tools are installed with apt-get when running as root (or with sudo) on a Debian-like
# system; a tool that cannot be installed or cannot run here is SKIPPED with a message. The
# script exits non-zero only when a validator that did run reported a failure.
#
# Structural checks that need no external tool (ports, probes, Secret wiring, metric names,
# the ConfigMap's config through the real loader) are in tests/it/deploy.rs:
#     cargo test --test it deploy::
#
# The Dockerfile is checked statically, with no container engine: scripts/check-image.sh fails
# when its COPY lines or its .dockerignore leave out anything `cargo build` reads (workspace
# members, path dependencies, targets the manifests declare, include_str!/include_bytes!
# files, Cargo.lock). It needs nothing but cargo and python3, so it always runs.
#
# Not covered here: building the image (needs a container engine that can pull
# rust:1.95-bookworm and distroless; podman installs on the build machine, but it cannot reach
# the registries) and the Kubernetes manifests against a cluster's schemas (e.g.
# `kubectl apply --dry-run=server -k deploy/k8s`).
#
# Environment: VALIDATE_DEPLOY_NO_INSTALL=1 never installs anything.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

ran=()
skipped=()
failed=()

note() { printf '\n== %s\n' "$*"; }
pass() { ran+=("$1"); printf 'PASS  %s\n' "$1"; }
fail() { ran+=("$1"); failed+=("$1"); printf 'FAIL  %s\n' "$1"; }
skip() { skipped+=("$1: $2"); printf 'SKIP  %s: %s\n' "$1" "$2"; }

# Best-effort apt-get install of a Debian package providing the command $1.
apt_updated=0
ensure() {
  local cmd=$1 pkg=$2
  command -v "$cmd" >/dev/null 2>&1 && return 0
  [ "${VALIDATE_DEPLOY_NO_INSTALL:-0}" = 1 ] && return 1
  command -v apt-get >/dev/null 2>&1 || return 1
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null || return 1
    sudo="sudo -n"
  fi
  echo "installing $pkg (for $cmd) ..."
  export DEBIAN_FRONTEND=noninteractive
  if [ "$apt_updated" = 0 ]; then
    $sudo apt-get update -qq >/dev/null 2>&1 || return 1
    apt_updated=1
  fi
  # --no-install-recommends: only promtool is needed from `prometheus`, not its web assets.
  $sudo apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null 2>&1 || return 1
  command -v "$cmd" >/dev/null 2>&1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- Container image (static) -------------------------------------------------------------
note "check-image"
if scripts/check-image.sh; then
  pass "check-image.sh deploy/docker/Dockerfile"
else
  fail "check-image.sh deploy/docker/Dockerfile"
fi

# --- Prometheus -----------------------------------------------------------------------------
# The scrape configs read the admin token from a file that exists only on a Prometheus server,
# and promtool checks that it exists: check copies that point at a stand-in token instead.
# Every other line is checked as written; alerts.yml sits next to them as rule_files expects.
stand_in() {
  mkdir -p "$work/prometheus"
  cp deploy/prometheus/alerts.yml "$work/prometheus/"
  printf 'stand-in\n' >"$work/prometheus/admin.token"
  sed "s#^\( *credentials_file:\).*#\1 $work/prometheus/admin.token#" "deploy/prometheus/$1" >"$work/prometheus/$1"
  printf '%s\n' "$work/prometheus/$1"
}
note "promtool"
if ensure promtool prometheus; then
  promtool --version 2>&1 | head -n1
  if promtool check rules deploy/prometheus/alerts.yml; then
    pass "promtool check rules alerts.yml"
  else
    fail "promtool check rules alerts.yml"
  fi
  if promtool test rules deploy/prometheus/alerts.test.yml; then
    pass "promtool test rules alerts.test.yml"
  else
    fail "promtool test rules alerts.test.yml"
  fi
  if promtool check config "$(stand_in prometheus.yml)"; then
    pass "promtool check config prometheus.yml"
  else
    fail "promtool check config prometheus.yml"
  fi
  # Debian builds Prometheus without Kubernetes service discovery; such a promtool rejects
  # kubernetes_sd_configs as an unknown field. That is the tool's gap, not the file's.
  out=$(promtool check config "$(stand_in prometheus-kubernetes.yml)" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  if [ $rc -eq 0 ]; then
    pass "promtool check config prometheus-kubernetes.yml"
  elif grep -q 'field kubernetes_sd_configs not found' <<<"$out"; then
    skip "promtool check config prometheus-kubernetes.yml" \
      "this promtool is built without Kubernetes discovery (Debian's is); use upstream's"
  else
    fail "promtool check config prometheus-kubernetes.yml"
  fi
else
  skip "promtool" "not installed and could not be installed (apt-get install prometheus)"
fi

# --- systemd --------------------------------------------------------------------------------
note "systemd-analyze"
if ensure systemd-analyze systemd; then
  # `verify` checks that every Exec*= binary exists. The unit runs /usr/local/bin/tollgate,
  # which a build machine does not have, so verify a copy whose commands run /bin/true with
  # the same arguments. Every other line is verified as written; the unit's name is kept.
  tmp="$work/systemd"
  mkdir -p "$tmp"
  sed 's#/usr/local/bin/tollgate#/bin/true#g' deploy/systemd/tollgate.service >"$tmp/tollgate.service"
  out=$(systemd-analyze verify --man=no "$tmp/tollgate.service" 2>&1)
  rc=$?
  # verify also reports problems of the host's own units; keep only lines about ours.
  ours=$(grep -F "tollgate.service" <<<"$out" || true)
  [ -n "$out" ] && printf '%s\n' "$out"
  if [ $rc -ne 0 ] && grep -qiE 'Failed to (connect|create|initialize)|Operation not permitted|not been booted' <<<"$out" && [ -z "$ours" ]; then
    skip "systemd-analyze verify" "cannot run in this environment"
  elif [ $rc -ne 0 ] || grep -qiE 'unknown|invalid|failed|ignoring|not valid|bad' <<<"$ours"; then
    fail "systemd-analyze verify tollgate.service"
  else
    pass "systemd-analyze verify tollgate.service"
  fi

  # The exposure score of the sandbox, shown as 0.0 (locked down) to 10.0 (unprotected); the
  # unit scores 1.4. --threshold counts in tenths (20 = 2.0): the run fails if a change weakens
  # the hardening noticeably.
  if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
    out=$(systemd-analyze security --offline=true --threshold=20 --no-pager "$tmp/tollgate.service" 2>&1)
    rc=$?
    printf '%s\n' "$out" | grep -E 'Overall exposure level' || printf '%s\n' "$out" | tail -n 5
    if [ $rc -eq 0 ]; then
      pass "systemd-analyze security --offline (exposure <= 2.0)"
    else
      printf '%s\n' "$out" | grep -v '^✓'
      fail "systemd-analyze security --offline (exposure <= 2.0)"
    fi
  else
    skip "systemd-analyze security" "this systemd has no --offline (needs v250 or later)"
  fi
else
  skip "systemd-analyze" "not installed and could not be installed (apt-get install systemd)"
fi

# --- Shell scripts --------------------------------------------------------------------------
note "shellcheck"
if ensure shellcheck shellcheck; then
  if shellcheck deploy/systemd/upgrade.sh scripts/validate-deploy.sh scripts/check-image.sh; then
    pass "shellcheck upgrade.sh validate-deploy.sh check-image.sh"
  else
    fail "shellcheck upgrade.sh validate-deploy.sh check-image.sh"
  fi
else
  skip "shellcheck" "not installed and could not be installed (apt-get install shellcheck)"
fi

# --- Summary --------------------------------------------------------------------------------
note "summary"
echo "ran:     ${#ran[@]}"
for s in "${skipped[@]}"; do echo "skipped: $s"; done
for f in "${failed[@]}"; do echo "FAILED:  $f"; done
echo "Not validated here: building the image (needs a container engine with registry access); the Kubernetes manifests against a cluster."
echo "$((${#ran[@]} - ${#failed[@]})) passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
[ ${#failed[@]} -eq 0 ]
