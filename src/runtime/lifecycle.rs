//! The process's life: readiness, signals, draining.
//!
//! | signal | effect |
//! |---|---|
//! | `SIGHUP` | reload the config (as `POST /reload`); a refused one keeps the old config |
//! | `SIGTERM` | drain (`shutdown.drain_seconds`: not ready, `Connection: close`), then Pingora's graceful terminate (listeners close; `grace_seconds` for requests in flight; `timeout_seconds` for the runtimes) |
//! | `SIGQUIT` | graceful upgrade: hand the listening sockets to a new process started with `--upgrade`; answers carry `Connection: close` until this process exits |
//! | `SIGINT` | exit now |
//!
//! `/readyz` is ready once the gateway's listener accepts a connection (probed here, from
//! inside the process) and, for a replica of a fleet that keeps nothing of its own (`cluster`
//! without `state.path`), the fleet's key changes are read and in force
//! ([`Health::awaiting_first_read`]); and until SIGTERM begins draining.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora::services::background::BackgroundService;
use tokio::signal::unix::{signal, SignalKind};

use super::live::LivePolicy;
use crate::clock::Clock;

const STARTING: u8 = 0;
const READY: u8 = 1;
const UPGRADING: u8 = 2;
const DRAINING: u8 = 3;

/// Where the process is in its life; shared by the gateway, the admin listener and the
/// signal handlers.
#[derive(Debug, Default)]
pub struct Health {
    state: AtomicU8,
    /// Still starting, whatever the listener does: the fleet's key changes are not read yet.
    awaiting: AtomicBool,
}

/// What `/readyz` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Starting,
    Ready,
    /// Handing over to a new process; still serving.
    Upgrading,
    /// SIGTERM received: still serving, but asking to be taken out of rotation.
    Draining,
}

impl Health {
    pub fn readiness(&self) -> Readiness {
        match self.state.load(Ordering::Acquire) {
            STARTING => Readiness::Starting,
            READY if self.awaiting.load(Ordering::Acquire) => Readiness::Starting,
            READY => Readiness::Ready,
            UPGRADING => Readiness::Upgrading,
            _ => Readiness::Draining,
        }
    }

    /// Whether answers should ask the client to close the connection (draining or upgrading).
    pub fn closing(&self) -> bool {
        self.state.load(Ordering::Relaxed) >= UPGRADING
    }

    /// Mark ready, unless shutdown has already begun.
    fn set_ready(&self) {
        let _ = self
            .state
            .compare_exchange(STARTING, READY, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Not ready, whatever the listener does, until [`Health::first_read_done`]: a replica
    /// that keeps no copy of its own (`cluster` without `state.path`) starts with the YAML
    /// alone, and knows the fleet's revocations, suspensions and issued keys only once it has
    /// read them. Envoy waits for its first configuration the same way before it serves.
    pub fn awaiting_first_read(&self) {
        self.awaiting.store(true, Ordering::Release);
    }

    /// The fleet's key changes are in force (or the store did not answer: then the replica
    /// serves degraded, as when Redis goes down later).
    pub fn first_read_done(&self) {
        self.awaiting.store(false, Ordering::Release);
    }

    pub fn set_upgrading(&self) {
        self.state.fetch_max(UPGRADING, Ordering::AcqRel);
    }

    pub fn set_draining(&self) {
        self.state.fetch_max(DRAINING, Ordering::AcqRel);
    }
}

/// The Unix signals of the module table, with the drain phase in front of Pingora's
/// graceful terminate.
pub struct Signals {
    pub health: Arc<Health>,
    pub drain: Duration,
}

#[async_trait]
impl ShutdownSignalWatch for Signals {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut quit), Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::quit()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers; exiting");
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = quit.recv() => {
                tracing::info!("SIGQUIT: handing the listeners to the new process");
                self.health.set_upgrading();
                ShutdownSignal::GracefulUpgrade
            }
            _ = term.recv() => {
                self.health.set_draining();
                tracing::info!(drain_seconds = self.drain.as_secs(), "SIGTERM: draining");
                tokio::select! {
                    _ = tokio::time::sleep(self.drain) => {}
                    _ = int.recv() => return ShutdownSignal::FastShutdown,
                }
                tracing::info!("drain over: closing the listeners");
                ShutdownSignal::GracefulTerminate
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: exiting now");
                ShutdownSignal::FastShutdown
            }
        }
    }
}

/// Reloads the config on every SIGHUP until shutdown.
pub struct ReloadOnHangup(pub Arc<LivePolicy>);

#[async_trait]
impl BackgroundService for ReloadOnHangup {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGHUP; reload with POST /reload");
                return;
            }
        };
        loop {
            tokio::select! {
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    tracing::info!("SIGHUP: reloading the config");
                    // Outcome logged and counted by `replace`.
                    let _ = self.0.reload();
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Every second: ends the auth-failure blocks whose time is over (one log line each), drops
/// the addresses with nothing left to remember, and keeps `tollgate_auth_blocked_ips` current;
/// and readies the usage counts' next 10-second bucket (`runtime::usage`).
pub struct BlockSweeper {
    pub live: Arc<LivePolicy>,
    pub clock: Arc<dyn Clock>,
    /// The admin listener's wrong-token blocks.
    pub admin_failures: Arc<crate::policy::blocking::FailureTable>,
}

impl BlockSweeper {
    /// One sweep.
    pub fn sweep(&self) {
        let snap = self.live.load();
        let failures = &snap.policy.failures;
        for key in failures.sweep(self.clock.now()) {
            tracing::info!(target: "tollgate::edge", client = %key.display(), "auth-failure block ended");
        }
        self.live
            .metrics()
            .set_auth_blocked_ips(failures.blocked_count());
        for key in self.admin_failures.sweep(self.clock.now()) {
            tracing::info!(target: "tollgate::admin", client = %key.display(), "admin listener: wrong-token block ended");
        }
        // The usage counts' next 10-second bucket, cleared before it is used.
        let usage = self.live.usage();
        usage.rotate(usage.now_ms() / 1000);
    }
}

#[async_trait]
impl BackgroundService for BlockSweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => self.sweep(),
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Keys that expire (`expires_at`) and `previous` digests that stop (`until`): marked on the
/// policy in force at their instant on the wall clock. It sleeps until the next one, and at
/// most a second (a reload may bring new ones, and the wall clock may step either way).
pub struct Expiry {
    pub live: Arc<LivePolicy>,
}

#[async_trait]
impl BackgroundService for Expiry {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let now = crate::clock::wall_ms();
            let next = self.live.expire(now);
            let wait = next.map_or(1000, |at| at.saturating_sub(now).clamp(1, 1000));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait)) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Marks the process ready once the gateway's listener accepts a TCP connection.
pub struct ReadinessProbe {
    pub health: Arc<Health>,
    pub listen: SocketAddr,
}

impl ReadinessProbe {
    /// The address to connect to: loopback for a wildcard listener.
    fn target(&self) -> SocketAddr {
        let ip = match self.listen.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        SocketAddr::new(ip, self.listen.port())
    }
}

#[async_trait]
impl BackgroundService for ReadinessProbe {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let target = self.target();
        loop {
            let probe = tokio::task::spawn_blocking(move || {
                TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_ok()
            });
            if matches!(probe.await, Ok(true)) {
                self.health.set_ready();
                if self.health.readiness() == Readiness::Ready {
                    tracing::info!(listen = %self.listen, "ready: the gateway listener accepts connections");
                } else {
                    tracing::info!(listen = %self.listen, "the gateway listener accepts connections; ready once the fleet's key changes are read");
                }
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_moves_forward_only() {
        let h = Health::default();
        assert_eq!(h.readiness(), Readiness::Starting);
        assert!(!h.closing());
        h.set_ready();
        assert_eq!(h.readiness(), Readiness::Ready);
        h.set_upgrading();
        assert!(h.closing());
        assert_eq!(h.readiness(), Readiness::Upgrading);
        h.set_draining();
        assert_eq!(h.readiness(), Readiness::Draining);
        h.set_upgrading();
        h.set_ready();
        assert_eq!(h.readiness(), Readiness::Draining);
    }

    #[test]
    fn a_replica_awaiting_its_first_read_is_starting_until_it_is_done() {
        let h = Health::default();
        h.awaiting_first_read();
        h.set_ready();
        assert_eq!(h.readiness(), Readiness::Starting, "listening, not read");
        h.first_read_done();
        assert_eq!(h.readiness(), Readiness::Ready);
        // Read before the listener accepts: still starting until it does.
        let h = Health::default();
        h.awaiting_first_read();
        h.first_read_done();
        assert_eq!(h.readiness(), Readiness::Starting);
        h.set_ready();
        assert_eq!(h.readiness(), Readiness::Ready);
        // Draining is draining, read or not.
        let h = Health::default();
        h.awaiting_first_read();
        h.set_draining();
        assert_eq!(h.readiness(), Readiness::Draining);
    }

    #[test]
    fn a_draining_process_never_becomes_ready() {
        let h = Health::default();
        h.set_draining();
        h.set_ready();
        assert_eq!(h.readiness(), Readiness::Draining);
    }

    #[test]
    fn the_probe_connects_to_loopback_for_a_wildcard_listener() {
        let p = |listen: &str| ReadinessProbe {
            health: Arc::default(),
            listen: listen.parse().unwrap(),
        };
        assert_eq!(p("0.0.0.0:8080").target().to_string(), "127.0.0.1:8080");
        assert_eq!(p("[::]:8080").target().to_string(), "[::1]:8080");
        assert_eq!(p("10.0.0.5:80").target().to_string(), "10.0.0.5:80");
    }
}
