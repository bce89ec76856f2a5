#!/usr/bin/env bash
# Install what a fresh machine lacks to build Tollgate: cmake (Pingora's zlib-ng build needs it).
# Safe to run repeatedly; does nothing when everything is present.
set -euo pipefail

need=()
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v cc >/dev/null 2>&1 || need+=(build-essential)
if ((${#need[@]})); then
  echo "bootstrap: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "bootstrap: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
