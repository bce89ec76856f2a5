//! Check the body: the request bodies whose shape the spec gives (spec sections as in docs/api.md).
//!
//! | rule | spec | what is checked |
//! |---|---|---|
//! | `group_event` | 2.1, 4.1 | `name`, `groupId` non-empty strings; `type` = `event`; `startTime` an ISO 8601 UTC timestamp with milliseconds (`2026-11-21T10:00:00.000Z`, a real calendar date); `eventOptions` an object with non-empty string `callType` and `description` |
//! | `webhook_set` | 2.2, 4.2 rules 1–5 | `url` an absolute http(s) URL with a host that passes the webhook URL guard ([`webhook`](super::webhook): no user info, no private-network name or address in any spelling, https only when `allow_http` is off, `allow_hosts` exempt); `signing`, when present, `on` or `off`; `webhookKey`, when present, a string of at least 16 characters; `signing: on` without a key is allowed (the provider may generate one) |
//! | `service_upgrade` | 2.3, 4.3 | `apiKey` a non-empty string; `planID` a JSON integer (no fraction, no exponent, within 64 bits) |
//!
//! Unknown extra fields pass, but not a rule's member spelled another way (`SIGNING`, `Url`,
//! `ſigning`): a case-insensitive reader upstream would take it for the member, which the
//! gateway checks only under its own spelling, so it is an error naming it. The document must be one JSON object. Every violation is reported
//! (not just the first) as a JSON Pointer and a detail. The caller enforces the size cap before
//! the body is read; [`check_body`] checks it again first. Parsing is bounded: `serde_json`
//! refuses nesting deeper than 128 levels without recursing further, numbers that do not fit
//! an `f64` are refused, and nothing is allocated beyond a small multiple of the (capped) input.
//! Duplicate object keys are refused as `invalid_json`: the upstream might read the other copy.
//! So are names that differ only in case, by Unicode case folding (`url` and `URL`, `apiKey`
//! and `APIKEY`, `k` and the Kelvin sign): a case-insensitive binder upstream would take them
//! for one member.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::webhook::check_url;
use crate::config::routes::BodyRule;
use crate::config::WebhookGuard;
use crate::digest::Digest;
use crate::path::hex_val;
use crate::refusal::{Code, FieldError, Refusal};

/// What a valid body tells the rest of the request path.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    /// A valid `group_event` body.
    GroupEvent,
    /// A valid `webhook_set` body.
    WebhookSet,
    /// The customer key the partner wants to act on, hashed at once, and the plan it asks for.
    ServiceUpgrade {
        /// The digest of the body's `apiKey`.
        target: Digest,
        /// The body's `planID`, as sent (not yet matched to a plan).
        plan_id: i128,
    },
    /// The customer key a partner's lifecycle operation names, hashed at once.
    ServiceKey {
        /// The digest of the body's `apiKey` (or the route's `key_field`).
        target: Digest,
    },
}

/// Check `body` against `rule`. `max` is the validated-body cap in bytes; `guard` is the
/// config's webhook URL guard, for the `url` of `webhook_set`.
pub fn check_body(
    rule: BodyRule,
    body: &[u8],
    max: u64,
    guard: &WebhookGuard,
) -> Result<Checked, Refusal> {
    check_body_with(rule, body, max, guard, API_KEY)
}

/// The field of a partner's body that names the customer key, unless the route says another.
pub const API_KEY: &str = "apiKey";

/// The members each rule checks, by object: the body rule's own and the query rule's
/// ([`check_query`]) from one list.
const GROUP_EVENT: &[&str] = &["name", "type", "groupId", "startTime", "eventOptions"];
const EVENT_OPTIONS: &[&str] = &["callType", "description"];
const WEBHOOK_SET: &[&str] = &["url", "signing", "webhookKey"];
const PLAN_ID: &str = "planID";

/// [`check_body`], with the customer key of `service_upgrade` and `service_key` in the field
/// `key_field` (a route's `key_field`).
pub fn check_body_with(
    rule: BodyRule,
    body: &[u8],
    max: u64,
    guard: &WebhookGuard,
    key_field: &str,
) -> Result<Checked, Refusal> {
    if body.len() as u64 > max {
        return Err(Refusal::new(
            Code::BodyTooLarge,
            format!("a {} body may be at most {max} bytes", rule.name()),
        ));
    }
    let doc = parse_strict(body)?;
    let Json::Object(obj) = doc else {
        let mut r = Refusal::new(Code::InvalidBody, "the body must be a JSON object");
        r.errors.push(FieldError::new("", "must be an object"));
        return Err(r);
    };
    let mut errors = Vec::new();
    let checked = match rule {
        BodyRule::GroupEvent => {
            group_event(&obj, &mut errors);
            Checked::GroupEvent
        }
        BodyRule::WebhookSet => {
            webhook_set(&obj, guard, &mut errors);
            Checked::WebhookSet
        }
        BodyRule::ServiceUpgrade => {
            misspelled(&obj, "", &[key_field, PLAN_ID], &mut errors);
            let (target, plan_id) = service_upgrade(&obj, key_field, &mut errors);
            Checked::ServiceUpgrade {
                target: target.unwrap_or(Digest([0; 32])),
                plan_id: plan_id.unwrap_or(0),
            }
        }
        BodyRule::ServiceKey => {
            misspelled(&obj, "", &[key_field], &mut errors);
            Checked::ServiceKey {
                target: service_key(&obj, key_field, &mut errors).unwrap_or(Digest([0; 32])),
            }
        }
    };
    if errors.is_empty() {
        Ok(checked)
    } else {
        let n = errors.len();
        let mut r = Refusal::new(
            Code::InvalidBody,
            format!(
                "{n} field{} of the {} body break the spec",
                if n == 1 { "" } else { "s" },
                rule.name()
            ),
        );
        r.errors = errors;
        Err(r)
    }
}

/// The body as one JSON document. A body that is UTF-8 throughout (every valid JSON text is)
/// is checked as such once, in one pass, and parsed as a `str`, so that serde_json does not
/// validate each string it meets again; any other body is parsed as bytes, for serde_json's
/// own error with its position. Either way the same documents pass and the same errors come
/// back (a property test holds the two to it).
fn parse_strict(body: &[u8]) -> Result<Json<'_>, Refusal> {
    match std::str::from_utf8(body) {
        Ok(text) => parse_from(serde_json::de::StrRead::new(text)),
        Err(_) => parse_from(serde_json::de::SliceRead::new(body)),
    }
}

fn parse_from<'a, R: serde_json::de::Read<'a>>(read: R) -> Result<Json<'a>, Refusal> {
    let mut de = serde_json::Deserializer::new(read);
    Json::deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| {
            Refusal::new(
                Code::InvalidJson,
                format!("the body is not valid JSON: {e}"),
            )
        })
}

/// A parsed body that borrows from it: a string without escapes is a slice of the input, an
/// object a list of members in their order. serde_json parses (its limits hold: 128 levels,
/// numbers within `f64`); this tree only keeps what the rules read, and refuses duplicate
/// member names, which `serde_json::Value` would silently collapse.
#[derive(Debug)]
enum Json<'a> {
    Null,
    Bool,
    /// A number without fraction or exponent that fits 64 bits (signed or not).
    Integer(i128),
    /// Any other number (finite).
    Float,
    String(Cow<'a, str>),
    Array,
    Object(Object<'a>),
}

#[derive(Debug)]
struct Object<'a>(Vec<(Cow<'a, str>, Json<'a>)>);

impl<'a> Object<'a> {
    fn get(&self, name: &str) -> Option<&Json<'a>> {
        self.0.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool)
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json<'de>, E> {
        Ok(Json::Integer(i128::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json<'de>, E> {
        Ok(Json::Integer(i128::from(v)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json<'de>, E> {
        if v.is_finite() {
            Ok(Json::Float)
        } else {
            Err(E::custom("number out of range"))
        }
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        // Elements are parsed (and checked for duplicate names within) but not kept: no rule
        // looks inside an array.
        while seq.next_element::<Json<'de>>()?.is_some() {}
        Ok(Json::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        /// Up to this many members, a duplicate is looked for by scanning; past it, by a set.
        const SCAN: usize = 16;
        let mut members: Vec<(Cow<'de, str>, Json<'de>)> = Vec::new();
        let mut names: Option<HashSet<Cow<'de, str>>> = None;
        // While every name is ASCII (nearly always), names of another length cannot be one.
        let mut all_ascii = true;
        while let Some(Name(k)) = map.next_key()? {
            let ascii = k.is_ascii();
            let duplicate = match names.as_mut() {
                Some(set) => !set.insert(folded(&k).into_owned().into()),
                None if members.len() < SCAN && all_ascii && ascii => members
                    .iter()
                    .any(|(n, _)| n.len() == k.len() && n.eq_ignore_ascii_case(&k)),
                None if members.len() < SCAN => members.iter().any(|(n, _)| same_member(n, &k)),
                None => {
                    let mut set: HashSet<Cow<'de, str>> = members
                        .iter()
                        .map(|(n, _)| folded(n).into_owned().into())
                        .collect();
                    let dup = !set.insert(folded(&k).into_owned().into());
                    names = Some(set);
                    dup
                }
            };
            if duplicate {
                return Err(de::Error::custom(format_args!(
                    "duplicate key `{}` (member names that differ only in case are one member to some readers)",
                    truncate(&k)
                )));
            }
            all_ascii &= ascii;
            let v = map.next_value()?;
            members.push((k, v));
        }
        Ok(Json::Object(Object(members)))
    }
}

/// Whether two member names are one member to some JSON reader: equal once case is folded.
/// Case-insensitive binders are common upstream (Go's `encoding/json` takes the last of the
/// members whose names fold together; Jackson's `ACCEPT_CASE_INSENSITIVE_PROPERTIES`,
/// System.Text.Json's `PropertyNameCaseInsensitive`), so `{"url": …, "URL": …}` would let the
/// gateway check one value and the upstream act on the other.
fn same_member(a: &str, b: &str) -> bool {
    if a.is_ascii() && b.is_ascii() {
        a.eq_ignore_ascii_case(b)
    } else {
        folded(a) == folded(b)
    }
}

/// A member name with its case folded for [`same_member`]: ASCII lower-cased; other text
/// upper- then lower-cased character by character (so `ſ` meets `s`, the Kelvin sign `k`,
/// `ß` `ss`), twice (`ẞ` → `ß` → `ss`), with the dotless `ı` and the dotted `İ` taken as `i`,
/// as readers that upper-case or lower-case by Unicode's simple mappings treat them.
fn folded(name: &str) -> Cow<'_, str> {
    if name.is_ascii() {
        return if name.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(name.to_ascii_lowercase())
        } else {
            Cow::Borrowed(name)
        };
    }
    let once: String = name.chars().flat_map(fold_char).collect();
    Cow::Owned(once.chars().flat_map(fold_char).collect())
}

pub(crate) fn fold_char(c: char) -> impl Iterator<Item = char> {
    let c = match c {
        '\u{131}' | '\u{130}' => 'i',
        c => c,
    };
    c.to_uppercase().flat_map(char::to_lowercase)
}

/// A member name, borrowed from the input when it has no escapes.
struct Name<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Name<'de>, E> {
                Ok(Name(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn kind(v: &Json<'_>) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool => "a boolean",
        Json::Integer(_) | Json::Float => "a number",
        Json::String(_) => "a string",
        Json::Array => "an array",
        Json::Object(_) => "an object",
    }
}

/// RFC 6901: escape `~` and `/` in a member name.
fn pointer(parent: &str, name: &str) -> String {
    format!("{parent}/{}", name.replace('~', "~0").replace('/', "~1"))
}

/// A required (or present optional) string member; records an error and returns `None` when
/// it is missing, not a string, or (with `non_empty`) empty.
fn string_field<'v>(
    obj: &'v Object<'_>,
    parent: &str,
    name: &str,
    required: bool,
    non_empty: bool,
    errors: &mut Vec<FieldError>,
) -> Option<&'v str> {
    // The pointer is built only for an error: a valid body allocates nothing here.
    let p = || pointer(parent, name);
    match obj.get(name) {
        None if required => {
            errors.push(FieldError::new(p(), "is required"));
            None
        }
        None => None,
        Some(Json::String(s)) if non_empty && s.is_empty() => {
            errors.push(FieldError::new(p(), "must not be empty"));
            None
        }
        Some(Json::String(s)) => Some(s.as_ref()),
        Some(other) => {
            errors.push(FieldError::new(
                p(),
                format!("must be a string, not {}", kind(other)),
            ));
            None
        }
    }
}

/// Each member of `obj` that is one of `names` spelled another way (another case, by the
/// folding of [`same_member`]): a reader upstream that ignores case would take it for that
/// member, which the gateway did not check under that spelling, so it is an error naming it.
fn misspelled(obj: &Object<'_>, parent: &str, names: &[&str], errors: &mut Vec<FieldError>) {
    for (k, _) in &obj.0 {
        if names.contains(&k.as_ref()) {
            continue;
        }
        if let Some(m) = names.iter().find(|m| same_member(k, m)) {
            errors.push(FieldError::new(
                pointer(parent, k),
                format!(
                    "is `{m}` spelled another way, which readers that ignore case take for it: send it as `{m}`"
                ),
            ));
        }
    }
}

fn group_event(obj: &Object<'_>, errors: &mut Vec<FieldError>) {
    misspelled(obj, "", GROUP_EVENT, errors);
    string_field(obj, "", "name", true, true, errors);
    if let Some(t) = string_field(obj, "", "type", true, false, errors) {
        if t != "event" {
            errors.push(FieldError::new(
                "/type",
                "must be \"event\" on this operation",
            ));
        }
    }
    string_field(obj, "", "groupId", true, true, errors);
    if let Some(s) = string_field(obj, "", "startTime", true, false, errors) {
        if !is_utc_millis_timestamp(s) {
            errors.push(FieldError::new(
                "/startTime",
                "must be an ISO 8601 UTC timestamp with milliseconds, such as 2026-11-21T10:00:00.000Z",
            ));
        }
    }
    match obj.get("eventOptions") {
        None => errors.push(FieldError::new("/eventOptions", "is required")),
        Some(Json::Object(opts)) => {
            misspelled(opts, "/eventOptions", EVENT_OPTIONS, errors);
            string_field(opts, "/eventOptions", "callType", true, true, errors);
            string_field(opts, "/eventOptions", "description", true, true, errors);
        }
        Some(other) => errors.push(FieldError::new(
            "/eventOptions",
            format!("must be an object, not {}", kind(other)),
        )),
    }
}

/// `YYYY-MM-DDTHH:MM:SS.sssZ`, exactly, on a real calendar date (proleptic Gregorian, years
/// 0000–9999; seconds 00–59). One pass over 24 fixed positions: the `time` crate's parser took
/// about ten times the instructions; a property test holds this to it.
pub fn is_utc_millis_timestamp(s: &str) -> bool {
    /// `d` a decimal digit, anything else itself.
    const SHAPE: &[u8; 24] = b"dddd-dd-ddTdd:dd:dd.dddZ";
    let b = s.as_bytes();
    let shaped = b.len() == SHAPE.len()
        && SHAPE.iter().zip(b).all(|(&want, &got)| match want {
            b'd' => got.is_ascii_digit(),
            _ => got == want,
        });
    if !shaped {
        return false;
    }
    let number = |from: usize, to: usize| {
        b[from..to]
            .iter()
            .fold(0u32, |n, &d| n * 10 + u32::from(d - b'0'))
    };
    let (year, month, day) = (number(0, 4), number(5, 7), number(8, 10));
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day) && number(11, 13) < 24 && number(14, 16) < 60 && number(17, 19) < 60
}

fn webhook_set(obj: &Object<'_>, guard: &WebhookGuard, errors: &mut Vec<FieldError>) {
    misspelled(obj, "", WEBHOOK_SET, errors);
    if let Some(url) = string_field(obj, "", "url", true, true, errors) {
        if let Err(detail) = check_url(url, guard) {
            errors.push(FieldError::new("/url", detail));
        }
    }
    if let Some(s) = string_field(obj, "", "signing", false, false, errors) {
        if s != "on" && s != "off" {
            errors.push(FieldError::new("/signing", "must be \"on\" or \"off\""));
        }
    }
    if let Some(k) = string_field(obj, "", "webhookKey", false, false, errors) {
        if k.chars().count() < 16 {
            errors.push(FieldError::new(
                "/webhookKey",
                "must be at least 16 characters",
            ));
        }
    }
}

/// The customer key a partner's body names (a non-empty string), hashed at once.
fn service_key(obj: &Object<'_>, key_field: &str, errors: &mut Vec<FieldError>) -> Option<Digest> {
    string_field(obj, "", key_field, true, true, errors).map(|k| Digest::of(k.as_bytes()))
}

fn service_upgrade(
    obj: &Object<'_>,
    key_field: &str,
    errors: &mut Vec<FieldError>,
) -> (Option<Digest>, Option<i128>) {
    let target = service_key(obj, key_field, errors);
    let mut plan_id = None;
    match obj.get("planID") {
        None => errors.push(FieldError::new("/planID", "is required")),
        Some(Json::Integer(n)) => plan_id = Some(*n),
        Some(Json::Float) => errors.push(FieldError::new(
            "/planID",
            "must be an integer (no fraction or exponent, within 64 bits)",
        )),
        Some(other) => errors.push(FieldError::new(
            "/planID",
            format!("must be an integer, not {}", kind(other)),
        )),
    }
    (target, plan_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const MAX: u64 = 64 * 1024;

    /// The guard of a config without a `webhook_guard` block.
    fn guard() -> WebhookGuard {
        WebhookGuard::default()
    }

    fn errors(rule: BodyRule, body: &str) -> Vec<(String, String)> {
        match check_body(rule, body.as_bytes(), MAX, &guard()) {
            Ok(_) => vec![],
            Err(r) => {
                assert_eq!(r.code, Code::InvalidBody, "{body}: {}", r.detail);
                r.errors
                    .into_iter()
                    .map(|e| (e.pointer, e.detail.into_owned()))
                    .collect()
            }
        }
    }

    fn code(rule: BodyRule, body: &[u8]) -> Option<Code> {
        check_body(rule, body, MAX, &guard()).err().map(|r| r.code)
    }

    const EVENT: &str = r#"{"name":"Standup","type":"event","groupId":"g-1","startTime":"2026-11-21T10:00:00.000Z","eventOptions":{"callType":"voice","description":"Daily"}}"#;

    fn event_with(patch: serde_json::Value) -> String {
        let mut v: Value = serde_json::from_str(EVENT).unwrap();
        fn merge(a: &mut Value, b: Value) {
            if let (Value::Object(a), Value::Object(b)) = (a, b) {
                for (k, v) in b {
                    match (a.get_mut(&k), v) {
                        (Some(slot @ Value::Object(_)), v @ Value::Object(_)) => merge(slot, v),
                        (_, Value::Null) => {
                            a.remove(&k);
                        }
                        (_, v) => {
                            a.insert(k, v);
                        }
                    }
                }
            }
        }
        merge(&mut v, patch);
        v.to_string()
    }

    #[test]
    fn a_valid_group_event_passes_with_extra_fields() {
        assert_eq!(
            check_body(BodyRule::GroupEvent, EVENT.as_bytes(), MAX, &guard()),
            Ok(Checked::GroupEvent)
        );
        let extra =
            event_with(serde_json::json!({"extra": [1, 2], "eventOptions": {"more": true}}));
        assert!(errors(BodyRule::GroupEvent, &extra).is_empty());
    }

    #[test]
    fn each_group_event_field_is_checked() {
        use serde_json::json;
        let cases = [
            (json!({"name": null}), "/name", "is required"),
            (json!({"name": ""}), "/name", "must not be empty"),
            (
                json!({"name": 5}),
                "/name",
                "must be a string, not a number",
            ),
            (json!({"type": "message"}), "/type", "must be \"event\""),
            (json!({"type": null}), "/type", "is required"),
            (json!({"groupId": null}), "/groupId", "is required"),
            (json!({"groupId": ["g"]}), "/groupId", "must be a string"),
            (
                json!({"startTime": "2026-11-21T10:00:00Z"}),
                "/startTime",
                "ISO 8601",
            ),
            (
                json!({"startTime": "2026-11-21T10:00:00.000+01:00"}),
                "/startTime",
                "ISO 8601",
            ),
            (
                json!({"startTime": "2026-02-30T10:00:00.000Z"}),
                "/startTime",
                "ISO 8601",
            ),
            (
                json!({"startTime": "2026-11-21 10:00:00.000Z"}),
                "/startTime",
                "ISO 8601",
            ),
            (
                json!({"startTime": "2026-11-21T24:00:00.000Z"}),
                "/startTime",
                "ISO 8601",
            ),
            (
                json!({"startTime": 1732183200000u64}),
                "/startTime",
                "must be a string",
            ),
            (
                json!({"eventOptions": null}),
                "/eventOptions",
                "is required",
            ),
            (
                json!({"eventOptions": "voice"}),
                "/eventOptions",
                "must be an object",
            ),
            (
                json!({"eventOptions": {"callType": null}}),
                "/eventOptions/callType",
                "is required",
            ),
            (
                json!({"eventOptions": {"callType": ""}}),
                "/eventOptions/callType",
                "must not be empty",
            ),
            (
                json!({"eventOptions": {"description": ""}}),
                "/eventOptions/description",
                "must not be empty",
            ),
            (
                json!({"eventOptions": {"description": false}}),
                "/eventOptions/description",
                "must be a string",
            ),
        ];
        for (patch, ptr, detail) in cases {
            let body = event_with(patch.clone());
            let errs = errors(BodyRule::GroupEvent, &body);
            assert_eq!(errs.len(), 1, "{patch}: {errs:?}");
            assert_eq!(errs[0].0, ptr, "{patch}");
            assert!(errs[0].1.contains(detail), "{patch}: {}", errs[0].1);
        }
    }

    #[test]
    fn every_violation_is_reported() {
        let errs = errors(BodyRule::GroupEvent, r#"{"type":"x","eventOptions":{}}"#);
        let ptrs: Vec<_> = errs.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            ptrs,
            [
                "/name",
                "/type",
                "/groupId",
                "/startTime",
                "/eventOptions/callType",
                "/eventOptions/description"
            ]
        );
    }

    #[test]
    fn leap_days_are_real_dates() {
        assert!(is_utc_millis_timestamp("2028-02-29T23:59:59.999Z"));
        assert!(!is_utc_millis_timestamp("2026-02-29T00:00:00.000Z"));
        assert!(!is_utc_millis_timestamp("+2026-11-21T10:00:00.000Z"));
        assert!(!is_utc_millis_timestamp("2026-11-21T10:00:00.0000Z"));
        assert!(!is_utc_millis_timestamp("2026-11-21T10:00:00.000z"));
        assert!(is_utc_millis_timestamp("2000-02-29T00:00:00.000Z"));
        assert!(!is_utc_millis_timestamp("1900-02-29T00:00:00.000Z"));
        assert!(!is_utc_millis_timestamp("2026-11-21T24:00:00.000Z"));
        assert!(!is_utc_millis_timestamp("2026-11-21T10:00:60.000Z"));
        assert!(!is_utc_millis_timestamp("2026-11-31T10:00:00.000Z"));
        assert!(!is_utc_millis_timestamp("2026-00-01T10:00:00.000Z"));
    }

    /// The `time` crate's reading of the same format, which this check replaced.
    fn timestamp_by_time(s: &str) -> bool {
        let fmt = time::macros::format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        );
        s.len() == 24
            && s.as_bytes()[0].is_ascii_digit()
            && time::PrimitiveDateTime::parse(s, fmt).is_ok()
    }

    #[test]
    fn timestamps_as_the_time_crate_reads_them_at_the_calendar_and_clock_bounds() {
        for year in [
            0, 1, 4, 100, 399, 400, 1900, 1970, 2000, 2024, 2026, 2100, 9996, 9999,
        ] {
            for month in 0..=13 {
                for day in 0..=32 {
                    let s = format!("{year:04}-{month:02}-{day:02}T23:59:59.999Z");
                    assert_eq!(is_utc_millis_timestamp(&s), timestamp_by_time(&s), "{s}");
                }
            }
        }
        for hour in 0..=25 {
            for minute in [0, 1, 30, 59, 60, 61, 99] {
                for second in [0, 1, 30, 59, 60, 61, 99] {
                    let s = format!("2026-11-21T{hour:02}:{minute:02}:{second:02}.000Z");
                    assert_eq!(is_utc_millis_timestamp(&s), timestamp_by_time(&s), "{s}");
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]

        /// Near-timestamps: every position a digit, the right separator or one of a few
        /// wrong bytes, and the lengths around 24.
        #[test]
        fn timestamps_as_the_time_crate_reads_them(
            bytes in proptest::collection::vec(
                proptest::sample::select(b"0123456789-T:.Z+ zt9".to_vec()), 22..=26),
            template in proptest::bool::weighted(0.7),
        ) {
            let mut b = bytes;
            if template && b.len() == 24 {
                // Mostly the right separators, so that the calendar part is what is tested.
                for (i, c) in b"dddd-dd-ddTdd:dd:dd.dddZ".iter().enumerate() {
                    if *c != b'd' {
                        b[i] = *c;
                    }
                }
            }
            let s = String::from_utf8(b).unwrap();
            proptest::prop_assert_eq!(is_utc_millis_timestamp(&s), timestamp_by_time(&s), "{:?}", s);
        }

        /// The two ways of parsing a body (as `str` when it is UTF-8, as bytes otherwise)
        /// accept the same documents and give the same errors.
        #[test]
        fn bodies_parse_alike_as_text_and_as_bytes(
            body in proptest::collection::vec(
                proptest::sample::select(b"{}[]\":,0123456789.eE+-truefalsnul \\u\xc3\xa9\xff\x01".to_vec()),
                0..40),
        ) {
            let as_bytes = parse_from(serde_json::de::SliceRead::new(&body)).map(|_| ()).map_err(|r| r.detail);
            let either = parse_strict(&body).map(|_| ()).map_err(|r| r.detail);
            proptest::prop_assert_eq!(either, as_bytes, "{:?}", String::from_utf8_lossy(&body));
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_gets_serde_jsons_own_error() {
        let body = b"{\"name\":\"a\xff\"}";
        let r = parse_strict(body).unwrap_err();
        assert_eq!(r.code, Code::InvalidJson);
        let by_bytes = parse_from(serde_json::de::SliceRead::new(body)).unwrap_err();
        assert_eq!(r.detail, by_bytes.detail);
    }

    #[test]
    fn webhook_rules() {
        let ok = [
            r#"{"url":"https://hooks.example.com/in"}"#,
            r#"{"url":"http://93.184.216.34:8080/x","signing":"off"}"#,
            r#"{"url":"https://h.example/x","signing":"on"}"#,
            r#"{"url":"https://h.example/x","signing":"on","webhookKey":"0123456789abcdef"}"#,
            r#"{"url":"https://h.example/x","signing":"on","webhookKey":"ééééééééééééééééé","other":1}"#,
        ];
        for b in ok {
            assert!(errors(BodyRule::WebhookSet, b).is_empty(), "{b}");
        }
        let bad = [
            (r#"{}"#, "/url"),
            (r#"{"url":"hooks.example.com/in"}"#, "/url"),
            (r#"{"url":"ftp://hooks.example.com/in"}"#, "/url"),
            (r#"{"url":"/relative"}"#, "/url"),
            (r#"{"url":"https://"}"#, "/url"),
            (r#"{"url":"https://h.example/a b"}"#, "/url"),
            (r#"{"url":7}"#, "/url"),
            (
                r#"{"url":"https://h.example/x","signing":"yes"}"#,
                "/signing",
            ),
            (
                r#"{"url":"https://h.example/x","signing":true}"#,
                "/signing",
            ),
            (
                r#"{"url":"https://h.example/x","signing":"ON"}"#,
                "/signing",
            ),
            (
                r#"{"url":"https://h.example/x","webhookKey":"short"}"#,
                "/webhookKey",
            ),
            (
                r#"{"url":"https://h.example/x","webhookKey":"0123456789abcde"}"#,
                "/webhookKey",
            ),
            (
                r#"{"url":"https://h.example/x","webhookKey":null}"#,
                "/webhookKey",
            ),
        ];
        for (b, ptr) in bad {
            let errs = errors(BodyRule::WebhookSet, b);
            assert_eq!(errs.len(), 1, "{b}: {errs:?}");
            assert_eq!(errs[0].0, ptr, "{b}");
        }
    }

    #[test]
    fn the_webhook_guard_judges_the_url_among_the_other_fields() {
        let body = r#"{"url":"http://0x7f.1/admin","signing":"yes","webhookKey":"short"}"#;
        let errs = errors(BodyRule::WebhookSet, body);
        let ptrs: Vec<_> = errs.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(ptrs, ["/url", "/signing", "/webhookKey"]);
        assert_eq!(
            errs[0].1,
            "must not point into a private network: 127.0.0.1 is in 127.0.0.0/8, loopback (RFC 1122 §3.2.1.3)"
        );
        for url in [
            "http://169.254.169.254/latest/meta-data",
            "http://[::ffff:10.0.0.1]/",
            "http://metadata.google.internal/",
            "http://user:pw@example.com/",
        ] {
            let errs = errors(BodyRule::WebhookSet, &format!(r#"{{"url":"{url}"}}"#));
            assert_eq!(errs.len(), 1, "{url}: {errs:?}");
            assert_eq!(errs[0].0, "/url", "{url}");
        }
        // The guard is the config's: off, only the http-URL check is left.
        let off = WebhookGuard {
            enabled: false,
            ..guard()
        };
        let b = br#"{"url":"http://127.0.0.1/"}"#;
        assert_eq!(
            check_body(BodyRule::WebhookSet, b, MAX, &off),
            Ok(Checked::WebhookSet)
        );
        // Other rules do not look at the guard.
        let https_only = WebhookGuard {
            allow_http: false,
            ..guard()
        };
        let ev = event_with(serde_json::json!({"name": "http://127.0.0.1/"}));
        assert_eq!(
            check_body(BodyRule::GroupEvent, ev.as_bytes(), MAX, &https_only),
            Ok(Checked::GroupEvent)
        );
    }

    #[test]
    fn service_upgrade_rules() {
        let ok = check_body(
            BodyRule::ServiceUpgrade,
            br#"{"apiKey":"k-1","planID":2}"#,
            MAX,
            &guard(),
        )
        .unwrap();
        assert_eq!(
            ok,
            Checked::ServiceUpgrade {
                target: Digest::of(b"k-1"),
                plan_id: 2
            }
        );
        let bad = [
            (r#"{"planID":2}"#, "/apiKey"),
            (r#"{"apiKey":"","planID":2}"#, "/apiKey"),
            (r#"{"apiKey":3,"planID":2}"#, "/apiKey"),
            (r#"{"apiKey":"k"}"#, "/planID"),
            (r#"{"apiKey":"k","planID":"2"}"#, "/planID"),
            (r#"{"apiKey":"k","planID":2.0}"#, "/planID"),
            (r#"{"apiKey":"k","planID":2.5}"#, "/planID"),
            (r#"{"apiKey":"k","planID":2e0}"#, "/planID"),
            (
                r#"{"apiKey":"k","planID":99999999999999999999999}"#,
                "/planID",
            ),
            (r#"{"apiKey":"k","planID":null}"#, "/planID"),
        ];
        for (b, ptr) in bad {
            let errs = errors(BodyRule::ServiceUpgrade, b);
            assert_eq!(errs.len(), 1, "{b}: {errs:?}");
            assert_eq!(errs[0].0, ptr, "{b}");
        }
        assert!(errors(BodyRule::ServiceUpgrade, r#"{"apiKey":"k","planID":-3}"#).is_empty());
    }

    #[test]
    fn unparsable_and_non_object_bodies() {
        for b in [
            &b""[..],
            b"{",
            b"{\"a\":}",
            b"\xff\xfe",
            b"{} {}",
            b"{\"a\":1,}",
            b"NaN",
        ] {
            assert_eq!(
                code(BodyRule::WebhookSet, b),
                Some(Code::InvalidJson),
                "{b:?}"
            );
        }
        for b in [&b"[]"[..], b"null", b"\"x\"", b"12"] {
            let r = check_body(BodyRule::WebhookSet, b, MAX, &guard()).unwrap_err();
            assert_eq!(
                (r.code, r.errors[0].pointer.as_str()),
                (Code::InvalidBody, ""),
                "{b:?}"
            );
        }
    }

    #[test]
    fn duplicates_are_found_in_large_objects_and_through_escapes() {
        // Past 16 members the duplicate check switches from a scan to a set.
        let members: Vec<String> = (0..40).map(|i| format!("\"f{i}\":{i}")).collect();
        let body = format!(r#"{{"url":"https://a.example/",{}}}"#, members.join(","));
        assert_eq!(code(BodyRule::WebhookSet, body.as_bytes()), None);
        for dup in [r#""f3":0"#, r#""f39":[]"#, r#""url":"x""#] {
            let body = format!(
                r#"{{"url":"https://a.example/",{},{dup}}}"#,
                members.join(",")
            );
            assert_eq!(
                code(BodyRule::WebhookSet, body.as_bytes()),
                Some(Code::InvalidJson),
                "{dup}"
            );
        }
        // An escaped name is the same name.
        let b = br#"{"url":"https://a.example/","u\u0072l":"javascript:x"}"#;
        assert_eq!(code(BodyRule::WebhookSet, b), Some(Code::InvalidJson));
        // An escaped value is read like any other.
        let b = br#"{"url":"https:\/\/a.example\/","signing":"o\u006e"}"#;
        assert_eq!(code(BodyRule::WebhookSet, b), None);
    }

    #[test]
    fn names_that_differ_only_in_case_are_duplicates() {
        let pairs = [
            ("url", "URL"),
            ("url", "Url"),
            ("apiKey", "APIKEY"),
            ("apiKey", "apikey"),
            // Unicode case folding: the Kelvin sign, the long s, the dotless and dotted i.
            ("apiKey", "api\u{212A}ey"),
            ("signing", "ſigning"),
            ("signing", "sıgning"),
            ("signing", "sİgning"),
            ("strasse", "STRAẞE"),
            ("straße", "STRASSE"),
            ("σ", "Σ"),
            ("ς", "σ"),
        ];
        for (a, b) in pairs {
            let first = format!(r#"{{"url":"https://a.example/","{a}":"1","{b}":"2"}}"#);
            let body = if a == "url" {
                format!(r#"{{"{a}":"https://a.example/","{b}":"http://169.254.169.254/"}}"#)
            } else {
                first
            };
            assert_eq!(
                code(BodyRule::WebhookSet, body.as_bytes()),
                Some(Code::InvalidJson),
                "{a} / {b}"
            );
            // Nested, and past the scan (a set of folded names).
            let nested = format!(r#"{{"url":"https://a.example/","o":{{"{a}":1,"{b}":2}}}}"#);
            assert_eq!(
                code(BodyRule::WebhookSet, nested.as_bytes()),
                Some(Code::InvalidJson)
            );
            let many: Vec<String> = (0..20).map(|i| format!("\"f{i}\":{i}")).collect();
            let large = format!(
                r#"{{"url":"https://a.example/",{},"{a}":1,"{b}":2}}"#,
                many.join(",")
            );
            assert_eq!(
                code(BodyRule::WebhookSet, large.as_bytes()),
                Some(Code::InvalidJson)
            );
        }
        let upgrade =
            br#"{"apiKey":"acme-customer-key","APIKEY":"globex-customer-key","planID":3}"#;
        assert_eq!(
            code(BodyRule::ServiceUpgrade, upgrade),
            Some(Code::InvalidJson)
        );
        // Names that fold apart are distinct members.
        let b = br#"{"url":"https://a.example/","urls":1,"uri":2,"\u00fcrl":3}"#;
        assert_eq!(code(BodyRule::WebhookSet, b), None);
    }

    #[test]
    fn case_folding_settles_in_two_passes() {
        // `folded` applies the per-character fold twice; a third pass changes nothing, for
        // every character.
        for c in (0..=0x10FFFF).filter_map(char::from_u32) {
            let s = c.to_string();
            let twice = folded(&s).into_owned();
            let thrice: String = twice.chars().flat_map(fold_char).collect();
            assert_eq!(twice, thrice, "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let b = br#"{"url":"https://a.example/","url":"javascript:x"}"#;
        let r = check_body(BodyRule::WebhookSet, b, MAX, &guard()).unwrap_err();
        assert_eq!(r.code, Code::InvalidJson);
        assert!(r.detail.contains("duplicate key `url`"), "{}", r.detail);
        let nested = event_with(serde_json::json!({})).replace(
            r#""callType":"voice""#,
            r#""callType":"voice","callType":"video""#,
        );
        assert_eq!(
            code(BodyRule::GroupEvent, nested.as_bytes()),
            Some(Code::InvalidJson)
        );
    }

    #[test]
    fn deep_nesting_and_huge_numbers_are_refused_safely() {
        let deep = format!("{{\"url\":{}{}}}", "[".repeat(60_000), "]".repeat(60_000));
        assert_eq!(
            code(BodyRule::WebhookSet, deep.as_bytes()),
            Some(Code::BodyTooLarge)
        );
        let deep = format!("{{\"url\":{}{}}}", "[".repeat(30_000), "]".repeat(30_000));
        assert_eq!(
            code(BodyRule::WebhookSet, deep.as_bytes()),
            Some(Code::InvalidJson)
        );
        let deep = "{\"a\":".repeat(10_000) + &"}".repeat(10_000);
        assert_eq!(
            code(BodyRule::WebhookSet, deep.as_bytes()),
            Some(Code::InvalidJson)
        );
        // Beyond 64 bits but a finite double: a number, not an integer the provider can take.
        let big = r#"{"apiKey":"k","planID":123456789012345678901234567890}"#;
        assert_eq!(
            code(BodyRule::ServiceUpgrade, big.as_bytes()),
            Some(Code::InvalidBody)
        );
        // Beyond any double: refused by the parser, without a big-number allocation.
        let huge = format!(r#"{{"apiKey":"k","planID":1{}}}"#, "0".repeat(60_000));
        assert_eq!(
            code(BodyRule::ServiceUpgrade, huge.as_bytes()),
            Some(Code::InvalidJson)
        );
        let inf = r#"{"apiKey":"k","planID":1e999}"#;
        assert_eq!(
            code(BodyRule::ServiceUpgrade, inf.as_bytes()),
            Some(Code::InvalidJson)
        );
    }

    #[test]
    fn the_cap_is_checked_first() {
        let r = check_body(BodyRule::GroupEvent, EVENT.as_bytes(), 10, &guard()).unwrap_err();
        assert_eq!(r.code, Code::BodyTooLarge);
    }

    #[test]
    fn a_member_spelled_another_way_is_an_error_naming_it() {
        // Alone (no duplicate to find), in another case or by Unicode's folding, at any
        // depth a rule checks: a case-insensitive reader upstream would take it for the
        // member the gateway checks under its own spelling only.
        let webhook = |extra: &str| format!(r#"{{"url":"https://example.com/",{extra}}}"#);
        for (body, at) in [
            (webhook(r#""SIGNING":"maybe""#), "/SIGNING"),
            (webhook(r#""Signing":"on""#), "/Signing"),
            (webhook(r#""\u017figning":"on""#), "/\u{17f}igning"),
            (
                webhook(r#""webhoo\u212aKey":"short""#),
                "/webhoo\u{212a}Key",
            ),
            (webhook(r#""WEBHOOKKEY":"x""#), "/WEBHOOKKEY"),
        ] {
            let got = errors(BodyRule::WebhookSet, &body);
            assert_eq!(got.len(), 1, "{body}: {got:?}");
            assert_eq!(got[0].0, at, "{body}");
            assert!(got[0].1.contains("spelled another way"), "{got:?}");
        }
        // Without the member itself, which is then missing too.
        let nested = EVENT.replace("\"callType\"", "\"CALLTYPE\"");
        assert_eq!(
            errors(BodyRule::GroupEvent, &nested),
            vec![
                (
                    "/eventOptions/CALLTYPE".to_string(),
                    "is `callType` spelled another way, which readers that ignore case take for it: send it as `callType`".to_string()
                ),
                ("/eventOptions/callType".to_string(), "is required".to_string()),
            ]
        );
        let top = EVENT.replace("\"startTime\"", "\"StartTime\"");
        assert_eq!(errors(BodyRule::GroupEvent, &top)[0].0, "/StartTime");
        let partner = r#"{"apiKey":"k","PLANID":3,"planID":1}"#;
        assert_eq!(
            code(BodyRule::ServiceUpgrade, partner.as_bytes()),
            Some(Code::InvalidJson)
        );
        let partner = r#"{"APIKEY":"k","planID":1}"#;
        let got = errors(BodyRule::ServiceUpgrade, partner);
        assert!(got.iter().any(|(p, _)| p == "/APIKEY"), "{got:?}");
        // A member of another rule, or a name no rule has, still passes.
        assert!(errors(BodyRule::ServiceKey, r#"{"apiKey":"k","PLANID":3}"#).is_empty());
        assert!(errors(BodyRule::WebhookSet, &webhook(r#""Extra":1"#)).is_empty());
    }

    #[test]
    fn pointers_escape_member_names() {
        assert_eq!(pointer("", "a/b~c"), "/a~1b~0c");
    }
}

/// Before reading a body: the query string of a checked operation names none of its body
/// rule's members, at any depth (`key_field` is the route's name for the customer key), in any
/// spelling the body check takes for one (case folded, as member names are), whether plain, in
/// brackets (`url[]`, `eventOptions[callType]`: Rails, PHP) or dotted (`eventOptions.callType`:
/// Spring), percent-encoded or not. Frameworks that merge query parameters over the JSON body
/// (Rails `params`, Express's `req.param`) would act on the query's value, which the gateway
/// did not check: such a request is `400 invalid_body`, every such parameter named.
pub fn check_query(rule: BodyRule, query: Option<&str>, key_field: &str) -> Result<(), Refusal> {
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(());
    };
    // The key field (`apiKey`, or the route's own) is matched on its own below.
    let members: &[&[&str]] = match rule {
        BodyRule::GroupEvent => &[GROUP_EVENT, EVENT_OPTIONS],
        BodyRule::WebhookSet => &[WEBHOOK_SET],
        BodyRule::ServiceUpgrade => &[&[API_KEY, PLAN_ID]],
        BodyRule::ServiceKey => &[&[API_KEY]],
    };
    let mut errors = Vec::new();
    for param in query.split(['&', ';']) {
        let raw = param.split('=').next().unwrap_or_default();
        let name = query_name(raw);
        let hit = name.split(['[', ']', '.']).map(str::trim).any(|part| {
            !part.is_empty()
                && (same_member(part, key_field)
                    || members
                        .iter()
                        .flat_map(|m| m.iter())
                        .any(|m| same_member(part, m)))
        });
        if hit {
            errors.push(FieldError::parameter(
                name.into_owned(),
                "a member of the body may not be sent in the query string",
            ));
        }
    }
    if errors.is_empty() {
        return Ok(());
    }
    let mut r = Refusal::new(
        Code::InvalidBody,
        "the query string names a member of the checked body",
    );
    r.errors = errors;
    Err(r)
}

/// A query parameter's name as a server reads it: `+` is a space, `%XX` its byte (invalid
/// UTF-8 replaced).
fn query_name(raw: &str) -> Cow<'_, str> {
    if !raw.contains(['%', '+']) {
        return Cow::Borrowed(raw);
    }
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex_val(b[i + 1]), hex_val(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Before reading a body: a checked operation must declare `Content-Type: application/json`
/// (parameters such as `charset=utf-8` allowed; type and subtype case-insensitive).
pub fn check_content_type(content_type: Option<&[u8]>) -> Result<(), Refusal> {
    let ok = content_type.is_some_and(|v| {
        let essence = v
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        essence.eq_ignore_ascii_case(b"application/json")
    });
    if ok {
        Ok(())
    } else {
        Err(Refusal::new(
            Code::UnsupportedMediaType,
            "this operation takes a JSON body: send Content-Type: application/json",
        ))
    }
}

/// Before reading a body: refuse at once when its declared length is over `cap`.
pub fn check_declared_length(content_length: Option<u64>, cap: u64) -> Result<(), Refusal> {
    match content_length {
        Some(n) if n > cap => Err(too_large(cap)),
        _ => Ok(()),
    }
}

/// The `413 body_too_large` refusal for a cap of `cap` bytes.
pub fn too_large(cap: u64) -> Refusal {
    Refusal::new(
        Code::BodyTooLarge,
        format!("the request body may be at most {cap} bytes"),
    )
}

#[cfg(test)]
mod header_tests {
    use super::*;

    #[test]
    fn a_query_that_names_a_body_member_is_refused_naming_it() {
        let refused = |rule, q: &str| {
            check_query(rule, Some(q), API_KEY)
                .unwrap_err()
                .errors
                .into_iter()
                .map(|e| e.parameter.unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            refused(BodyRule::WebhookSet, "url=http://169.254.169.254/"),
            ["url"]
        );
        // Any case or folding, brackets, dots, percent-encoding, `+`, `;`: each named.
        for q in [
            "URL=x",
            "Url=x",
            "%75rl=x",
            "url[]=x",
            "url%5B%5D=x",
            " url=x",
            "+url=x",
            "a=1;url=x",
            "webhook.url=x",
            "WEBHOOKKEY=x",
            "signing",
        ] {
            assert_eq!(refused(BodyRule::WebhookSet, q).len(), 1, "{q}");
        }
        assert_eq!(
            refused(BodyRule::ServiceUpgrade, "apiKey=other&planID=3&x=1"),
            ["apiKey", "planID"]
        );
        assert_eq!(
            refused(BodyRule::ServiceKey, "APIKEY=k"),
            ["APIKEY"],
            "a partner's key field, case folded"
        );
        assert_eq!(
            refused(BodyRule::GroupEvent, "eventOptions[callType]=x"),
            ["eventOptions[callType]"]
        );
        assert_eq!(
            refused(BodyRule::GroupEvent, "%C5%BFtartTime=x").len(),
            1,
            "ſ is s"
        );
        // A route's own key field.
        assert!(check_query(BodyRule::ServiceKey, Some("customer=k"), "customer").is_err());
        // Other parameters pass, and so does no query.
        for q in ["", "x=1", "urls=1", "callback=u", "page=2&limit=10"] {
            assert!(
                check_query(BodyRule::WebhookSet, Some(q), API_KEY).is_ok(),
                "{q}"
            );
        }
        assert!(check_query(BodyRule::WebhookSet, None, API_KEY).is_ok());
        let r = check_query(BodyRule::WebhookSet, Some("url=x"), API_KEY).unwrap_err();
        assert_eq!(r.code, Code::InvalidBody);
        let v: serde_json::Value = serde_json::from_str(&r.problem_json()).unwrap();
        assert_eq!(v["errors"][0]["parameter"], "url");
    }

    #[test]
    fn content_type_must_be_json() {
        for ok in [
            &b"application/json"[..],
            b"Application/JSON",
            b"application/json; charset=utf-8",
            b" application/json ",
        ] {
            assert!(check_content_type(Some(ok)).is_ok(), "{ok:?}");
        }
        for bad in [
            &b"text/plain"[..],
            b"application/jsonx",
            b"application/x-www-form-urlencoded",
            b"",
        ] {
            assert_eq!(
                check_content_type(Some(bad)).unwrap_err().code,
                Code::UnsupportedMediaType
            );
        }
        assert_eq!(
            check_content_type(None).unwrap_err().code,
            Code::UnsupportedMediaType
        );
    }

    #[test]
    fn declared_length_over_the_cap_is_refused() {
        assert!(check_declared_length(Some(100), 100).is_ok());
        assert!(check_declared_length(None, 100).is_ok());
        assert_eq!(
            check_declared_length(Some(101), 100).unwrap_err().code,
            Code::BodyTooLarge
        );
    }
}
