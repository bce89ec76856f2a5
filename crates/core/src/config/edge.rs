//! The edge blocks of the config: `server` (deadlines, caps, trusted proxies), `auth_failures`
//! (blocking of addresses that keep failing authentication) and `webhook_guard`.

use std::net::IpAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use ipnet::IpNet;

use super::file::{FileAuthFailures, FileConfig, FileServer, FileWebhookGuard};
use super::Invalid;
use crate::digest::Digest;

/// Pingora's own ceiling on a request head (`v1/common.rs`): a tighter cap is ours to set.
pub const MAX_HEADER_BYTES: u64 = 1_048_575;
/// Pingora's own ceiling on the number of header fields.
pub const MAX_HEADERS: u64 = 256;
/// The longest deadline a `server` timeout may set, but the idle one (one hour).
pub(crate) const MAX_TIMEOUT_SECONDS: u64 = 3_600;
/// The longest idle keep-alive (one day).
pub(crate) const MAX_IDLE_SECONDS: u64 = 86_400;

/// What no client may exceed: deadlines for each phase of a connection, caps on heads and
/// connections, and the proxies whose `X-Forwarded-For` is believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// A request head must be complete this long after the connection opens (first request)
    /// or after its first byte (later requests): a total, not per read.
    pub header_timeout: Duration,
    /// A keep-alive connection with no request in progress (HTTP/2: no open stream) is closed.
    pub idle_timeout: Duration,
    /// A request body must finish arriving this long after its head.
    pub body_timeout: Duration,
    /// A client that takes no byte of an answer for this long is dropped.
    pub send_timeout: Duration,
    /// A TLS handshake on the TLS listener must finish within this long.
    pub tls_handshake_timeout: Duration,
    /// The last request on a connection is answered with `Connection: close` (HTTP/1.1).
    pub max_requests_per_connection: NonZeroU32,
    /// Request line and header fields, in bytes.
    pub max_header_bytes: usize,
    /// Header fields in a request head; over: `431 headers_too_large`.
    pub max_headers: usize,
    /// Open downstream connections, all listeners together.
    pub max_connections: NonZeroU32,
    /// Open connections per client address (an IPv6 address by its /64); `None`: no cap.
    pub max_connections_per_ip: Option<NonZeroU32>,
    /// Peers whose `X-Forwarded-For` names the client.
    pub trusted_proxies: Vec<IpNet>,
    /// Open connections to the admin listener (counted apart from the gateway's).
    pub admin_max_connections: NonZeroU32,
}

impl Server {
    /// Whether `peer` is one of the trusted proxies.
    pub fn is_trusted(&self, peer: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|n| n.contains(&peer))
    }
}

/// Blocking of client addresses that fail authentication too often (the `auth_failures`
/// block; off when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthFailures {
    /// Failed authentications within `window` that block the address...
    pub max_failures: NonZeroU32,
    /// The span the failures are counted over (`auth_failures.window_seconds`).
    pub window: Duration,
    /// ...for this long: every request is `429 too_many_auth_failures`.
    pub block: Duration,
    /// State is kept for at most this many addresses; the least recently seen go first.
    pub max_tracked_ips: NonZeroUsize,
}

/// The `webhook_set` rule's guard against URLs into private networks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookGuard {
    /// `false`: a webhook `url` need only be an absolute http(s) URL.
    pub enabled: bool,
    /// `false`: only `https` URLs.
    pub allow_http: bool,
    /// Host names exempt from the guard (lower case), such as an operator's own relay.
    pub allow_hosts: Vec<String>,
}

impl Default for WebhookGuard {
    fn default() -> Self {
        Self {
            enabled: true,
            allow_http: true,
            allow_hosts: Vec::new(),
        }
    }
}

fn seconds(v: u64, field: &str, max: u64) -> Result<Duration, Invalid> {
    match v {
        0 => Err(Invalid::new(field, "must be greater than 0")),
        v if v > max => Err(Invalid::new(
            field,
            format!("{v} is above the maximum of {max}"),
        )),
        v => Ok(Duration::from_secs(v)),
    }
}

fn bounded(v: u64, field: &str, min: u64, max: u64, why: &str) -> Result<u64, Invalid> {
    if v < min || v > max {
        Err(Invalid::new(
            field,
            format!("{v} is not within {min}..={max}{why}"),
        ))
    } else {
        Ok(v)
    }
}

pub(super) fn server(f: &FileServer) -> Result<Server, Invalid> {
    let s = |v, name: &str, max| seconds(v, &format!("server.{name}"), max);
    let max_connections = NonZeroU32::new(f.max_connections)
        .ok_or_else(|| Invalid::new("server.max_connections", "must be greater than 0"))?;
    if f.max_connections_per_ip > f.max_connections {
        return Err(Invalid::new(
            "server.max_connections_per_ip",
            format!(
                "{} is above server.max_connections ({})",
                f.max_connections_per_ip, f.max_connections
            ),
        ));
    }
    let mut trusted_proxies = Vec::with_capacity(f.trusted_proxies.len());
    for (i, t) in f.trusted_proxies.iter().enumerate() {
        let net = t
            .parse::<IpNet>()
            .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
            .map_err(|_| {
                Invalid::new(
                    format!("server.trusted_proxies[{i}]"),
                    format!("`{t}` is not an address or a CIDR such as 10.0.0.0/8"),
                )
            })?;
        trusted_proxies.push(net.trunc());
    }
    Ok(Server {
        header_timeout: s(
            f.header_timeout_seconds,
            "header_timeout_seconds",
            MAX_TIMEOUT_SECONDS,
        )?,
        idle_timeout: s(
            f.idle_timeout_seconds,
            "idle_timeout_seconds",
            MAX_IDLE_SECONDS,
        )?,
        body_timeout: s(
            f.body_timeout_seconds,
            "body_timeout_seconds",
            MAX_TIMEOUT_SECONDS,
        )?,
        send_timeout: s(
            f.send_timeout_seconds,
            "send_timeout_seconds",
            MAX_TIMEOUT_SECONDS,
        )?,
        tls_handshake_timeout: s(
            f.tls_handshake_timeout_seconds,
            "tls_handshake_timeout_seconds",
            MAX_TIMEOUT_SECONDS,
        )?,
        max_requests_per_connection: NonZeroU32::new(f.max_requests_per_connection).ok_or_else(
            || {
                Invalid::new(
                    "server.max_requests_per_connection",
                    "must be greater than 0",
                )
            },
        )?,
        max_header_bytes: bounded(
            f.max_header_bytes,
            "server.max_header_bytes",
            1024,
            MAX_HEADER_BYTES,
            " (Pingora reads at most 1048575 bytes of head)",
        )? as usize,
        max_headers: bounded(
            f.max_headers,
            "server.max_headers",
            1,
            MAX_HEADERS,
            " (Pingora parses at most 256 fields)",
        )? as usize,
        max_connections,
        max_connections_per_ip: NonZeroU32::new(f.max_connections_per_ip),
        trusted_proxies,
        admin_max_connections: NonZeroU32::new(f.admin_max_connections).ok_or_else(|| {
            Invalid::new("server.admin_max_connections", "must be greater than 0")
        })?,
    })
}

/// The admin listener's token digest (`admin_token_sha256`) and the names it answers to
/// (`admin_hosts`).
pub(super) fn admin(raw: &FileConfig) -> Result<(Option<Digest>, Vec<String>), Invalid> {
    let token = match &raw.admin_token_sha256 {
        None => None,
        Some(h) => Some(Digest::from_hex(h).ok_or_else(|| {
            Invalid::new(
                "admin_token_sha256",
                "must be 64 hex characters: the SHA-256 of the token (`tollgate hash-key`)",
            )
        })?),
    };
    Ok((token, admin_hosts(&raw.admin_hosts)?))
}

/// `admin_hosts`: host names (lower case) the admin listener answers to; `*.example.internal`
/// stands for every name under `example.internal`.
fn admin_hosts(hosts: &[String]) -> Result<Vec<String>, Invalid> {
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let field = format!("admin_hosts[{i}]");
            match h.strip_prefix("*.") {
                Some(suffix) => host_name(suffix, &field).map(|s| format!("*.{s}")),
                None => host_name(h, &field),
            }
        })
        .collect()
}

/// A host name (no scheme, port, path or IP literal), lower-cased.
fn host_name(h: &str, field: &str) -> Result<String, Invalid> {
    let lower = h.to_ascii_lowercase();
    let is_name = matches!(url::Host::parse(&lower), Ok(url::Host::Domain(d)) if d == lower);
    if !is_name {
        return Err(Invalid::new(
            field,
            format!("`{h}` is not a host name (no scheme, port, path or IP literal)"),
        ));
    }
    Ok(lower)
}

pub(super) fn auth_failures(f: &FileAuthFailures) -> Result<AuthFailures, Invalid> {
    let max_tracked = bounded(
        f.max_tracked_ips,
        "auth_failures.max_tracked_ips",
        1,
        10_000_000,
        "",
    )?;
    Ok(AuthFailures {
        max_failures: NonZeroU32::new(f.max_failures)
            .ok_or_else(|| Invalid::new("auth_failures.max_failures", "must be greater than 0"))?,
        window: seconds(
            f.window_seconds,
            "auth_failures.window_seconds",
            MAX_IDLE_SECONDS,
        )?,
        block: seconds(
            f.block_seconds,
            "auth_failures.block_seconds",
            7 * MAX_IDLE_SECONDS,
        )?,
        max_tracked_ips: NonZeroUsize::new(max_tracked as usize).unwrap_or(NonZeroUsize::MIN),
    })
}

pub(super) fn webhook_guard(f: &FileWebhookGuard) -> Result<WebhookGuard, Invalid> {
    let allow_hosts = f
        .allow_hosts
        .iter()
        .enumerate()
        .map(|(i, h)| host_name(h, &format!("webhook_guard.allow_hosts[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(WebhookGuard {
        enabled: f.enabled,
        allow_http: f.allow_http,
        allow_hosts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_contracts() {
        let s = server(&FileServer::default()).unwrap();
        assert_eq!(s.header_timeout, Duration::from_secs(10));
        assert_eq!(s.idle_timeout, Duration::from_secs(60));
        assert_eq!(s.body_timeout, Duration::from_secs(30));
        assert_eq!(s.send_timeout, Duration::from_secs(30));
        assert_eq!(s.tls_handshake_timeout, Duration::from_secs(10));
        assert_eq!(s.max_requests_per_connection.get(), 1000);
        assert_eq!((s.max_header_bytes, s.max_headers), (32768, 100));
        assert_eq!(s.max_connections.get(), 10_000);
        assert_eq!(s.max_connections_per_ip.map(NonZeroU32::get), Some(256));
        assert!(s.trusted_proxies.is_empty());
        let a = auth_failures(&FileAuthFailures::default()).unwrap();
        assert_eq!(a.max_failures.get(), 20);
        assert_eq!(a.window, Duration::from_secs(60));
        assert_eq!(a.block, Duration::from_secs(300));
        assert_eq!(a.max_tracked_ips.get(), 100_000);
        let w = webhook_guard(&FileWebhookGuard::default()).unwrap();
        assert!(w.enabled && w.allow_http && w.allow_hosts.is_empty());
    }

    #[test]
    fn trusted_proxies_are_cidrs_or_addresses() {
        let f = FileServer {
            trusted_proxies: vec![
                "10.1.2.3/8".into(),
                "192.0.2.7".into(),
                "2001:db8::/32".into(),
            ],
            ..FileServer::default()
        };
        let s = server(&f).unwrap();
        assert_eq!(
            s.trusted_proxies
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>(),
            ["10.0.0.0/8", "192.0.2.7/32", "2001:db8::/32"]
        );
        assert!(s.is_trusted("10.200.0.1".parse().unwrap()));
        assert!(s.is_trusted("192.0.2.7".parse().unwrap()));
        assert!(!s.is_trusted("192.0.2.8".parse().unwrap()));
        assert!(s.is_trusted("2001:db8:1::9".parse().unwrap()));
        for bad in ["10.0.0.0/33", "example.com", "10.0.0", ""] {
            let f = FileServer {
                trusted_proxies: vec!["127.0.0.1".into(), bad.into()],
                ..FileServer::default()
            };
            assert_eq!(
                server(&f).unwrap_err().field,
                "server.trusted_proxies[1]",
                "{bad}"
            );
        }
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        let cases: Vec<(FileServer, &str)> = vec![
            (
                FileServer {
                    header_timeout_seconds: 0,
                    ..FileServer::default()
                },
                "server.header_timeout_seconds",
            ),
            (
                FileServer {
                    idle_timeout_seconds: 86_401,
                    ..FileServer::default()
                },
                "server.idle_timeout_seconds",
            ),
            (
                FileServer {
                    max_headers: 257,
                    ..FileServer::default()
                },
                "server.max_headers",
            ),
            (
                FileServer {
                    max_header_bytes: 2 * 1024 * 1024,
                    ..FileServer::default()
                },
                "server.max_header_bytes",
            ),
            (
                FileServer {
                    max_connections: 10,
                    max_connections_per_ip: 11,
                    ..FileServer::default()
                },
                "server.max_connections_per_ip",
            ),
            (
                FileServer {
                    max_requests_per_connection: 0,
                    ..FileServer::default()
                },
                "server.max_requests_per_connection",
            ),
        ];
        for (f, field) in cases {
            assert_eq!(server(&f).unwrap_err().field, field);
        }
        let no_cap = FileServer {
            max_connections_per_ip: 0,
            ..FileServer::default()
        };
        assert_eq!(server(&no_cap).unwrap().max_connections_per_ip, None);
    }

    #[test]
    fn allow_hosts_are_host_names() {
        let f = FileWebhookGuard {
            allow_hosts: vec!["Relay.Example.com".into()],
            ..FileWebhookGuard::default()
        };
        assert_eq!(
            webhook_guard(&f).unwrap().allow_hosts,
            ["relay.example.com"]
        );
        for bad in [
            "https://relay.example.com",
            "relay.example.com:8443",
            "10.0.0.1",
            "a/b",
            "",
        ] {
            let f = FileWebhookGuard {
                allow_hosts: vec![bad.into()],
                ..FileWebhookGuard::default()
            };
            assert_eq!(
                webhook_guard(&f).unwrap_err().field,
                "webhook_guard.allow_hosts[0]",
                "{bad}"
            );
        }
    }
}
