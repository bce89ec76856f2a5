#!/usr/bin/env bash
# Zero-downtime binary upgrade of Tollgate on a systemd host (tollgate.service beside this file).
#
#   usage: sudo deploy/systemd/upgrade.sh /path/to/new/tollgate
#
#   Optional environment: TOLLGATE_ADMIN=http://127.0.0.1:9091 (the admin_listen of
#   gateway.yaml) to wait for /readyz and confirm the new version from /metrics, and
#   TOLLGATE_UNIT, TOLLGATE_BIN, TOLLGATE_CONFIG, TOLLGATE_PINGORA_CONF to override the paths
#   tollgate.service uses.
#
# What happens: Pingora's graceful upgrade (pingora docs/user_guide/graceful.md).
#   - The old process gets SIGQUIT. It sends its listening sockets (gateway, TLS, admin) over
#     the unix socket upgrade_sock (/run/tollgate/upgrade.sock, see pingora.yaml), keeps
#     serving for 5 s while the new process takes over, then shuts down like SIGTERM:
#     shutdown.grace_seconds for requests in flight, shutdown.timeout_seconds for the
#     runtimes. Its answers meanwhile carry Connection: close, so clients reconnect to the new
#     process.
#   - The new process, started with --upgrade, receives those sockets on upgrade_sock instead
#     of binding. The sockets never close, so no client sees a refused connection.
#
# Why through systemd and not by hand. By hand the recipe is: install the new binary, run
#     tollgate run --config ... --conf ... --upgrade --daemon
# and `kill -QUIT <old pid>`. Under systemd that goes wrong: systemd supervises one main PID
# per service, and a process started from a shell is outside the unit (no sandbox, not the
# unit's user, no tollgate.env, not in its cgroup). When the old main PID exits, systemd
# marks the service stopped while the new process runs unsupervised: no restart on a crash,
# and the next `systemctl start` fails on ports still in use.
#
# Pingora's documented systemd integration (pingora docs/user_guide/systemd.md) solves this
# with Type=forking + PIDFile= + --daemon, and runs the upgrade as the unit's reload:
#     ExecReload=kill -QUIT $MAINPID
#     ExecReload=/bin/pingora -u -d -c /etc/pingora.conf
# The new process is then started by systemd, inside the unit, and systemd reads the new main
# PID from the PID file when the reload completes. tollgate.service keeps `systemctl reload`
# for config reloads (SIGHUP), the everyday operation, which also keeps rate budgets. So this
# script puts Pingora's sequence in place of ExecReload for one reload only, through a runtime
# drop-in under /run/systemd/system/, and removes it afterwards.
#
# Steps:
#   1. Install the new binary atomically (rename); keep the previous one as tollgate.prev.
#   2. Reload #1 runs only `tollgate check` with the NEW binary, inside the unit (same user,
#      sandbox and environment as the service). Nothing has been signalled yet, so a refusal
#      just puts the previous binary back.
#   3. Reload #2: SIGQUIT to the main PID, then the new binary with --upgrade --daemon.
#   4. Verify that systemd's main PID changed and the unit is active; with TOLLGATE_ADMIN, wait
#      for /readyz and for tollgate_build_info to report the new version.
#   If step 3 fails, SIGQUIT has already been sent and the old process is leaving: the
#   previous binary is put back and the unit restarted (a short outage instead of a long one).
#
# Caveats:
#   - The order (SIGQUIT first, then the new process) is Pingora's: the old process retries
#     connecting to upgrade_sock for about 5 s (upgrade_sock_connect_accept_max_retries, 1 s
#     apart), which is how long the new process has to reach that point.
#   - Per-key rate budgets live in process memory and start afresh in the new process.
#   - The new process reads gateway.yaml and tollgate.env afresh: settings a reload cannot
#     change (listen, admin_listen, tls, log, shutdown) and changed key_env values take effect.
#   - Let the old process finish draining (grace + timeout seconds) before the next upgrade;
#     `systemctl status tollgate` lists both processes meanwhile.
set -euo pipefail

UNIT=${TOLLGATE_UNIT:-tollgate.service}
BIN=${TOLLGATE_BIN:-/usr/local/bin/tollgate}
CONFIG=${TOLLGATE_CONFIG:-/etc/tollgate/gateway.yaml}
PINGORA_CONF=${TOLLGATE_PINGORA_CONF:-/etc/tollgate/pingora.yaml}
ADMIN=${TOLLGATE_ADMIN:-}
DROPIN_DIR=/run/systemd/system/${UNIT}.d
DROPIN=${DROPIN_DIR}/zz-tollgate-upgrade.conf

log() { printf 'upgrade: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

if [ $# -ne 1 ]; then
  echo "usage: $0 /path/to/new/tollgate" >&2
  exit 2
fi
new=$1

[ "$(id -u)" -eq 0 ] || die "run as root (it installs $BIN and drives systemctl)"
if [ ! -f "$new" ] || [ ! -x "$new" ]; then die "$new is not an executable file"; fi
new_version=$("$new" --version) || die "$new --version failed: not a working tollgate binary"
systemctl is-active --quiet "$UNIT" ||
  die "$UNIT is not active: install the binary and run 'systemctl start $UNIT' instead"
[ "$(systemctl show -p Type --value "$UNIT")" = forking ] ||
  die "$UNIT is not Type=forking; the upgrade relies on PIDFile= (see tollgate.service)"
if [ -e "$DROPIN" ]; then
  die "$DROPIN exists: another upgrade is running, or one was interrupted (remove it, then 'systemctl daemon-reload')"
fi

# Point ExecReload at the given commands (one per argument) for the next reload.
set_reload() {
  mkdir -p "$DROPIN_DIR"
  {
    echo "# Written by deploy/systemd/upgrade.sh for one reload; removed when it ends."
    echo "[Service]"
    echo "ExecReload="
    local cmd
    for cmd in "$@"; do echo "ExecReload=$cmd"; done
  } >"$DROPIN"
  systemctl daemon-reload
}

clear_reload() {
  if [ -e "$DROPIN" ]; then
    rm -f "$DROPIN"
    rmdir "$DROPIN_DIR" 2>/dev/null || true
    systemctl daemon-reload
  fi
}
trap clear_reload EXIT

restore_previous() {
  if [ -f "$BIN.prev" ]; then
    install -m 0755 "$BIN.prev" "$BIN.new" && mv -f "$BIN.new" "$BIN"
    log "previous binary restored to $BIN"
  fi
}

# 1. Install. A rename replaces the file atomically; the running process keeps its own inode.
if [ -f "$BIN" ]; then cp -p "$BIN" "$BIN.prev"; fi
install -m 0755 "$new" "$BIN.new"
mv -f "$BIN.new" "$BIN"
log "installed $new_version as $BIN"

# 2. Check the config with the new binary, inside the unit.
set_reload "$BIN check --config $CONFIG"
if ! systemctl reload "$UNIT"; then
  restore_previous
  die "the new binary refuses $CONFIG (journalctl -u $UNIT shows why); nothing was signalled"
fi

# 3. Pingora's upgrade: SIGQUIT to the old main process, then the new one with --upgrade.
old_pid=$(systemctl show -p MainPID --value "$UNIT")
# shellcheck disable=SC2016 # $MAINPID is for systemd to expand, not the shell
set_reload '/bin/kill -QUIT $MAINPID' "$BIN run --config $CONFIG --conf $PINGORA_CONF --upgrade --daemon"
log "handing the sockets of PID $old_pid over to the new binary"
if ! systemctl reload "$UNIT"; then
  log "the new process did not take over; the old one is already shutting down"
  restore_previous
  clear_reload
  systemctl restart "$UNIT"
  die "upgrade failed; $UNIT restarted on the previous binary (journalctl -u $UNIT shows why)"
fi

# 4. Verify.
new_pid=$(systemctl show -p MainPID --value "$UNIT")
if [ "$new_pid" = "$old_pid" ] || [ "$new_pid" = 0 ]; then
  die "systemd's main PID is still '$new_pid': PIDFile= in the unit and pid_file in $PINGORA_CONF must agree"
fi
systemctl is-active --quiet "$UNIT" || die "$UNIT is not active after the upgrade"
log "main PID $old_pid -> $new_pid; PID $old_pid drains and exits on its own"

if [ -n "$ADMIN" ]; then
  command -v curl >/dev/null 2>&1 || die "TOLLGATE_ADMIN is set but curl is not installed"
  # `tollgate --version` prints "tollgate X.Y.Z"; tollgate_build_info carries X.Y.Z.
  want="tollgate_build_info{version=\"${new_version##* }\"} 1"
  # For about 5 s the old process still accepts on the same admin socket: poll until the
  # answers come from the new one.
  for _ in $(seq 1 30); do
    if curl -fsS "$ADMIN/readyz" >/dev/null 2>&1 &&
      curl -fsS "$ADMIN/metrics" 2>/dev/null | grep -qxF "$want"; then
      log "$ADMIN: ready, $want"
      exit 0
    fi
    sleep 1
  done
  die "$ADMIN did not report ready with '$want' within 30 s"
fi
log "done (set TOLLGATE_ADMIN to also check /readyz and the reported version)"
