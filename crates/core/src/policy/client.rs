//! The client's address: who is on the other end, for auth-failure blocking, logs and the
//! `X-Forwarded-For` sent upstream.
//!
//! The client is the TCP peer, unless the peer is one of `server.trusted_proxies` (a load
//! balancer in front of Tollgate): then `X-Forwarded-For` is read from the right, skipping
//! entries that are themselves trusted proxies, and the first entry that is not one is the
//! client. Entries further left were written by the client and are never believed. A trusted
//! peer whose header has no usable entry there (missing, or not an IP address) is taken as the
//! client itself: a misconfigured proxy is blocked before a spoofed address is believed.
//!
//! Addresses are grouped per [`ClientKey`]: an IPv4 address on its own, an IPv6 address by its
//! /64 (one subscriber's usual allocation, so rotating through it gains an attacker nothing).

use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

/// A client address as one counting unit: IPv4 addresses mapped into IPv6, IPv6 addresses
/// reduced to their /64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientKey(u128);

impl ClientKey {
    /// The key of `ip`: an IPv4 (or IPv4-mapped IPv6) address itself, an IPv6 address's /64.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => ClientKey(u128::from(v4.to_ipv6_mapped())),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientKey::of(IpAddr::V4(v4)),
                None => ClientKey(u128::from(v6) & !((1u128 << 64) - 1)),
            },
        }
    }

    /// The key an operator names as [`ClientKey::display`] writes it (`192.0.2.7`,
    /// `2001:db8:1:2::/64`), or by any address it stands for (`2001:db8:1:2::5`); `None` for
    /// anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let ip: IpAddr = addr.parse().ok()?;
        match (ip, prefix) {
            (_, None) | (IpAddr::V6(_), Some("64")) => Some(ClientKey::of(ip)),
            _ => None,
        }
    }

    /// The address or network the key stands for, for logs: `192.0.2.7` or `2001:db8:1:2::/64`.
    pub fn display(&self) -> String {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => format!("{v6}/64"),
        }
    }
}

/// The client of a request, and where in `X-Forwarded-For` it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Client {
    /// The client's address: the peer, or the entry of `X-Forwarded-For` believed.
    pub ip: IpAddr,
    /// Its position in the request's `X-Forwarded-For` entries (all fields, left to right), or
    /// `None` when the client is the peer itself.
    pub forwarded_at: Option<usize>,
}

/// The client of a request from `peer` whose `X-Forwarded-For` fields are `forwarded_for`, given
/// the trusted proxies.
pub fn client<'a>(
    peer: IpAddr,
    forwarded_for: impl Iterator<Item = &'a [u8]>,
    trusted: &[IpNet],
) -> Client {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    let as_peer = Client {
        ip: peer,
        forwarded_at: None,
    };
    if trusted.is_empty() || !is_trusted(&peer) {
        return as_peer;
    }
    let entries: Vec<&[u8]> = forwarded_for
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .collect();
    for (i, e) in entries.iter().enumerate().rev() {
        match parse_ip(e) {
            Some(ip) if is_trusted(&ip) => continue,
            Some(ip) => {
                return Client {
                    ip,
                    forwarded_at: Some(i),
                }
            }
            None => return as_peer,
        }
    }
    as_peer
}

/// An address as proxies write it in `X-Forwarded-For`: bare, or (rarely) with a port, IPv6 in
/// brackets when it has one.
fn parse_ip(e: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(e).ok()?;
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<std::net::SocketAddr>() {
        return Some(sa.ip());
    }
    s.strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .and_then(|v6| v6.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn of(peer: &str, xff: &[&str], trusted: &[&str]) -> Client {
        let values: Vec<&[u8]> = xff.iter().map(|v| v.as_bytes()).collect();
        client(ip(peer), values.iter().copied(), &nets(trusted))
    }

    #[test]
    fn an_operator_names_a_key_as_it_is_displayed_or_by_an_address_it_covers() {
        for (text, shown) in [
            ("192.0.2.7", Some("192.0.2.7")),
            ("::ffff:192.0.2.7", Some("192.0.2.7")),
            ("2001:db8:1:2::/64", Some("2001:db8:1:2::/64")),
            ("2001:db8:1:2::5", Some("2001:db8:1:2::/64")),
            ("2001:db8:1:2::5/64", Some("2001:db8:1:2::/64")),
            ("2001:db8:1:2::/48", None),
            ("192.0.2.7/32", None),
            ("192.0.2", None),
            ("example.com", None),
            ("", None),
        ] {
            assert_eq!(
                ClientKey::parse(text).map(|k| k.display()).as_deref(),
                shown,
                "{text}"
            );
        }
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_sends() {
        let c = of("203.0.113.9", &["10.0.0.1, 198.51.100.2"], &["10.0.0.0/8"]);
        assert_eq!((c.ip, c.forwarded_at), (ip("203.0.113.9"), None));
        let c = of("10.0.0.5", &["198.51.100.2"], &[]);
        assert_eq!(c.ip, ip("10.0.0.5"));
    }

    #[test]
    fn from_a_trusted_peer_the_last_untrusted_entry_is_the_client() {
        // client → LB (10.0.0.5) → Tollgate; the client put a spoofed entry in front.
        let c = of("10.0.0.5", &["1.2.3.4, 198.51.100.2"], &["10.0.0.0/8"]);
        assert_eq!((c.ip, c.forwarded_at), (ip("198.51.100.2"), Some(1)));
        // Two trusted hops, over two header fields.
        let c = of(
            "10.0.0.5",
            &["1.2.3.4", "198.51.100.2, 10.1.1.1"],
            &["10.0.0.0/8"],
        );
        assert_eq!((c.ip, c.forwarded_at), (ip("198.51.100.2"), Some(1)));
        // IPv6, with brackets and a port.
        let c = of(
            "2001:db8::1",
            &["[2001:db8:ffff::7]:443"],
            &["2001:db8::/112"],
        );
        assert_eq!(c.ip, ip("2001:db8:ffff::7"));
    }

    #[test]
    fn a_trusted_peer_without_a_usable_entry_is_the_client() {
        let trusted = ["10.0.0.0/8"];
        assert_eq!(of("10.0.0.5", &[], &trusted).ip, ip("10.0.0.5"));
        assert_eq!(of("10.0.0.5", &["garbage"], &trusted).ip, ip("10.0.0.5"));
        // Every entry trusted: the nearest is the client.
        assert_eq!(of("10.0.0.5", &["10.9.9.9"], &trusted).ip, ip("10.0.0.5"));
        // Garbage left of the client entry is never reached.
        let c = of("10.0.0.5", &["nonsense, 198.51.100.2"], &trusted);
        assert_eq!(c.ip, ip("198.51.100.2"));
    }

    #[test]
    fn keys_group_ipv6_by_its_slash_64() {
        let k = |s: &str| ClientKey::of(ip(s));
        assert_eq!(k("2001:db8:1:2::1"), k("2001:db8:1:2:ffff::9"));
        assert_ne!(k("2001:db8:1:2::1"), k("2001:db8:1:3::1"));
        assert_eq!(k("192.0.2.7"), k("::ffff:192.0.2.7"));
        assert_ne!(k("192.0.2.7"), k("192.0.2.8"));
        assert_eq!(k("192.0.2.7").display(), "192.0.2.7");
        assert_eq!(k("2001:db8:1:2::1").display(), "2001:db8:1:2::/64");
    }
}
