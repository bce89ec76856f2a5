//! The request line: the method policy and the guard of the checked operations, on any
//! method and path a client can send.
//!
//! Input: `METHOD path` (split at the first space). Seeds: `fuzz/seeds/request_target/`;
//! reproducers of the outside attack run's findings (another method, a lower-case `post`, a
//! near spelling of `/v2/settings/webhook/set`): `fuzz/regressions/request_target/`.
//!
//! Invariants checked, besides "never panics":
//! - `check_method` admits exactly `GET HEAD POST PUT PATCH DELETE OPTIONS` (byte for byte);
//! - no request reaches an operation with a body rule unchecked: whenever an upstream that
//!   reads paths loosely (ASCII case folded; each segment cut at its first byte that is not a
//!   letter or digit, as frameworks cut a format suffix or stray bytes; trailing segments
//!   ignored; and the same after the path is percent-decoded and its Unicode letters folded as
//!   Java's `equalsIgnoreCase` or Python's `casefold` fold them: `%C5%BF` is `s`, the Kelvin
//!   sign `k`) would route the path to a checked route, `classify` either refuses it, or gives
//!   that very route for its own method, or the path is an exact route's own path, whatever
//!   the method (the spec's `/v2/sendGroup/` beside the checked `/v2/sendGroup`);
//! - a `405` names the methods of the path in `Allow`, and never the method that was sent.

#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tollgate_core::config::routes::{Catalogue, MethodSel, PathMatch, Route};
use tollgate_core::path::normalize;
use tollgate_core::policy::classify::classify;
use tollgate_core::policy::method::check_method;
use tollgate_core::policy::Code;
use tollgate_fuzz::{percent_decoded, unicode_fold};

fn catalogue() -> &'static Catalogue {
    static CATALOGUE: OnceLock<Catalogue> = OnceLock::new();
    CATALOGUE.get_or_init(Catalogue::builtin)
}

/// The path as a loose upstream router reads it: lower case, each segment cut at its first
/// byte that is not a letter or digit.
fn loose_segments(path: &str) -> Vec<String> {
    path.to_ascii_lowercase()
        .split('/')
        .map(|s| {
            s.split(|c: char| !c.is_ascii_alphanumeric())
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

fn stem(r: &Route) -> String {
    let p = match &r.path {
        PathMatch::Exact(p) | PathMatch::Prefix(p) => p,
    };
    p.trim_end_matches('/').to_ascii_lowercase()
}

/// Whether a loose upstream would route `path` to `r`, as it came or decoded and folded.
fn loosely_routes_to(path: &str, r: &Route) -> bool {
    let want: Vec<String> = stem(r).split('/').map(str::to_string).collect();
    [path.to_string(), unicode_fold(&percent_decoded(path))]
        .iter()
        .any(|p| {
            let got = loose_segments(p);
            got.len() >= want.len() && got[..want.len()] == want[..]
        })
}

fn method_ok(r: &Route, method: &str) -> bool {
    match &r.method {
        MethodSel::Any => true,
        MethodSel::One(m) => m == method,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((method, path)) = text.split_once(' ') else {
        return;
    };
    let standard = matches!(
        method,
        "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS"
    );
    assert_eq!(check_method(method).is_ok(), standard, "{method:?}");
    if !standard {
        return;
    }
    let Ok(norm) = normalize(path) else {
        return;
    };
    let c = catalogue();
    let classified = classify(c, method, path);
    if let Err(r) = &classified {
        if r.code == Code::MethodNotAllowed {
            let allow = r.allow.as_deref().unwrap_or("");
            assert!(!allow.is_empty(), "{method} {path:?}: 405 without Allow");
            assert!(
                !allow.split(", ").any(|m| m == method),
                "{method} {path:?}: 405 allows {allow}"
            );
        }
    }
    for checked in c.routes().iter().filter(|r| r.body.is_some()) {
        if !loosely_routes_to(&norm, checked) {
            continue;
        }
        let Ok(got) = &classified else {
            continue;
        };
        let route = c.get(got.route);
        let itself = route.id == checked.id && method_ok(route, method);
        // The path is an operation's own spelling (the spec's `/v2/sendGroup/` beside the
        // checked `/v2/sendGroup`), whatever the method: the upstream tells them apart.
        let own_exact = c
            .routes()
            .iter()
            .any(|r| matches!(&r.path, PathMatch::Exact(p) if p.eq_ignore_ascii_case(&norm)));
        assert!(
            itself || own_exact,
            "{method} {path:?} would reach {} upstream, but is classified as {} (unchecked)",
            checked.id,
            route.id
        );
    }
});
