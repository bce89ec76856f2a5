//! Classify: method + path → a catalogued route, and the exact path to forward.
//!
//! The path is normalized once, by [`crate::path::normalize`], and anything a server might read
//! two ways is refused (`400 invalid_path`) rather than guessed at. The query string is not part
//! of routing and is forwarded as is.
//!
//! **Case.** Routes match ASCII-case-insensitively, and a matched request is forwarded with the
//! catalogue's spelling of the matched part, so `/V2/Settings/Webhook/Set` *is* `webhook_set`
//! — for the allow-list, the body check and the upstream alike. No case variant of a restricted
//! path can be forwarded as something else.
//!
//! **Trailing slash.** `/v2/sendMessage` finds `/v2/sendMessage/` (and is forwarded with the
//! slash) unless the other spelling is a route of its own: `/v2/sendGroup` (event variant) and
//! `/v2/sendGroup/` (general) stay distinct, as the spec says.
//!
//! **Precedence.** Exact path with a matching method; then the same with the trailing slash
//! toggled; then the longest matching prefix route; then, under a partner prefix,
//! `404 unknown_route`; then, under `/v2/`, the synthetic `unknown` customer route (allowed
//! only to plans with `allow: all`); anything else is `404 unknown_route`.
//!
//! **Checked operations.** Before a path that no exact route of its method matched falls to a
//! prefix or to `unknown`, the catalogue's guard ([`Catalogue::guard`]) keeps the operations
//! with a body rule from being reached unchecked: their path with another method is
//! `405 method_not_allowed` (with `Allow`), and a near spelling of it (`/set.json`, `/set~`,
//! `/set%20`, `/set/x`) is `404 unknown_route`.
//!
//! **The catalogue's own spellings.** A path that is, byte for byte, an exact route's path as
//! the catalogue spells it (`/v2/sendMessage/`: what clients built from the spec send) is
//! classified by one lookup ([`Catalogue::spelled`]): each such path and method was classified
//! the long way when the policy was built, and the answer kept, so the lookup answers exactly
//! what the steps above would.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::config::routes::{Catalogue, Guard, PathMatch, RouteIdx, Spellings, METHODS};
use crate::path::{hex_val, normalize, PathError};
use crate::refusal::{Code, Refusal};

impl From<PathError> for Refusal {
    fn from(e: PathError) -> Self {
        Refusal::new(Code::InvalidPath, e.detail())
    }
}

/// A classified request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified<'a> {
    /// The route matched.
    pub route: RouteIdx,
    /// The path to forward (before the upstream's base path), in the catalogue's spelling for
    /// the matched part.
    pub path: Cow<'a, str>,
}

/// Paths longer than this are lower-cased on the heap; shorter ones on the stack.
const STACK_PATH: usize = 256;

/// Classify a request path (without its query).
#[inline]
pub fn classify<'a>(
    catalogue: &Catalogue,
    method: &str,
    path: &'a str,
) -> Result<Classified<'a>, Refusal> {
    match catalogue.spelled(path, method) {
        Some(route) => Ok(Classified {
            route,
            path: Cow::Borrowed(path),
        }),
        None => classify_steps(catalogue, method, path),
    }
}

/// The catalogue's exact paths as it spells them, with the route each method reaches there:
/// every (path, method) that [`classify_steps`] admits and forwards unchanged. Called once
/// per policy, when it is built ([`Catalogue::set_spellings`]).
pub(crate) fn spellings(catalogue: &Catalogue) -> Spellings {
    let mut out: Spellings = HashMap::default();
    for route in catalogue.routes() {
        let PathMatch::Exact(p) = &route.path else {
            continue;
        };
        for &m in METHODS {
            if let Ok(c) = classify_steps(catalogue, m, p) {
                if c.path == p.as_str() {
                    let slot = out.entry(p.clone().into_boxed_str()).or_default();
                    if !slot.iter().any(|&(have, _)| have == m) {
                        slot.push((m, c.route));
                    }
                }
            }
        }
    }
    out
}

/// The steps of [`classify`]: normalize, match, guard.
fn classify_steps<'a>(
    catalogue: &Catalogue,
    method: &str,
    path: &'a str,
) -> Result<Classified<'a>, Refusal> {
    let norm = normalize(path)?;
    let mut stack = [0u8; STACK_PATH];
    let mut heap = Vec::new();
    let lower: &str = {
        let buf: &mut [u8] = if norm.len() <= STACK_PATH {
            &mut stack[..norm.len()]
        } else {
            heap.resize(norm.len(), 0);
            &mut heap[..]
        };
        buf.copy_from_slice(norm.as_bytes());
        buf.make_ascii_lowercase();
        std::str::from_utf8(buf).expect("normalized paths are ASCII")
    };

    let found = match_route(catalogue, method, lower);
    // Nor by a Unicode spelling that a case-insensitive comparison behind takes for it.
    if let Some(folded) = unicode_folded(lower) {
        let as_folded = match_route(catalogue, method, &folded);
        if as_folded.is_some_and(|r| catalogue.get(r).body.is_some())
            || catalogue.guard(&folded, as_folded).is_some()
        {
            return Err(Refusal::new(
                Code::UnknownRoute,
                "no such operation (a Unicode spelling of a checked one)",
            ));
        }
    }
    // A checked operation is reached by its own method and spelling only.
    match catalogue.guard(lower, found) {
        None => {}
        Some(Guard::OtherMethod(allow)) => {
            let mut r = Refusal::new(
                Code::MethodNotAllowed,
                format!("this operation takes {allow} only"),
            );
            r.allow = Some(allow.to_owned().into());
            return Err(r);
        }
        Some(Guard::NearSpelling) => {
            return Err(Refusal::new(
                Code::UnknownRoute,
                "no such operation (a near spelling of a checked one)",
            ))
        }
    }
    let route = match found {
        Some(r) => r,
        None if catalogue.in_partner_namespace(lower) => {
            return Err(Refusal::new(
                Code::UnknownRoute,
                "no such partner operation",
            ))
        }
        None if lower.starts_with("/v2/") => {
            return Ok(Classified {
                route: catalogue.unknown(),
                path: norm,
            });
        }
        None => {
            return Err(Refusal::new(
                Code::UnknownRoute,
                "only paths under /v2/ are served",
            ))
        }
    };
    let forwarded = match &catalogue.get(route).path {
        PathMatch::Exact(p) => {
            if norm == p.as_str() {
                norm
            } else {
                Cow::Owned(p.clone())
            }
        }
        PathMatch::Prefix(p) => {
            // `norm` matched `p` case-insensitively over `n` bytes (all of it, or all but the
            // slash for `/v2/client`); re-spell those bytes as the catalogue does.
            let n = p.len().min(norm.len());
            if norm.as_bytes()[..n] == p.as_bytes()[..n] {
                norm
            } else {
                Cow::Owned(format!("{}{}", &p[..n], &norm[n..]))
            }
        }
    };
    Ok(Classified {
        route,
        path: forwarded,
    })
}

/// A normalized path with percent-encoded non-ASCII text (`%C5%BF`, `ſ`) as a Unicode-aware,
/// case-insensitive comparison reads it (Java's `equalsIgnoreCase`, Python's `casefold()`,
/// JavaScript's `/iu`: `ſ` is `s`, the Kelvin sign `k`, `İ` and `ı` are `i`); `None` for a
/// path with no such text. Each character that folds to ASCII is replaced by its fold; any
/// other character, and every byte that is not UTF-8 (a truncated `%C2`, which a lossy
/// decoder reads as U+FFFD), keeps its escape. The result is ASCII, so the near-spelling
/// guard judges it as it judges any path: `sett%C4%B0ngs/webhook/set%C2` is the webhook's
/// `settings` with a stray byte after `set`.
fn unicode_folded(lower: &str) -> Option<String> {
    let b = lower.as_bytes();
    let encoded_high = b
        .windows(3)
        .any(|w| w[0] == b'%' && matches!(w[1], b'8'..=b'9' | b'a'..=b'f'));
    if !encoded_high {
        return None;
    }
    let mut out = String::with_capacity(b.len());
    let mut run = Vec::new();
    let mut i = 0;
    while i <= b.len() {
        let high = (b.get(i) == Some(&b'%'))
            .then(|| Some((hex_val(*b.get(i + 1)?)?, hex_val(*b.get(i + 2)?)?)))
            .flatten()
            .map(|(h, l)| h * 16 + l)
            .filter(|&v| v >= 0x80);
        if let Some(v) = high {
            run.push(v);
            i += 3;
            continue;
        }
        if !run.is_empty() {
            fold_run(&run, &mut out);
            run.clear();
        }
        if let Some(&c) = b.get(i) {
            out.push(char::from(c));
        }
        i += 1;
    }
    Some(out)
}

/// One run of decoded high bytes, folded into `out`: a character whose fold is ASCII as its
/// fold, anything else as its lower-case escapes.
fn fold_run(run: &[u8], out: &mut String) {
    use std::fmt::Write;
    let escape = |out: &mut String, bytes: &[u8]| {
        for v in bytes {
            let _ = write!(out, "%{v:02x}");
        }
    };
    for chunk in run.utf8_chunks() {
        for c in chunk.valid().chars() {
            let folded: String = super::body::fold_char(c).collect();
            if folded.is_ascii() {
                out.push_str(&folded.to_ascii_lowercase());
            } else {
                escape(out, c.encode_utf8(&mut [0; 4]).as_bytes());
            }
        }
        escape(out, chunk.invalid());
    }
}

/// Find the route for a lower-cased, normalized path.
fn match_route(catalogue: &Catalogue, method: &str, lower: &str) -> Option<RouteIdx> {
    if let Some(r) = catalogue.exact(lower, method) {
        return Some(r);
    }
    // `lower` with a trailing slash added, for the toggle and the prefix-without-slash match.
    let with_slash = (!lower.ends_with('/')).then(|| format!("{lower}/"));
    // One trailing slash either way, unless the path as written is a route of its own.
    if !catalogue.has_exact_path(lower) {
        let toggled = lower.strip_suffix('/').or(with_slash.as_deref());
        if let Some(r) = toggled.and_then(|t| catalogue.exact(t, method)) {
            return Some(r);
        }
    }
    // Longest prefix: `lower` itself taken as a prefix when it ends in `/`, then every shorter
    // cut at a `/`. The prefix written without its slash (`/v2/client`) also matches.
    if let Some(r) = with_slash
        .as_deref()
        .and_then(|w| catalogue.prefix(w, method))
    {
        return Some(r);
    }
    let mut end = lower.len();
    while let Some(pos) = lower[..end].rfind('/') {
        if let Some(r) = catalogue.prefix(&lower[..=pos], method) {
            return Some(r);
        }
        if pos == 0 {
            break;
        }
        end = pos;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(c: &Catalogue, method: &str, path: &str) -> Result<(String, String), Code> {
        classify(c, method, path)
            .map(|m| (c.get(m.route).id.clone(), m.path.into_owned()))
            .map_err(|r| r.code)
    }

    #[test]
    fn routes_by_exact_path_and_method() {
        let c = Catalogue::builtin();
        assert_eq!(
            id(&c, "POST", "/v2/sendMessage/").unwrap().0,
            "send_message"
        );
        assert_eq!(
            id(&c, "GET", "/v2/groupChat/getGroupList/").unwrap().0,
            "group_list"
        );
        assert_eq!(
            id(&c, "POST", "/v2/settings/webhook/set").unwrap().0,
            "webhook_set"
        );
        assert_eq!(
            id(&c, "POST", "/v2/service/upgrade").unwrap().0,
            "service_upgrade"
        );
    }

    #[test]
    fn send_group_variants_stay_distinct() {
        let c = Catalogue::builtin();
        assert_eq!(
            id(&c, "POST", "/v2/sendGroup").unwrap(),
            ("send_group_event".into(), "/v2/sendGroup".into())
        );
        assert_eq!(
            id(&c, "POST", "/v2/sendGroup/").unwrap(),
            ("send_group".into(), "/v2/sendGroup/".into())
        );
        assert_eq!(
            id(&c, "POST", "/V2/SENDGROUP").unwrap(),
            ("send_group_event".into(), "/v2/sendGroup".into())
        );
    }

    #[test]
    fn case_and_trailing_slash_variants_reach_the_canonical_route() {
        let c = Catalogue::builtin();
        for p in [
            "/v2/settings/webhook/set",
            "/V2/Settings/Webhook/Set",
            "/v2/SETTINGS/webhook/set/",
            "/v2/settings/%77ebhook/set",
        ] {
            assert_eq!(
                id(&c, "POST", p).unwrap(),
                ("webhook_set".into(), "/v2/settings/webhook/set".into()),
                "{p}"
            );
        }
        assert_eq!(
            id(&c, "POST", "/v2/sendMessage").unwrap(),
            ("send_message".into(), "/v2/sendMessage/".into())
        );
    }

    #[test]
    fn prefix_routes_keep_the_rest_of_the_path() {
        let c = Catalogue::builtin();
        assert_eq!(
            id(&c, "GET", "/v2/client/getChats").unwrap(),
            ("client".into(), "/v2/client/getChats".into())
        );
        assert_eq!(
            id(&c, "GET", "/V2/CLIENT/getChats").unwrap(),
            ("client".into(), "/v2/client/getChats".into())
        );
        assert_eq!(
            id(&c, "POST", "/v2/client").unwrap(),
            ("client".into(), "/v2/client".into())
        );
    }

    #[test]
    fn a_method_that_does_not_match_falls_through() {
        let c = Catalogue::builtin();
        // GET on a POST-only path of an unchecked operation is not send_message: it is an
        // uncatalogued operation.
        assert_eq!(id(&c, "GET", "/v2/sendMessage/").unwrap().0, "unknown");
        // POST on the group list falls to the wider Group actions prefix.
        assert_ne!(
            id(&c, "POST", "/v2/groupChat/getGroupList/").unwrap().0,
            "group_list"
        );
    }

    #[test]
    fn a_checked_operation_is_reached_by_its_own_method_only() {
        let c = Catalogue::builtin();
        let refused = |m: &str, p: &str| {
            let r = classify(&c, m, p).unwrap_err();
            (r.code, r.allow.map(|a| a.into_owned()))
        };
        let post_only = (Code::MethodNotAllowed, Some("POST".to_string()));
        for m in ["PUT", "PATCH", "GET", "HEAD", "DELETE", "OPTIONS"] {
            for p in [
                "/v2/settings/webhook/set",
                "/V2/Settings/Webhook/SET",
                "/v2/settings/webhook/set/",
                "/v2/settings/%77ebhook/set",
                "/v2/sendGroup",
                "/v2/service/upgrade",
                "/v2/service/upgrade/",
            ] {
                assert_eq!(refused(m, p), post_only, "{m} {p}");
            }
        }
        // The general group send is a route of its own: its other methods fall through as
        // before, and it is not a spelling of the event variant.
        assert_eq!(id(&c, "GET", "/v2/sendGroup/").unwrap().0, "unknown");
        assert_eq!(id(&c, "POST", "/v2/sendGroup/").unwrap().0, "send_group");
    }

    #[test]
    fn near_spellings_of_a_checked_operation_are_unknown_routes() {
        let c = Catalogue::builtin();
        for p in [
            "/v2/settings/webhook/set.json",
            "/v2/settings/webhook/set~",
            "/v2/settings/webhook/set%20",
            "/v2/settings/webhook/set%2e",
            "/v2/settings/webhook/set.",
            "/v2/settings/webhook/set-",
            "/v2/settings/webhook/set_",
            "/v2/settings/webhook/set!",
            "/v2/settings/webhook/set%3F",
            "/v2/settings/webhook/set%23",
            "/v2/settings/webhook/set%09x",
            "/v2/settings/webhook/set/x",
            "/v2/settings/webhook/set/x/y",
            "/v2/settings/webhook.json/set",
            "/v2/settings/webhook~/set.json",
            "/v2/Settings~/webhook/set",
            "/v2~/settings/webhook/set",
            "/v2/sendGroup.json",
            "/v2/sendGroup~",
            "/v2/sendGroup/x",
            "/v2/service/upgrade.json",
        ] {
            never_routed(&c, p);
        }
        // Not near: a letter or digit goes on, or another segment differs.
        for (p, route) in [
            ("/v2/settings/webhook/setup", "settings_other"),
            ("/v2/settings/webhook/set2", "settings_other"),
            ("/v2/settings/webhooks/set", "settings_other"),
            ("/v2/settings/webhook/scope/x", "webhook_scope"),
            ("/v2/settings/getSettings", "settings_other"),
            ("/v2/sendGroupX", "unknown"),
            ("/v2/client/settings/webhook/set", "client"),
        ] {
            assert_eq!(id(&c, "PUT", p).map(|r| r.0), Ok(route.to_string()), "{p}");
        }
    }

    /// `p` is refused as an unknown route or an invalid path, by every method tried.
    fn never_routed(c: &Catalogue, p: &str) {
        for m in ["POST", "PUT", "GET"] {
            match classify(c, m, p) {
                Err(r) => assert!(
                    matches!(r.code, Code::UnknownRoute | Code::InvalidPath),
                    "{m} {p}: {:?}",
                    r.code
                ),
                Ok(k) => panic!("{m} {p} was classified as {}", c.get(k.route).id),
            }
        }
    }

    #[test]
    fn unicode_spellings_of_a_checked_operation_are_unknown_routes() {
        let c = Catalogue::builtin();
        for p in [
            "/v2/%C5%BFettings/webhook/set",
            "/v2/settings/webhoo%E2%84%AA/set",
            "/v2/sett%C4%B0ngs/webhook/set",
            "/v2/sett%C4%B1ngs/webhook/set",
            "/v2/%c5%bfettings/webhook/set",
            "/v2/%C5%BFendGroup",
            "/v2/%C5%BFervice/upgrade",
            "/v2/settings/webhook/%C5%BFet.json",
            // A byte that is not UTF-8 beside the folded text (a lossy decoder's U+FFFD).
            "/v2/sett%C4%B0ngs/webhook/set%C2",
            "/v2/sett%C4%B0ngs/webhook/set%FF%FE",
            "/v2/%C5%BFettings/webhook%C3/set",
            // A character that stays non-ASCII, after one that folds.
            "/v2/%C5%BFettings/webhook/set%C3%A9",
        ] {
            never_routed(&c, p);
        }
        // Non-ASCII text that folds to no checked operation goes on as before.
        for p in ["/v2/%C3%A9v%C3%A9nements", "/v2/%C5%BFendMessage/"] {
            assert!(classify(&c, "GET", p).is_ok(), "{p}");
        }
    }

    #[test]
    fn unknown_paths() {
        let c = Catalogue::builtin();
        assert_eq!(id(&c, "GET", "/v2/somethingNew").unwrap().0, "unknown");
        assert_eq!(id(&c, "GET", "/v1/sendMessage/"), Err(Code::UnknownRoute));
        assert_eq!(id(&c, "GET", "/"), Err(Code::UnknownRoute));
        assert_eq!(id(&c, "GET", "/v2"), Err(Code::UnknownRoute));
        assert_eq!(
            id(&c, "POST", "/v2/service/doSomethingElse"),
            Err(Code::UnknownRoute)
        );
        assert_eq!(
            id(&c, "GET", "/v2/sendMessage/../settings/webhook/set"),
            Err(Code::InvalidPath)
        );
    }
}

#[cfg(test)]
mod spelled_tests {
    use super::*;
    use proptest::prelude::*;

    /// Each catalogue's exact paths, with their case and trailing-slash variants, and some
    /// paths near them.
    fn paths(c: &Catalogue) -> Vec<String> {
        let mut out = Vec::new();
        for r in c.routes() {
            let p = match &r.path {
                PathMatch::Exact(p) | PathMatch::Prefix(p) => p.clone(),
            };
            out.push(p.to_ascii_uppercase());
            out.push(format!("{p}x"));
            out.push(format!("{p}/"));
            out.push(p.trim_end_matches('/').to_string());
            out.push(p.replace('/', "//"));
            out.push(p);
        }
        out
    }

    /// The built-in catalogue with its spellings, as a policy has it.
    fn catalogue() -> Catalogue {
        let mut c = Catalogue::builtin();
        c.set_spellings(spellings(&c));
        c
    }

    #[test]
    fn the_catalogues_own_spellings_are_classified_by_one_lookup() {
        let c = catalogue();
        assert_eq!(
            Catalogue::builtin().spelled("/v2/sendMessage/", "POST"),
            None
        );
        assert_eq!(
            c.spelled("/v2/sendMessage/", "POST"),
            c.find("send_message")
        );
        // Not a route of its own with GET: the `unknown` route, as the steps find it.
        assert_eq!(c.spelled("/v2/sendMessage/", "GET"), Some(c.unknown()));
        // Another case, the slash toggled, a method spelled otherwise: the steps decide.
        assert_eq!(c.spelled("/v2/sendmessage/", "POST"), None);
        assert_eq!(c.spelled("/v2/sendMessage", "POST"), None);
        assert_eq!(c.spelled("/v2/sendMessage/", "post"), None);
    }

    #[test]
    fn the_lookup_answers_what_the_steps_answer() {
        let c = catalogue();
        let mut hits = 0;
        for p in paths(&c) {
            for m in METHODS.iter().copied().chain(["post", "FOO"]) {
                if c.spelled(&p, m).is_some() {
                    hits += 1;
                }
                assert_eq!(classify(&c, m, &p), classify_steps(&c, m, &p), "{m} {p}");
            }
        }
        assert!(hits > 20, "the index is used: {hits}");
    }

    proptest! {
        #[test]
        fn any_path_is_classified_as_the_steps_classify_it(
            i in 0usize..64, tail in "[a-zA-Z/%.~]{0,6}", m in 0usize..8
        ) {
            let c = catalogue();
            let all = paths(&c);
            let p = format!("{}{tail}", all[i % all.len()]);
            let m = METHODS.get(m).copied().unwrap_or("BREW");
            prop_assert_eq!(classify(&c, m, &p), classify_steps(&c, m, &p));
        }
    }
}
