//! The upstream peer of a request, from the target its snapshot resolved
//! ([`crate::runtime::upstream::Target`]).

use std::time::Duration;

use pingora::upstreams::peer::{HttpPeer, HttpUpstreamRequestPolicy};

use crate::runtime::upstream::Target;

/// How long an idle upstream connection stays in Pingora's pool.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// A peer for `t`: its timeouts, and for TLS the certificate and host-name checks (against a
/// private CA when one is configured).
pub(crate) fn peer(t: &Target) -> HttpPeer {
    let mut peer = HttpPeer::new(t.addr, t.tls, t.sni.clone());
    peer.options.connection_timeout = Some(t.connect_timeout);
    peer.options.total_connection_timeout = Some(t.connect_timeout);
    peer.options.read_timeout = Some(t.read_timeout);
    peer.options.write_timeout = Some(t.read_timeout);
    peer.options.idle_timeout = Some(POOL_IDLE);
    // Hop-by-hop fields stripped, and no upgrade handshake ever forwarded: no tunnels.
    peer.options.http_upstream_request_policy = HttpUpstreamRequestPolicy::deny_upgrades();
    if t.tls {
        peer.options.verify_cert = true;
        peer.options.verify_hostname = true;
        peer.options.ca = t.ca.clone();
    }
    peer
}
