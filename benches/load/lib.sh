# shellcheck shell=bash
# Sourced by the load scripts (run.sh, flood.sh, cluster.sh, instructions.sh, smoke.sh): what
# each of them needs the same way. Not a script of its own.
#
#   log MSG...            a timestamped line on stderr
#   die MSG...            log "error: MSG" and exit 1
#   apt_install PKG...    install packages with apt-get (sudo when not root), quietly
#   need CMD [PKG]        apt_install PKG (default CMD) when CMD is not on the PATH
#   release_bin           BIN (default target/release/tollgate): built when missing or older
#                         than a source file; an explicit BIN must be an executable
#   free_ports N          N free ports on 127.0.0.1, outside the kernel's ephemeral range
#   wait_port PORT        until 127.0.0.1:PORT accepts, 10 s at most
#   wait_ready PORT       until the admin listener on PORT answers /readyz with 200, 30 s at most
#   PIDS+=("$!")          a process started in the background, stopped at exit (last first)
#   stop_pid PID [SIG]    SIG (TERM), up to 5 s, then SIGKILL, its children too
#   forget PID            stopped already: never signal that number again (it may be reused)
#   on_exit_cleanup       trap: stop every PIDS entry, remove $TMP (when set), keep the status
#
# The caller sets ROOT (the repository) before sourcing, and OUT when its logs go there.

log() { printf '[%(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "error: $*"; exit 1; }

apt_install() {
  (($#)) || return 0
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  log "installing $* (apt-get)"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "$@" >/dev/null
}

need() {
  command -v "$1" >/dev/null 2>&1 || apt_install "${2:-$1}"
}

release_bin() {
  BIN=${BIN:-$ROOT/target/release/tollgate}
  if [ "$BIN" = "$ROOT/target/release/tollgate" ]; then
    # Missing, or older than a source file: build (cargo does nothing when it is up to date).
    if [ ! -x "$BIN" ] || [ -n "$(cd "$ROOT" && find src crates Cargo.toml Cargo.lock -newer "$BIN" -print -quit)" ]; then
      log "building the release binary (cargo build --release --locked --bin tollgate)"
      (cd "$ROOT" && cargo build --release --locked --bin tollgate)
    fi
  else
    [ -x "$BIN" ] || die "no executable at BIN=$BIN"
  fi
}

# In 40000-49999 unless that overlaps the kernel's ephemeral range (outgoing connections — wrk,
# oha, a flood, the proxies' upstream pools — take their local ports from it and could occupy a
# port before its server starts), else just below that range.
free_ports() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
try:
    lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
except Exception:
    lo, hi = 32768, 60999
cands = [p for p in range(40000, 50000) if not lo <= p <= hi]
if len(cands) < 100:
    cands = [p for p in range(max(1024, lo - 12000), lo)]
if len(cands) < 100:
    cands = list(range(hi + 1, 65536))
random.shuffle(cands)
ports = []
for p in cands:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        continue
    finally:
        s.close()
    ports.append(p)
    if len(ports) == n:
        break
if len(ports) < n:
    sys.exit(f"no {n} free ports found")
print(*ports)
EOF
}

wait_port() {
  local _
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  die "nothing listens on 127.0.0.1:$1 after 10 s${OUT:+ (see $OUT/logs)}"
}

wait_ready() {
  local _
  for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "http://127.0.0.1:$1/readyz")" = 200 ] && return 0
    sleep 0.1
  done
  die "the admin listener on 127.0.0.1:$1 is not ready after 30 s${OUT:+ (see $OUT/logs)}"
}

PIDS=()

# Running (a zombie waiting for `wait` is not).
alive() {
  local st
  st=$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

stop_pid() {
  local pid=$1 sig=${2:-TERM} kids k _
  alive "$pid" || { wait "$pid" 2>/dev/null || true; return 0; }
  kids=$(pgrep -P "$pid" || true)
  kill -s "$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then
    log "pid $pid ignored SIG$sig; killing it"
    for k in $kids; do kill -KILL "$k" 2>/dev/null || true; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}

forget() {
  local p keep=()
  for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=("${keep[@]}")
}

on_exit_cleanup() {
  local rc=$? i
  trap - EXIT INT TERM
  # Last started, first stopped: the gateways before what they talk to.
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}"; done
  if [ -n "${TMP:-}" ]; then rm -rf "$TMP"; fi
  exit "$rc"
}
