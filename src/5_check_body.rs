//! Step 5 — check body: the request bodies whose shape the spec gives.
//!
//! | rule | spec | what is checked |
//! |---|---|---|
//! | `group_event` | 2.1, 4.1 | `name`, `groupId` non-empty strings; `type` = `event`; `startTime` an ISO 8601 UTC timestamp with milliseconds (`2026-11-21T10:00:00.000Z`, a real calendar date); `eventOptions` an object with non-empty string `callType` and `description` |
//! | `webhook_set` | 2.2, 4.2 rules 1–5 | `url` an absolute http(s) URL with a host; `signing`, when present, `on` or `off`; `webhookKey`, when present, a string of at least 16 characters; `signing: on` without a key is allowed (the provider may generate one) |
//! | `service_upgrade` | 2.3, 4.3 | `apiKey` a non-empty string; `planID` a JSON integer (no fraction, no exponent, within 64 bits) |
//!
//! Unknown extra fields pass. The document must be one JSON object. Every violation is reported
//! (not just the first) as a JSON Pointer and a detail. The caller enforces the size cap before
//! the body is read; [`check_body`] checks it again first. Parsing is bounded: `serde_json`
//! refuses nesting deeper than 128 levels without recursing further, numbers that do not fit
//! an `f64` are refused, and nothing is allocated beyond a small multiple of the (capped) input.
//! Duplicate object keys are refused as `invalid_json`: the upstream might read the other copy.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use time::macros::format_description;
use time::PrimitiveDateTime;

use crate::authenticate::Digest;
use crate::refusal::{Code, FieldError, Refusal};
use crate::routes::BodyRule;

/// What a valid body tells the rest of the request path.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    GroupEvent,
    WebhookSet,
    /// The customer key the partner wants to act on, hashed at once.
    ServiceUpgrade {
        target: Digest,
    },
}

/// Check `body` against `rule`. `max` is the validated-body cap in bytes.
pub fn check_body(rule: BodyRule, body: &[u8], max: u64) -> Result<Checked, Refusal> {
    if body.len() as u64 > max {
        return Err(Refusal::new(
            Code::BodyTooLarge,
            format!("a {} body may be at most {max} bytes", rule.name()),
        ));
    }
    let doc = parse_strict(body)?;
    let Value::Object(obj) = doc else {
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
            webhook_set(&obj, &mut errors);
            Checked::WebhookSet
        }
        BodyRule::ServiceUpgrade => {
            let target = service_upgrade(&obj, &mut errors);
            Checked::ServiceUpgrade {
                target: target.unwrap_or(Digest([0; 32])),
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

fn parse_strict(body: &[u8]) -> Result<Value, Refusal> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let v = StrictValue::deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| {
            Refusal::new(
                Code::InvalidJson,
                format!("the body is not valid JSON: {e}"),
            )
        })?;
    Ok(v.0)
}

/// A `serde_json::Value` that refuses duplicate object keys.
struct StrictValue(Value);

impl<'de> Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(StrictValue(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(de::Error::custom(format_args!(
                    "duplicate key `{}`",
                    truncate(&k)
                )));
            }
            let StrictValue(v) = map.next_value()?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

fn truncate(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// RFC 6901: escape `~` and `/` in a member name.
fn pointer(parent: &str, name: &str) -> String {
    format!("{parent}/{}", name.replace('~', "~0").replace('/', "~1"))
}

/// A required (or present optional) string member; records an error and returns `None` when
/// it is missing, not a string, or (with `non_empty`) empty.
fn string_field<'v>(
    obj: &'v Map<String, Value>,
    parent: &str,
    name: &str,
    required: bool,
    non_empty: bool,
    errors: &mut Vec<FieldError>,
) -> Option<&'v str> {
    let p = pointer(parent, name);
    match obj.get(name) {
        None if required => {
            errors.push(FieldError::new(p, "is required"));
            None
        }
        None => None,
        Some(Value::String(s)) if non_empty && s.is_empty() => {
            errors.push(FieldError::new(p, "must not be empty"));
            None
        }
        Some(Value::String(s)) => Some(s),
        Some(other) => {
            errors.push(FieldError::new(
                p,
                format!("must be a string, not {}", kind(other)),
            ));
            None
        }
    }
}

fn group_event(obj: &Map<String, Value>, errors: &mut Vec<FieldError>) {
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
        Some(Value::Object(opts)) => {
            string_field(opts, "/eventOptions", "callType", true, true, errors);
            string_field(opts, "/eventOptions", "description", true, true, errors);
        }
        Some(other) => errors.push(FieldError::new(
            "/eventOptions",
            format!("must be an object, not {}", kind(other)),
        )),
    }
}

/// `YYYY-MM-DDTHH:MM:SS.sssZ`, exactly, on a real calendar date.
pub fn is_utc_millis_timestamp(s: &str) -> bool {
    let fmt =
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    s.len() == 24 && s.as_bytes()[0].is_ascii_digit() && PrimitiveDateTime::parse(s, fmt).is_ok()
}

fn webhook_set(obj: &Map<String, Value>, errors: &mut Vec<FieldError>) {
    if let Some(url) = string_field(obj, "", "url", true, true, errors) {
        if !is_http_url(url) {
            errors.push(FieldError::new(
                "/url",
                "must be an absolute http:// or https:// URL with a host",
            ));
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

pub fn is_http_url(s: &str) -> bool {
    let Ok(uri) = s.parse::<http::Uri>() else {
        return false;
    };
    matches!(uri.scheme_str(), Some("http") | Some("https"))
        && uri.authority().is_some_and(|a| !a.host().is_empty())
}

fn service_upgrade(obj: &Map<String, Value>, errors: &mut Vec<FieldError>) -> Option<Digest> {
    let target =
        string_field(obj, "", "apiKey", true, true, errors).map(|k| Digest::of(k.as_bytes()));
    match obj.get("planID") {
        None => errors.push(FieldError::new("/planID", "is required")),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => {}
        Some(Value::Number(_)) => errors.push(FieldError::new(
            "/planID",
            "must be an integer (no fraction or exponent, within 64 bits)",
        )),
        Some(other) => errors.push(FieldError::new(
            "/planID",
            format!("must be an integer, not {}", kind(other)),
        )),
    }
    target
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = 64 * 1024;

    fn errors(rule: BodyRule, body: &str) -> Vec<(String, String)> {
        match check_body(rule, body.as_bytes(), MAX) {
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
        check_body(rule, body, MAX).err().map(|r| r.code)
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
            check_body(BodyRule::GroupEvent, EVENT.as_bytes(), MAX),
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
    }

    #[test]
    fn webhook_rules() {
        let ok = [
            r#"{"url":"https://hooks.example.com/in"}"#,
            r#"{"url":"http://10.0.0.1:8080/x","signing":"off"}"#,
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
    fn service_upgrade_rules() {
        let ok = check_body(
            BodyRule::ServiceUpgrade,
            br#"{"apiKey":"k-1","planID":2}"#,
            MAX,
        )
        .unwrap();
        assert_eq!(
            ok,
            Checked::ServiceUpgrade {
                target: Digest::of(b"k-1")
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
            let r = check_body(BodyRule::WebhookSet, b, MAX).unwrap_err();
            assert_eq!(
                (r.code, r.errors[0].pointer.as_str()),
                (Code::InvalidBody, ""),
                "{b:?}"
            );
        }
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        let b = br#"{"url":"https://a.example/","url":"javascript:x"}"#;
        let r = check_body(BodyRule::WebhookSet, b, MAX).unwrap_err();
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
        let r = check_body(BodyRule::GroupEvent, EVENT.as_bytes(), 10).unwrap_err();
        assert_eq!(r.code, Code::BodyTooLarge);
    }

    #[test]
    fn pointers_escape_member_names() {
        assert_eq!(pointer("", "a/b~c"), "/a~1b~0c");
    }
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
