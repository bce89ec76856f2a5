#!/usr/bin/env bash
# Three Tollgate replicas sharing one Redis (docs/cluster.md), on this machine, end to end:
#
#   1. a redis-server of its own (no persistence), `tollgate stand-in` as the upstream, and
#      three `tollgate run` replicas of policies/cluster.yaml, all on free loopback ports, their
#      output in log files (shown only when something fails); a port another program takes
#      before its server binds it starts the fleet again on other ports (three times at most);
#   2. waits (bounded) until every replica is ready and its heartbeat counts the fleet:
#      `/readyz` says `ready` and `tollgate_cluster_replicas` is 3 on each (before that, a
#      replica that counted itself alone would spend the budget as if it were);
#   3. sends the burst: 60 requests of demo-burst-key (Basic: 40 per 10 s), one at a time,
#      round robin over the three replicas, and prints what they answered;
#   4. checks what the design promises for that burst, exits 0 only if it holds, and stops
#      everything it started (on success, failure, Ctrl-C or TERM).
#
# The promise is both ways. The key is idle fleet-wide, so the burst's first 40 requests fit
# its budget: all 40 pass, as with one process (a replica with no lease for the key asks Redis
# for one, and a request past the small credit each replica may give a quiet key waits for the
# answer, one round trip: the script prints how many waited). GCRA refills one request every
# T = 10 s / 40 = 250 ms, so one process passes 40 + ⌊D / T⌋ of a burst lasting D, and
# docs/cluster.md bounds a fleet of up to three replicas at 10 % of the limit over one process:
# at most 40 + ⌊D / T⌋ + 4 pass, where three separate budgets would pass all 60.
#
# Usage: scripts/fleet-demo.sh
# Env:   TOLLGATE   the tollgate binary (default: `cargo build --release --locked --bin
#                   tollgate`, then target/release/tollgate)
# Needs: redis-server (scripts/bootstrap.sh installs it), curl; python3 to pick free ports
#        (without it, ports are probed with bash's /dev/tcp).
set -euo pipefail
# TOLLGATE as the caller meant it: a path from the caller's directory, or a name on PATH.
if [ -n "${TOLLGATE:-}" ]; then
  case $TOLLGATE in
  /*) ;;
  */*) TOLLGATE=$PWD/$TOLLGATE ;;
  *) TOLLGATE=$(command -v "$TOLLGATE" || echo "$TOLLGATE") ;;
  esac
fi
cd "$(dirname "$0")/.."

KEY=demo-burst-key
ROUNDS=20           # of one request to each of the three replicas: 60 in all
PACE=100            # requests a second, at most
READY_SECONDS=30    # bound on every wait for start-up

say() { echo "fleet-demo: $*"; }
die() {
  echo "fleet-demo: $*" >&2
  exit 1
}

command -v redis-server >/dev/null 2>&1 ||
  die "redis-server is not installed: scripts/bootstrap.sh installs it (apt-get install redis-server)"
command -v curl >/dev/null 2>&1 || die "curl is not installed (apt-get install curl)"

# Everything this script starts, and where it writes (made once the traps are set).
work=""
pids=()
names=()
logs=()
failed=1
launching=""

# Whether process $1 runs (a zombie, exited but not yet reaped, does not). Every return
# names its status: a bare `return` in a function called from a trap returns the status from
# before the trap.
alive() {
  local pid=$1 stat state
  if [ ! -r "/proc/$pid/stat" ]; then
    kill -0 "$pid" 2>/dev/null && return 0
    return 1
  fi
  read -r stat <"/proc/$pid/stat" 2>/dev/null || return 1
  state=${stat##*) } # after "pid (name) ", whatever the name holds
  state=${state%% *}
  [ -n "$state" ] && [ "$state" != Z ] && return 0
  return 1
}

show_logs() {
  local i
  for i in "${!logs[@]}"; do
    if [ -s "${logs[$i]}" ]; then
      echo "---- ${names[$i]} (the last 30 lines of its log) ----" >&2
      tail -n 30 "${logs[$i]}" >&2
    else
      echo "---- ${names[$i]} (its log is empty) ----" >&2
    fi
  done
}

# Stop every process started (5 s at most), and forget them.
stop_started() {
  local i p
  # The replicas and the stand-in exit at once on SIGINT; redis-server on SIGTERM.
  for i in "${!pids[@]}"; do
    if [ "${names[$i]}" = redis-server ]; then
      kill -TERM "${pids[$i]}" 2>/dev/null || true
    else
      kill -INT "${pids[$i]}" 2>/dev/null || true
    fi
  done
  for _ in $(seq 50); do
    p=""
    for i in "${!pids[@]}"; do alive "${pids[$i]}" && p=1; done
    [ -z "$p" ] && break
    sleep 0.1
  done
  for i in "${!pids[@]}"; do
    if alive "${pids[$i]}"; then kill -KILL "${pids[$i]}" 2>/dev/null || true; fi
    wait "${pids[$i]}" 2>/dev/null || true
  done
  pids=()
  names=()
  logs=()
  return 0
}

stop_all() {
  local status=$?
  # Once begun, the cleaning runs to its end (5 s at most): a signal now would cut it short.
  trap - EXIT
  trap '' INT TERM HUP
  set +e
  # On a failure, what the processes said; not when stopped by a signal (Ctrl-C).
  [ "$failed" = 1 ] && [ "$status" -lt 128 ] && show_logs
  [ "$status" -ge 128 ] && echo "fleet-demo: stopped by a signal; stopping what it started" >&2
  stop_started
  [ -n "$work" ] && rm -rf "$work"
  exit "$status"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
work=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-fleet.XXXXXX")

# Start `$@` in the background, output to $work/<name>.log; remember it.
start() {
  local name=$1
  shift
  "$@" >"$work/$name.log" 2>&1 </dev/null &
  pids+=("$!")
  names+=("$name")
  logs+=("$work/$name.log")
}

# Whether the log $1 says its process could not bind its port: another program took it
# between free_ports's probe and the bind (redis-server: "Address already in use"; tollgate:
# the OS's error, "os error 98").
port_taken() { grep -qiE 'address already in use|os error 98' "$1"; }

# Fail (with the logs) if something started has died; while the fleet is being launched
# (`launching`), return 2 instead when it died because its port was taken.
check_alive() {
  local i status
  for i in "${!pids[@]}"; do
    if ! alive "${pids[$i]}"; then
      [ -n "$launching" ] && port_taken "${logs[$i]}" && return 2
      status=0
      wait "${pids[$i]}" || status=$?
      die "${names[$i]} exited early, status $status (its log is below)"
    fi
  done
}

# Microseconds of the wall clock (bash 5's EPOCHREALTIME; date on older shells).
now_us() {
  local t=${EPOCHREALTIME:-}
  if [ -n "$t" ]; then echo "${t/[.,]/}"; else date +%s%6N; fi
}

# Poll `$@` (every 50 ms, at most READY_SECONDS) until it succeeds.
wait_for() {
  local what=$1 end
  shift
  end=$(($(now_us) + READY_SECONDS * 1000000))
  until "$@"; do
    check_alive || return $?
    [ "$(now_us)" -lt "$end" ] || die "timed out after ${READY_SECONDS} s waiting for $what"
    sleep 0.05
  done
}

http() { curl -q -s --noproxy '*' --max-time 5 "$@"; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

redis_pong() {
  local reply
  reply=$(
    exec 2>/dev/null
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
    printf 'PING\r\n' >&3
    read -r -t 2 r <&3 && echo "$r"
  ) || return 1
  [ "${reply%$'\r'}" = "+PONG" ]
}

# A replica is ready to share budgets when it serves (`/readyz` says `ready`, not `degraded`)
# and its last heartbeat counted all three replicas (the cost and cap of a cold key use it).
replica_ready() {
  local admin=$1 metrics
  [ "$(http "http://127.0.0.1:$admin/readyz")" = ready ] || return 1
  metrics=$(http "http://127.0.0.1:$admin/metrics") || return 1
  grep -qx 'tollgate_cluster_replicas 3' <<<"$metrics" &&
    grep -qx 'tollgate_cluster_store_up 1' <<<"$metrics"
}

fleet_ready() {
  local a
  for a in "${admin[@]}"; do replica_ready "$a" || return 1; done
}

# Eight free loopback ports: Redis, the stand-in, three listeners, three admin listeners. They
# are drawn from 16000-19999, below Linux's ephemeral range (32768-60999): a port the kernel
# hands out for binding to port 0 can be taken, before this script's servers bind it, as the
# source port of some other program's outgoing connection (seen with the test suite running
# beside it). The test suite's own servers draw from 20000-32767 (tests/it/harness/mod.rs):
# a port this script found free is never one a test is about to bind (seen once: the suite's
# server took this script's Redis port between the probe and the bind).
free_ports() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import random, socket
got, socks = [], []
for _ in range(1000):
    if len(got) == 8:
        break
    p = random.randint(16000, 19999)
    if p in got:
        continue
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    socks.append(s)
    got.append(p)
print(" ".join(map(str, got)))'
    return 0
  fi
  local got=() p
  while [ "${#got[@]}" -lt 8 ]; do
    p=$((16000 + RANDOM % 4000))
    [[ " ${got[*]} " == *" $p "* ]] && continue
    port_open "$p" || got+=("$p")
  done
  echo "${got[*]}"
}

# The binary.
if [ -n "${TOLLGATE:-}" ]; then
  bin=$TOLLGATE
else
  say "building target/release/tollgate (cargo build --release --locked --bin tollgate; minutes the first time) ..."
  if ! cargo build --release --locked --bin tollgate >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    die "cargo build failed"
  fi
  bin=target/release/tollgate
fi
[ -x "$bin" ] || die "TOLLGATE=$bin is not an executable file"

# Start the fleet on free ports; 2 when a process found its port taken (see check_alive).
launch() {
  read -r redis_port upstream_port l1 l2 l3 a1 a2 a3 < <(free_ports)
  listen=("$l1" "$l2" "$l3")
  admin=("$a1" "$a2" "$a3")
  say "tollgate $bin; ports: redis $redis_port, stand-in $upstream_port, replicas ${listen[*]} (admin ${admin[*]})"

  started=$(now_us)
  start redis-server redis-server --port "$redis_port" --bind 127.0.0.1 --save "" \
    --appendonly no --daemonize no --dir "$work"
  start stand-in "$bin" stand-in --listen "127.0.0.1:$upstream_port"
  wait_for "redis-server on port $redis_port" redis_pong "$redis_port" || return $?
  wait_for "the stand-in on port $upstream_port" port_open "$upstream_port" || return $?

  # policies/cluster.yaml with this run's ports; each substitution must have happened.
  local i config want
  for i in 0 1 2; do
    config="$work/replica$((i + 1)).yaml"
    sed -e "s|^listen: \"127.0.0.1:8080\"|listen: \"127.0.0.1:${listen[$i]}\"|" \
      -e "s|^admin_listen: \"127.0.0.1:9091\"|admin_listen: \"127.0.0.1:${admin[$i]}\"|" \
      -e "s|base_url: \"http://127.0.0.1:8081\"|base_url: \"http://127.0.0.1:$upstream_port\"|" \
      -e "s|redis_url: \"redis://127.0.0.1:6379/0\"|redis_url: \"redis://127.0.0.1:$redis_port/0\"|" \
      -e "s|path: \"replica-state.db\"|path: \"replica$((i + 1))-state.db\"|" \
      policies/cluster.yaml >"$config"
    for want in "listen: \"127.0.0.1:${listen[$i]}\"" "admin_listen: \"127.0.0.1:${admin[$i]}\"" \
      "base_url: \"http://127.0.0.1:$upstream_port\"" "redis_url: \"redis://127.0.0.1:$redis_port/0\"" \
      "path: \"replica$((i + 1))-state.db\""; do
      grep -qF "$want" "$config" ||
        die "policies/cluster.yaml no longer has the line this script rewrites to $want"
    done
    start "replica$((i + 1))" "$bin" run --config "$config" --allow-demo-keys
  done
  say "started redis-server, the stand-in and three replicas (logs in $work, shown if something fails)"
  wait_for "every replica to be ready and to count three replicas" fleet_ready || return $?
}

# The ports free_ports found free are not held: another program may bind one before this
# script's servers do (seen in CI, with the test suite running beside it). Then the fleet
# is stopped and started again on other ports, three times at most.
launching=1
for attempt in 1 2 3; do
  status=0
  launch || status=$?
  [ "$status" = 0 ] && break
  [ "$attempt" = 3 ] && die "a port this script found free was taken before it could bind it, three times"
  say "a port this script found free was taken before it could bind it; starting again on other ports"
  stop_started
done
launching=""
ready=$(now_us)
say "fleet ready in $(((ready - started) / 1000)) ms: /readyz ready, tollgate_cluster_replicas 3 and tollgate_cluster_store_up 1 on each"

# The burst: one request at a time, round robin r1 r2 r3, at most PACE a second: one curl
# with --rate and its connections kept alive, so that the pace is not that of starting a
# process (5 to 50 ms, by the machine's load); a curl without --rate (before 7.84) runs once
# per request instead. The answers' headers give the limit and window of the promise.
targets=()
for ((n = 0; n < ROUNDS; n++)); do
  for i in 0 1 2; do targets+=(-o /dev/null "http://127.0.0.1:${listen[$i]}/v2/client/getStatus"); done
done
burst=(-D "$work/heads" -w '%{http_code}\n' -H "Authorization: Bearer $KEY")
codes=()
burst_start=$(now_us)
if curl --help all 2>/dev/null | grep -q -- '--rate'; then
  how="at most $PACE a second"
  http --rate "$PACE/s" "${burst[@]}" "${targets[@]}" >"$work/codes" || true
  mapfile -t codes <"$work/codes"
else
  how="a curl each"
  for ((k = 0; k < ${#targets[@]}; k += 3)); do
    codes+=("$(http "${burst[@]}" "${targets[@]:k:3}" || true)")
  done
fi
burst_us=$(($(now_us) - burst_start))

passed=0 refused=0 other=0 line=""
per=(0 0 0)
for ((k = 0; k < ${#codes[@]}; k++)); do
  ((k % 3 == 0 && k > 0)) && line+=" "
  case ${codes[$k]} in
  200) passed=$((passed + 1)) per[k%3]=$((per[k % 3] + 1)) line+=. ;;
  429) refused=$((refused + 1)) line+=x ;;
  *) other=$((other + 1)) line+="?" ;;
  esac
done
total=${#codes[@]}
secs=$(printf '%d.%02d' $((burst_us / 1000000)) $((burst_us % 1000000 / 10000)))

echo
echo "burst: $total requests of $KEY, one at a time ($how), round robin over the three replicas: $secs s"
echo "  in order, a group per round r1 r2 r3 (. 200, x 429, ? other):"
echo "  $line"
echo "  200 x$passed, 429 x$refused$( ((other)) && echo ", other x$other"); passed per replica: r1 ${per[0]}, r2 ${per[1]}, r3 ${per[2]}"
((other == 0)) || die "answers other than 200 and 429: ${codes[*]}"

# The limit and window, as the first answer's RateLimit-Policy gives them ("basic";q=40;w=10).
policy=$(tr -d '\r' <"$work/heads" | grep -i -m 1 '^ratelimit-policy:' || true)
limit=$(sed -n 's/.*[;:] *q=\([0-9]*\).*/\1/p' <<<"$policy")
window=$(sed -n 's/.*;w=\([0-9]*\).*/\1/p' <<<"$policy")
if [ -z "$limit" ] || [ -z "$window" ]; then
  die "the first answer has no RateLimit-Policy with q= and w= (got: ${policy:-nothing})"
fi
interval_us=$(((window * 1000000 + limit - 1) / limit))
refill=$((burst_us / interval_us))
slack=$((limit / 10))
promise=$((limit + refill + slack))

# From each replica's metrics: failed exchanges, and the requests that waited for Redis (their
# key had no lease on that replica and no credit left) with the sum of their waits (seconds, as
# Prometheus prints). The first request on each replica is admitted on credit: none of them waits.
errors=0 parked=0 wait_us=0
for a in "${admin[@]}"; do
  page=$(http "http://127.0.0.1:$a/metrics")
  e=$(sed -n 's/^tollgate_cluster_sync_errors_total //p' <<<"$page")
  p=$(sed -n 's/^tollgate_cluster_settle_wait_seconds_count //p' <<<"$page")
  w=$(sed -n 's/^tollgate_cluster_settle_wait_seconds_sum //p' <<<"$page")
  errors=$((errors + ${e:-0}))
  parked=$((parked + ${p:-0}))
  wait_us=$((wait_us + $(awk -v s="${w:-0}" 'BEGIN { printf "%d", s * 1000000 }')))
done
if ((parked)); then
  echo "  $parked of them waited for Redis (no lease for the key on their replica, no credit left), $((wait_us / parked)) µs on average"
else
  echo "  none of them waited for Redis"
fi

echo "promised: at least $limit and at most $promise of $total (three separate budgets would pass all $total)"
printf '  %3s  %s\n' \
  "$limit" "the one budget the three share ($limit per $window s), all of it: the key was idle" \
  "+$refill" "refilled during the $secs s burst, one per $((interval_us / 1000)) ms: one process passes them too" \
  "+$slack" "docs/cluster.md's bound: up to three replicas admit at most 10 % of the limit over one process"
if ((errors)); then
  printf '  %s\n' "note: $errors exchange(s) with Redis failed or passed timeout_ms (a loaded machine?):" \
    "meanwhile that replica enforced limit / N alone (docs/cluster.md, \"When Redis is down\")"
fi
if ((passed > promise)); then
  echo "passed $passed of $total: more than the $promise promised"
  exit 1
fi
if ((passed < limit)); then
  echo "passed $passed of $total: fewer than the $limit promised"
  exit 1
fi
echo "passed $passed of $total, as promised (at least $limit, at most $promise)"
failed=0
