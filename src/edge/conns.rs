//! Connection caps: open downstream connections in total and per client address, counted
//! exactly while each connection lives.
//!
//! A connection is admitted at accept time, before any TLS handshake or byte of HTTP, and
//! holds a [`ConnGuard`] for as long as it lives; dropping the guard (when the connection's
//! stream is dropped, whatever ended it) gives its place back. Per-address counts are keyed by
//! [`ClientKey`] (an IPv6 client by its /64) in a [`DashMap`]; an address's entry is removed
//! when its last connection closes, so the map holds only addresses with open connections.
//! Trusted proxies (`server.trusted_proxies`) carry many clients and have no per-address cap.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use prometheus::IntGauge;

use crate::config::Server;
use crate::policy::client::ClientKey;

/// Why a connection was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// `server.max_connections` are open.
    MaxConnections,
    /// `server.max_connections_per_ip` are open from this address.
    MaxConnectionsPerIp,
    /// The process is short of file descriptors ([`super::fds`]).
    NoDescriptors,
}

impl Refused {
    /// The `reason` label of `tollgate_connections_refused_total`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Refused::MaxConnections => "max_connections",
            Refused::MaxConnectionsPerIp => "max_connections_per_ip",
            Refused::NoDescriptors => "no_descriptors",
        }
    }
}

/// The caps one limiter admits connections under, from the config in force at accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Open connections in all.
    pub total: u32,
    /// Open connections per client address; `None`: no cap.
    pub per_ip: Option<NonZeroU32>,
}

impl Caps {
    /// The gateway listeners': `max_connections`, `max_connections_per_ip`.
    pub(crate) fn gateway(s: &Server) -> Self {
        Self {
            total: s.max_connections.get(),
            per_ip: s.max_connections_per_ip,
        }
    }

    /// The admin listener's: `admin_max_connections` in all (operators' tools, few and known),
    /// and a quarter of them per client address, at least one: one client holding idle
    /// connections never locks the probes and the scraper out.
    pub(crate) fn admin(s: &Server) -> Self {
        let total = s.admin_max_connections.get();
        Self {
            total,
            per_ip: NonZeroU32::new((total / 4).max(1)),
        }
    }
}

/// The open connections of one listener group (the gateway's listeners, or the admin one).
#[derive(Debug, Default)]
pub(crate) struct ConnLimiter {
    total: AtomicU32,
    per_ip: DashMap<ClientKey, u32, foldhash::fast::RandomState>,
}

/// One admitted connection's place; given back when dropped.
#[derive(Debug)]
pub(crate) struct ConnGuard {
    limiter: Arc<ConnLimiter>,
    /// The address counted, when one was.
    key: Option<ClientKey>,
    /// `tollgate_connections{listener}` (none for an HTTP/2 stream's place).
    gauge: Option<IntGauge>,
}

impl ConnLimiter {
    pub(crate) fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Connections open now, all listeners.
    pub(crate) fn open(&self) -> u32 {
        self.total.load(Ordering::Relaxed)
    }

    /// Connections open now from `ip`'s address.
    #[cfg(test)]
    pub(crate) fn open_from(&self, ip: IpAddr) -> u32 {
        self.per_ip.get(&ClientKey::of(ip)).map_or(0, |n| *n)
    }

    /// Admit a connection from `peer` (`None`: no IP address, as on a Unix socket) under
    /// `caps` (trusted proxies, from `limits`, have no per-address cap), counting it in `gauge`
    /// while it lives.
    pub(crate) fn admit(
        self: &Arc<Self>,
        peer: Option<IpAddr>,
        caps: Caps,
        limits: &Server,
        gauge: &IntGauge,
    ) -> Result<ConnGuard, Refused> {
        self.take(peer, caps, limits, Some(gauge))
    }

    /// Admit an HTTP/2 request from `peer` under `caps` into this limiter of streams (one of
    /// its own, beside the connections'): an address holds at most `max_connections_per_ip`
    /// requests in flight over HTTP/2, whatever the number of its connections, and all
    /// addresses `max_connections`, as nginx's `limit_conn` counts each HTTP/2 request as a
    /// connection. A connection's streams each hold the buffers of an exchange (Pingora's
    /// channel of the upstream's body, some hundreds of KiB while the client takes nothing):
    /// multiplexing must not multiply what one address may hold.
    pub(crate) fn admit_stream(
        self: &Arc<Self>,
        peer: Option<IpAddr>,
        caps: Caps,
        limits: &Server,
    ) -> Result<ConnGuard, Refused> {
        self.take(peer, caps, limits, None)
    }

    fn take(
        self: &Arc<Self>,
        peer: Option<IpAddr>,
        caps: Caps,
        limits: &Server,
        gauge: Option<&IntGauge>,
    ) -> Result<ConnGuard, Refused> {
        let max = caps.total;
        self.total
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Refused::MaxConnections)?;
        let capped = peer
            .zip(caps.per_ip)
            .filter(|(ip, _)| !limits.is_trusted(*ip));
        let key = match capped {
            None => None,
            Some((ip, cap)) => {
                let key = ClientKey::of(ip);
                let mut n = self.per_ip.entry(key).or_insert(0);
                // A fresh entry (0) is always under a cap of at least 1: a refusal never leaves
                // an empty entry behind.
                if *n >= cap.get() {
                    drop(n);
                    self.total.fetch_sub(1, Ordering::AcqRel);
                    return Err(Refused::MaxConnectionsPerIp);
                }
                *n += 1;
                Some(key)
            }
        };
        if let Some(g) = gauge {
            g.inc();
        }
        Ok(ConnGuard {
            limiter: Arc::clone(self),
            key,
            gauge: gauge.cloned(),
        })
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.limiter.per_ip.remove_if_mut(&key, |_, n| {
                *n = n.saturating_sub(1);
                *n == 0
            });
        }
        if let Some(g) = &self.gauge {
            g.dec();
        }
        self.limiter.total.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(total: u32, per_ip: u32, trusted: &[&str]) -> Server {
        tollgate_core::testing::TestConfig::new()
            .server(|s| {
                s.max_connections = total;
                s.max_connections_per_ip = per_ip;
                s.trusted_proxies = trusted.iter().map(|t| t.to_string()).collect();
            })
            .parse()
            .server
            .as_ref()
            .clone()
    }

    fn admit(
        l: &Arc<ConnLimiter>,
        peer: Option<IpAddr>,
        lim: &Server,
        g: &IntGauge,
    ) -> Result<ConnGuard, Refused> {
        l.admit(peer, Caps::gateway(lim), lim, g)
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn caps_hold_and_places_come_back_when_connections_close() {
        let l = ConnLimiter::new();
        let g = IntGauge::new("g", "g").unwrap();
        let lim = limits(4, 2, &[]);
        let a1 = admit(&l, ip("192.0.2.1"), &lim, &g).unwrap();
        let a2 = admit(&l, ip("192.0.2.1"), &lim, &g).unwrap();
        assert_eq!(
            admit(&l, ip("192.0.2.1"), &lim, &g).unwrap_err(),
            Refused::MaxConnectionsPerIp
        );
        let b1 = admit(&l, ip("192.0.2.2"), &lim, &g).unwrap();
        let b2 = admit(&l, ip("192.0.2.2"), &lim, &g).unwrap();
        assert_eq!(
            admit(&l, ip("192.0.2.3"), &lim, &g).unwrap_err(),
            Refused::MaxConnections
        );
        assert_eq!((l.open(), g.get()), (4, 4));
        drop(a1);
        assert_eq!(
            (l.open(), l.open_from("192.0.2.1".parse().unwrap())),
            (3, 1)
        );
        let a3 = admit(&l, ip("192.0.2.1"), &lim, &g).unwrap();
        drop((a2, a3, b1, b2));
        assert_eq!((l.open(), g.get()), (0, 0));
        assert!(l.per_ip.is_empty(), "no entry outlives its connections");
    }

    #[test]
    fn ipv6_counts_by_its_64_and_trusted_proxies_have_no_per_address_cap() {
        let l = ConnLimiter::new();
        let g = IntGauge::new("g", "g").unwrap();
        let lim = limits(100, 1, &["10.0.0.0/8"]);
        let _a = admit(&l, ip("2001:db8:1:2::1"), &lim, &g).unwrap();
        assert!(admit(&l, ip("2001:db8:1:2::ffff"), &lim, &g).is_err());
        let _b = admit(&l, ip("2001:db8:1:3::1"), &lim, &g).unwrap();
        let lb: Vec<_> = (0..10)
            .map(|_| admit(&l, ip("10.0.0.5"), &lim, &g).unwrap())
            .collect();
        assert_eq!(lb.len(), 10);
        // No address (a Unix socket): only the total applies.
        let _u = admit(&l, None, &lim, &g).unwrap();
        let no_cap = limits(100, 0, &[]);
        let many: Vec<_> = (0..5)
            .map(|_| admit(&l, ip("192.0.2.9"), &no_cap, &g).unwrap())
            .collect();
        assert_eq!(many.len(), 5);
    }

    #[test]
    fn the_admin_listener_gives_one_address_a_quarter() {
        let l = ConnLimiter::new();
        let g = IntGauge::new("g", "g").unwrap();
        let lim = tollgate_core::testing::TestConfig::new()
            .server(|s| s.admin_max_connections = 64)
            .parse()
            .server
            .as_ref()
            .clone();
        let caps = Caps::admin(&lim);
        assert_eq!((caps.total, caps.per_ip.map(|n| n.get())), (64, Some(16)));
        let held: Vec<_> = (0..16)
            .map(|_| l.admit(ip("192.0.2.1"), caps, &lim, &g).unwrap())
            .collect();
        assert_eq!(
            l.admit(ip("192.0.2.1"), caps, &lim, &g).unwrap_err(),
            Refused::MaxConnectionsPerIp
        );
        assert!(l.admit(ip("192.0.2.2"), caps, &lim, &g).is_ok());
        drop(held);
        // A cap under four still lets each address one.
        let small = tollgate_core::testing::TestConfig::new()
            .server(|s| s.admin_max_connections = 3)
            .parse()
            .server
            .as_ref()
            .clone();
        assert_eq!(Caps::admin(&small).per_ip.map(|n| n.get()), Some(1));
    }

    #[test]
    fn many_threads_never_pass_the_caps() {
        let l = ConnLimiter::new();
        let g = IntGauge::new("g", "g").unwrap();
        let lim = limits(50, 10, &[]);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (l, g, lim) = (&l, &g, &lim);
                s.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..500u32 {
                        let peer = ip(&format!("192.0.2.{}", (i + t) % 7));
                        if let Ok(c) = admit(l, peer, lim, g) {
                            held.push(c);
                        }
                        assert!(l.open() <= 50);
                        if i % 3 == 0 {
                            held.pop();
                        }
                    }
                });
            }
        });
        assert_eq!((l.open(), g.get()), (0, 0));
        assert!(l.per_ip.is_empty());
    }
}
