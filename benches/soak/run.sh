#!/usr/bin/env bash
# The soak (docs/security.md, "The soak"): a long run of the release build at half its
# saturating rate with 100,000 keys in rotation from 10,000 client addresses, a reload every
# minute, Redis restarted twice and a partner upgrade every second; RSS, descriptors and
# Redis memory sampled each minute into target/soak/ (soak.csv, soak.svg,
# summary.json, gateway.log). Not a CI test: 30 minutes by default.
#
#   benches/soak/run.sh [--minutes 30] [--keys 100000] [--addresses 10000] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in wrk redis-server python3; do
  command -v "$tool" >/dev/null || { echo "soak: $tool is needed (apt-get install $tool)" >&2; exit 1; }
done
cargo build --release --locked --quiet
exec python3 benches/soak/soak.py "$@"
