//! Property tests (proptest) for the parts of the request path that read attacker-controlled
//! input: the path normalizer, the classifier and plan check as composed by `Policy::decide`,
//! and the body checker; plus deterministic stress cases for the body parser.
//!
//! Paths come from a grammar that mixes catalogue words (randomly re-cased and with random
//! percent-encoding of their unreserved characters), dot segments in every spelling, encoded
//! delimiters, raw `;` `\` `#`, doubled slashes, random (also malformed) escapes, control
//! bytes and non-ASCII characters. Failures are not persisted to disk (no regressions file);
//! a failing case is printed, shrunk, by the runner.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::Config as ProptestConfig;
use serde_json::{Map, Value};

use tollgate_core::config::routes::{BodyRule, Catalogue};
use tollgate_core::config::{Allow, WebhookGuard};
use tollgate_core::path::normalize;
use tollgate_core::policy::authenticate::AuthHeader;
use tollgate_core::policy::body::{check_body, Checked};
use tollgate_core::policy::classify::classify;
use tollgate_core::policy::{Policy, RequestHead};
use tollgate_core::refusal::{Code, Refusal};
use tollgate_core::testing;

/// `cases` cases, and no regressions file written next to this one.
fn cfg(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn hex_val(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Percent-decode once, as an upstream would (malformed escapes are left as they are).
fn decode_once(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' && i + 2 < s.len() {
            if let (Some(h), Some(l)) = (hex_val(s[i + 1]), hex_val(s[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// The segments after the leading `/`.
fn segments(p: &[u8]) -> Vec<&[u8]> {
    p[1..].split(|&c| c == b'/').collect()
}

fn has_dot_segment(p: &[u8]) -> bool {
    segments(p).iter().any(|s| *s == b"." || *s == b"..")
}

/// Everything a successful `normalize` promises about its output (property 1b, 1d).
fn assert_normal_form(input: &str, out: &str) -> Result<(), TestCaseError> {
    let b = out.as_bytes();
    prop_assert_eq!(b.first(), Some(&b'/'), "{:?} -> {:?}", input, out);
    let segs = segments(b);
    for (i, s) in segs.iter().enumerate() {
        prop_assert!(
            *s != b"." && *s != b"..",
            "dot segment in {:?} -> {:?}",
            input,
            out
        );
        prop_assert!(
            !s.is_empty() || i + 1 == segs.len(),
            "empty segment in {:?} -> {:?}",
            input,
            out
        );
    }
    for (i, &c) in b.iter().enumerate() {
        prop_assert!(
            (0x20..=0x7E).contains(&c),
            "byte {:#04x} in {:?} -> {:?}",
            c,
            input,
            out
        );
        prop_assert!(
            !matches!(c, b';' | b'\\' | b'#'),
            "{:?} in {:?} -> {:?}",
            c as char,
            input,
            out
        );
        if c == b'%' {
            let (h, l) = (b.get(i + 1).copied(), b.get(i + 2).copied());
            let upper_hex = |d: Option<u8>| matches!(d, Some(b'0'..=b'9' | b'A'..=b'F'));
            prop_assert!(
                upper_hex(h) && upper_hex(l),
                "escape at {} not upper-case hex in {:?} -> {:?}",
                i,
                input,
                out
            );
            let v = hex_val(h.unwrap()).unwrap() << 4 | hex_val(l.unwrap()).unwrap();
            prop_assert!(
                !is_unreserved(v) && !matches!(v, b'/' | b'\\' | b';') && !v.is_ascii_control(),
                "escape %{:02X} should not survive: {:?} -> {:?}",
                v,
                input,
                out
            );
        }
    }
    // 1d: one decode by the upstream neither makes a dot segment nor a new `/`.
    let decoded = decode_once(b);
    prop_assert!(
        !has_dot_segment(&decoded),
        "dot segment after one decode: {:?} -> {:?}",
        input,
        out
    );
    prop_assert_eq!(
        decoded.iter().filter(|&&c| c == b'/').count(),
        b.iter().filter(|&&c| c == b'/').count(),
        "a `/` appears after one decode: {:?} -> {:?}",
        input,
        out
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Path grammar
// ---------------------------------------------------------------------------------------------

const WORDS: &[&str] = &[
    "v2",
    "settings",
    "webhook",
    "set",
    "scope",
    "chats",
    "contacts",
    "channels",
    "history",
    "receivedList",
    "sentList",
    "sentStatus",
    "pendings",
    "client",
    "getChats",
    "sendMessage",
    "sendGroup",
    "groupChat",
    "getGroupList",
    "countryCodes",
    "getSettings",
    "message",
    "service",
    "upgrade",
    "x",
    "a.b",
    "-_~",
];

const SPECIAL: &[&str] = &[
    ".", "..", "...", "%2e", "%2E", "%2e%2e", "%2E%2e", ".%2e", "%2e.", "%2f", "%2F", "%5c", "%5C",
    "%00", "%3b", "%3B", ";", "\\", "#", "//", "/", "?", "=", "%", "%2", "%25", "%252e", "%252f",
    "%20", "%7e", "%7E", "%41", "%zz", "%g0", "%C3%A9", "%c3%a9", "%ff", "%7f", "%1f", "\t",
    "\u{7f}", " ", "\0", "é", "\u{130}", "\u{17f}", "\u{212a}", "\u{ff0e}", "\u{2215}",
];

/// `w` with each character maybe re-cased and maybe percent-encoded (upper or lower hex);
/// `/` is kept (the atoms bring encoded slashes).
fn mangle(w: &str, flags: &[(bool, u8, bool)]) -> String {
    let mut out = String::new();
    for (i, c) in w.chars().enumerate() {
        let (flip, enc, lower_hex) = flags.get(i).copied().unwrap_or((false, 1, false));
        let c = if flip {
            if c.is_ascii_uppercase() {
                c.to_ascii_lowercase()
            } else {
                c.to_ascii_uppercase()
            }
        } else {
            c
        };
        if enc == 0 && c.is_ascii() && c != '/' {
            if lower_hex {
                out.push_str(&format!("%{:02x}", c as u8));
            } else {
                out.push_str(&format!("%{:02X}", c as u8));
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn word() -> impl Strategy<Value = String> {
    (
        select(WORDS),
        prop::collection::vec((any::<bool>(), 0u8..6, any::<bool>()), 0..16),
    )
        .prop_map(|(w, flags)| mangle(w, &flags))
}

fn atom() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => word(),
        4 => Just("/".to_string()),
        3 => select(SPECIAL).prop_map(str::to_string),
        1 => "%[0-9a-fA-FgG%]{0,2}",
        1 => (0u8..0x80).prop_map(|b| (b as char).to_string()),
        1 => any::<char>().prop_map(|c| c.to_string()),
    ]
}

/// Catalogued paths: Basic's, the ones restricted for Basic, and a few others.
const ROUTE_PATHS: &[&str] = &[
    "/v2/sendMessage/",
    "/v2/sendGroup/",
    "/v2/sendGroup",
    "/v2/groupChat/getGroupList/",
    "/v2/groupChat/",
    "/v2/client/",
    "/v2/client",
    "/v2/settings/getSettings",
    "/v2/settings/countryCodes/",
    "/v2/history/sentStatus",
    "/v2/history/sentList",
    "/v2/history/pendings",
    "/v2/settings/webhook/set",
    "/v2/settings/webhook/scope/",
    "/v2/settings/",
    "/v2/history/receivedList",
    "/v2/message/",
    "/v2/chats/",
    "/v2/contacts/",
    "/v2/channels/",
    "/v2/service/upgrade",
    "/v2/",
];

/// A catalogued path, re-cased and partly percent-encoded, maybe with its last slash toggled.
fn route_path() -> impl Strategy<Value = String> {
    (
        select(ROUTE_PATHS),
        prop::collection::vec((any::<bool>(), 0u8..6, any::<bool>()), 0..32),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(p, flags, toggle)| {
            let mut p = mangle(p, &flags);
            if toggle {
                if p.ends_with('/') {
                    p.pop();
                } else {
                    p.push('/');
                }
            }
            p
        })
}

/// Segments that are, or nearly are, dot segments.
const DOTS: &[&str] = &[
    ".",
    "..",
    "...",
    "%2e",
    "%2E",
    "%2e%2e",
    "%2E%2E",
    ".%2e",
    "%2e.",
    "%2E.",
    ".%2E",
    "a.",
    ".a",
    "%2ea",
    "..%2e",
    ".~",
    "%252e",
    "%252e%252e",
    "%2e%2E%2e",
];

/// `seg/seg/…[/]` of dot-like segments and words, relative (no leading `/`).
fn dotty() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(
            prop_oneof![2 => select(DOTS).prop_map(str::to_string), 1 => word()],
            1..6,
        ),
        any::<bool>(),
    )
        .prop_map(|(segs, slash)| format!("{}{}", segs.join("/"), if slash { "/" } else { "" }))
}

/// Paths from the grammar: mostly under `/v2/`, sometimes only `/`, sometimes not absolute;
/// catalogued paths (mangled) with atoms spliced in or appended, or with a second catalogued
/// path after them (`/v2/client/` + `%2e%2e/` + `chats/`), so routes are hit often.
fn path() -> impl Strategy<Value = String> {
    let atoms = |n: usize| prop::collection::vec(atom(), 0..n).prop_map(|v| v.concat());
    prop_oneof![
        4 => atoms(12).prop_map(|s| format!("/v2/{s}")),
        2 => (word(), atoms(12)).prop_map(|(v2, s)| format!("/{v2}/{s}")),
        3 => (prop::collection::vec(word(), 1..5), any::<bool>()).prop_map(|(w, slash)| {
            format!("/v2/{}{}", w.join("/"), if slash { "/" } else { "" })
        }),
        4 => route_path(),
        3 => (route_path(), atoms(4)).prop_map(|(r, a)| r + &a),
        3 => (route_path(), any::<prop::sample::Index>(), atoms(3)).prop_map(|(r, at, a)| {
            // Mangled catalogue paths are ASCII: any byte index is a char boundary.
            let i = at.index(r.len() + 1);
            format!("{}{a}{}", &r[..i], &r[i..])
        }),
        3 => (route_path(), atoms(3), route_path(), any::<bool>()).prop_map(|(r, a, s, strip)| {
            let s = if strip { s.trim_start_matches('/').to_string() } else { s };
            format!("{r}{a}{s}")
        }),
        3 => (route_path(), dotty()).prop_map(|(r, d)| {
            format!("{}/{d}", r.trim_end_matches('/'))
        }),
        2 => atoms(12).prop_map(|s| format!("/{s}")),
        1 => atoms(12),
    ]
}

fn method() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        4 => Just("POST"),
        4 => Just("GET"),
        1 => select(&["HEAD", "PUT", "PATCH", "DELETE", "OPTIONS", "post", "Get", ""][..]),
    ]
}

// ---------------------------------------------------------------------------------------------
// 1. normalize
// ---------------------------------------------------------------------------------------------

fn check_normalize(input: &str) -> Result<(), TestCaseError> {
    let Ok(out) = normalize(input) else {
        return Ok(());
    };
    assert_normal_form(input, &out)?;
    // 1c: idempotent, and a normal path comes back borrowed.
    let again = normalize(&out);
    prop_assert_eq!(
        again.as_deref(),
        Ok(&*out),
        "not idempotent: {:?} -> {:?}",
        input,
        &*out
    );
    // Normalizing does not change what the path means to a decoder.
    prop_assert_eq!(
        decode_once(input.as_bytes()),
        decode_once(out.as_bytes()),
        "meaning changed: {:?} -> {:?}",
        input,
        &*out
    );
    Ok(())
}

proptest! {
    #![proptest_config(cfg(2000))]

    #[test]
    fn normalize_grammar_paths(p in path()) {
        check_normalize(&p)?;
    }

    #[test]
    fn normalize_arbitrary_strings(s in any::<String>(), ascii in "[ -~]{0,40}") {
        check_normalize(&s)?;
        check_normalize(&format!("/{s}"))?;
        check_normalize(&format!("/{ascii}"))?;
    }

    #[test]
    fn normalize_arbitrary_bytes(b in prop::collection::vec(any::<u8>(), 0..64)) {
        let s = String::from_utf8_lossy(&b);
        check_normalize(&s)?;
        check_normalize(&format!("/{s}"))?;
        // Bytes below 0x80 only (the lossy form of the rest is U+FFFD, refused at once).
        let ascii: String = b.iter().map(|&c| (c & 0x7F) as char).collect();
        check_normalize(&format!("/{ascii}"))?;
    }
}

// ---------------------------------------------------------------------------------------------
// 2. classify and the Basic plan
// ---------------------------------------------------------------------------------------------

static CATALOGUE: LazyLock<Catalogue> = LazyLock::new(Catalogue::builtin);
static POLICY: LazyLock<Policy> = LazyLock::new(|| Policy::new(testing::config(), None));
/// The limiter's clock for these tests: every decision is a full window after the last, so
/// the rate limit never refuses and every refusal seen is the policy's.
static NOW: AtomicU64 = AtomicU64::new(0);
const WINDOW_NS: u64 = 10_000_000_000;

const WEBHOOK_SET: &str = "/v2/settings/webhook/set";

/// Route ids the Basic plan allows.
fn basic_allowed() -> HashSet<String> {
    let cfg = &POLICY.config;
    let Allow::Only(list) = &cfg.plan("basic").unwrap().allow else {
        panic!("basic must be an allow-list")
    };
    list.iter()
        .map(|&i| cfg.catalogue.get(i).id.clone())
        .collect()
}

static BASIC_ALLOWED: LazyLock<HashSet<String>> = LazyLock::new(basic_allowed);

/// Whether a forwarded path (once decoded, lower-cased) reaches an operation Basic may not
/// use. Exact operations are matched as the path itself or anything under it; areas as the
/// area with or without its slash, or anything under it. ("Contains" anywhere would flag
/// `/v2/client/x/v2/chats/`, which is a client operation Basic may use.)
fn restricted_for_basic(p: &str) -> Option<&'static str> {
    const EXACT: &[&str] = &[WEBHOOK_SET, "/v2/history/receivedlist"];
    const AREAS: &[&str] = &["/v2/chats", "/v2/contacts", "/v2/channels"];
    EXACT
        .iter()
        .chain(AREAS)
        .find(|&&e| p == e || p.strip_prefix(e).is_some_and(|rest| rest.starts_with('/')))
        .copied()
}

/// Per character of `WEBHOOK_SET`: flip case, percent-encode, lower-case hex.
fn webhook_variant() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(
            (any::<bool>(), any::<bool>(), any::<bool>()),
            WEBHOOK_SET.len(),
        ),
        any::<bool>(),
    )
        .prop_map(|(flags, slash)| {
            let mut out = String::new();
            for (c, (flip, enc, lower_hex)) in WEBHOOK_SET.chars().zip(flags) {
                let c = if flip && c.is_ascii_alphabetic() {
                    if c.is_ascii_uppercase() {
                        c.to_ascii_lowercase()
                    } else {
                        c.to_ascii_uppercase()
                    }
                } else {
                    c
                };
                if enc && c.is_ascii_alphanumeric() {
                    if lower_hex {
                        out.push_str(&format!("%{:02x}", c as u8));
                    } else {
                        out.push_str(&format!("%{:02X}", c as u8));
                    }
                } else {
                    out.push(c);
                }
            }
            if slash {
                out.push('/');
            }
            out
        })
}

fn head<'a>(method: &'a str, path: &'a str, auth: &'a str) -> RequestHead<'a> {
    RequestHead {
        method,
        path,
        authorization: AuthHeader::One(auth.as_bytes()),
    }
}

proptest! {
    #![proptest_config(cfg(2000))]

    /// Every spelling of the webhook path is `webhook_set`, forwarded in the catalogue's
    /// spelling; on any other method it is never a route Basic may use.
    #[test]
    fn webhook_set_spellings(p in webhook_variant(), m in method()) {
        let c = &*CATALOGUE;
        let got = classify(c, m, &p);
        if m == "POST" {
            let k = got.map_err(|r| {
                TestCaseError::fail(format!("{p:?} refused: {:?} {}", r.code, r.detail))
            })?;
            prop_assert_eq!(&c.get(k.route).id, "webhook_set", "{:?}", p);
            prop_assert_eq!(&*k.path, WEBHOOK_SET, "{:?}", p);
        } else if let Ok(k) = got {
            let id = &c.get(k.route).id;
            prop_assert!(!BASIC_ALLOWED.contains(id), "{} {:?} is {}", m, p, id);
        }
        // And through the whole policy: never admitted for Basic.
        let now = NOW.fetch_add(WINDOW_NS, Ordering::Relaxed);
        let d = POLICY.decide(&head(m, &p, "Bearer basic-key-1"), now);
        prop_assert!(d.verdict.is_err(), "{} {:?} admitted for basic: {:?}", m, p, d.verdict);
    }

    /// Whatever the path, an admitted Basic request never forwards to a restricted operation;
    /// the forwarded path is in normal form and means what the request said (up to case and
    /// one trailing slash).
    #[test]
    fn basic_never_reaches_restricted_operations(p in path(), m in method()) {
        let now = NOW.fetch_add(WINDOW_NS, Ordering::Relaxed);
        let d = POLICY.decide(&head(m, &p, "Bearer basic-key-1"), now);
        let fwd = match d.verdict {
            Err(r) => {
                prop_assert_ne!(r.code, Code::RateLimited);
                return Ok(());
            }
            Ok(f) => f,
        };
        let route = POLICY.config.catalogue.get(d.route.unwrap());
        prop_assert!(BASIC_ALLOWED.contains(&route.id), "{} {:?} -> {}", m, p, route.id);
        assert_normal_form(&p, &fwd.path)?;
        let seen = String::from_utf8_lossy(&decode_once(fwd.path.as_bytes())).to_ascii_lowercase();
        prop_assert!(
            restricted_for_basic(&seen).is_none(),
            "{} {:?} admitted for basic, forwarded as {:?} ({})",
            m, p, &*fwd.path, route.id
        );
        // Same meaning as the request (case aside, one trailing slash either way).
        let asked = normalize(&p).expect("admitted, so normal").to_ascii_lowercase();
        let fwd_l = fwd.path.to_ascii_lowercase();
        prop_assert!(
            asked.trim_end_matches('/') == fwd_l.trim_end_matches('/')
                && asked.len().abs_diff(fwd_l.len()) <= 1,
            "{:?} forwarded as {:?}", p, &*fwd.path
        );
    }

    /// The same for every key: whatever is admitted is forwarded in normal form.
    #[test]
    fn admitted_paths_are_normal_for_every_key(
        p in path(),
        m in method(),
        key in select(&["standard-key-1", "pro-key-1", "acme-partner-key"][..]),
    ) {
        let now = NOW.fetch_add(WINDOW_NS, Ordering::Relaxed);
        let auth = format!("Bearer {key}");
        let d = POLICY.decide(&head(m, &p, &auth), now);
        if let Ok(fwd) = d.verdict {
            assert_normal_form(&p, &fwd.path)?;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. check_body
// ---------------------------------------------------------------------------------------------

const RULES: [BodyRule; 4] = [
    BodyRule::GroupEvent,
    BodyRule::WebhookSet,
    BodyRule::ServiceUpgrade,
    BodyRule::ServiceKey,
];
const MAX: u64 = 64 * 1024;
/// The webhook URL guard of a config without a `webhook_guard` block.
static GUARD: LazyLock<WebhookGuard> = LazyLock::new(WebhookGuard::default);

/// The pointers each rule can report.
fn known_pointers(rule: BodyRule) -> &'static [&'static str] {
    match rule {
        BodyRule::GroupEvent => &[
            "",
            "/name",
            "/type",
            "/groupId",
            "/startTime",
            "/eventOptions",
            "/eventOptions/callType",
            "/eventOptions/description",
        ],
        BodyRule::WebhookSet => &["", "/url", "/signing", "/webhookKey"],
        BodyRule::ServiceUpgrade => &["", "/apiKey", "/planID"],
        BodyRule::ServiceKey => &["", "/apiKey"],
    }
}

/// The refusal contract of `check_body`, for any input.
fn check_refusal(rule: BodyRule, body: &[u8], r: &Refusal) -> Result<(), TestCaseError> {
    let shown = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    prop_assert!(
        matches!(
            r.code,
            Code::InvalidJson | Code::InvalidBody | Code::BodyTooLarge
        ),
        "{:?} on {:?}: {:?}",
        rule,
        shown,
        r
    );
    if r.code == Code::InvalidBody {
        prop_assert!(!r.errors.is_empty(), "{:?} on {:?}: no errors", rule, shown);
        let mut seen = HashSet::new();
        for e in &r.errors {
            prop_assert!(
                e.pointer.is_empty() || e.pointer.starts_with('/'),
                "bad pointer {:?}",
                e.pointer
            );
            prop_assert!(
                known_pointers(rule).contains(&e.pointer.as_str()),
                "{:?}: unexpected pointer {:?}",
                rule,
                e.pointer
            );
            prop_assert!(
                seen.insert(e.pointer.as_str()),
                "{:?}: {:?} reported twice on {:?}",
                rule,
                e.pointer,
                shown
            );
            prop_assert!(!e.detail.is_empty());
        }
    }
    Ok(())
}

fn run(rule: BodyRule, body: &[u8], max: u64) -> Result<Result<Checked, Refusal>, TestCaseError> {
    let got = check_body(rule, body, max, &GUARD);
    if let Err(r) = &got {
        check_refusal(rule, body, r)?;
        if body.len() as u64 > max {
            prop_assert_eq!(r.code, Code::BodyTooLarge);
        }
    } else {
        prop_assert!(body.len() as u64 <= max);
    }
    Ok(got)
}

const FIELD_NAMES: &[&str] = &[
    "name",
    "type",
    "groupId",
    "startTime",
    "eventOptions",
    "callType",
    "description",
    "url",
    "signing",
    "webhookKey",
    "apiKey",
    "planID",
];

/// Any text (cheaper to generate than a `.{m,n}` regex).
fn text(len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), len).prop_map(String::from_iter)
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(FIELD_NAMES).prop_map(str::to_string),
        2 => text(0..12),
        1 => "[a-z/~]{0,6}",
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        select(&[u64::MAX, i64::MAX as u64, 0, 1 << 53, (1 << 53) + 1][..]).prop_map(Value::from),
        select(&[i64::MIN, -1][..]).prop_map(Value::from),
        select(
            &[
                f64::MAX,
                f64::MIN,
                f64::MIN_POSITIVE,
                f64::EPSILON,
                -0.0,
                1e300,
                2.5,
                1.0
            ][..]
        )
        .prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text(0..20).prop_map(Value::String),
        select(
            &[
                "event",
                "on",
                "off",
                "https://h.example/x",
                "2026-11-21T10:00:00.000Z",
                ""
            ][..]
        )
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(8, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6).prop_map(|kv| Value::Object(distinct(kv))),
        ]
    })
}

/// A top-level object with fields the rules look at, holding anything.
fn json_object() -> impl Strategy<Value = Value> {
    prop::collection::vec((key(), json_value()), 0..10)
        .prop_map(|kv| Value::Object(kv.into_iter().collect()))
}

/// JSON-ish text: numbers of any size (beyond `f64`, beyond 64 bits), duplicate keys, escapes,
/// and some broken tokens.
fn json_text() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        4 => "-?(0|[1-9][0-9]{0,40})(\\.[0-9]{1,30})?([eE][+-]?[0-9]{1,4})?",
        1 => "-?[1-9][0-9]{300,340}",
        2 => "\"([a-zA-Z0-9 ]|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4}){0,12}\"",
        1 => select(&["true", "false", "null", "\"event\"", "\"\\ud800\"", "tru", "-", "01", "1.", "NaN", "Infinity", "\"\\x\"", "\u{feff}"][..])
            .prop_map(str::to_string),
    ];
    leaf.prop_recursive(8, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(|v| format!("[{}]", v.join(","))),
            prop::collection::vec((key(), inner), 0..6).prop_map(|kv| {
                let fields: Vec<String> = kv
                    .into_iter()
                    .map(|(k, v)| format!("{}:{v}", Value::String(k)))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    })
}

/// `depth` levels of arrays or objects around a leaf, as text.
fn nested() -> impl Strategy<Value = (usize, String)> {
    (0usize..400, prop::collection::vec(any::<bool>(), 0..8)).prop_map(|(depth, kinds)| {
        let (mut open, mut close) = (String::from("{\"url\":"), String::new());
        for i in 0..depth {
            if kinds.get(i % kinds.len().max(1)).copied().unwrap_or(true) {
                open.push('[');
                close.insert(0, ']');
            } else {
                open.push_str("{\"name\":");
                close.insert(0, '}');
            }
        }
        (depth, format!("{open}1{close}}}"))
    })
}

/// A valid group event, with valid but random contents.
fn valid_event() -> impl Strategy<Value = Map<String, Value>> {
    let ts = (
        1000u32..=9999,
        1u32..=12,
        1u32..=28,
        0u32..24,
        0u32..60,
        0u32..60,
        0u32..1000,
    )
        .prop_map(|(y, mo, d, h, mi, s, ms)| {
            format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
        });
    (text(1..16), text(1..16), ts, text(1..8), text(1..16)).prop_map(
        |(name, group, start, call, desc)| {
            let v = serde_json::json!({
                "name": name,
                "type": "event",
                "groupId": group,
                "startTime": start,
                "eventOptions": {"callType": call, "description": desc},
            });
            let Value::Object(m) = v else { unreachable!() };
            m
        },
    )
}

/// Extra members whose names the group-event rule does not know.
fn extra_fields() -> impl Strategy<Value = Vec<(String, Value)>> {
    prop::collection::vec(
        (
            key().prop_filter("unknown name", |k| {
                !FIELD_NAMES.iter().any(|f| fold(f) == fold(k))
            }),
            json_value(),
        ),
        0..4,
    )
    .prop_map(|kv| distinct(kv).into_iter().collect())
}

/// A member name as the gateway compares names for duplicates: characters upper- then
/// lower-cased, twice, with `ı` and `İ` taken as `i` (the body checker refuses members whose
/// names fold together, so a generator that means a valid object must not make two).
fn fold(name: &str) -> String {
    let once = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if matches!(c, '\u{131}' | '\u{130}') {
                    'i'
                } else {
                    c
                }
            })
            .flat_map(char::to_uppercase)
            .flat_map(char::to_lowercase)
            .collect()
    };
    once(&once(name))
}

/// An object of the members given, keeping the first of any whose names fold together.
fn distinct(kv: Vec<(String, Value)>) -> Map<String, Value> {
    let mut seen = std::collections::HashSet::new();
    kv.into_iter()
        .filter(|(k, _)| seen.insert(fold(k)))
        .collect()
}

/// One required group-event field, as a path of member names.
const REQUIRED: &[&[&str]] = &[
    &["name"],
    &["type"],
    &["groupId"],
    &["startTime"],
    &["eventOptions", "callType"],
    &["eventOptions", "description"],
];

proptest! {
    #![proptest_config(cfg(500))]

    #[test]
    fn arbitrary_bytes_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..4096),
        max in prop_oneof![Just(MAX), Just(u64::MAX), 0u64..4096],
    ) {
        for rule in RULES {
            let _ = run(rule, &body, max)?;
        }
    }

    #[test]
    fn arbitrary_values_are_checked_not_crashed(v in json_value()) {
        let text = v.to_string();
        for rule in RULES {
            let got = run(rule, text.as_bytes(), u64::MAX)?;
            // serde_json's own output is valid JSON without duplicate keys.
            if let Err(r) = got {
                prop_assert_ne!(r.code, Code::InvalidJson, "{}: {}", text, r.detail);
            }
        }
    }

    #[test]
    fn arbitrary_objects_are_checked_not_crashed(v in json_object()) {
        let text = v.to_string();
        for rule in RULES {
            if let Err(r) = run(rule, text.as_bytes(), MAX)? {
                prop_assert_eq!(r.code, Code::InvalidBody, "{}: {}", text, r.detail);
            }
        }
    }

    #[test]
    fn arbitrary_json_text_never_panics(t in json_text(), wrap in any::<bool>()) {
        let text = if wrap { format!("{{\"planID\":{t},\"url\":{t}}}") } else { t };
        for rule in RULES {
            let _ = run(rule, text.as_bytes(), u64::MAX)?;
        }
    }

    #[test]
    fn nesting_of_any_depth_is_bounded((depth, text) in nested()) {
        for rule in RULES {
            let got = run(rule, text.as_bytes(), u64::MAX)?;
            if depth < 100 {
                // Well within serde_json's limit of 128: parsed, judged on its fields.
                if let Err(r) = got {
                    prop_assert_eq!(r.code, Code::InvalidBody);
                }
            } else if depth > 130 {
                prop_assert_eq!(got.unwrap_err().code, Code::InvalidJson);
            }
        }
    }

    #[test]
    fn a_valid_group_event_with_unknown_fields_passes(
        mut ev in valid_event(),
        top in extra_fields(),
        inner in extra_fields(),
    ) {
        for (k, v) in top {
            ev.insert(k, v);
        }
        if let Some(Value::Object(opts)) = ev.get_mut("eventOptions") {
            for (k, v) in inner {
                opts.insert(k, v);
            }
        }
        let text = Value::Object(ev).to_string();
        let got = run(BodyRule::GroupEvent, text.as_bytes(), u64::MAX)?;
        prop_assert_eq!(got, Ok(Checked::GroupEvent), "{}", text);
    }

    #[test]
    fn a_required_field_that_is_not_a_string_is_named(
        mut ev in valid_event(),
        extra in extra_fields(),
        which in 0..REQUIRED.len(),
        bad in json_value().prop_filter("not a string", |v| !v.is_string()),
    ) {
        for (k, v) in extra {
            ev.insert(k, v);
        }
        let path = REQUIRED[which];
        let mut slot = &mut ev;
        for seg in &path[..path.len() - 1] {
            let Some(Value::Object(o)) = slot.get_mut(*seg) else { unreachable!() };
            slot = o;
        }
        slot.insert(path[path.len() - 1].to_string(), bad);
        let text = Value::Object(ev).to_string();
        let r = run(BodyRule::GroupEvent, text.as_bytes(), u64::MAX)?
            .expect_err("a non-string required field must fail");
        let want = format!("/{}", path.join("/"));
        let ptrs: Vec<_> = r.errors.iter().map(|e| e.pointer.as_str()).collect();
        prop_assert_eq!((r.code, ptrs), (Code::InvalidBody, vec![want.as_str()]), "{}", text);
    }

    #[test]
    fn event_options_that_is_not_an_object_is_named(
        mut ev in valid_event(),
        bad in json_value().prop_filter("not an object", |v| !v.is_object()),
    ) {
        ev.insert("eventOptions".into(), bad);
        let text = Value::Object(ev).to_string();
        let r = run(BodyRule::GroupEvent, text.as_bytes(), u64::MAX)?
            .expect_err("eventOptions must be an object");
        let ptrs: Vec<_> = r.errors.iter().map(|e| e.pointer.as_str()).collect();
        prop_assert_eq!(ptrs, vec!["/eventOptions"], "{}", text);
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Deterministic stress
// ---------------------------------------------------------------------------------------------

/// Run `f` and return its result, failing if it takes longer than `limit` (generous: debug).
/// A bound against a blow-up (a parse gone quadratic), not a window to cross: so the one
/// reading of the system's clock in the core's tests.
#[allow(clippy::disallowed_methods)]
fn quickly<T>(what: &str, limit: Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    let took = t.elapsed();
    assert!(took < limit, "{what} took {took:?}");
    out
}

#[test]
fn hundred_thousand_deep_nesting_is_refused_quickly() {
    let n = 100_000;
    let bodies = [
        "[".repeat(n),
        format!("{}{}", "[".repeat(n), "]".repeat(n)),
        format!("{{\"url\":{}", "[".repeat(n)),
        "{\"a\":".repeat(n),
        "[{\"a\":".repeat(n / 2),
    ];
    for body in &bodies {
        for rule in RULES {
            let r = quickly("deep nesting", Duration::from_secs(2), || {
                check_body(rule, body.as_bytes(), u64::MAX, &GUARD)
            })
            .unwrap_err();
            assert_eq!(r.code, Code::InvalidJson, "{rule:?}: {}", r.detail);
        }
    }
}

#[test]
fn one_megabyte_bodies_are_refused_quickly() {
    const MB: usize = 1 << 20;
    let pad = |prefix: &str, fill: char, suffix: &str| {
        let mut s = String::with_capacity(MB);
        s.push_str(prefix);
        while s.len() + suffix.len() < MB {
            s.push(fill);
        }
        s.push_str(suffix);
        s
    };
    let nested = pad("", '[', "");
    let string_field = pad("{\"name\":\"", 'x', "\"}");
    let garbage = pad("{", '\u{1}', "");
    let numbers = {
        let mut s = String::from("[");
        while s.len() < MB {
            s.push_str("12345678901234567890,");
        }
        s.push_str("0]");
        s
    };
    let big_number = pad("{\"planID\":1", '0', "}");
    for body in [&nested, &string_field, &garbage, &numbers, &big_number] {
        assert!(body.len() >= MB);
        for rule in RULES {
            // At the real cap: refused before parsing.
            let r = quickly("1 MB at the cap", Duration::from_millis(200), || {
                check_body(rule, body.as_bytes(), MAX, &GUARD)
            })
            .unwrap_err();
            assert_eq!(r.code, Code::BodyTooLarge);
            // Without a cap: parsed (or not), and refused on its merits.
            let r = quickly("1 MB without a cap", Duration::from_secs(3), || {
                check_body(rule, body.as_bytes(), u64::MAX, &GUARD)
            })
            .unwrap_err();
            assert!(
                matches!(r.code, Code::InvalidJson | Code::InvalidBody),
                "{rule:?}: {r:?}"
            );
        }
    }
}
