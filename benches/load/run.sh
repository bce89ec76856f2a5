#!/usr/bin/env bash
# Load benchmark: Tollgate side by side with nginx and a bare Pingora pass-through.
#
#   benches/load/run.sh            # full run: 3 repetitions of 10 s, 10,000 keys (≈ 25 min)
#   benches/load/run.sh --quick    # smoke: 1 repetition of 3 s, 3,000 keys (≈ 2 min + the build)
#   OUT=/some/dir benches/load/run.sh
#   KEYS=100000 ZIPF=1.0 SETUPS="G Ga" benches/load/run.sh   # keys drawn Zipf(1.0), not rotated
#   PINGORA_CONF=/some/runtime.yaml SETUPS="P0m G" benches/load/run.sh   # another runtime for
#                  every Pingora proxy (G's --conf, P0's fourth argument; benches/load/runtime.sh)
#
# Setups (see benches/load/README.md):
#   D      direct to the upstream: nginx `return 200 '{}'`, one worker (also the upstream of all
#          the proxies below)
#   N1     nginx doing the policy nginx can do (nginx/policy.conf), one worker
#   H1     HAProxy doing the policy HAProxy can do (haproxy/policy.cfg: bearer key -> digest ->
#          plan through a map, the Basic allow-list by ACL, a per-key 10 s request rate in a
#          stick table), one thread
#   P0     bare Pingora pass-through (p0.rs, `cargo build --release --example p0`), 1 thread,
#          the system allocator
#   P0m    P0 with Tollgate's allocator (p0m.rs): the like-for-like baseline
#   G      Tollgate, every policy on, 1 thread, TOLLGATE_LOG=warn (no access log lines)
#   Ga     G with every part-two and part-three feature on (benches/load/all.yaml and gen.py's
#          tollgate-p3.yaml): the edge spelled out, auth-failure blocking, the webhook guard,
#          usage counting, `cluster:` against a redis-server this script starts on the load
#          CPU, `state.path`, the ledger, a monthly quota on the keys' plan, an expiry on every
#          key and one key in ten sent by its rotated `previous` digest
#   Gn     Ga without `cluster:` (every part-two feature but shared budgets): Ga - Gn is what
#          sharing budgets through Redis costs, Gn - G the rest of part two
#   Gq     G with quotas and the ledger on (a monthly quota on the keys' plan that no run reaches,
#          `ledger:`, `state.path`): Gq - G is what issue 26's counting costs
#   Gt     G with `tracing:` configured, no request recorded (`sample_ratio: 0`); Gts: every
#          request recorded (`sample_ratio: 1`), exported to the upstream nginx (a 200 to the post)
#   N1-log N1 with a buffered access log (`access_log … buffer=64k flush=1s`)
#   G-log  G with TOLLGATE_LOG=info: one access line per request, to a file
#          (N1-log and G-log: saturation on sendMessage only, every line checked present)
# Routes: send_message = POST /v2/sendMessage/ (forwarded as is: "G"), send_group_event =
# POST /v2/sendGroup with a group-event body Tollgate parses and checks ("Gv").
#
# Method: the proxy under test is pinned to CPU 0, the load generator and the upstream nginx
# to CPU 1. Keep-alive on both legs. Before every measurement a warm-up run of the same kind.
#   saturation  wrk -t1 -c64 (keys rotate per request, no key is limited) -> req/s and the
#               proxy's CPU µs per request (utime+stime of all its threads, /proc/PID/stat),
#               and user µs per request (utime alone); where `perf stat` can count tracepoints,
#               the proxy's system calls and context switches per request
#   latency     oha open loop at 5,000 and 20,000 req/s, -c64, --latency-correction -> p50,
#               p99, p99.9; one fixed key on the `bench` plan (1,000,000 req / 10 s)
#   overload    after the repetitions, for G and Ga (OVERLOAD_SETUPS): oha open loop at 1.5x
#               the setup's saturating rate, -c250 (under G's default per-address cap of
#               256) -> achieved req/s, p50/p99/p99.9, errors, and the proxy's RSS before,
#               after and at its peak (see overload() below)
# Output in $OUT (default target/bench-results/<timestamp>/): results.csv (setup, route,
# metric, rep, value), summary.md (medians, ratios, machine), benchmarks.png, raw/ (tool
# output), logs/.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
HERE=$ROOT/benches/load
# shellcheck source=benches/load/lib.sh
. "$HERE/lib.sh"

QUICK=0
for arg in "$@"; do
  case $arg in
    --quick) QUICK=1 ;;
    -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

if [ "$QUICK" = 1 ]; then
  REPS=${REPS:-1}; DURATION=${DURATION:-3}; WARMUP=${WARMUP:-1}; KEYS=${KEYS:-3000}
else
  REPS=${REPS:-3}; DURATION=${DURATION:-10}; WARMUP=${WARMUP:-2}; KEYS=${KEYS:-10000}
fi
CONNS=${CONNS:-64}
RATES=${RATES:-"5000 20000"}
PACES=${PACES-}   # e.g. "4": after each saturation run, a paced one (see paced() below)
SETUPS=${SETUPS:-"D N1 H1 P0 P0m G Ga"}
LOG_SETUPS=${LOG_SETUPS-"N1-log G-log"}
OVERLOAD_SETUPS=${OVERLOAD_SETUPS-"G Ga"}
PROFILE=${PROFILE:-0}   # 1: a perf profile of each setup and route (see profile() below)
PROFILE_RECORD=${PROFILE_RECORD:-}   # more `perf record` options (e.g. -g: the data file is kept in raw/)
OVERLOAD_CONNS=${OVERLOAD_CONNS:-250}   # below the gateway's default max_connections_per_ip (256)
ROUTES=${ROUTES:-"send_message send_group_event"}
# Pingora's own settings for G, P0 and P0m alike (the gateway's `--conf`; P0's fourth
# argument): the runtime every proxy of the run is measured with (docs/benchmarks.md).
PINGORA_CONF=${PINGORA_CONF:-$HERE/pingora.yaml}
PROXY_CPU=${PROXY_CPU:-0}   # a list (0,1) runs the proxy on several CPUs (the first one's load is reported)
LOAD_CPU=${LOAD_CPU:-1}
OHA_KEY=bench-fixed-key   # public test key, plan `bench` (1,000,000 per 10 s)
OUT=${OUT:-$ROOT/target/bench-results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT/raw" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
CSV=$OUT/results.csv
echo "setup,route,metric,rep,value" > "$CSV"

if [ "$(nproc)" -lt 2 ]; then die "needs at least 2 CPUs (proxy on CPU $PROXY_CPU, load on CPU $LOAD_CPU)"; fi

# --- tools ---------------------------------------------------------------------------------
apt_missing=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || apt_missing+=(nginx)
command -v wrk >/dev/null 2>&1 || apt_missing+=(wrk)
command -v curl >/dev/null 2>&1 || apt_missing+=(curl)
command -v taskset >/dev/null 2>&1 || apt_missing+=(util-linux)
case " $SETUPS " in *" H1 "*) command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || apt_missing+=(haproxy) ;; esac
case " $SETUPS " in *" Ga "*) command -v redis-server >/dev/null 2>&1 || apt_missing+=(redis-server) ;; esac
apt_install "${apt_missing[@]}"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v oha >/dev/null 2>&1; then
  log "installing oha (cargo install oha --locked; a few minutes)"
  cargo install oha --locked --quiet
fi
if ! python3 -c 'import matplotlib' >/dev/null 2>&1; then
  log "installing matplotlib (pip)"
  python3 -m pip install --quiet matplotlib || log "matplotlib install failed: no plot"
fi
# System calls per request, where perf can count tracepoints (a VM may not expose them; then
# the columns are left out).
PERF_SYSCALLS=0
if command -v perf >/dev/null 2>&1 &&
  perf stat -x, -e raw_syscalls:sys_enter -- true 2>&1 | grep -q '^[0-9]'; then
  PERF_SYSCALLS=1
fi
if [ "$PROFILE" = 1 ] && ! perf record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; then
  die "PROFILE=1 needs perf record -e cpu-clock (apt-get install linux-perf)"
fi
# oha's JSON switch changed names across versions.
if oha --help 2>&1 | grep -q -- '--output-format'; then OHA_JSON=(--output-format json)
else OHA_JSON=(-j); fi
OHA_LATCORR=()
oha --help 2>&1 | grep -q -- '--latency-correction' && OHA_LATCORR=(--latency-correction)
# At the end of -z, wait for the requests in flight instead of aborting them (counted as errors).
OHA_WAIT=()
oha --help 2>&1 | grep -q -- '--wait-ongoing-requests-after-deadline' && OHA_WAIT=(-w)

# --- build (then run private copies: others may rebuild target/ during the run) -----------
log "building (cargo build --release --locked; --example p0 --example p0m)"
cargo build --release --locked --quiet
cargo build --release --locked --quiet --example p0 --example p0m
TMP=$(mktemp -d /tmp/tollgate-bench.XXXXXX)
# TOLLGATE=/path/to/tollgate measures that build instead (a baseline built elsewhere).
cp "${TOLLGATE:-target/release/tollgate}" "$TMP/tollgate"
cp target/release/examples/p0 "$TMP/p0"
cp target/release/examples/p0m "$TMP/p0m"

# --- processes -----------------------------------------------------------------------------
trap on_exit_cleanup EXIT
trap 'exit 130' INT TERM

# Free ports on 127.0.0.1, outside the kernel's ephemeral range (lib.sh).
read -r D_PORT N1_PORT P0_PORT G_PORT G_ADMIN_PORT H1_PORT < <(free_ports 6)
[ -n "${H1_PORT:-}" ] || die "no 6 free ports found"

python3 "$HERE/gen.py" --dir "$TMP" --keys "$KEYS" --d-port "$D_PORT" --n1-port "$N1_PORT" \
  --h1-port "$H1_PORT" --g-port "$G_PORT" --g-admin-port "$G_ADMIN_PORT" --zipf "${ZIPF:-0}"
"$TMP/tollgate" check --config "$TMP/tollgate.yaml" > "$OUT/logs/tollgate-check.txt" \
  || die "generated tollgate config refused: see $OUT/logs/tollgate-check.txt"
R_PORT=""
REDIS_PID=""   # the shared budgets' redis-server, when a setup needs one (Ga)
case " $SETUPS " in
  *" Gn "*)
    # Gn: all.yaml without its `cluster:` block (to the next top-level key or the end).
    { cat "$TMP/tollgate.yaml"; sed -e "s|@STATE@|$TMP/state-gn.db|" "$HERE/all.yaml" |
      awk '/^cluster:/ { skip = 1; next } skip && /^[^ #]/ { skip = 0 } !skip'; } >"$TMP/tollgate-gn.yaml"
    "$TMP/tollgate" check --config "$TMP/tollgate-gn.yaml" > "$OUT/logs/tollgate-gn-check.txt" \
      || die "generated Gn config refused: see $OUT/logs/tollgate-gn-check.txt"
    grep -q '^cluster:' "$TMP/tollgate-gn.yaml" && die "Gn's config still has a cluster block" ;;
esac
case " $SETUPS " in
  *" Gt "* | *" Gts "*)
    # Gt, Gts: G with traces on (Gt: configured, nothing recorded; Gts: every request
    # recorded), exported to the upstream nginx, which answers the OTLP post 200 as any other.
    for r in 0 1; do
      { cat "$TMP/tollgate.yaml"
        printf 'tracing:\n  otlp_endpoint: "http://127.0.0.1:%s"\n  sample_ratio: %s\n' "$D_PORT" "$r"; } \
        >"$TMP/tollgate-t$r.yaml"
    done ;;
esac
case " $SETUPS " in
  *" Gq "*)
    # Gq: the keys' plan (pro) with a quota no run reaches, the ledger on, kept in state.path.
    sed -e 's|^  pro: {\(.*\) }$|  pro: {\1, quota: { requests: 1000000000, per: month } }|' \
      "$TMP/tollgate.yaml" >"$TMP/tollgate-q.yaml"
    printf 'ledger:\n  retention_days: 400\nstate:\n  path: "%s"\n' "$TMP/state-q.db" >>"$TMP/tollgate-q.yaml"
    grep -q 'quota: { requests: 1000000000' "$TMP/tollgate-q.yaml" || die "Gq: no pro plan line"
    "$TMP/tollgate" check --config "$TMP/tollgate-q.yaml" > "$OUT/logs/tollgate-q-check.txt" \
      || die "generated Gq config refused: see $OUT/logs/tollgate-q-check.txt" ;;
esac
case " $SETUPS " in
  *" Ga "*)
    # The shared budgets' Redis, on the load CPU (in a fleet it is another machine).
    R_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    { cat "$TMP/tollgate-p3.yaml"; sed -e "s|@REDIS_PORT@|$R_PORT|" -e "s|@STATE@|$TMP/state.db|" \
      "$HERE/all.yaml"; } >"$TMP/tollgate-all.yaml"
    "$TMP/tollgate" check --config "$TMP/tollgate-all.yaml" > "$OUT/logs/tollgate-all-check.txt" \
      || die "generated all-on config refused: see $OUT/logs/tollgate-all-check.txt" ;;
esac
for n in nginx-d nginx-n1 nginx-n1log; do
  "$NGINX" -t -q -p "$TMP/$n" -c "$TMP/$n/nginx.conf" -e "$TMP/$n/error.log" \
    || die "nginx refused $TMP/$n/nginx.conf"
done
case " $SETUPS " in
  *" H1 "*) "$HAPROXY" -c -q -f "$TMP/haproxy-h1/haproxy.cfg" || die "haproxy refused $TMP/haproxy-h1/haproxy.cfg" ;;
esac

start_nginx() { # name cpu -> echo pid
  local n=$1 cpu=$2
  taskset -c "$cpu" "$NGINX" -p "$TMP/$n" -c "$TMP/$n/nginx.conf" -e "$TMP/$n/error.log" \
    -g 'daemon off;' >"$OUT/logs/$n.out" 2>&1 &
  echo $!
}

log "upstream nginx on 127.0.0.1:$D_PORT (CPU $LOAD_CPU)"
UP_PID=$(start_nginx nginx-d "$LOAD_CPU")
PIDS+=("$UP_PID")
wait_port "$D_PORT"
if [ -n "$R_PORT" ]; then
  log "redis-server on 127.0.0.1:$R_PORT (CPU $LOAD_CPU) for Ga"
  taskset -c "$LOAD_CPU" redis-server --port "$R_PORT" --bind 127.0.0.1 --save "" \
    --appendonly no --dir "$TMP" >"$OUT/logs/redis.out" 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  wait_port "$R_PORT"
fi

CUR_PID=""     # the proxy under test
CUR_PORT=""
CUR_SIG=TERM
start_setup() { # setup
  local s=$1
  case $s in
    D) CUR_PID=$UP_PID; CUR_PORT=$D_PORT; return ;;
    N1)
      CUR_PID=$(start_nginx nginx-n1 "$PROXY_CPU"); CUR_PORT=$N1_PORT; CUR_SIG=TERM ;;
    N1-log)
      CUR_PID=$(start_nginx nginx-n1log "$PROXY_CPU"); CUR_PORT=$N1_PORT; CUR_SIG=TERM ;;
    H1)
      taskset -c "$PROXY_CPU" "$HAPROXY" -db -f "$TMP/haproxy-h1/haproxy.cfg" \
        >"$OUT/logs/h1.out" 2>&1 &
      CUR_PID=$!; CUR_PORT=$H1_PORT; CUR_SIG=TERM ;;
    P0 | P0m)
      local bin=p0; [ "$s" = P0m ] && bin=p0m
      taskset -c "$PROXY_CPU" "$TMP/$bin" "127.0.0.1:$P0_PORT" "127.0.0.1:$D_PORT" 1 "$PINGORA_CONF" \
        >"$OUT/logs/$bin.out" 2>&1 &
      CUR_PID=$!; CUR_PORT=$P0_PORT; CUR_SIG=INT ;;
    G | G-log | Ga | Gn | Gq | Gt | Gts)
      local level=warn dest="$OUT/logs/g.out" config="$TMP/tollgate.yaml"
      if [ "$s" = G-log ]; then level=info; dest="$TMP/g-access.log"; fi
      if [ "$s" = Ga ]; then dest="$OUT/logs/ga.out"; config="$TMP/tollgate-all.yaml"; fi
      if [ "$s" = Gn ]; then dest="$OUT/logs/gn.out"; config="$TMP/tollgate-gn.yaml"; fi
      if [ "$s" = Gq ]; then dest="$OUT/logs/gq.out"; config="$TMP/tollgate-q.yaml"; fi
      if [ "$s" = Gt ]; then dest="$OUT/logs/gt.out"; config="$TMP/tollgate-t0.yaml"; fi
      if [ "$s" = Gts ]; then dest="$OUT/logs/gts.out"; config="$TMP/tollgate-t1.yaml"; fi
      TOLLGATE_LOG=$level taskset -c "$PROXY_CPU" "$TMP/tollgate" run \
        --config "$config" --conf "$PINGORA_CONF" >>"$dest" 2>&1 &
      CUR_PID=$!; CUR_PORT=$G_PORT; CUR_SIG=INT ;;
    *) die "unknown setup $s" ;;
  esac
  PIDS+=("$CUR_PID")
  wait_port "$CUR_PORT"
  case $s in G | G-log | Ga | Gn | Gq | Gt | Gts) wait_ready "$G_ADMIN_PORT" ;; esac
}
stop_setup() {
  if [ "$CUR_PID" != "$UP_PID" ]; then
    stop_pid "$CUR_PID" "$CUR_SIG"
    forget "$CUR_PID"
  fi
  CUR_PID=""
}

# CPU clock ticks (utime+stime) of a process: /proc/PID/stat counts every thread of the
# process; for nginx the master and its workers are added up.
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { # pid [user]: utime+stime, or utime alone with a second argument
  local total=0 p t
  for p in "$1" $(pgrep -P "$1" || true); do
    t=$(awk -v u="${2:-}" '{ sub(/^.*\) /, ""); print u ? $12 : $12 + $13 }' "/proc/$p/stat" 2>/dev/null || echo 0)
    total=$((total + t))
  done
  echo "$total"
}

row() { echo "$1,$2,$3,$4,$5" >> "$CSV"; }
# CPU µs a request: clock ticks over requests.
per_req() { awk -v d="$1" -v h="$CLK_TCK" -v n="$2" 'BEGIN {printf "%.2f", d * 1e6 / h / n}'; }

# Ticks of both CPUs from /proc/stat, "total busy steal" for the proxy's CPU then the load
# CPU: busy = all but idle and iowait (steal and interrupts included); steal = time the
# hypervisor gave to someone else.
cores() {
  awk -v a="cpu${PROXY_CPU%%,*}" -v b="cpu$LOAD_CPU" '
    $1 == a || $1 == b { t = $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9; v[$1] = t " " (t - $5 - $6) " " $9 }
    END { print v[a], v[b] }' /proc/stat
}
# CPU ticks used by this shell's finished children (bash `times`, second line): the load
# generator's CPU time. Must run in this shell, not in a $( ) subshell.
children_ticks() {
  times > "$TMP/times"
  LG_TICKS=$(awk -v h="$CLK_TCK" 'NR == 2 {
      t = 0
      for (i = 1; i <= 2; i++) { split($i, p, "m"); sub(/s$/, "", p[2]); t += p[1] * 60 + p[2] }
      printf "%d", t * h + 0.5 }' "$TMP/times")
}
# Per-thread CPU ticks (utime+stime) of a process: "tid name ticks", a line per thread.
thread_ticks() { # pid
  local t
  for t in /proc/"$1"/task/*; do
    awk -v tid="${t##*/}" '{ n = $0; sub(/^[^(]*\(/, "", n); sub(/\).*$/, "", n); gsub(/[ ,]/, "_", n)
      sub(/^.*\) /, ""); print tid, n, $12 + $13 }' "$t/stat" 2>/dev/null || true
  done
}
# The threads of the proxy that used CPU between two thread_ticks snapshots, busiest first:
# rows thread<N>_cpu_pct<suffix> (N = 1, 2, 3: % of one CPU over the wall time), the list in
# raw/threads-<setup>-<route>-<rep><suffix>.txt. With 2 worker threads, how evenly they share
# the work.
thread_rows() { # setup route rep suffix before after wall
  local s=$1 r=$2 rep=$3 sfx=$4 f="$OUT/raw/threads-$1-$2-$3$4.txt"
  awk -v h="$CLK_TCK" -v w="$7" 'NR == FNR { b[$1] = $3; next }
    { d = $3 - ($1 in b ? b[$1] : 0); if (d > 0) printf "%.1f %s %s\n", d / h / w * 100, $1, $2 }' \
    "$5" "$6" | sort -rn > "$f"
  local n=0 pct
  while read -r pct _ _; do
    n=$((n + 1)); [ "$n" -le 3 ] || break
    row "$s" "$r" "thread${n}_cpu_pct$sfx" "$rep" "$pct"
  done < "$f"
}

# measured setup route rep suffix -- command...: run the command and record, over its wall
# time, how busy both CPUs were and who used them: the proxy, the upstream, the load
# generator (rows *_pct<suffix>). Leaves the proxy's ticks in M_PROXY_TICKS, and its user-space
# ticks alone in M_PROXY_USER_TICKS.
measured() {
  local s=$1 r=$2 rep=$3 sfx=$4; shift 5
  local p0 u0 k0 w0 g0 p1 u1 k1 w1 g1 pu0 pu1 r0=0 r1=0
  pu0=$(cpu_ticks "$CUR_PID" user)
  [ -n "$REDIS_PID" ] && r0=$(cpu_ticks "$REDIS_PID")
  thread_ticks "$CUR_PID" > "$TMP/threads-before"
  p0=$(cpu_ticks "$CUR_PID"); u0=$(cpu_ticks "$UP_PID"); k0=$(cores); w0=$(date +%s%N)
  children_ticks; g0=$LG_TICKS
  "$@"
  children_ticks; g1=$LG_TICKS
  w1=$(date +%s%N); p1=$(cpu_ticks "$CUR_PID"); u1=$(cpu_ticks "$UP_PID"); k1=$(cores)
  pu1=$(cpu_ticks "$CUR_PID" user)
  thread_ticks "$CUR_PID" > "$TMP/threads-after"
  [ -n "$REDIS_PID" ] && r1=$(cpu_ticks "$REDIS_PID")
  M_PROXY_TICKS=$((p1 - p0))
  M_PROXY_USER_TICKS=$((pu1 - pu0))
  local wall; wall=$(awk -v a="$w0" -v b="$w1" 'BEGIN {printf "%.6f", (b - a) / 1e9}')
  pct() { awk -v d="$1" -v h="$CLK_TCK" -v w="$wall" 'BEGIN {printf "%.1f", d / h / w * 100}'; }
  row "$s" "$r" "proxy_cpu_pct$sfx" "$rep" "$(pct $((p1 - p0)))"
  row "$s" "$r" "upstream_cpu_pct$sfx" "$rep" "$(pct $((u1 - u0)))"
  row "$s" "$r" "loadgen_cpu_pct$sfx" "$rep" "$(pct $((g1 - g0)))"
  [ "$CUR_PID" = "$UP_PID" ] ||
    thread_rows "$s" "$r" "$rep" "$sfx" "$TMP/threads-before" "$TMP/threads-after" "$wall"
  [ -n "$REDIS_PID" ] && row "$s" "$r" "redis_cpu_pct$sfx" "$rep" "$(pct $((r1 - r0)))"
  local -a a b
  read -r -a a <<<"$k0"
  read -r -a b <<<"$k1"
  local i cpu name col
  for i in 0 1; do
    cpu=${PROXY_CPU%%,*}; [ "$i" = 1 ] && cpu=$LOAD_CPU
    local tot=$((b[i * 3] - a[i * 3]))
    for col in 1 2; do
      case $col in 1) name=busy ;; 2) name=steal ;; esac
      row "$s" "$r" "cpu${cpu}_${name}_pct$sfx" "$rep" \
        "$(awk -v d=$((b[i * 3 + col] - a[i * 3 + col])) -v t="$tot" 'BEGIN {printf "%.1f", t ? d / t * 100 : 0}')"
    done
  done
}

# --- sanity: the policy answers what it should, before anything is measured ---------------
status() { # method port path key [body-file] [content-type]
  local args=(-s -o /dev/null -w '%{http_code}' --max-time 5 -X "$1" "http://127.0.0.1:$2$3")
  [ -n "$4" ] && args+=(-H "Authorization: Bearer $4")
  [ -n "${5:-}" ] && args+=(--data-binary "@$5" -H "Content-Type: ${6:-application/json}")
  curl "${args[@]}" || true
}
expect() { # what got want
  [ "$2" = "$3" ] || die "sanity check on $CUR_SETUP: $1: got $2, want $3"
}
sanity() { # setup
  local s=$1 p=$CUR_PORT r
  for r in $ROUTES; do
    expect "$r with a pro key" "$(status POST "$p" "$(cat "$TMP/path-$r")" bench-key-00000 "$TMP/body-$r.json")" 200
    expect "$r with the oha key" "$(status POST "$p" "$(cat "$TMP/path-$r")" "$OHA_KEY" "$TMP/body-$r.json")" 200
  done
  [ "$s" = D ] || [ "$s" = P0 ] || [ "$s" = P0m ] || {
    expect "no key" "$(status POST "$p" /v2/sendMessage/ "" "$TMP/body-send_message.json")" 401
    expect "unknown key" "$(status POST "$p" /v2/sendMessage/ nope "$TMP/body-send_message.json")" 401
    expect "basic key, allowed route" "$(status GET "$p" /v2/history/sentList bench-basic-key)" 200
    expect "basic key, route off the allow-list" "$(status GET "$p" /v2/history/receivedList bench-basic-key)" 403
    expect "group event as text/plain" \
      "$(status POST "$p" /v2/sendGroup bench-key-00001 "$TMP/body-send_group_event.json" text/plain)" 415
    echo '{"name":"","type":"meeting","groupId":"g-1"}' > "$TMP/bad-event.json"
    local bad; bad=$(status POST "$p" /v2/sendGroup bench-key-00002 "$TMP/bad-event.json")
    case $s in
      G*) expect "invalid group event body" "$bad" 400 ;;
      N1* | H1) expect "invalid group event body ($s cannot check JSON: forwarded)" "$bad" 200 ;;
    esac
  }
}

# --- measurements ----------------------------------------------------------------------------
# The shared budgets' counters on G*'s admin listener: Redis script calls, requests that waited.
cluster_counts() {
  curl -s "http://127.0.0.1:$G_ADMIN_PORT/metrics" | awk '
    $1 == "tollgate_cluster_redis_calls_total" {c = $2}
    $1 == "tollgate_cluster_settle_wait_seconds_count" {w = $2}
    END {printf "%d %d", c, w}'
}

# Redis script calls and requests that waited for Redis, per request of wrk's count (the
# warm-up's requests are outside both counts; the ticks' heartbeats are in the calls).
shared_rows() { # setup route rep suffix counts-before wrk-output
  local after n; after=$(cluster_counts); n=$(awk '/requests in/ {print $1}' "$6")
  row "$1" "$2" "redis_calls_per_req$4" "$3" "$(awk -v a="$5" -v b="$after" -v n="$n" 'BEGIN {split(a, x, " "); split(b, y, " "); printf "%.4f", (y[1] - x[1]) / n}')"
  row "$1" "$2" "waited_per_req$4" "$3" "$(awk -v a="$5" -v b="$after" -v n="$n" 'BEGIN {split(a, x, " "); split(b, y, " "); printf "%.4f", (y[2] - x[2]) / n}')"
}

saturation() { # setup route rep
  local s=$1 r=$2 rep=$3 f="$OUT/raw/wrk-$1-$2-$3.txt" pf="$OUT/raw/perf-$1-$2-$3.txt" perf_pid=""
  local url="http://127.0.0.1:$CUR_PORT/"
  taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${WARMUP}s" -s "$TMP/wrk-$r.lua" "$url" >"$TMP/warm.txt"
  if [ "$PERF_SYSCALLS" = 1 ]; then
    # The proxy's system calls and context switches over the run (every process of it: nginx's
    # master and workers), on the CPU that perf itself does not load (it sleeps meanwhile).
    local pids; pids=$(echo "$CUR_PID" $(pgrep -P "$CUR_PID" || true) | tr ' ' ',')
    perf stat -x, -e raw_syscalls:sys_enter,context-switches -p "$pids" -o "$pf" \
      -- sleep "$DURATION" >/dev/null 2>&1 &
    perf_pid=$!
  fi
  local shared_before=""
  [ "$s" = Ga ] && shared_before=$(cluster_counts)
  measured "$s" "$r" "$rep" "" -- \
    taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s "$TMP/wrk-$r.lua" "$url" > "$f"
  if [ -n "$perf_pid" ]; then wait "$perf_pid" 2>/dev/null || true; fi
  [ -z "$shared_before" ] || shared_rows "$s" "$r" "$rep" "" "$shared_before" "$f"
  local reqs rps non2xx errs
  reqs=$(awk '/requests in/ {print $1}' "$f")
  rps=$(awk '/^Requests\/sec/ {print $2}' "$f")
  non2xx=$(awk '/Non-2xx or 3xx responses/ {print $5}' "$f"); non2xx=${non2xx:-0}
  errs=$(awk '/Socket errors/ {gsub(/,/, ""); print $4 + $6 + $8 + $10}' "$f"); errs=${errs:-0}
  [ -n "$reqs" ] && [ "$reqs" -gt 0 ] || die "wrk measured nothing: $f"
  row "$s" "$r" rps "$rep" "$rps"
  ACCESS_SENT=$((ACCESS_SENT + reqs + $(awk '/requests in/ {print $1}' "$TMP/warm.txt")))
  row "$s" "$r" requests "$rep" "$reqs"
  row "$s" "$r" non2xx "$rep" "$non2xx"
  row "$s" "$r" socket_errors "$rep" "$errs"
  row "$s" "$r" cpu_us_per_req "$rep" "$(per_req "$M_PROXY_TICKS" "$reqs")"
  row "$s" "$r" user_us_per_req "$rep" "$(per_req "$M_PROXY_USER_TICKS" "$reqs")"
  if [ -s "$pf" ]; then
    # perf's window is DURATION s from its start, wrk's DURATION s from its own: per request
    # of wrk's count, to within the few ms between the two starts.
    row "$s" "$r" syscalls_per_req "$rep" "$(awk -F, -v n="$reqs" '$3 == "raw_syscalls:sys_enter" && $1 ~ /^[0-9]+$/ {printf "%.2f", $1 / n}' "$pf")"
    row "$s" "$r" ctxsw_per_req "$rep" "$(awk -F, -v n="$reqs" '$3 == "context-switches" && $1 ~ /^[0-9]+$/ {printf "%.4f", $1 / n}' "$pf")"
  fi
  row "$s" "$r" wrk_p50_ms "$rep" "$(awk '$1 == "50%" {print $2}' "$f" | python3 "$HERE/summary.py" --to-ms)"
  row "$s" "$r" wrk_p99_ms "$rep" "$(awk '$1 == "99%" {print $2}' "$f" | python3 "$HERE/summary.py" --to-ms)"
  [ "$non2xx" = 0 ] && [ "$errs" = 0 ] || log "  warning: $s $r: $non2xx non-2xx answers, $errs socket errors (see $f)"
  log "  $s $r rep $rep: $rps req/s, $(awk -F, -v s="$s" -v r="$r" -v k="$rep" \
    '$1==s && $2==r && $4==k && ($3=="cpu_us_per_req" || $3=="user_us_per_req" || $3=="proxy_cpu_pct" || $3=="wrk_p99_ms") {printf "%s=%s ", $3, $5}' "$CSV")"
}

# PACES="4 …": after each saturation run, the same traffic paced: every connection waits PACE
# ms before each request (wrk's delay(), gen.py's scripts), an offered rate of about
# CONNS / (PACE ms + the answer's time), under every setup's saturation and nearly the same for
# each. CPU µs a request then compares the setups' work at one rate: at saturation a slower
# setup also pays for more of the kernel's wake-ups of its peers, who are more often found
# asleep (docs/benchmarks.md, "Where Ga − G goes in the kernel"). Rows <metric>@pace<ms>.
paced() { # setup route rep pace-ms
  local s=$1 r=$2 rep=$3 d=$4 f="$OUT/raw/wrk-$1-$2-$3-pace$4.txt" sfx="@pace$4"
  local url="http://127.0.0.1:$CUR_PORT/" shared_before=""
  PACE_MS=$d taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${WARMUP}s" -s "$TMP/wrk-$r.lua" "$url" >"$TMP/warm.txt"
  [ "$s" = Ga ] && shared_before=$(cluster_counts)
  measured "$s" "$r" "$rep" "$sfx" -- \
    env PACE_MS="$d" taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$TMP/wrk-$r.lua" "$url" > "$f"
  [ -z "$shared_before" ] || shared_rows "$s" "$r" "$rep" "$sfx" "$shared_before" "$f"
  local reqs; reqs=$(awk '/requests in/ {print $1}' "$f")
  [ -n "$reqs" ] && [ "$reqs" -gt 0 ] || die "wrk measured nothing: $f"
  ACCESS_SENT=$((ACCESS_SENT + reqs + $(awk '/requests in/ {print $1}' "$TMP/warm.txt")))
  row "$s" "$r" "rps$sfx" "$rep" "$(awk '/^Requests\/sec/ {print $2}' "$f")"
  row "$s" "$r" "requests$sfx" "$rep" "$reqs"
  row "$s" "$r" "cpu_us_per_req$sfx" "$rep" "$(per_req "$M_PROXY_TICKS" "$reqs")"
  row "$s" "$r" "user_us_per_req$sfx" "$rep" "$(per_req "$M_PROXY_USER_TICKS" "$reqs")"
  log "  $s $r rep $rep paced ${d} ms: $(awk -F, -v s="$s" -v r="$r" -v k="$rep" -v x="$sfx" \
    '$1==s && $2==r && $4==k && ($3=="rps"x || $3=="cpu_us_per_req"x || $3=="user_us_per_req"x || $3=="waited_per_req"x) {printf "%s=%s ", $3, $5}' "$CSV")"
}

# PROFILE=1: after the first repetition's saturation run of each setup and route, one more
# wrk run of the same kind (not measured) with the proxy sampled by `perf record -e cpu-clock`
# (a software event: it works where the VM exposes no hardware counters), kernel included.
# raw/profile-<setup>-<route>.txt is `perf report` by object and function, and the run's CPU
# µs per request goes in results.csv as profile_cpu_us_per_req (sampling at 999 Hz costs a
# few per cent; at 4999 Hz it cost a quarter on this VM, each sample a timer interrupt):
# profile.py spreads the measured runs' median µs per request over the samples, by crate
# and function, and gives one setup's difference to another's.
profile() { # setup route
  local s=$1 r=$2 f="$OUT/raw/wrk-profile-$1-$2.txt" data="$TMP/perf-$1-$2.data"
  local url="http://127.0.0.1:$CUR_PORT/" pids
  pids=$(echo "$CUR_PID" $(pgrep -P "$CUR_PID" || true) | tr ' ' ',')
  # shellcheck disable=SC2086 # PROFILE_RECORD is a list of perf options
  perf record -q -e cpu-clock -F 999 $PROFILE_RECORD -p "$pids" -o "$data" -- sleep "$DURATION" >/dev/null 2>&1 &
  local perf_pid=$!
  measured "$s" "$r" 1 "_profile" -- \
    taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$TMP/wrk-$r.lua" "$url" > "$f"
  wait "$perf_pid" 2>/dev/null || true
  local reqs; reqs=$(awk '/requests in/ {print $1}' "$f")
  row "$s" "$r" profile_cpu_us_per_req 1 "$(per_req "$M_PROXY_TICKS" "$reqs")"
  perf report -i "$data" --stdio --no-children --sort dso,sym --percent-limit 0.01 -g none \
    >"$OUT/raw/profile-$s-$r.txt" 2>/dev/null || log "  warning: perf report failed for $s $r"
  [ -z "$PROFILE_RECORD" ] || cp "$data" "$OUT/raw/perf-$s-$r.data"
  log "  $s $r profile: $(awk -F, -v s="$s" -v r="$r" '$1==s && $2==r && $3=="profile_cpu_us_per_req" {print $5}' "$CSV") µs/req, raw/profile-$s-$r.txt"
}

latency() { # setup route rep rate
  local s=$1 r=$2 rep=$3 q=$4 f="$OUT/raw/oha-$1-$2-$3-$4.json"
  local cmd=(taskset -c "$LOAD_CPU" oha --no-tui -c "$CONNS" -q "$q" "${OHA_LATCORR[@]}" "${OHA_WAIT[@]}" -m POST
    -H "Content-Type: application/json" -H "Authorization: Bearer $OHA_KEY"
    -D "$TMP/body-$r.json" "${OHA_JSON[@]}" "http://127.0.0.1:$CUR_PORT$(cat "$TMP/path-$r")")
  "${cmd[@]}" -z "${WARMUP}s" >/dev/null
  measured "$s" "$r" "$rep" "@$q" -- "${cmd[@]}" -z "${DURATION}s" > "$f"
  python3 "$HERE/summary.py" --oha "$f" --rate "$q" --setup "$s" --route "$r" --rep "$rep" \
    --cpu-ticks "$M_PROXY_TICKS" --clk-tck "$CLK_TCK" >> "$CSV"
  log "  $s $r rep $rep @ $q/s: $(awk -F, -v s="$s" -v r="$r" -v k="$rep" -v q="$q" \
    '$1==s && $2==r && $4==k && ($3=="p50_ms@"q || $3=="p99_ms@"q || $3=="p999_ms@"q || $3=="achieved_rps@"q) {printf "%s=%s ", $3, $5}' "$CSV")"
}

measure_setup() { # setup rep what(all|sat)
  local s=$1 rep=$2 what=${3:-all} routes=${4:-$ROUTES} r q d
  CUR_SETUP=$s
  start_setup "$s"
  sanity "$s"
  access_lines "$s" - -   # the sanity checks' lines out of the count
  for r in $routes; do
    saturation "$s" "$r" "$rep"
    access_lines "$s" "$r" "$rep"
    if [ "$PROFILE" = 1 ] && [ "$rep" = 1 ] && [ "$s" != D ]; then
      profile "$s" "$r"
      access_lines "$s" - -
    fi
    [ "$what" = all ] || continue
    for d in $PACES; do paced "$s" "$r" "$rep" "$d"; done
    for q in $RATES; do latency "$s" "$r" "$rep" "$q"; done
  done
  stop_setup
  return 0
}
# G-log and N1-log: every request answered has its line. wrk's count of requests completed is
# compared with the lines written since the last check (the warm-up's included, counted by
# wrk's report of it), then the file is emptied. A line short fails the run.
access_lines() { # setup route rep
  local f
  case $1 in
    G-log) f=$TMP/g-access.log ;;
    N1-log) f=$TMP/nginx-n1log/access.log; sleep 1.5 ;;  # nginx flushes its buffer each second
    *) return 0 ;;
  esac
  local n; n=$(grep -c 'tollgate::access.*status=200\|HTTP/1.1" 200 ' "$f" || true)
  if [ "$2" != - ]; then
    log "  $1: $n access lines of 200s, $ACCESS_SENT requests answered 200 since the last check"
    [ "$n" -ge "$ACCESS_SENT" ] || die "$1: $n access lines for $ACCESS_SENT requests answered"
  fi
  : > "$f"   # opened with O_APPEND: writes go on at the new end
  ACCESS_SENT=0
}
ACCESS_SENT=0

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average before the run: $LOAD_START (should be near 0: the numbers assume an idle machine)"
log "ports: D $D_PORT, N1 $N1_PORT, H1 $H1_PORT, P0 and P0m $P0_PORT, G* $G_PORT (admin $G_ADMIN_PORT); $KEYS keys"
log "$REPS repetition(s) of ${DURATION}s (warm-up ${WARMUP}s); setups $SETUPS, $LOG_SETUPS; output $OUT"
for rep in $(seq "$REPS"); do
  for s in $SETUPS; do
    log "rep $rep: $s"
    measure_setup "$s" "$rep"
  done
  # With an access line per request (saturation, sendMessage only).
  for s in $LOG_SETUPS; do
    log "rep $rep: $s"
    measure_setup "$s" "$rep" sat send_message
  done
done

# --- overload: open loop at 1.5x the saturating rate ------------------------------------------
# For each of OVERLOAD_SETUPS: the rate is 1.5x the setup's median saturating req/s measured
# above (sendMessage); oha sends it open loop for DURATION s over OVERLOAD_CONNS connections
# with the fixed key (never limited). Recorded: what was achieved, the latency percentiles of
# the answers (with --latency-correction: from when each request was due), errors, and the
# proxy's resident memory before, after, and at its peak (VmHWM, reset before the run):
# memory that stays flat while the offered load exceeds capacity means nothing queues
# without bound inside the proxy (the excess waits in the client, as it would in the network).
overload() { # setup
  local s=$1 r=send_message f="$OUT/raw/oha-$1-overload.json" sat q rss0 rss1 hwm
  sat=$(awk -F, -v s="$s" '$1 == s && $2 == "send_message" && $3 == "rps" { print $5 }' "$CSV" | sort -n |
    awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }')
  [ -n "$sat" ] || { log "overload $s: no saturation measured; skipped"; return 0; }
  q=$(awk -v x="$sat" 'BEGIN { printf "%d", x * 1.5 }')
  CUR_SETUP=$s
  start_setup "$s"
  local cmd=(taskset -c "$LOAD_CPU" oha --no-tui -c "$OVERLOAD_CONNS" -q "$q" "${OHA_LATCORR[@]}" "${OHA_WAIT[@]}"
    -m POST -H "Content-Type: application/json" -H "Authorization: Bearer $OHA_KEY"
    -D "$TMP/body-$r.json" "${OHA_JSON[@]}" "http://127.0.0.1:$CUR_PORT$(cat "$TMP/path-$r")")
  "${cmd[@]}" -z "${WARMUP}s" >/dev/null
  rss0=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$CUR_PID/status")
  echo 5 > "/proc/$CUR_PID/clear_refs" 2>/dev/null || true
  measured "$s-overload" "$r" 1 "@over" -- "${cmd[@]}" -z "${DURATION}s" > "$f"
  rss1=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$CUR_PID/status")
  hwm=$(awk '$1 == "VmHWM:" { print $2 }' "/proc/$CUR_PID/status")
  stop_setup
  python3 "$HERE/summary.py" --oha "$f" --rate "$q" --setup "$s-overload" --route "$r" --rep 1 \
    --cpu-ticks "$M_PROXY_TICKS" --clk-tck "$CLK_TCK" | sed "s/@$q,/@over,/" >> "$CSV"
  row "$s-overload" "$r" offered_rps 1 "$q"
  row "$s-overload" "$r" saturating_rps 1 "$sat"
  row "$s-overload" "$r" rss_before_kb 1 "$rss0"
  row "$s-overload" "$r" rss_after_kb 1 "$rss1"
  row "$s-overload" "$r" rss_peak_kb 1 "$hwm"
  log "  $s overload at $q req/s (1.5 x $sat): $(awk -F, -v s="$s-overload" \
    '$1==s && ($3 ~ /@over$/ || $3 ~ /rss/) {printf "%s=%s ", $3, $5}' "$CSV")"
}
for s in $OVERLOAD_SETUPS; do
  log "overload: $s"
  overload "$s"
done

# --- report ----------------------------------------------------------------------------------
{
  echo "nproc=$(nproc)"
  echo "cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)$(lscpu 2>/dev/null | awk -F': *' '/^Model:/ {m=$2} /^CPU family:/ {f=$2} /^Stepping:/ {st=$2} /^CPU max MHz:/ {mhz=$2} END {if (f != "") printf " (family %s model %s stepping %s%s)", f, m, st, mhz ? ", max " mhz " MHz" : ""}')"
  echo "kernel=$(uname -srm)"
  echo "virtualization=$(lscpu 2>/dev/null | awk -F': *' '/^Hypervisor vendor:/ {h=$2} /^Virtualization type:/ {t=$2} END {print (h != "" ? h " " t : "none reported")}')"
  echo "nginx=$("$NGINX" -v 2>&1 | sed 's/^nginx version: //')"
  echo "haproxy=$("$HAPROXY" -v 2>&1 | head -n 1 | awk '{print $3}')"
  echo "wrk=$(wrk -v 2>&1 | head -n 1 | awk '{print $1, $2}')"
  echo "oha=$(oha --version 2>&1 | head -n 1)"
  echo "rustc=$(rustc --version)"
  echo "pingora=$(awk '/^name = "pingora"$/ {getline; print $3}' Cargo.lock | tr -d '"')"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- src Cargo.toml Cargo.lock 2>/dev/null || echo ' (src/Cargo changed since)')"
  echo "mode=$([ "$QUICK" = 1 ] && echo quick || echo full)"
  echo "reps=$REPS"
  echo "duration_s=$DURATION"
  echo "warmup_s=$WARMUP"
  echo "conns=$CONNS"
  echo "overload_conns=$OVERLOAD_CONNS"
  echo "keys=$KEYS zipf=${ZIPF:-0}"
  echo "rates=$RATES"
  echo "paces=$PACES"
  echo "oha_latency_correction=${OHA_LATCORR[*]:-no}"
  echo "loadavg_start=$LOAD_START"
  echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "proxy_cpu=$PROXY_CPU"
  echo "load_cpu=$LOAD_CPU"
  echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
} > "$OUT/machine.txt"
python3 "$HERE/summary.py" --csv "$CSV" --machine "$OUT/machine.txt" --out "$OUT/summary.md"
if python3 -c 'import matplotlib' >/dev/null 2>&1; then
  python3 "$HERE/plot.py" "$CSV" "$OUT/benchmarks.png" || log "plot failed"
fi
log "done: $OUT/summary.md"
cat "$OUT/summary.md"
