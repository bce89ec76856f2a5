//! What a recorded request leaves for the exporter: its ids and times, and what its spans'
//! attributes are read from. Names (route, plan, key) are not copied on the request path:
//! the record holds the request's snapshot, and the exporter's thread reads them from it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::config::routes::RouteIdx;
use crate::policy::keys::{Credential, KeyIdx};
use crate::policy::{Code, Outcome};
use crate::runtime::live::Snapshot;

use super::w3c::{SpanId, TraceId};

/// One recorded request: its `SERVER` span and the children it had.
pub(crate) struct Finished {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// The client's span, when the request continued a trace.
    pub(crate) parent: Option<SpanId>,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    /// The config that decided the request: route, plan and key names are read from it.
    pub(crate) snap: Option<Arc<Snapshot>>,
    pub(crate) method: http::Method,
    /// The request's path, without its query.
    pub(crate) path: String,
    /// Whether the request came over TLS (`url.scheme`).
    pub(crate) tls: bool,
    /// `1.0`, `1.1` or `2` (`network.protocol.version`).
    pub(crate) version: &'static str,
    pub(crate) client: Option<IpAddr>,
    pub(crate) route: Option<RouteIdx>,
    /// The caller's key, or a known key that was refused.
    pub(crate) key: Option<KeyIdx>,
    pub(crate) credential: Option<Credential>,
    pub(crate) outcome: Outcome,
    pub(crate) code: Option<Code>,
    /// The status sent to the client (0: none was).
    pub(crate) status: u16,
    /// The upstream call (the `CLIENT` span), when there was one.
    pub(crate) upstream: Option<Upstream>,
    /// The wait on the fleet store (the `fleet_wait` span): start and end.
    pub(crate) fleet_wait: Option<(u64, u64)>,
}

/// The upstream call of a recorded request.
pub(crate) struct Upstream {
    /// The span id the upstream's `traceparent` named.
    pub(crate) span_id: SpanId,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    /// The upstream's status (0: no answer came).
    pub(crate) status: u16,
}

impl Finished {
    /// How many spans this record holds (what is counted exported or dropped).
    pub(crate) fn spans(&self) -> u64 {
        1 + u64::from(self.upstream.is_some()) + u64::from(self.fleet_wait.is_some())
    }
}

/// Instants as nanoseconds since the Unix epoch, from one reading of both clocks.
#[derive(Clone, Copy)]
pub(crate) struct Wall {
    now: Instant,
    unix_ns: u64,
}

impl Wall {
    pub(crate) fn now() -> Self {
        let unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Self {
            now: Instant::now(),
            unix_ns,
        }
    }

    /// `t` (at or before this reading) in ns since the Unix epoch.
    pub(crate) fn at(&self, t: Instant) -> u64 {
        let ago = self.now.saturating_duration_since(t);
        self.unix_ns
            .saturating_sub(u64::try_from(ago.as_nanos()).unwrap_or(u64::MAX))
    }

    /// This reading, in ns since the Unix epoch.
    #[cfg(test)]
    fn ns(&self) -> u64 {
        self.unix_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn instants_become_unix_nanoseconds_in_order() {
        let before = Instant::now();
        std::thread::yield_now();
        let w = Wall::now();
        assert!(w.at(before) <= w.ns());
        let earlier = w.now - Duration::from_millis(5);
        assert_eq!(w.ns() - w.at(earlier), 5_000_000);
        assert!(w.ns() > 1_700_000_000_000_000_000);
    }
}
