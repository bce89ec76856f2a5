//! Out of file descriptors: the gateway's listeners refuse before the process runs out, so the
//! admin listener and the process's own files always have descriptors left.
//!
//! Pingora's accept loop meets `EMFILE` by logging an error and sleeping a second, on every
//! listener alike: an orchestrator probing `/healthz` would then kill a gateway that is only
//! busy, and no metric would say why. Tollgate never lets the gateway's connections reach the
//! limit, as HAProxy derives `maxconn` from `ulimit -n`:
//!
//! - at start the soft `RLIMIT_NOFILE` is raised to the hard one (as Go's runtime and
//!   HAProxy do), and read;
//! - [`RESERVE`] descriptors plus `server.admin_max_connections` are kept for the admin
//!   listener, Redis, the log and `state.path`: the gateway's budget is the rest;
//! - a gateway connection is refused (closed at once,
//!   `tollgate_connections_refused_total{reason="no_descriptors"}`) when its descriptor's
//!   number reaches the budget (the kernel hands out the lowest free number, so every number
//!   below it is in use), or when the gateway's connections reach half the budget (each may
//!   hold an upstream connection too);
//! - one line is logged when an episode starts, and one when a connection is admitted a second
//!   or more after the last refusal (an episode does not end on one admission between two
//!   refusals: a descriptor freed for a moment).
//!
//! The listener never sees `EMFILE`, so it serves again as soon as descriptors are free.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long without a refusal ends an episode.
const QUIET: Duration = Duration::from_secs(1);

/// Descriptors kept beyond the admin listener's connections: listening sockets, the epoll and
/// wake-up descriptors of the runtime's threads, Redis connections, the log file and
/// `state.path`.
pub(crate) const RESERVE: u64 = 64;

/// Raise the soft descriptor limit to the hard one; the soft limit in force after.
pub(crate) fn raise_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write or read only the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return u64::MAX;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        u64::MAX
    } else {
        lim.rlim_cur
    }
}

/// The process's descriptor limit and the gateway's episodes of running short.
#[derive(Debug)]
pub(crate) struct Descriptors {
    limit: u64,
    short: AtomicBool,
    refused: AtomicU64,
    /// When the last refusal was, in ms since `since`.
    last_refused: AtomicU64,
    since: Instant,
}

impl Descriptors {
    /// Under the limit `limit` (from [`raise_limit`]).
    pub(crate) fn new(limit: u64) -> Self {
        Self {
            limit,
            short: AtomicBool::new(false),
            refused: AtomicU64::new(0),
            last_refused: AtomicU64::new(0),
            since: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.since.elapsed().as_millis() as u64
    }

    /// The gateway's budget: what is left of the limit after the reserve and the admin
    /// listener's connections.
    pub(crate) fn budget(&self, admin_max_connections: u32) -> u64 {
        self.limit
            .saturating_sub(RESERVE + u64::from(admin_max_connections))
    }

    /// Whether a gateway connection on descriptor `fd`, with `open` gateway connections
    /// already admitted, must be refused.
    pub(crate) fn exhausted(&self, fd: i32, open: u32, admin_max_connections: u32) -> bool {
        let budget = self.budget(admin_max_connections);
        let Ok(fd) = u64::try_from(fd) else {
            return false;
        };
        fd >= budget || u64::from(open) >= budget / 2
    }

    /// A gateway connection was refused for want of descriptors: the first of an episode
    /// logs.
    pub(crate) fn refused(&self, open: u32) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.last_refused.store(self.now_ms(), Ordering::Relaxed);
        if !self.short.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                target: "tollgate::edge",
                limit = self.limit,
                open,
                "out of file descriptors: refusing new gateway connections (the admin listener keeps its own)"
            );
        }
    }

    /// A gateway connection was admitted: an episode, if one was on and no connection was
    /// refused for a second, is over.
    pub(crate) fn admitted(&self) {
        self.admitted_at(self.now_ms());
    }

    fn admitted_at(&self, now_ms: u64) {
        if !self.short.load(Ordering::Relaxed) {
            return;
        }
        let quiet = now_ms.saturating_sub(self.last_refused.load(Ordering::Relaxed));
        if quiet >= QUIET.as_millis() as u64 && self.short.swap(false, Ordering::AcqRel) {
            let refused = self.refused.swap(0, Ordering::Relaxed);
            tracing::info!(
                target: "tollgate::edge",
                refused,
                "file descriptors free again: serving new gateway connections"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_keeps_off_the_admin_listeners_reserve() {
        let d = Descriptors::new(300);
        // 300 - 64 - 16 = 220 for the gateway, half of it for its connections.
        assert_eq!(d.budget(16), 220);
        assert!(!d.exhausted(100, 10, 16));
        assert!(d.exhausted(220, 10, 16), "every number below 220 is in use");
        assert!(
            d.exhausted(50, 110, 16),
            "110 connections may hold 220 descriptors"
        );
        assert!(!d.exhausted(219, 109, 16));
        // No limit at all.
        assert!(!Descriptors::new(u64::MAX).exhausted(i32::MAX, u32::MAX - 1, 16));
        // A limit below the reserve: nothing for the gateway.
        assert!(Descriptors::new(40).exhausted(3, 0, 16));
    }

    #[test]
    fn an_episode_logs_once_and_ends_on_the_next_admission() {
        let d = Descriptors::new(300);
        d.refused(5);
        d.refused(5);
        assert!(d.short.load(Ordering::Relaxed));
        assert_eq!(d.refused.load(Ordering::Relaxed), 2);
        let at = d.last_refused.load(Ordering::Relaxed);
        d.admitted_at(at + 10);
        assert!(
            d.short.load(Ordering::Relaxed),
            "a moment's admission ends nothing"
        );
        d.admitted_at(at + 1_000);
        assert!(!d.short.load(Ordering::Relaxed));
        assert_eq!(d.refused.load(Ordering::Relaxed), 0);
    }
}
