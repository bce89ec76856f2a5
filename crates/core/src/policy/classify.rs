//! Classify: method + path → a catalogued route, and the exact path to forward.
//!
//! The path is normalized once, here, and anything a server might read two ways is refused
//! (`400 invalid_path`) rather than guessed at:
//! - dot segments (`.`, `..`, also when written `%2e`), empty segments (`//`);
//! - percent-encoded `/`, `\`, `;`, NUL or other control bytes, and malformed escapes;
//! - double encodings (`%25` followed by two hex digits, such as `%252e`);
//! - raw `\`, `;` (path parameters), `#` (fragments), control bytes, and any non-ASCII byte.
//!
//! Escapes of unreserved characters (`A–Z a–z 0–9 - . _ ~`) are decoded; other escapes are
//! kept, with upper-case hex. The query string is not part of routing and is forwarded as is.
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

use std::borrow::Cow;

use super::refusal::{Code, Refusal};
use super::routes::{Catalogue, Guard, PathMatch, RouteIdx};

/// Why a path was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathError {
    NotAbsolute,
    NonAscii,
    ControlByte,
    Fragment,
    Backslash,
    Semicolon,
    BadEscape,
    EncodedDelimiter,
    DoubleEncoded,
    DotSegment,
    EmptySegment,
}

impl PathError {
    pub fn detail(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "the path must start with `/`",
            PathError::NonAscii => "the path contains a non-ASCII byte",
            PathError::ControlByte => "the path contains a control character",
            PathError::Fragment => "the path contains a fragment (`#`)",
            PathError::Backslash => "the path contains `\\`",
            PathError::Semicolon => "the path contains `;` (path parameters are ambiguous)",
            PathError::BadEscape => "the path contains a malformed percent-escape",
            PathError::EncodedDelimiter => {
                "the path contains an encoded `/`, `\\`, `;`, NUL or control character"
            }
            PathError::DoubleEncoded => {
                "the path contains a double percent-encoding (`%25` followed by hex digits)"
            }
            PathError::DotSegment => "the path contains a `.` or `..` segment",
            PathError::EmptySegment => "the path contains an empty segment (`//`)",
        }
    }
}

impl From<PathError> for Refusal {
    fn from(e: PathError) -> Self {
        Refusal::new(Code::InvalidPath, e.detail())
    }
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Bytes the fast path of [`normalize`] must look at: `/` (a segment ends), `%` (an escape:
/// the full path), and every byte that refuses a path.
const SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] =
            c >= 0x80 || c <= 0x1F || c == 0x7F || matches!(c, b'#' | b'\\' | b';' | b'%' | b'/');
        i += 1;
    }
    t
};

/// Normalize a request path (without its query), or refuse it. Borrows when nothing changes.
///
/// Most paths hold no escape: one pass checks their bytes and segments and borrows them
/// (a sixth of `decide`'s time went into the two passes of the general case); a path with a
/// `%` takes the general case, [`normalize_escaped`]. Both answer alike, errors included
/// (a byte's refusal before a segment's, as the general case finds them); a property test
/// holds them to it.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut segment = 1;
    let mut bad_segment = None;
    for (i, &c) in b.iter().enumerate().skip(1) {
        if !SPECIAL[usize::from(c)] {
            continue;
        }
        match c {
            b'/' => {
                if bad_segment.is_none() {
                    bad_segment = segment_error(&b[segment..i], false);
                }
                segment = i + 1;
            }
            b'%' => return normalize_escaped(path),
            0x80..=0xFF => return Err(PathError::NonAscii),
            b'#' => return Err(PathError::Fragment),
            b'\\' => return Err(PathError::Backslash),
            b';' => return Err(PathError::Semicolon),
            _ => return Err(PathError::ControlByte),
        }
    }
    match bad_segment.or_else(|| segment_error(&b[segment..], true)) {
        Some(e) => Err(e),
        None => Ok(Cow::Borrowed(path)),
    }
}

/// A segment's refusal: empty (but the last, a trailing `/`), `.` or `..`.
fn segment_error(seg: &[u8], last: bool) -> Option<PathError> {
    match seg {
        b"" if !last => Some(PathError::EmptySegment),
        b"." | b".." => Some(PathError::DotSegment),
        _ => None,
    }
}

/// [`normalize`] in general: escapes decoded where they stand for an unreserved byte,
/// upper-cased otherwise, refused where they hide a delimiter or a double encoding.
pub fn normalize_escaped(path: &str) -> Result<Cow<'_, str>, PathError> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            0x80..=0xFF => return Err(PathError::NonAscii),
            0x00..=0x1F | 0x7F => return Err(PathError::ControlByte),
            b'#' => return Err(PathError::Fragment),
            b'\\' => return Err(PathError::Backslash),
            b';' => return Err(PathError::Semicolon),
            b'%' => {
                let (h, l) = match (
                    b.get(i + 1).copied().and_then(hex_val),
                    b.get(i + 2).copied().and_then(hex_val),
                ) {
                    (Some(h), Some(l)) => (h, l),
                    _ => return Err(PathError::BadEscape),
                };
                let decoded = h << 4 | l;
                if matches!(decoded, b'/' | b'\\' | b';' | 0x00..=0x1F | 0x7F) {
                    return Err(PathError::EncodedDelimiter);
                }
                // `%252e` is `%2e` to a server that decodes twice: refuse the ambiguity.
                if decoded == b'%'
                    && b.get(i + 3).copied().and_then(hex_val).is_some()
                    && b.get(i + 4).copied().and_then(hex_val).is_some()
                {
                    return Err(PathError::DoubleEncoded);
                }
                let buf = out.get_or_insert_with(|| b[..i].to_vec());
                if is_unreserved(decoded) {
                    buf.push(decoded);
                } else {
                    buf.extend_from_slice(&[
                        b'%',
                        b[i + 1].to_ascii_uppercase(),
                        b[i + 2].to_ascii_uppercase(),
                    ]);
                }
                i += 3;
                continue;
            }
            _ => {}
        }
        if let Some(buf) = out.as_mut() {
            buf.push(c);
        }
        i += 1;
    }
    let norm: &[u8] = out.as_deref().unwrap_or(b);
    // Decoding may have built a double encoding out of escapes (`%25%32e` → `%252e`): the
    // path forwarded must not hold one either.
    if out.is_some()
        && norm
            .windows(5)
            .any(|w| w[..3] == *b"%25" && hex_val(w[3]).is_some() && hex_val(w[4]).is_some())
    {
        return Err(PathError::DoubleEncoded);
    }
    // Segments: skip the leading `/`; a final empty segment (trailing `/`) is allowed.
    let segments = &norm[1..];
    let mut parts = segments.split(|&c| c == b'/').peekable();
    while let Some(seg) = parts.next() {
        let last = parts.peek().is_none();
        match seg {
            b"" if !last => return Err(PathError::EmptySegment),
            b"." | b".." => return Err(PathError::DotSegment),
            _ => {}
        }
    }
    Ok(match out {
        // Only ASCII went in, and every escape kept is ASCII.
        Some(v) => Cow::Owned(String::from_utf8(v).expect("ASCII")),
        None => Cow::Borrowed(path),
    })
}

/// A classified request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Classified<'a> {
    pub route: RouteIdx,
    /// The path to forward (before the upstream's base path), in the catalogue's spelling for
    /// the matched part.
    pub path: Cow<'a, str>,
}

/// Paths longer than this are lower-cased on the heap; shorter ones on the stack.
const STACK_PATH: usize = 256;

/// Classify a request path (without its query).
pub fn classify<'a>(
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]
        /// The fast path answers exactly as the general case, on paths made of the bytes
        /// that matter (slashes, dots, escapes, refused bytes) and a few plain ones.
        #[test]
        fn the_fast_path_answers_as_the_general_case(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "/", "/", "/", ".", "..", "a", "Bc", "%", "%2e", "%2F", "%41", "%25", "%2", "5",
                "#", ";", "\\", "\u{1}", "\u{7f}", "é", "~", "-",
            ]), 0..12),
            rooted in proptest::bool::weighted(0.8),
        ) {
            let path = if rooted { format!("/{}", parts.concat()) } else { parts.concat() };
            proptest::prop_assert_eq!(normalize(&path), normalize_escaped(&path), "{:?}", path);
        }
    }

    fn id(c: &Catalogue, method: &str, path: &str) -> Result<(String, String), Code> {
        classify(c, method, path)
            .map(|m| (c.get(m.route).id.clone(), m.path.into_owned()))
            .map_err(|r| r.code)
    }

    #[test]
    fn normalize_accepts_plain_paths_unchanged() {
        for p in [
            "/",
            "/v2/sendMessage/",
            "/v2/client/getChats",
            "/v2/a-b_c~d.e/x",
        ] {
            assert!(
                matches!(normalize(p), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
    }

    #[test]
    fn normalize_decodes_unreserved_and_uppercases_other_escapes() {
        assert_eq!(normalize("/v2/%73endMessage/").unwrap(), "/v2/sendMessage/");
        assert_eq!(normalize("/v2/a%2db%7Ec").unwrap(), "/v2/a-b~c");
        assert_eq!(normalize("/v2/a%20b%c3%a9").unwrap(), "/v2/a%20b%C3%A9");
    }

    #[test]
    fn normalize_refuses_ambiguous_paths() {
        let cases: &[(&str, PathError)] = &[
            ("v2/x", PathError::NotAbsolute),
            ("", PathError::NotAbsolute),
            ("/v2/../x", PathError::DotSegment),
            ("/v2/./x", PathError::DotSegment),
            ("/v2/x/..", PathError::DotSegment),
            ("/v2/%2e%2e/x", PathError::DotSegment),
            ("/v2/.%2E/x", PathError::DotSegment),
            ("/v2/%2e/x", PathError::DotSegment),
            ("/v2//x", PathError::EmptySegment),
            ("//v2/x", PathError::EmptySegment),
            ("/v2/a%2Fb", PathError::EncodedDelimiter),
            ("/v2/a%2fb", PathError::EncodedDelimiter),
            ("/v2/a%5Cb", PathError::EncodedDelimiter),
            ("/v2/a%00b", PathError::EncodedDelimiter),
            ("/v2/a%3Bb", PathError::EncodedDelimiter),
            ("/v2/a%0ab", PathError::EncodedDelimiter),
            ("/v2/a;b=c", PathError::Semicolon),
            ("/v2/a\\b", PathError::Backslash),
            ("/v2/a#b", PathError::Fragment),
            ("/v2/a\tb", PathError::ControlByte),
            ("/v2/é", PathError::NonAscii),
            ("/v2/client/%252e%252e/chats/", PathError::DoubleEncoded),
            ("/v2/a%252Fb", PathError::DoubleEncoded),
            // Built from escapes (found by fuzzing): `%25` then an escaped digit.
            ("/%25%625", PathError::DoubleEncoded),
            (
                "/v2/client/%25%32e%25%32e/settings/webhook/set",
                PathError::DoubleEncoded,
            ),
            ("/v2/%25%32%46x", PathError::DoubleEncoded),
            ("/v2/a%zz", PathError::BadEscape),
            ("/v2/a%2", PathError::BadEscape),
            ("/v2/a%", PathError::BadEscape),
        ];
        for (p, e) in cases {
            assert_eq!(normalize(p), Err(*e), "{p:?}");
        }
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
            for m in ["POST", "PUT", "GET"] {
                match classify(&c, m, p) {
                    Err(r) => assert!(
                        matches!(r.code, Code::UnknownRoute | Code::InvalidPath),
                        "{m} {p}: {:?}",
                        r.code
                    ),
                    Ok(k) => panic!("{m} {p} was classified as {}", c.get(k.route).id),
                }
            }
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
