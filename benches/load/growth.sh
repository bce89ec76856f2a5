#!/usr/bin/env bash
# How the cost per request grows with the keys, in exact instruction counts (callgrind, through
# instructions.sh), and then the memory, reload and Redis figures (scale.sh, exchange.sh);
# one plot of it all (growth_plot.py).
#
#   benches/load/growth.sh                  # everything (≈ 30 min)
#   PARTS="configured" benches/load/growth.sh
#
# Parts (PARTS, default all four):
#   configured  G's instructions per request with 1k, 100k and 1M keys configured
#               (CONFIGURED_LIST), N requests with the keys in rotation (so with 100k and 1M
#               keys each request is a key not seen before)
#   active      Ga's (everything on, `cluster:` included) instructions per request on the
#               request path and in the exchange with Redis (the other threads), with 1k, 10k
#               and 100k keys in rotation (ACTIVE_LIST): under callgrind a request takes some
#               hundreds of µs, so every key in rotation is a new key in its sync interval
#   scale       benches/load/scale.sh: memory per configured and per active key, reload at 1M
#   exchange    benches/load/exchange.sh: Redis CPU per key call, 1k/10k/100k active keys per
#               interval × 1/3/10 replicas
# Output under $OUT (default target/growth/<time>/): growth.csv, each part's own output, and
# growth.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/benches/load
# shellcheck source=benches/load/lib.sh
. "$HERE/lib.sh"
PARTS=${PARTS:-"configured active scale exchange"}
CONFIGURED_LIST=${CONFIGURED_LIST:-"1000 100000 1000000"}
ACTIVE_LIST=${ACTIVE_LIST:-"1000 10000 100000"}
N=${N:-5000}
OUT=${OUT:-$ROOT/target/growth/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
CSV=$OUT/growth.csv
[ -f "$CSV" ] || echo "part,keys,metric,value" > "$CSV"

# instructions.sh's table rows: "| <setup>[, what] | route | count |"
count() { # file row-prefix
  awk -F'|' -v p="$2" '{ gsub(/^ +| +$/, "", $2) } $2 == p { gsub(/ /, "", $4); print $4 }' "$1"
}

for part in $PARTS; do
  case $part in
    configured)
      for k in $CONFIGURED_LIST; do
        log "configured: G with $k keys"
        KEYS=$k SETUPS=G N=$N OUT="$OUT/instr-g-$k" "$HERE/instructions.sh" > "$OUT/instr-g-$k.md"
        echo "configured,$k,instructions_per_request,$(count "$OUT/instr-g-$k.md" G)" >> "$CSV"
      done ;;
    active)
      for k in $ACTIVE_LIST; do
        log "active: Ga with $k keys in rotation"
        KEYS=$k SETUPS=Ga N=$N OUT="$OUT/instr-ga-$k" "$HERE/instructions.sh" > "$OUT/instr-ga-$k.md"
        echo "active,$k,request_path_instructions,$(count "$OUT/instr-ga-$k.md" "Ga, the request path (the proxy threads)")" >> "$CSV"
        echo "active,$k,exchange_instructions,$(count "$OUT/instr-ga-$k.md" "Ga, the other threads (the exchange with Redis, the keeper, the log writer)")" >> "$CSV"
      done ;;
    scale) OUT="$OUT/scale" "$HERE/scale.sh" | tee "$OUT/scale.md" ;;
    exchange) OUT="$OUT/exchange" "$HERE/exchange.sh" | tee "$OUT/exchange.md" ;;
    *) die "unknown part $part" ;;
  esac
done
if python3 -c 'import matplotlib' >/dev/null 2>&1; then
  python3 "$HERE/growth_plot.py" "$OUT" "$OUT/growth.png" || log "plot failed"
fi
log "done: $OUT"
