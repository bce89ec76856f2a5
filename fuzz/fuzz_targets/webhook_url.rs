//! The webhook URL guard: `policy::webhook::check_url` on any URL a customer can register,
//! under fixed guards and one built from the input.
//!
//! Input: the URL, optionally followed by a NUL byte and bytes from which `arbitrary` builds a
//! guard ([`Knobs`]: off, https only, exempt hosts). With no NUL the fuzzed guard is the
//! default one, so a seed is just a URL. Seeds: `fuzz/seeds/webhook_url/`.
//!
//! Invariants checked, besides "never panics":
//! - **no way in**: a URL the default guard allows names no loopback, private, link-local or
//!   otherwise special address, and no refused name (an oracle of its own, on std's address
//!   predicates, not the guard's tables), as the WHATWG parser reads it; and where `http::Uri`
//!   (the parser behind the guard's first check, and of hyper) reads a different host, that
//!   host is not private either; nor is a name allowed that has a single label;
//! - **monotone**: https-only allows less than the default, `allow_hosts` only adds, a guard
//!   that is off allows everything the others do, and refuses only what is not an http(s) URL;
//! - a refusal's detail is bounded (it is echoed in the answer);
//! - `check_body` for `webhook_set` refuses `/url` exactly when `check_url` does.

#![no_main]

use std::borrow::Cow;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use tollgate_core::config::WebhookGuard;
use tollgate_core::policy::webhook::is_http_url;
use tollgate_core::config::routes::BodyRule;
use tollgate_core::policy::webhook::{check_url, NOT_HTTP_URL};
use tollgate_fuzz::{check_body, MAX_BODY};
use url::{Host, Url};

/// A guard as an operator could write it; all-false is the default guard.
#[derive(Arbitrary, Debug)]
struct Knobs {
    off: bool,
    https_only: bool,
    allow_hosts: Vec<String>,
}

impl Knobs {
    fn guard(self) -> WebhookGuard {
        WebhookGuard {
            enabled: !self.off,
            allow_http: !self.https_only,
            // As the config validates them: lower-case host names, nothing else.
            allow_hosts: self
                .allow_hosts
                .into_iter()
                .map(|h| h.to_ascii_lowercase())
                .filter(|h| matches!(Host::parse(h), Ok(Host::Domain(d)) if d == *h))
                .collect(),
        }
    }
}

/// Exempt hosts of the loosened guard: names the default guard refuses.
const EXEMPT: [&str; 3] = ["localhost", "relay.internal", "hooks.local."];

/// A refusal's detail longer than this would echo the URL back.
const MAX_DETAIL: usize = 256;

/// Not plain global unicast IPv4, by std's predicates and the special-purpose registry.
fn special_v4(a: Ipv4Addr) -> bool {
    let [o0, o1, o2, _] = a.octets();
    a.is_unspecified()
        || a.is_loopback()
        || a.is_private()
        || a.is_link_local()
        || a.is_broadcast()
        || a.is_documentation()
        || a.is_multicast()
        || o0 == 0
        || o0 >= 240
        || (o0 == 100 && (64..128).contains(&o1))
        || (o0 == 192 && o1 == 0 && o2 == 0)
        || (o0 == 198 && (18..20).contains(&o1))
        || (o0 == 192 && o1 == 88 && o2 == 99)
}

/// Not plain global unicast IPv6; embedded IPv4 addresses judged as IPv4.
fn special_v6(a: Ipv6Addr) -> bool {
    let s = a.segments();
    let bits = u128::from(a);
    let low32 = Ipv4Addr::from(bits as u32);
    if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) && !(s[5] == 0 && s[6] == 0) {
        // IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d
        return special_v4(low32);
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return special_v4(low32); // NAT64 well-known prefix
    }
    if s[0] == 0x2002 {
        return special_v4(Ipv4Addr::from((bits >> 80) as u32)); // 6to4
    }
    a.is_unspecified()
        || a.is_loopback()
        || a.is_multicast()
        || s[..2] == [0, 0]                     // ::/32 and around: no global unicast
        || (s[0] & 0xe000) != 0x2000            // outside 2000::/3
        || (s[0] & 0xfe00) == 0xfc00            // unique local
        || (s[0] & 0xffc0) == 0xfe80            // link-local
        || (s[0] == 0x2001 && s[1] < 0x200)     // IETF protocol assignments, Teredo
        || (s[0] == 0x2001 && s[1] == 0xdb8)    // documentation
        || (s[0] == 0x3fff && s[1] < 0x1000)    // documentation (RFC 9637)
        || s[..3] == [0x64, 0xff9b, 1] // NAT64 local use
}

fn refused_name(name: &str) -> bool {
    let name = name.trim_end_matches('.');
    ["localhost", "local", "internal", "home.arpa"]
        .iter()
        .any(|z| name == *z || name.ends_with(&format!(".{z}")))
}

/// The host of `url` as `http::Uri` reads it, when that differs from the WHATWG reading.
fn uri_host(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    Some(uri.host()?.to_ascii_lowercase())
}

/// Whether `host`, as text from `http::Uri` (no WHATWG normalization), is a private address
/// or name by the most literal reading.
fn uri_host_is_private(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => special_v4(a),
        Ok(IpAddr::V6(a)) => special_v6(a),
        Err(_) => refused_name(host),
    }
}

/// The guard allowed `url` (and was on, with `exempt` hosts): it must lead nowhere private.
fn check_allowed(url: &str, exempt: &[String]) {
    let parsed = Url::parse(url).unwrap_or_else(|e| panic!("{url:?} allowed, but {e}"));
    assert!(
        parsed.username().is_empty() && parsed.password().is_none(),
        "{url:?} allowed with user info"
    );
    match parsed.host() {
        Some(Host::Ipv4(a)) => assert!(!special_v4(a), "{url:?} allowed: {a} is not global"),
        Some(Host::Ipv6(a)) => assert!(!special_v6(a), "{url:?} allowed: {a} is not global"),
        Some(Host::Domain(d)) => {
            let bare = d.trim_end_matches('.');
            let exempted = exempt.iter().any(|h| h.trim_end_matches('.') == bare);
            assert!(
                exempted || !refused_name(d),
                "{url:?} allowed: {d} is a private name"
            );
            // A single label resolves only through a search domain (`http://metadata/`).
            assert!(
                exempted || bare.contains('.'),
                "{url:?} allowed: {d} is a single-label name"
            );
            // A name that is a number to the parser would have been an IPv4 address.
            assert!(
                bare.parse::<Ipv4Addr>().is_err(),
                "{url:?} allowed: {d} reads as IPv4"
            );
        }
        None => panic!("{url:?} allowed without a host"),
    }
    if let Some(h) = uri_host(url) {
        let whatwg = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
        let exempted = exempt
            .iter()
            .any(|e| e.trim_end_matches('.') == h.trim_end_matches('.'));
        if h != whatwg && !exempted {
            assert!(
                !uri_host_is_private(&h),
                "{url:?} allowed as host {whatwg:?}, but http::Uri reads host {h:?}"
            );
        }
    }
}

fn detail_ok(url: &str, r: &Result<(), Cow<'static, str>>) {
    if let Err(d) = r {
        assert!(
            d.chars().count() <= MAX_DETAIL,
            "{url:?}: a detail of {} characters: {d}",
            d.chars().count()
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let (url_bytes, knobs) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(url) = std::str::from_utf8(url_bytes) else {
        return;
    };
    let Ok(knobs) = Knobs::arbitrary_take_rest(Unstructured::new(knobs)) else {
        return;
    };
    let fuzzed = knobs.guard();

    let default = WebhookGuard::default();
    let https = WebhookGuard {
        allow_http: false,
        ..WebhookGuard::default()
    };
    let exempt: Vec<String> = EXEMPT.iter().map(|h| h.to_string()).collect();
    let loose = WebhookGuard {
        allow_hosts: exempt.clone(),
        ..WebhookGuard::default()
    };
    let off = WebhookGuard {
        enabled: false,
        ..WebhookGuard::default()
    };

    let r_default = check_url(url, &default);
    let r_https = check_url(url, &https);
    let r_loose = check_url(url, &loose);
    let r_off = check_url(url, &off);
    let r_fuzzed = check_url(url, &fuzzed);
    for r in [&r_default, &r_https, &r_loose, &r_off, &r_fuzzed] {
        detail_ok(url, r);
    }

    // Off: only the http(s) check.
    match &r_off {
        Ok(()) => assert!(is_http_url(url)),
        Err(d) => {
            assert!(!is_http_url(url));
            assert_eq!(d, NOT_HTTP_URL);
        }
    }
    // Monotone.
    if r_https.is_ok() {
        assert_eq!(
            r_default,
            Ok(()),
            "{url:?}: https-only allows what the default refuses"
        );
    }
    if r_default.is_ok() {
        assert_eq!(
            r_loose,
            Ok(()),
            "{url:?}: allow_hosts refuses what the default allows"
        );
    }
    for r in [&r_default, &r_https, &r_loose, &r_fuzzed] {
        if r.is_ok() {
            assert_eq!(
                r_off,
                Ok(()),
                "{url:?}: allowed by a guard, refused by none"
            );
        }
    }

    // No way in.
    if r_default.is_ok() {
        check_allowed(url, &[]);
    }
    if r_loose.is_ok() {
        check_allowed(url, &exempt);
    }
    if r_fuzzed.is_ok() && fuzzed.enabled {
        check_allowed(url, &fuzzed.allow_hosts);
        if !fuzzed.allow_http {
            assert_eq!(
                Url::parse(url).map(|u| u.scheme() == "https"),
                Ok(true),
                "{url:?}"
            );
        }
    }

    // The body rule agrees with the guard on `/url`.
    let body = serde_json::to_vec(&serde_json::json!({ "url": url })).expect("JSON");
    let url_refused = match check_body(BodyRule::WebhookSet, &body, MAX_BODY, &default) {
        Ok(_) => false,
        Err(r) => r.errors.iter().any(|e| e.pointer == "/url"),
    };
    assert_eq!(
        url_refused,
        r_default.is_err(),
        "{url:?}: check_body and check_url disagree ({r_default:?})"
    );
});
