//! The webhook URL guard: the `url` of a `webhook_set` body must not make the provider call
//! into a private network.
//!
//! The provider calls whatever URL a customer registers, from inside its own network. A URL
//! that names a loopback, private, link-local (169.254.169.254 is the cloud metadata service)
//! or otherwise non-global address would turn the provider into the caller's proxy into
//! networks the caller cannot reach (server-side request forgery). [`check_url`] judges a URL
//! as it would be resolved: the `url` crate parses it by the WHATWG URL Standard (the parser of
//! browsers and of most HTTP clients), so every spelling it accepts of an address or a name —
//! `http://2130706433/`, `http://0x7f.1/`, `http://0177.0.0.1/`, `http://127.1/`,
//! `http://[::ffff:127.0.0.1]/`, `http://[64:ff9b::a9fe:a9fe]/`, `http://LOCALHOST./` — comes
//! out as the one address or lower-case ASCII name it means, and that is what is judged. A URL
//! that parser refuses is refused. (Rule 0 already refuses percent-escapes and non-ASCII
//! characters in a host, such as `http://%6c%6fcalhost/` or full-width digits; the rules after
//! it would judge those as resolved too.)
//!
//! | # | rule | refused |
//! |---|---|---|
//! | 0 | the `webhook_set` rule's own check ([`is_http_url`]) | anything but an absolute `http://` or `https://` URL with a host |
//! | 1 | user info | any `user@…` or `user:password@…`, even an empty one (`http://@host/`) |
//! | 2 | scheme | `http` when `allow_http` is off |
//! | 3 | `allow_hosts` | nothing: a listed host passes, unchecked |
//! | 4 | names ([`REFUSED_NAMES`]) | single-label names (`http://metadata/`, resolved only through a search domain); `localhost`, `local`, `internal`, `home.arpa` and every name under them |
//! | 5 | IPv4 literals ([`REFUSED_V4`]) | every address that is not plain global unicast |
//! | 6 | IPv6 literals ([`REFUSED_V6`]) | every address that is not plain global unicast (2000::/3 less the special ranges); IPv4-mapped, IPv4-compatible, NAT64 and 6to4 addresses are judged by the IPv4 address they embed |
//!
//! With `enabled: false` only rule 0 applies. Names are compared after trailing dots are
//! removed (`localhost.` is `localhost`). The range tables are ours, each row with its RFC
//! (std's `is_global` is unstable), and the first row that matches names the refusal. A
//! refusal's detail shows the address or name as judged, never more than [`SHOWN_CHARS`]
//! characters of it. The guard costs one URL parse (after rule 0's own); nothing else is
//! allocated unless the URL is refused.
//!
//! What a URL cannot show, the guard cannot see: a public name whose DNS answer is private,
//! or a public URL that redirects inward, is for the provider's own egress rules.

use std::borrow::Cow;
use std::net::{Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

use crate::config::WebhookGuard;

/// The detail of rule 0, the `webhook_set` rule's own check.
pub const NOT_HTTP_URL: &str = "must be an absolute http:// or https:// URL with a host";

/// At most this many characters of a refused name are shown in a detail.
pub const SHOWN_CHARS: usize = 64;

/// Check a webhook `url` against the `/url` rules of `webhook_set` and the guard; the error is
/// the human detail of the `/url` field error.
pub fn check_url(url: &str, guard: &WebhookGuard) -> Result<(), Cow<'static, str>> {
    if !is_http_url(url) {
        return Err(NOT_HTTP_URL.into());
    }
    if !guard.enabled {
        return Ok(());
    }
    judge(url, guard)
}

/// Rules 1–6, on a URL as the WHATWG parser reads it. Rule 0 ([`is_http_url`]) refuses
/// percent-escapes and non-ASCII in a host before they get here; these rules would judge them
/// as resolved all the same.
fn judge(url: &str, guard: &WebhookGuard) -> Result<(), Cow<'static, str>> {
    let Ok(parsed) = Url::parse(url) else {
        return Err("must be a URL that parses by the WHATWG URL Standard".into());
    };
    // `http://@host/` has an empty user info, which the parser drops: look at the text too.
    let authority = url.split_once("//").map_or("", |(_, rest)| rest);
    let authority = &authority[..authority.find(['/', '?', '#']).unwrap_or(authority.len())];
    if !parsed.username().is_empty() || parsed.password().is_some() || authority.contains('@') {
        return Err("must not contain user info (user@ or user:password@)".into());
    }
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(NOT_HTTP_URL.into());
    }
    if parsed.scheme() == "http" && !guard.allow_http {
        return Err("must be an https:// URL".into());
    }
    let host = match parsed.host() {
        // `127.0.0.1..`: the parser drops one trailing dot before it decides whether a host
        // is a number; read the name again without any, as a resolver might.
        Some(Host::Domain(name)) => {
            if name.trim_end_matches('.').contains("..") || name.ends_with("..") {
                return Err("must not have an empty label in its host name (`..`)".into());
            }
            match Host::parse(name.trim_end_matches('.')) {
                Ok(Host::Ipv4(a)) => Some(Host::Ipv4(a)),
                _ => Some(Host::Domain(name)),
            }
        }
        Some(Host::Ipv4(a)) => Some(Host::Ipv4(a)),
        Some(Host::Ipv6(a)) => Some(Host::Ipv6(a)),
        None => None,
    };
    match host {
        Some(Host::Domain(name)) => check_name(name, &guard.allow_hosts),
        Some(Host::Ipv4(a)) => match refused_v4(a) {
            Some(row) => Err(private(format!("{a} is in {row}"))),
            None => Ok(()),
        },
        Some(Host::Ipv6(a)) => match judge_v6(a) {
            V6Judgement::Global => Ok(()),
            V6Judgement::Refused(row) => Err(private(format!("{a} is in {row}"))),
            V6Judgement::Embedded { v4, row, embedded } => Err(private(format!(
                "{a} is in {row} and embeds {embedded}, which is in {v4}"
            ))),
            V6Judgement::Reserved => Err(private(format!(
                "{a} is reserved: outside {GLOBAL_UNICAST_V6} and every special range"
            ))),
        },
        // An http(s) URL always has a host; refuse rather than guess.
        None => Err(NOT_HTTP_URL.into()),
    }
}

fn private(why: String) -> Cow<'static, str> {
    Cow::Owned(format!("must not point into a private network: {why}"))
}

/// Rules 3 and 4 for a host name (lower-case ASCII, as the parser gives it).
fn check_name(name: &str, allow_hosts: &[String]) -> Result<(), Cow<'static, str>> {
    let name = name.trim_end_matches('.');
    if allow_hosts.iter().any(|h| h.trim_end_matches('.') == name) {
        return Ok(());
    }
    for zone in &REFUSED_NAMES {
        let under = name
            .strip_suffix(zone.name)
            .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'));
        if under {
            let shown = match name.char_indices().nth(SHOWN_CHARS) {
                Some((i, _)) => &name[..i],
                None => name,
            };
            let more = if shown.len() < name.len() { "…" } else { "" };
            return Err(private(format!(
                "`{shown}{more}` is under `{}`, {}",
                zone.name, zone.what
            )));
        }
    }
    if !name.contains('.') {
        // `http://metadata/` reaches the cloud metadata service through the host's search
        // domain; a name a public resolver can answer always has a dot.
        let shown: String = name.chars().take(SHOWN_CHARS).collect();
        return Err(private(format!(
            "`{shown}` is a single-label name, resolved only through a local search domain"
        )));
    }
    Ok(())
}

/// A name refused with every name under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zone {
    /// Lower case, without a trailing dot.
    pub name: &'static str,
    /// What it is, and where it is reserved.
    pub what: &'static str,
}

/// Rule 4: names that only ever resolve inside a host or a private network.
pub static REFUSED_NAMES: [Zone; 4] = [
    Zone {
        name: "localhost",
        what: "the loopback name (RFC 6761 §6.3)",
    },
    Zone {
        name: "local",
        what: "link-local multicast DNS (RFC 6762)",
    },
    Zone {
        name: "internal",
        what: "reserved for private networks (ICANN, 2024)",
    },
    Zone {
        name: "home.arpa",
        what: "reserved for home networks (RFC 8375)",
    },
];

/// A row of [`REFUSED_V4`]: `net/prefix`, and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V4Range {
    /// The network address.
    pub net: Ipv4Addr,
    /// The prefix length, in bits (0–32).
    pub prefix: u8,
    /// What the range is, and its RFC.
    pub what: &'static str,
}

impl V4Range {
    const fn new(a: u8, b: u8, c: u8, d: u8, prefix: u8, what: &'static str) -> Self {
        Self {
            net: Ipv4Addr::new(a, b, c, d),
            prefix,
            what,
        }
    }

    /// The mask of the network part.
    pub fn mask(&self) -> u32 {
        u32::MAX
            .checked_shl(32 - u32::from(self.prefix.min(32)))
            .unwrap_or(0)
    }

    /// Whether `a` is in the range.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & self.mask() == u32::from(self.net)
    }
}

impl std::fmt::Display for V4Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}, {}", self.net, self.prefix, self.what)
    }
}

/// Rule 5: every IPv4 range that is not plain global unicast (after the IANA IPv4
/// Special-Purpose Address Registry, RFC 6890, less its globally reachable rows). The first
/// row that contains an address names its refusal; every address outside all rows is allowed.
#[rustfmt::skip]
pub static REFUSED_V4: [V4Range; 16] = [
    V4Range::new(0, 0, 0, 0, 8, "this network, incl. the unspecified 0.0.0.0 (RFC 1122 §3.2.1.3)"),
    V4Range::new(10, 0, 0, 0, 8, "private (RFC 1918)"),
    V4Range::new(100, 64, 0, 0, 10, "shared address space, carrier-grade NAT (RFC 6598)"),
    V4Range::new(127, 0, 0, 0, 8, "loopback (RFC 1122 §3.2.1.3)"),
    V4Range::new(169, 254, 0, 0, 16, "link-local, incl. cloud metadata services (RFC 3927)"),
    V4Range::new(172, 16, 0, 0, 12, "private (RFC 1918)"),
    V4Range::new(192, 0, 0, 0, 24, "IETF protocol assignments (RFC 6890)"),
    V4Range::new(192, 0, 2, 0, 24, "documentation, TEST-NET-1 (RFC 5737)"),
    V4Range::new(192, 88, 99, 0, 24, "6to4 relay anycast, deprecated (RFC 7526)"),
    V4Range::new(192, 168, 0, 0, 16, "private (RFC 1918)"),
    V4Range::new(198, 18, 0, 0, 15, "benchmarking (RFC 2544)"),
    V4Range::new(198, 51, 100, 0, 24, "documentation, TEST-NET-2 (RFC 5737)"),
    V4Range::new(203, 0, 113, 0, 24, "documentation, TEST-NET-3 (RFC 5737)"),
    V4Range::new(224, 0, 0, 0, 4, "multicast (RFC 5771)"),
    // Before 240/4, which holds it, so that the refusal names it.
    V4Range::new(255, 255, 255, 255, 32, "limited broadcast (RFC 919)"),
    V4Range::new(240, 0, 0, 0, 4, "reserved for future use (RFC 1112 §4)"),
];

/// The first row of [`REFUSED_V4`] that contains `a`.
pub fn refused_v4(a: Ipv4Addr) -> Option<&'static V4Range> {
    REFUSED_V4.iter().find(|r| r.contains(a))
}

/// What the guard does with the addresses of a [`REFUSED_V6`] row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V6Rule {
    /// Refuse them.
    Refuse,
    /// Judge the IPv4 address in bits `at..at + 32` by [`REFUSED_V4`].
    EmbeddedV4 {
        /// Where the IPv4 address starts, in bits from the top (96: the last 32 bits).
        at: u8,
    },
}

/// A row of [`REFUSED_V6`]: `net/prefix`, what is done with it, and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct V6Range {
    /// The network address.
    pub net: Ipv6Addr,
    /// The prefix length, in bits (0–128).
    pub prefix: u8,
    /// What the guard does with the range's addresses.
    pub rule: V6Rule,
    /// What the range is, and its RFC.
    pub what: &'static str,
}

impl V6Range {
    /// The mask of the network part.
    pub fn mask(&self) -> u128 {
        u128::MAX
            .checked_shl(128 - u32::from(self.prefix.min(128)))
            .unwrap_or(0)
    }

    /// Whether `a` is in the range.
    pub fn contains(&self, a: Ipv6Addr) -> bool {
        u128::from(a) & self.mask() == u128::from(self.net)
    }

    /// The IPv4 address `a` embeds, for an [`V6Rule::EmbeddedV4`] row.
    pub fn embedded(&self, a: Ipv6Addr) -> Option<Ipv4Addr> {
        match self.rule {
            V6Rule::Refuse => None,
            V6Rule::EmbeddedV4 { at } => {
                let shift = 96u32.saturating_sub(u32::from(at));
                Some(Ipv4Addr::from((u128::from(a) >> shift) as u32))
            }
        }
    }
}

impl std::fmt::Display for V6Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}, {}", self.net, self.prefix, self.what)
    }
}

const fn v6(segments: [u16; 8], prefix: u8, rule: V6Rule, what: &'static str) -> V6Range {
    let [a, b, c, d, e, f, g, h] = segments;
    V6Range {
        net: Ipv6Addr::new(a, b, c, d, e, f, g, h),
        prefix,
        rule,
        what,
    }
}

const REFUSE: V6Rule = V6Rule::Refuse;
/// The IPv4 address in the last 32 bits.
const LOW_32: V6Rule = V6Rule::EmbeddedV4 { at: 96 };

/// Rule 6: the special IPv6 ranges (after the IANA IPv6 Special-Purpose Address Registry,
/// RFC 6890), refused or judged by the IPv4 address they embed. The first row that contains
/// an address decides; an address in no row is allowed only inside [`GLOBAL_UNICAST_V6`].
#[rustfmt::skip]
pub static REFUSED_V6: [V6Range; 16] = [
    v6([0, 0, 0, 0, 0, 0, 0, 0], 128, REFUSE, "unspecified (RFC 4291 §2.5.2)"),
    v6([0, 0, 0, 0, 0, 0, 0, 1], 128, REFUSE, "loopback (RFC 4291 §2.5.3)"),
    v6([0, 0, 0, 0, 0, 0xffff, 0, 0], 96, LOW_32, "IPv4-mapped (RFC 4291 §2.5.5.2)"),
    v6([0, 0, 0, 0, 0, 0, 0, 0], 96, LOW_32, "IPv4-compatible, deprecated (RFC 4291 §2.5.5.1)"),
    v6([0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96, LOW_32, "NAT64 well-known prefix (RFC 6052)"),
    v6([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, REFUSE, "NAT64 local use (RFC 8215)"),
    v6([0x100, 0, 0, 0, 0, 0, 0, 0], 64, REFUSE, "discard-only (RFC 6666)"),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, REFUSE, "Teredo (RFC 4380)"),
    v6([0x2001, 0, 0, 0, 0, 0, 0, 0], 23, REFUSE, "IETF protocol assignments (RFC 2928)"),
    v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, REFUSE, "documentation (RFC 3849)"),
    v6([0x2002, 0, 0, 0, 0, 0, 0, 0], 16, V6Rule::EmbeddedV4 { at: 16 }, "6to4 (RFC 3056)"),
    v6([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, REFUSE, "documentation (RFC 9637)"),
    v6([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, REFUSE, "unique local (RFC 4193)"),
    v6([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, REFUSE, "link-local (RFC 4291 §2.5.6)"),
    v6([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, REFUSE, "site-local, deprecated (RFC 3879)"),
    v6([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, REFUSE, "multicast (RFC 4291 §2.7)"),
];

/// Global unicast (RFC 4291 §2.4, IANA's IPv6 address space registry). An IPv6 address in
/// no [`REFUSED_V6`] row is allowed only inside it: all else is unassigned, reserved space.
/// (Its `rule` is not read.)
pub static GLOBAL_UNICAST_V6: V6Range = v6(
    [0x2000, 0, 0, 0, 0, 0, 0, 0],
    3,
    REFUSE,
    "global unicast (RFC 4291 §2.4)",
);

/// How the guard judges an IPv6 address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum V6Judgement {
    /// Plain global unicast: allowed.
    Global,
    /// In a refused row.
    Refused(&'static V6Range),
    /// In `row`, whose embedded address `embedded` is in the refused IPv4 range `v4`.
    Embedded {
        /// The row of [`REFUSED_V6`] that contains the address.
        row: &'static V6Range,
        /// The IPv4 address it embeds.
        embedded: Ipv4Addr,
        /// The row of [`REFUSED_V4`] that contains `embedded`.
        v4: &'static V4Range,
    },
    /// In no row, and outside [`GLOBAL_UNICAST_V6`]: reserved.
    Reserved,
}

/// Judge `a` by [`REFUSED_V6`] (and [`REFUSED_V4`] for an embedded IPv4 address).
pub fn judge_v6(a: Ipv6Addr) -> V6Judgement {
    match REFUSED_V6.iter().find(|r| r.contains(a)) {
        Some(row) => match row.embedded(a) {
            None => V6Judgement::Refused(row),
            Some(embedded) => match refused_v4(embedded) {
                Some(v4) => V6Judgement::Embedded { row, embedded, v4 },
                None => V6Judgement::Global,
            },
        },
        None if GLOBAL_UNICAST_V6.contains(a) => V6Judgement::Global,
        None => V6Judgement::Reserved,
    }
}

/// An absolute `http://` or `https://` URL with a host (RFC 3986, as `http::Uri` reads it):
/// the first of the `url` rules, before the webhook URL guard.
pub fn is_http_url(s: &str) -> bool {
    let Ok(uri) = s.parse::<http::Uri>() else {
        return false;
    };
    matches!(uri.scheme_str(), Some("http") | Some("https"))
        && uri.authority().is_some_and(|a| !a.host().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard() -> WebhookGuard {
        WebhookGuard::default()
    }

    fn refused(url: &str) -> String {
        match check_url(url, &guard()) {
            Ok(()) => panic!("{url} was allowed"),
            Err(d) => d.into_owned(),
        }
    }

    #[track_caller]
    fn assert_allowed(url: &str, g: &WebhookGuard) {
        assert_eq!(check_url(url, g), Ok(()), "{url}");
    }

    #[track_caller]
    fn assert_private(url: &str, shows: &str) {
        let d = refused(url);
        assert!(
            d.starts_with("must not point into a private network: ") && d.contains(shows),
            "{url}: {d}"
        );
    }

    #[test]
    fn every_spelling_the_parser_accepts_is_judged_as_resolved() {
        let cases = [
            ("http://2130706433/", "127.0.0.1 is in 127.0.0.0/8, loopback"),
            ("http://0x7f.1/", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://0177.0.0.1/", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://127.1/", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://127.0.1/", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://0x7f000001/", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://017700000001/", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://0X7F.0x00.0.01/", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://127.0.0.1./", "127.0.0.1 is in 127.0.0.0/8"),
            ("http://0/", "0.0.0.0 is in 0.0.0.0/8"),
            (
                "http://[::ffff:127.0.0.1]/",
                "::ffff:127.0.0.1 is in ::ffff:0.0.0.0/96, IPv4-mapped (RFC 4291 §2.5.5.2) and embeds 127.0.0.1, which is in 127.0.0.0/8",
            ),
            ("http://[::ffff:7f00:1]/", "embeds 127.0.0.1"),
            ("http://[0:0:0:0:0:FFFF:A9FE:A9FE]/", "embeds 169.254.169.254"),
            ("http://[::127.0.0.1]/", "IPv4-compatible, deprecated (RFC 4291 §2.5.5.1) and embeds 127.0.0.1"),
            ("http://[::a00:1]/", "embeds 10.0.0.1"),
            ("http://[64:ff9b::a9fe:a9fe]/", "NAT64 well-known prefix (RFC 6052) and embeds 169.254.169.254"),
            ("http://[64:ff9b::192.168.0.1]/", "embeds 192.168.0.1"),
            ("http://[2002:a9fe:a9fe::]/", "6to4 (RFC 3056) and embeds 169.254.169.254"),
            ("http://[2002:7f00:1:ffff::1]/", "embeds 127.0.0.1"),
            ("http://localhost/", "`localhost` is under `localhost`"),
            ("http://LOCALHOST./", "`localhost` is under `localhost`"),
            ("http://Api.LocalHost:8080/", "`api.localhost` is under `localhost`"),
            ("http://printer.local/", "`printer.local` is under `local`, link-local multicast DNS"),
            ("http://metadata.google.internal/", "`metadata.google.internal` is under `internal`"),
            ("http://internal/", "under `internal`"),
            ("http://nas.home.arpa/", "`nas.home.arpa` is under `home.arpa`"),
            ("http://169.254.169.254/latest/meta-data", "169.254.169.254 is in 169.254.0.0/16, link-local"),
            ("https://169.254.169.254:443/latest/meta-data?x=1#y", "169.254.169.254"),
        ];
        for (url, shows) in cases {
            assert_private(url, shows);
        }
        // Found by fuzzing: two trailing dots keep the parser from reading a number, and no
        // resolver takes an empty label.
        for url in [
            "http://localhost../",
            "http://127.0.0.1../",
            "http://a..b.example/",
        ] {
            let why = check_url(url, &guard()).unwrap_err();
            assert!(why.contains("an empty label"), "{url}: {why}");
        }
    }

    /// Rule 0 (`http::Uri`) takes no percent-escape and no non-ASCII character in a host, so
    /// these never reach the guard; the guard alone would judge them as resolved too.
    #[test]
    fn escaped_and_unicode_hosts_are_refused_first_and_would_be_judged_as_resolved() {
        let cases = [
            ("http://%6c%6fcalhost/", "`localhost` is under `localhost`"),
            ("http://%31%32%37.0.0.1/", "127.0.0.1 is in 127.0.0.0/8"),
            (
                "http://\u{ff11}\u{ff12}\u{ff17}.0.0.1/",
                "127.0.0.1 is in 127.0.0.0/8",
            ),
            (
                "http://\u{24db}ocalhost/",
                "`localhost` is under `localhost`",
            ),
            (
                "http://METADATA.google.%49nternal./",
                "`metadata.google.internal` is under",
            ),
            (
                "http://\u{ff4c}ocalhost\u{3002}/",
                "`localhost` is under `localhost`",
            ),
        ];
        for (url, shows) in cases {
            assert_eq!(refused(url), NOT_HTTP_URL, "{url}");
            let d = judge(url, &guard()).unwrap_err();
            assert!(d.contains(shows), "{url}: {d}");
        }
        assert_eq!(
            judge("ftp://example.com/", &guard()),
            Err(NOT_HTTP_URL.into())
        );
    }

    #[test]
    fn names_that_only_end_like_a_zone_are_public() {
        for url in [
            "https://notlocalhost.example/x",
            "https://localhost.example.com/x",
            "https://mylocal.example/x",
            "https://local.example/x",
            "https://internal.example.com/x",
            "https://homearpa.net/x",
            "https://arpa.example/x",
        ] {
            assert_allowed(url, &guard());
        }
    }

    #[test]
    fn single_label_names_are_refused_unless_listed() {
        for url in [
            "http://metadata/computeMetadata/v1/",
            "https://intranet./",
            "http://db:5432/",
        ] {
            let e = check_url(url, &guard()).unwrap_err();
            assert!(e.contains("single-label"), "{url}: {e}");
        }
        let listed = WebhookGuard {
            allow_hosts: vec!["relay".into()],
            ..guard()
        };
        assert_allowed("https://relay/in", &listed);
    }

    #[test]
    fn user_info_is_refused() {
        for url in [
            "http://user:pw@example.com/",
            "http://user@example.com/",
            "https://:pw@example.com/",
            "https://@example.com/",
            "https://example.com@127.0.0.1/",
        ] {
            assert_eq!(
                refused(url),
                "must not contain user info (user@ or user:password@)",
                "{url}"
            );
        }
        // An `@` after the authority is not user info.
        assert_allowed("https://example.com/a@b?c=@d", &guard());
    }

    /// The first and last address of every IPv4 row, and the public neighbours of each.
    #[test]
    fn every_ipv4_range_is_refused_to_its_edges() {
        let refused_v4 = [
            ("0.0.0.0", "0.0.0.0/8"),
            ("0.255.255.255", "0.0.0.0/8"),
            ("10.0.0.0", "10.0.0.0/8, private (RFC 1918)"),
            ("10.255.255.255", "10.0.0.0/8"),
            ("100.64.0.0", "100.64.0.0/10, shared address space"),
            ("100.127.255.255", "100.64.0.0/10"),
            ("127.0.0.0", "127.0.0.0/8, loopback"),
            ("127.255.255.255", "127.0.0.0/8"),
            ("169.254.0.0", "169.254.0.0/16, link-local"),
            ("169.254.255.255", "169.254.0.0/16"),
            ("172.16.0.0", "172.16.0.0/12, private"),
            ("172.31.255.255", "172.16.0.0/12"),
            ("192.0.0.0", "192.0.0.0/24, IETF protocol assignments"),
            ("192.0.0.255", "192.0.0.0/24"),
            ("192.0.2.0", "192.0.2.0/24, documentation"),
            ("192.0.2.255", "192.0.2.0/24"),
            ("192.88.99.0", "192.88.99.0/24, 6to4 relay anycast"),
            ("192.88.99.255", "192.88.99.0/24"),
            ("192.168.0.0", "192.168.0.0/16, private"),
            ("192.168.255.255", "192.168.0.0/16"),
            ("198.18.0.0", "198.18.0.0/15, benchmarking"),
            ("198.19.255.255", "198.18.0.0/15"),
            ("198.51.100.0", "198.51.100.0/24, documentation"),
            ("198.51.100.255", "198.51.100.0/24"),
            ("203.0.113.0", "203.0.113.0/24, documentation"),
            ("203.0.113.255", "203.0.113.0/24"),
            ("224.0.0.0", "224.0.0.0/4, multicast"),
            ("239.255.255.255", "224.0.0.0/4"),
            ("240.0.0.0", "240.0.0.0/4, reserved"),
            ("255.255.255.254", "240.0.0.0/4"),
            ("255.255.255.255", "255.255.255.255/32, limited broadcast"),
        ];
        for (ip, row) in refused_v4 {
            assert_private(&format!("http://{ip}/"), &format!("{ip} is in {row}"));
        }
        let public = [
            "1.0.0.0",
            "9.255.255.255",
            "11.0.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "126.255.255.255",
            "128.0.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "191.255.255.255",
            "192.0.1.0",
            "192.0.3.0",
            "192.88.98.255",
            "192.88.100.0",
            "192.167.255.255",
            "192.169.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.99.255",
            "198.51.101.0",
            "203.0.112.255",
            "203.0.114.0",
            "223.255.255.255",
            "93.184.216.34",
            "8.8.8.8",
        ];
        for ip in public {
            assert_allowed(&format!("http://{ip}/"), &guard());
        }
    }

    #[test]
    fn every_ipv6_range_is_refused_to_its_edges() {
        let refused_v6 = [
            ("::", "::/128, unspecified"),
            ("::1", "::1/128, loopback"),
            ("64:ff9b:1::", "64:ff9b:1::/48, NAT64 local use"),
            ("64:ff9b:1:ffff:ffff:ffff:ffff:ffff", "64:ff9b:1::/48"),
            ("100::", "100::/64, discard-only"),
            ("100::ffff:ffff:ffff:ffff", "100::/64"),
            ("2001::", "2001::/32, Teredo"),
            ("2001:0:ffff:ffff:ffff:ffff:ffff:ffff", "2001::/32, Teredo"),
            ("2001:1::1", "2001::/23, IETF protocol assignments"),
            ("2001:1ff:ffff:ffff:ffff:ffff:ffff:ffff", "2001::/23"),
            ("2001:db8::", "2001:db8::/32, documentation"),
            ("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "2001:db8::/32"),
            ("3fff::", "3fff::/20, documentation"),
            ("3fff:fff:ffff:ffff:ffff:ffff:ffff:ffff", "3fff::/20"),
            ("fc00::", "fc00::/7, unique local"),
            ("fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fc00::/7"),
            ("fe80::", "fe80::/10, link-local"),
            ("febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fe80::/10"),
            ("fec0::", "fec0::/10, site-local"),
            ("feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fec0::/10"),
            ("ff00::", "ff00::/8, multicast"),
            ("ff02::1", "ff00::/8"),
            ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ff00::/8"),
        ];
        for (ip, row) in refused_v6 {
            let a: Ipv6Addr = ip.parse().unwrap();
            assert_private(&format!("http://[{ip}]/"), &format!("{a} is in {row}"));
        }
        // Outside 2000::/3 and every special row: reserved.
        for ip in [
            "1::1",
            "64:ff9b:2::1",
            "::ffff:0:7f00:1",
            "4000::1",
            "fb00::1",
        ] {
            let a: Ipv6Addr = ip.parse().unwrap();
            assert_private(
                &format!("http://[{ip}]/"),
                &format!(
                    "{a} is reserved: outside 2000::/3, global unicast (RFC 4291 §2.4) and every special range"
                ),
            );
        }
        let public = [
            "2606:4700::1111",
            "2001:200::1",
            "2001:db7:ffff:ffff:ffff:ffff:ffff:ffff",
            "2001:db9::",
            "2003::1",
            "2000::",
            "3ffe:ffff::1",
            "3fff:1000::",
            "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            "::ffff:93.184.216.34",
            "::8.8.8.8",
            "64:ff9b::8.8.8.8",
            "2002:5db8:d822::1",
        ];
        for ip in public {
            assert_allowed(&format!("http://[{ip}]/"), &guard());
        }
    }

    #[test]
    fn public_hosts_and_addresses_are_allowed() {
        for url in [
            "https://hooks.example.com/x",
            "http://93.184.216.34/",
            "http://[2606:4700::1111]/",
            "https://hooks.example.com:8443/in?x=1#frag",
            "HTTPS://Hooks.Example.COM./x",
            "https://xn--bcher-kva.example/x",
        ] {
            assert_allowed(url, &guard());
        }
    }

    #[test]
    fn the_http_check_comes_first() {
        for url in [
            "ftp://127.0.0.1/",
            "localhost/x",
            "/relative",
            "https://",
            "http://a b/",
        ] {
            assert_eq!(refused(url), NOT_HTTP_URL, "{url}");
        }
        // Accepted by the first check, refused by the WHATWG parser: refused.
        for url in [
            "http://999.0.0.1/",
            "http://1.2.3.4.5/",
            "http://example.com:99999/",
        ] {
            assert_eq!(
                refused(url),
                "must be a URL that parses by the WHATWG URL Standard",
                "{url}"
            );
        }
    }

    #[test]
    fn allow_http_false_takes_https_only() {
        let g = WebhookGuard {
            allow_http: false,
            ..guard()
        };
        assert_eq!(
            check_url("http://hooks.example.com/x", &g),
            Err("must be an https:// URL".into())
        );
        assert_eq!(
            check_url("HTTP://hooks.example.com/x", &g),
            Err("must be an https:// URL".into())
        );
        assert_allowed("https://hooks.example.com/x", &g);
        // User info is named before the scheme; private hosts stay private over https.
        assert!(check_url("http://u@hooks.example.com/", &g)
            .unwrap_err()
            .contains("user info"));
        assert!(check_url("https://127.0.0.1/", &g)
            .unwrap_err()
            .contains("private network"));
    }

    #[test]
    fn allow_hosts_exempts_exactly_the_hosts_listed() {
        let g = WebhookGuard {
            allow_hosts: vec!["relay.internal".into(), "hooks.local.".into()],
            ..guard()
        };
        for url in [
            "http://relay.internal/in",
            "https://RELAY.Internal./in",
            "https://relay.internal:8443/in",
            "https://hooks.local/in",
        ] {
            assert_allowed(url, &g);
        }
        for url in [
            "http://x.relay.internal/in",
            "http://relayinternal.internal/in",
            "http://other.internal/in",
            "http://x.hooks.local/in",
        ] {
            assert!(
                check_url(url, &g).unwrap_err().contains("private network"),
                "{url}"
            );
        }
        // The exemption comes after user info and the scheme.
        assert!(check_url("http://u:p@relay.internal/", &g)
            .unwrap_err()
            .contains("user info"));
        let https = WebhookGuard {
            allow_http: false,
            ..g
        };
        assert_eq!(
            check_url("http://relay.internal/", &https),
            Err("must be an https:// URL".into())
        );
        assert_allowed("https://relay.internal/", &https);
    }

    #[test]
    fn a_disabled_guard_keeps_only_the_http_check() {
        let g = WebhookGuard {
            enabled: false,
            allow_http: false,
            allow_hosts: vec![],
        };
        for url in [
            "http://127.0.0.1/",
            "http://localhost/",
            "http://user:pw@example.com/",
            "http://[::1]/",
            "http://999.0.0.1/",
        ] {
            assert_allowed(url, &g);
        }
        assert_eq!(
            check_url("ftp://example.com/", &g),
            Err(NOT_HTTP_URL.into())
        );
    }

    #[test]
    fn a_long_name_is_shown_bounded() {
        let label = "a".repeat(60);
        let url = format!(
            "http://{label}.{label}.{label}.{label}.internal/{}",
            "p".repeat(5000)
        );
        let d = refused(&url);
        assert!(d.len() < 200, "{d}");
        assert!(d.contains(&format!("`{label}.{}…`", &label[..3])), "{d}");
    }

    /// The longest details there are: every IPv4 row embedded in every embedding IPv6 row,
    /// with every other bit set (the longest text), every row's last address, a long name.
    #[test]
    fn every_detail_is_at_most_256_characters() {
        let mut urls = vec![format!("http://{}.internal/", "a".repeat(200))];
        for r in &REFUSED_V4 {
            let last = Ipv4Addr::from(u32::from(r.net) | !r.mask());
            urls.push(format!("http://{last}/"));
        }
        for r in &REFUSED_V6 {
            let last = Ipv6Addr::from(u128::from(r.net) | !r.mask());
            urls.push(format!("http://[{last}]/"));
            let V6Rule::EmbeddedV4 { at } = r.rule else {
                continue;
            };
            let shift = 96 - u32::from(at);
            for v4 in &REFUSED_V4 {
                let embedded = u32::from(v4.net) | !v4.mask();
                let rest = !r.mask() & !(u128::from(u32::MAX) << shift);
                let a = Ipv6Addr::from(u128::from(r.net) | rest | u128::from(embedded) << shift);
                urls.push(format!("http://[{a}]/"));
            }
        }
        let mut longest = 0;
        for url in &urls {
            let d = refused(url);
            longest = longest.max(d.chars().count());
            assert!(d.chars().count() <= 256, "{url}: {d}");
        }
        assert!(longest > 200, "the worst case was not reached: {longest}");
    }

    #[test]
    fn the_tables_are_well_formed() {
        for r in &REFUSED_V4 {
            assert!(r.prefix <= 32, "{r}");
            assert_eq!(u32::from(r.net) & !r.mask(), 0, "host bits set: {r}");
        }
        for r in REFUSED_V6.iter().chain([&GLOBAL_UNICAST_V6]) {
            assert!(r.prefix <= 128, "{r}");
            assert_eq!(u128::from(r.net) & !r.mask(), 0, "host bits set: {r}");
            if let V6Rule::EmbeddedV4 { at } = r.rule {
                assert!(u32::from(at) + 32 <= 128 && at >= r.prefix, "{r}");
            }
        }
        // No row is hidden whole behind an earlier one.
        for (i, r) in REFUSED_V4.iter().enumerate() {
            assert_eq!(refused_v4(r.net), Some(r), "{r}");
            assert!(REFUSED_V4[..i]
                .iter()
                .all(|e| !e.contains(r.net) || e.prefix > r.prefix));
        }
        for (i, r) in REFUSED_V6.iter().enumerate() {
            assert!(REFUSED_V6[..i]
                .iter()
                .all(|e| !e.contains(r.net) || e.prefix > r.prefix));
        }
    }
}

#[cfg(test)]
mod properties {
    //! IPv4 addresses from the refused and the public space, written in every spelling the
    //! WHATWG host parser accepts; IPv6 addresses from every row. Generated from the tables.

    use super::*;
    use proptest::prelude::*;
    use proptest::sample::select;
    use proptest::test_runner::Config as ProptestConfig;

    fn cfg(cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// An address in `row`: its network with random host bits.
    fn in_v4(row: &V4Range, bits: u32) -> u32 {
        u32::from(row.net) | (bits & !row.mask())
    }

    fn refused_v4_addr() -> impl Strategy<Value = u32> {
        (select(&REFUSED_V4[..]), any::<u32>()).prop_map(|(row, bits)| in_v4(&row, bits))
    }

    fn public_v4_addr() -> impl Strategy<Value = u32> {
        any::<u32>().prop_filter("public", |a| refused_v4(Ipv4Addr::from(*a)).is_none())
    }

    /// How one number is written: radix (0 decimal, 1 octal, 2 hex), extra leading zeros,
    /// upper case (hex).
    #[derive(Clone, Copy, Debug)]
    struct Num {
        radix: u8,
        zeros: usize,
        upper: bool,
    }

    fn num() -> impl Strategy<Value = Num> {
        (0u8..3, 0usize..4, any::<bool>()).prop_map(|(radix, zeros, upper)| Num {
            radix,
            zeros,
            upper,
        })
    }

    fn write_num(n: u32, how: Num) -> String {
        let zeros = "0".repeat(how.zeros);
        match how.radix {
            // Decimal has no leading zeros: a leading zero makes it octal.
            0 => n.to_string(),
            1 => format!("0{zeros}{n:o}"),
            _ if how.upper => format!("0X{zeros}{n:X}"),
            _ => format!("0x{zeros}{n:x}"),
        }
    }

    /// How an IPv4 address is written.
    #[derive(Clone, Debug)]
    enum Spelling {
        /// `parts` numbers (1–4); the last holds the remaining bytes; maybe a trailing dot.
        V4 {
            parts: usize,
            nums: [Num; 4],
            dot: bool,
        },
        /// An IPv6 address with the IPv4 address embedded: a prefix (`::ffff:`, `::`,
        /// `64:ff9b::`, 6to4) and the IPv4 part in dotted decimal or two hex groups.
        V6 {
            prefix: u8,
            dotted: bool,
            expand: bool,
            upper: bool,
        },
    }

    fn spelling() -> impl Strategy<Value = Spelling> {
        prop_oneof![
            3 => (1usize..=4, [num(), num(), num(), num()], any::<bool>())
                .prop_map(|(parts, nums, dot)| Spelling::V4 { parts, nums, dot }),
            2 => (0u8..4, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
                |(prefix, dotted, expand, upper)| Spelling::V6 { prefix, dotted, expand, upper }
            ),
        ]
    }

    /// `a` as the host of a URL, spelled `how`.
    fn spell(a: u32, how: &Spelling) -> String {
        match *how {
            Spelling::V4 { parts, nums, dot } => {
                let bytes = a.to_be_bytes();
                let mut out: Vec<String> = (0..parts - 1)
                    .map(|i| write_num(u32::from(bytes[i]), nums[i]))
                    .collect();
                let rest = a & (u32::MAX >> (8 * (parts as u32 - 1)));
                out.push(write_num(rest, nums[parts - 1]));
                let mut host = out.join(".");
                if dot {
                    host.push('.');
                }
                host
            }
            Spelling::V6 {
                prefix,
                dotted,
                expand,
                upper,
            } => {
                let (hi, lo) = ((a >> 16) as u16, a as u16);
                let v4 = if dotted {
                    Ipv4Addr::from(a).to_string()
                } else {
                    format!("{hi:x}:{lo:x}")
                };
                let s = match (prefix, expand) {
                    (0, false) => format!("::ffff:{v4}"),
                    (0, true) => format!("0:0:0:0:0:ffff:{v4}"),
                    (1, false) => format!("::{v4}"),
                    (1, true) => format!("0:0:0:0:0:0:{v4}"),
                    (2, false) => format!("64:ff9b::{v4}"),
                    (2, true) => format!("0064:ff9b:0:0:0:0:{v4}"),
                    // 6to4: the IPv4 address in the second and third groups.
                    (_, false) => format!("2002:{hi:x}:{lo:x}::1"),
                    (_, true) => format!("2002:{hi:04x}:{lo:04x}:0:0:0:0:1"),
                };
                let s = if upper { s.to_uppercase() } else { s };
                format!("[{s}]")
            }
        }
    }

    fn url(scheme: bool, host: &str, path: &str) -> String {
        let scheme = if scheme { "https" } else { "http" };
        format!("{scheme}://{host}/{path}")
    }

    proptest! {
        #![proptest_config(cfg(2000))]

        #[test]
        fn refused_ipv4_in_any_spelling_is_refused(
            a in refused_v4_addr(),
            how in spelling(),
            https in any::<bool>(),
            path in "[a-z0-9/]{0,8}",
        ) {
            let host = spell(a, &how);
            // The spelling means the address (the parser agrees with the generator).
            let parsed = Url::parse(&url(https, &host, &path)).unwrap();
            if let Spelling::V4 { .. } = how {
                prop_assert_eq!(parsed.host(), Some(Host::Ipv4(Ipv4Addr::from(a))), "{}", host);
            }
            let shown = Ipv4Addr::from(a);
            let d = check_url(&url(https, &host, &path), &WebhookGuard::default()).err();
            let d = d.unwrap_or_else(|| panic!("{host} ({shown}) was allowed"));
            prop_assert!(d.starts_with("must not point into a private network: "), "{}: {}", host, d);
            // Named as the address it means: itself, or the IPv4 address its IPv6 form embeds
            // (but `::` and `::1`, refused as themselves).
            let named = match (&how, parsed.host()) {
                (Spelling::V4 { .. }, _) => d.contains(&format!("{shown} is in ")),
                (_, Some(Host::Ipv6(v6))) => {
                    d.contains(&format!("embeds {shown}, which is in "))
                        || matches!(judge_v6(v6), V6Judgement::Refused(_))
                }
                _ => false,
            };
            prop_assert!(named, "{}: {}", host, d);
        }

        #[test]
        fn public_ipv4_in_any_spelling_is_allowed(
            a in public_v4_addr(),
            how in spelling(),
            https in any::<bool>(),
            path in "[a-z0-9/]{0,8}",
        ) {
            let host = spell(a, &how);
            let u = url(https, &host, &path);
            if let Spelling::V4 { .. } = how {
                let parsed = Url::parse(&u).unwrap();
                prop_assert_eq!(parsed.host(), Some(Host::Ipv4(Ipv4Addr::from(a))), "{}", host);
            }
            prop_assert_eq!(check_url(&u, &WebhookGuard::default()), Ok(()), "{}", host);
        }

        #[test]
        fn every_address_of_a_refused_ipv6_row_is_refused(
            row in select(
                REFUSED_V6.iter().filter(|r| r.rule == V6Rule::Refuse).collect::<Vec<_>>()
            ),
            bits in any::<u128>(),
            compress in any::<bool>(),
        ) {
            let a = Ipv6Addr::from(u128::from(row.net) | (bits & !row.mask()));
            prop_assert!(matches!(judge_v6(a), V6Judgement::Refused(_)), "{}", a);
            let host = if compress { a.to_string() } else {
                a.segments().map(|s| format!("{s:04X}")).join(":")
            };
            let d = check_url(&format!("http://[{host}]/"), &WebhookGuard::default())
                .unwrap_err();
            prop_assert!(d.contains(&format!("{a} is in ")), "{}: {}", host, d);
        }

        #[test]
        fn global_unicast_ipv6_outside_every_row_is_allowed(
            bits in any::<u128>()
                .prop_map(|b| u128::from(GLOBAL_UNICAST_V6.net) | (b & !GLOBAL_UNICAST_V6.mask()))
                .prop_filter("not special", |b| {
                    REFUSED_V6.iter().all(|r| !r.contains(Ipv6Addr::from(*b)))
                }),
        ) {
            let a = Ipv6Addr::from(bits);
            prop_assert_eq!(check_url(&format!("https://[{a}]/x"), &WebhookGuard::default()), Ok(()));
        }

        #[test]
        fn any_text_is_judged_without_panicking(s in "\\PC{0,60}", tail in "[a-zA-Z0-9.:@%\\[\\]/]{0,40}") {
            let g = WebhookGuard::default();
            let _ = check_url(&s, &g);
            let _ = check_url(&format!("http://{tail}"), &g);
            let _ = check_url(&format!("https://{s}"), &g);
        }
    }
}
