#!/usr/bin/env bash
# Instructions per request, P0 vs G (and Gv), counted by valgrind's callgrind.
#
#   benches/load/instructions.sh            # P0, G, P0v, Gv: 5,000 measured requests each
#   (P0v is P0 on G's validated route, POST /v2/sendGroup with the group-event body)
#   N=20000 SETUPS="G" benches/load/instructions.sh
#   SETUPS="G Gc" benches/load/instructions.sh   # Gc: G with `cluster:` on, against a redis-server
#                                                # the script starts (shared budgets, docs/cluster.md)
#   SETUPS="P0m G" benches/load/instructions.sh  # P0m: P0 with Tollgate's allocator (p0m.rs)
#   SETUPS="G G-log" benches/load/instructions.sh # G-log: G with an access line per request
#                                                # (TOLLGATE_LOG=info, stderr to a file)
#   SETUPS="G Ga" benches/load/instructions.sh   # Ga: every part-two and part-three feature on
#                                                # (benches/load/all.yaml: the edge, auth-failure
#                                                # blocking, webhook guard, usage counting,
#                                                # cluster, state.path, the ledger; gen.py's
#                                                # tollgate-p3.yaml: quotas, expiries, rotations)
#   SETUPS="Gn" benches/load/instructions.sh      # Gn: Ga without cluster (Gnv: on the validated route)
#   SETUPS="G Gq" benches/load/instructions.sh    # Gq: G with a monthly quota on the keys' plan and the
#                                                # ledger on, kept in state.path (issue 26's cost)
#   SETUPS="G Gt Gts" benches/load/instructions.sh # Gt: G with `tracing:` on, no request recorded
#                                                # (sample_ratio 0: the traceparent read, a span id,
#                                                # the field the upstream gets); Gts: every request
#                                                # recorded (ratio 1), spans posted to a port where
#                                                # nothing listens (the exporter's thread counted apart)
#   TOLLGATE=/tmp/tollgate-before SETUPS="G" benches/load/instructions.sh
#                                                # count another build of the gateway (an A/B of a
#                                                # tuning step: the binary of the commit before)
#   KEYS=10 KEY_PLAN=bench SETUPS="G Gc" benches/load/instructions.sh
#                                                # hot keys: 10 keys in rotation (default 1000),
#                                                # on the bench plan (1,000,000 per window; pro's
#                                                # 150 per 10 s would refuse them), so that with
#                                                # cluster on each keeps its lease and never parks
#
# Why: on this VM the wall-clock CPU µs per request of run.sh moves ±10 % between repetitions,
# more than the 1 µs the P0/G goal is about. Callgrind counts the instructions the proxy runs
# in user space instead: the same binary and inputs give the same count, whatever else the
# machine is doing, so a tuning step can be judged by a small, exact difference. It does not
# see the kernel (system calls, TCP), which is the larger part of a request's CPU: use it for
# A/B steps of Tollgate's own code and run.sh for the real req/s and µs.
#
# How: the upstream is nginx `return 200 '{}'` (benches/load/nginx/upstream.conf); the proxy
# runs under callgrind with instrumentation off; a Python client sends W warm-up requests over one
# keep-alive connection, turns instrumentation on (callgrind_control -i on), sends N more with keys
# in rotation (the same requests as run.sh's wrk scripts), and dumps. The count divided by N
# is the figure. Output: a table on stdout, and the callgrind files plus
# `callgrind_annotate` top functions under $OUT (default target/instructions/<time>).
#
# Needs valgrind and nginx (installed from apt when missing); builds the release binaries
# itself. Cargo's own variables apply, e.g. to count a fat-LTO build in its own target dir:
#   CARGO_TARGET_DIR=target/fat CARGO_PROFILE_RELEASE_LTO=fat benches/load/instructions.sh
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=benches/load/lib.sh
. "$HERE/lib.sh"
N=${N:-5000}
W=${W:-1000}
KEYS=${KEYS:-1000}
KEY_PLAN=${KEY_PLAN:-pro}
SETUPS=${SETUPS:-"P0 G P0v Gv"}
OUT=${OUT:-$ROOT/target/instructions/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"

need valgrind
[ -x /usr/sbin/nginx ] || need nginx
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
case " $SETUPS " in
  *" Gc "* | *" Ga "* | *" Gav "*) need redis-server ;;
esac

(cd "$ROOT" && cargo build --release --locked --quiet --bin tollgate --example p0 --example p0m)
REL=$(cd "$ROOT" && realpath -m "${CARGO_TARGET_DIR:-target}")/release
TOLLGATE=${TOLLGATE:-$REL/tollgate}
# Pingora's settings for every proxy alike (G's `--conf`, P0's fourth argument): the runtime
# they are counted under (docs/benchmarks.md, "The runtime").
PINGORA_CONF=${PINGORA_CONF:-$HERE/pingora.yaml}
TMP=$(mktemp -d)
trap on_exit_cleanup EXIT

read -r D_PORT N1_PORT G_PORT G_ADMIN_PORT P0_PORT R_PORT < <(free_ports 6)
[ -n "${R_PORT:-}" ] || die "no 6 free ports found"
python3 "$HERE/gen.py" --dir "$TMP" --keys "$KEYS" --d-port "$D_PORT" --n1-port "$N1_PORT" \
  --g-port "$G_PORT" --g-admin-port "$G_ADMIN_PORT"
# The generated keys' plan (gen.py writes `plan: pro }` on each of their lines).
[ "$KEY_PLAN" = pro ] || sed -i "s/, plan: pro }\$/, plan: $KEY_PLAN }/" "$TMP/tollgate.yaml"
"$NGINX" -p "$TMP/nginx-d" -c "$TMP/nginx-d/nginx.conf" -e "$TMP/nginx-d/error.log" \
  -g 'daemon off;' >"$OUT/nginx.out" 2>&1 &
PIDS+=($!)
case " $SETUPS " in
  *" Gc "* | *" Ga "* | *" Gav "*)
    redis-server --port "$R_PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" \
      >"$OUT/redis.out" 2>&1 &
    PIDS+=($!)
    cp "$TMP/tollgate.yaml" "$TMP/tollgate-cluster.yaml"
    printf 'cluster:\n  redis_url: "redis://127.0.0.1:%s/0"\n  key_prefix: "tgbench"\n' "$R_PORT" \
      >>"$TMP/tollgate-cluster.yaml"
    # Ga: every part-two and part-three feature (all.yaml, tollgate-p3.yaml), the Redis above.
    # Under valgrind the gateway runs some fifty times slower: an exchange would pass all.yaml's
    # 100 ms timeout, fail, and be sent again, counting its work twice. 5 s here.
    { cat "$TMP/tollgate-p3.yaml"; sed -e "s|@REDIS_PORT@|$R_PORT|" -e "s|@STATE@|$TMP/state.db|" \
      -e "s|timeout_ms: 100$|timeout_ms: 5000|" "$HERE/all.yaml"; } >"$TMP/tollgate-all.yaml" ;;
esac

# Gn: all.yaml without its cluster block (every part-two feature but shared budgets).
{ cat "$TMP/tollgate.yaml"; sed -e "s|@STATE@|$TMP/state-gn.db|" "$HERE/all.yaml" |
  awk '/^cluster:/ { skip = 1; next } skip && /^[^ #]/ { skip = 0 } !skip'; } >"$TMP/tollgate-gn.yaml"

# Gq: G with quotas and the ledger on (a quota no run reaches, so every request is charged).
sed -e "s|^  $KEY_PLAN: {\(.*\) }\$|  $KEY_PLAN: {\1, quota: { requests: 1000000000, per: month } }|" \
  "$TMP/tollgate.yaml" >"$TMP/tollgate-q.yaml"
grep -q "quota: { requests: 1000000000" "$TMP/tollgate-q.yaml" || die "no $KEY_PLAN plan line to give a quota"
printf 'ledger:\n  retention_days: 400\nstate:\n  path: "%s"\n' "$TMP/state-q.db" >>"$TMP/tollgate-q.yaml"

# Gt, Gts: G with traces on; the collector's port (9, discard) has no listener, so the exporter
# fails fast and counts its spans dropped: the request path's cost is what is measured.
for r in 0 1; do
  { cat "$TMP/tollgate.yaml"
    printf 'tracing:\n  otlp_endpoint: "http://127.0.0.1:9"\n  sample_ratio: %s\n' "$r"; } \
    >"$TMP/tollgate-t$r.yaml"
done

# client.py PORT PATH BODY_FILE W N CTL: W warm-up requests, then `CTL on`, N requests, `CTL off`.
cat > "$TMP/client.py" <<'EOF'
import socket, subprocess, sys, time
port, path, body_file, warm, n, pid, keys = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], int(sys.argv[7])
body = open(body_file, "rb").read()
def req(i):
    return (b"POST %s HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer bench-key-%05d\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (path.encode(), i % keys, len(body))) + body
def connect():
    for _ in range(300):
        try:
            s = socket.create_connection(("127.0.0.1", int(port)), timeout=60)
            return s, s.makefile("rb")
        except OSError:
            time.sleep(0.1)
    sys.exit("proxy not listening")
s, f = connect()
def one(i):
    # A keep-alive client, as wrk is: a `Connection: close` answer (the gateway's last request
    # on a connection, server.max_requests_per_connection) is followed by a new connection.
    global s, f
    s.sendall(req(i))
    status = f.readline()
    if b" 200 " not in status:
        sys.exit("request %d: %r" % (i, status))
    length, close = 0, False
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v)
        elif k == b"connection" and v.strip().lower() == b"close":
            close = True
    f.read(length)
    if close:
        s.close()
        s, f = connect()
for i in range(warm):
    one(i)
subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
for i in range(n):
    one(warm + i)
subprocess.run(["callgrind_control", "-d", "measured", pid], check=True, capture_output=True)
EOF

printf '| setup | route | instructions/request |\n|---|---|---|\n'
for s in $SETUPS; do
  route=send_message
  case $s in
    P0 | P0v)
      [ "$s" = P0v ] && route=send_group_event
      cmd=("$REL/examples/p0" "127.0.0.1:$P0_PORT" "127.0.0.1:$D_PORT" 1 "$PINGORA_CONF")
      port=$P0_PORT ;;
    P0m)
      cmd=("$REL/examples/p0m" "127.0.0.1:$P0_PORT" "127.0.0.1:$D_PORT" 1 "$PINGORA_CONF")
      port=$P0_PORT ;;
    G | Gv | G-log)
      [ "$s" = Gv ] && route=send_group_event
      cmd=("$TOLLGATE" run --config "$TMP/tollgate.yaml" --conf "$PINGORA_CONF")
      port=$G_PORT ;;
    Gc)
      cmd=("$TOLLGATE" run --config "$TMP/tollgate-cluster.yaml" --conf "$PINGORA_CONF")
      port=$G_PORT ;;
    Ga | Gav)
      [ "$s" = Gav ] && route=send_group_event
      cmd=("$TOLLGATE" run --config "$TMP/tollgate-all.yaml" --conf "$PINGORA_CONF")
      port=$G_PORT ;;
    Gq)
      cmd=("$TOLLGATE" run --config "$TMP/tollgate-q.yaml" --conf "$PINGORA_CONF")
      port=$G_PORT ;;
    Gt | Gts)
      ratio=0
      [ "$s" = Gts ] && ratio=1
      cmd=("$TOLLGATE" run --config "$TMP/tollgate-t$ratio.yaml" --conf "$PINGORA_CONF")
      port=$G_PORT ;;
    Gn | Gnv)
      [ "$s" = Gnv ] && route=send_group_event
      cmd=("$TOLLGATE" run --config "$TMP/tollgate-gn.yaml" --conf "$PINGORA_CONF")
      port=$G_PORT ;;
    *) die "unknown setup $s (P0, P0v, P0m, G, Gv, G-log, Gc, Gn, Gnv, Gq, Ga, Gav, Gt, Gts)" ;;
  esac
  threads=no
  # One dump per thread: the request path apart from the sync (G-log: apart from the log writer).
  case $s in Gc | Gq | Ga | Gav | G-log | Gt | Gts) threads=yes ;; esac
  level=warn
  [ "$s" = G-log ] && level=info
  TOLLGATE_LOG=$level valgrind --tool=callgrind --instr-atstart=no --separate-threads="$threads" \
    --callgrind-out-file="$OUT/callgrind.$s.%p" "${cmd[@]}" >"$OUT/$s.out" 2>&1 &
  pid=$!
  python3 "$TMP/client.py" "$port" "$(cat "$TMP/path-$route")" "$TMP/body-$route.json" "$W" "$N" "$pid" "$KEYS"
  kill -INT "$pid"; wait "$pid" 2>/dev/null || true
  if [ "$threads" = no ]; then
    dumps=("$OUT"/callgrind."$s".*.1)
    file=${dumps[0]}
    [ -f "$file" ] || die "no callgrind dump for $s (see $OUT/$s.out)"
    total=$(awk '/^totals:/ { print $2; exit }' "$file")
    callgrind_annotate --inclusive=no "$file" > "$OUT/$s.top.txt" 2>/dev/null || true
    printf '| %s | %s | %s |\n' "$s" "$route" "$((total / N))"
    continue
  fi
  # Gc, Ga: the threads that served requests (Pingora's proxy ran on them) are the request path;
  # the others (the background exchange with Redis, its connection, the timers) are the sync.
  # Only the measured dump's files (`.1-<thread>`): the others hold what ran after it (shutdown).
  path=0 sync=0
  for f in "$OUT"/callgrind."$s".*.1-*; do
    t=$(awk '/^totals:/ { print $2; exit }' "$f")
    [ -n "$t" ] || continue
    if grep -q "proxy_1to1" "$f"; then path=$((path + t)); else sync=$((sync + t)); fi
  done
  ((path > 0)) || die "no request-path thread in the $s dumps (see $OUT/$s.out)"
  printf '| %s | %s | %s |\n' "$s" "$route" "$(((path + sync) / N))"
  printf '| %s, the request path (the proxy threads) | %s | %s |\n' "$s" "$route" "$((path / N))"
  printf '| %s, the other threads (the exchange with Redis, the keeper, the log writer, the trace exporter) | %s | %s |\n' "$s" "$route" "$((sync / N))"
done
log "callgrind files and top functions in $OUT"
