//! The bodies `/api/keys/…` takes, typed: each is read as JSON, must be an object, and is then
//! deserialized into its struct through `serde_path_to_error`, so that a 400 names the field
//! that broke, as the request path's refusals do.
//!
//! | body | answer |
//! |---|---|
//! | not JSON (empty too, where a body is required) | 400 `invalid_json` |
//! | JSON, not an object | 400 `invalid_body`, pointer `""` |
//! | a field of the wrong type, missing, or outside its rule | 400 `invalid_body`, pointer `/field`, the field's rule as `detail` |
//! | a member the body does not have, at any depth | 400 `invalid_body`, its pointer, the members the body has |
//! | a member named twice in one object, at any depth | 400 `invalid_body`, its pointer |
//! | anything but nothing, white space or `{}`, where the request takes no body ([`none`]) | 400, as above |
//!
//! A member the body does not have, at any depth, is refused (400 `invalid_body`, its pointer,
//! and the members it may have): a misspelt `expires_at` or `requests_per_window` would
//! otherwise make a key that never expires or keeps its plan's limit, as a misspelt query
//! parameter would answer another question (`query.rs`), and as the YAML refuses unknown
//! fields. A member named twice in one object is refused (400 `invalid_body`, its pointer):
//! readers differ on which copy counts (the first, the last, both), so a proxy or an audit
//! log before the gateway could read another key or plan than the one made, as the request
//! path refuses them too. With more than one bad field, the one named is the first of a
//! wrong type (in name order), else the first the body's checks meet.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_path_to_error::Segment;
use utoipa::ToSchema;

use super::codes::AdminCode;
use super::reply::{problem, problem_with};
use super::view::{FieldErrorView, FieldErrors};
use crate::config::{Period, QuotaSpec, MAX_QUOTA_REQUESTS, MAX_REQUESTS_PER_WINDOW};
use crate::digest::Digest;
use crate::keys::secret::{self, Shape};
use crate::policy::authenticate::bearer_token;

/// A refusal of the admin API, boxed (a `Response` is large for an `Err`).
pub(super) type Refused = Box<http::Response<Vec<u8>>>;

/// A body of the admin API: its struct, and the rule of each field in words.
pub(super) trait Body: DeserializeOwned {
    /// What the field at `pointer` must be: the `detail` of the 400 that names it.
    fn rule(pointer: &str) -> String;
}

/// `POST /api/keys/{name}/suspend`: optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SuspendBody {
    /// Why, for the record (at most [`MAX_REASON`] characters).
    reason: Option<String>,
}

/// The longest `reason` a suspension keeps, in characters.
const MAX_REASON: usize = 200;

/// `PUT /api/keys/{name}/limit`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitBody {
    requests_per_window: Option<u64>,
}

/// `PUT /api/keys/{name}/quota`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct QuotaBody {
    pub(super) requests: Option<u64>,
    #[schema(value_type = Option<super::view::PeriodSchema>)]
    pub(super) per: Option<Period>,
}

/// `POST /api/keys/revoke`: the leak path.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SecretBody {
    /// The secret, bare or as `Bearer <secret>`; never logged or echoed.
    key: Option<String>,
}

impl Body for SuspendBody {
    fn rule(_: &str) -> String {
        format!("must be a string of at most {MAX_REASON} characters")
    }
}

impl Body for LimitBody {
    fn rule(_: &str) -> String {
        format!("must be an integer from 1 to {MAX_REQUESTS_PER_WINDOW}, as a plan's (required)")
    }
}

impl Body for QuotaBody {
    fn rule(pointer: &str) -> String {
        match pointer {
            "/per" => "must be `day` or `month` (required)".into(),
            _ => {
                format!("must be an integer from 1 to {MAX_QUOTA_REQUESTS}, as a plan's (required)")
            }
        }
    }
}

impl Body for SecretBody {
    fn rule(_: &str) -> String {
        "must be the secret itself, as a string (required)".into()
    }
}

impl SuspendBody {
    /// The body, or none (an empty body is `{}`).
    pub(super) fn read_optional(body: &[u8]) -> Result<Self, Refused> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        read(body)
    }

    /// The reason, checked.
    pub(super) fn reason(self) -> Result<Option<String>, Refused> {
        match self.reason {
            Some(r) if r.chars().count() > MAX_REASON => Err(broken::<Self>("/reason")),
            r => Ok(r),
        }
    }
}

impl LimitBody {
    /// The window limit, checked.
    pub(super) fn requests_per_window(&self) -> Result<u32, Refused> {
        self.requests_per_window
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| (1..=MAX_REQUESTS_PER_WINDOW).contains(n))
            .ok_or_else(|| broken::<Self>("/requests_per_window"))
    }
}

impl QuotaBody {
    /// The quota, checked: `requests`, then `per`.
    pub(super) fn quota(&self) -> Result<QuotaSpec, Refused> {
        let requests = self
            .requests
            .filter(|n| (1..=MAX_QUOTA_REQUESTS).contains(n))
            .ok_or_else(|| broken::<Self>("/requests"))?;
        let per = self.per.ok_or_else(|| broken::<Self>("/per"))?;
        Ok(QuotaSpec { requests, per })
    }
}

impl SecretBody {
    /// The digest of the secret, as it was found: bare, or as an `Authorization` value;
    /// spaces around it (a paste) are not part of it (a key is a token68: it has none).
    pub(super) fn digest(&self) -> Result<Digest, Refused> {
        let s = self.key.as_deref().ok_or_else(|| broken::<Self>("/key"))?;
        let s = s.trim_matches(|c: char| c.is_ascii_whitespace());
        let token = bearer_token(s.as_bytes()).unwrap_or(s.as_bytes());
        if token.is_empty() {
            return Err(invalid("/key", "must not be empty"));
        }
        // A secret in the gateway's own format that does not check out was cut or mistyped:
        // said at once, rather than looked up as a secret no key has.
        if token.starts_with(secret::PREFIX.as_bytes())
            && std::str::from_utf8(token).map_or(true, |t| secret::shape(t) == Shape::Malformed)
        {
            return Err(invalid(
                "/key",
                "starts with `tg_` but is not a secret this gateway issued (its length, characters or checksum are wrong)",
            ));
        }
        Ok(Digest::of(token))
    }
}

/// `body` as `B`: JSON, an object, then `B`'s fields, each named when it breaks.
pub(super) fn read<B: Body>(body: &[u8]) -> Result<B, Refused> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| Box::new(problem(AdminCode::InvalidJson, "send a JSON object")))?;
    if !value.is_object() {
        return Err(invalid("", "must be a JSON object"));
    }
    // Read once more for members named twice: the body is small (the listener bounds it).
    if let Ok(Twice(Some(at))) = serde_json::from_slice::<Twice>(body) {
        return Err(invalid(&at, "is given more than once"));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let at = pointer(e.path());
        match unknown_member(&e.inner().to_string()) {
            Some(members) => invalid(&at, &format!("is not a member of this body: {members}")),
            None => broken::<B>(&at),
        }
    })
}

/// The body of a request that takes none: nothing, white space or `{}`; anything else is
/// 400 (`invalid_json`, or `invalid_body` naming the first member: "it has none").
pub(super) fn none(body: &[u8]) -> Result<(), Refused> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    read::<NoBody>(body).map(|_| ())
}

/// What a request that takes no body may send: an empty object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoBody {}

impl Body for NoBody {
    fn rule(_: &str) -> String {
        "is not a member of this body: it has none".into()
    }
}

/// For serde's error on a member a struct that denies unknown fields does not have ("unknown
/// field `x`, expected `a` or `b`", "…, expected one of `a`, `b`, `c`", "…, there are no
/// fields"), the members it may have, in words; `None` for any other error.
fn unknown_member(message: &str) -> Option<String> {
    if !message.starts_with("unknown field `") {
        return None;
    }
    if message.ends_with(", there are no fields") {
        return Some("it has none".into());
    }
    // The list serde ends its message with (a member's name may hold anything, the list not).
    let (_, expected) = message.rsplit_once(", expected ")?;
    let names: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    Some(format!("it has `{}`", names.join("`, `")))
}

/// The JSON Pointer of the first member a JSON text names twice in one object, if any.
struct Twice(Option<String>);

impl<'de> Deserialize<'de> for Twice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::DeserializeSeed::deserialize(At(String::new()), d).map(Twice)
    }
}

/// A value at a pointer, read for [`Twice`].
struct At(String);

impl<'de> serde::de::DeserializeSeed<'de> for At {
    type Value = Option<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for At {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut first = None;
        for i in 0.. {
            match seq.next_element_seed(At(format!("{}/{i}", self.0)))? {
                Some(found) => first = first.or(found),
                None => break,
            }
        }
        Ok(first)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut names = std::collections::HashSet::new();
        let mut first = None;
        while let Some(name) = map.next_key::<String>()? {
            let at = format!("{}/{}", self.0, name.replace('~', "~0").replace('/', "~1"));
            let within = map.next_value_seed(At(at.clone()))?;
            if !names.insert(name) {
                first = first.or(Some(at));
            }
            first = first.or(within);
        }
        Ok(first)
    }
}

/// The JSON Pointer (RFC 6901) of a path serde followed.
fn pointer(path: &serde_path_to_error::Path) -> String {
    let mut p = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => p.push_str(&format!("/{index}")),
            Segment::Map { key } => {
                p.push('/');
                p.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            Segment::Enum { .. } | Segment::Unknown => {}
        }
    }
    p
}

/// 400 `invalid_body`: the field at `pointer` breaks `B`'s rule for it.
pub(super) fn broken<B: Body>(pointer: &str) -> Refused {
    invalid(pointer, &B::rule(pointer))
}

/// 400 `invalid_body` with one field error.
pub(super) fn invalid(pointer: &str, detail: &str) -> Refused {
    Box::new(problem_with(
        AdminCode::InvalidBody,
        &format!("`{pointer}` {detail}"),
        FieldErrors {
            errors: vec![FieldErrorView {
                pointer: pointer.into(),
                detail: detail.into(),
            }],
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The code, the pointer and the detail of a refusal.
    fn refused(r: &http::Response<Vec<u8>>) -> (String, String, String) {
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        let e = &v["errors"][0];
        (
            v["code"].as_str().unwrap().into(),
            e["pointer"].as_str().unwrap_or("-").into(),
            e["detail"].as_str().unwrap_or("-").into(),
        )
    }

    fn limit(body: &str) -> Result<u32, (String, String, String)> {
        read::<LimitBody>(body.as_bytes())
            .and_then(|b| b.requests_per_window())
            .map_err(|r| refused(&r))
    }

    #[test]
    fn a_400_names_the_field_whatever_broke_it() {
        // A member the body does not have: 400 naming it and the members there are.
        for (body, at) in [
            (r#"{"requests_per_window":3,"x":1}"#, "/x"),
            (r#"{"request_per_window":3}"#, "/request_per_window"),
            (r#"{"requests_per_window":4,"x":{"a":1,"b":{"a":2}}}"#, "/x"),
            (r#"{"a/b":1,"requests_per_window":4}"#, "/a~1b"),
            (r#"{"x`, expected `y":1}"#, "/x`, expected `y"),
        ] {
            let (code, pointer, detail) = limit(body).unwrap_err();
            assert_eq!(
                (code.as_str(), pointer.as_str(), detail.as_str()),
                (
                    "invalid_body",
                    at,
                    "is not a member of this body: it has `requests_per_window`"
                ),
                "{body}"
            );
        }
        for body in [
            "{}",
            r#"{"requests_per_window":null}"#,
            r#"{"requests_per_window":0}"#,
            r#"{"requests_per_window":"5"}"#,
            r#"{"requests_per_window":2.5}"#,
            r#"{"requests_per_window":-1}"#,
            r#"{"requests_per_window":1000001}"#,
            r#"{"requests_per_window":99999999999999999999999}"#,
        ] {
            let (code, pointer, detail) = limit(body).unwrap_err();
            assert_eq!(
                (code.as_str(), pointer.as_str()),
                ("invalid_body", "/requests_per_window"),
                "{body}"
            );
            assert!(detail.contains("from 1 to 1000000"), "{detail}");
        }
        assert_eq!(limit("[3]").unwrap_err().1, "");
        assert_eq!(limit("3").unwrap_err().1, "");
        for body in ["", "{", "{} x"] {
            assert_eq!(limit(body).unwrap_err().0, "invalid_json", "{body:?}");
        }
        // A member named twice, at any depth, whichever copy is good: 400 naming it.
        for (body, at) in [
            (
                r#"{"requests_per_window":0,"requests_per_window":4}"#,
                "/requests_per_window",
            ),
            (
                r#"{"requests_per_window":4,"requests_per_window":4}"#,
                "/requests_per_window",
            ),
            (
                r#"{"requests_per_window":4,"x":{"a/b":1,"a/b":2}}"#,
                "/x/a~1b",
            ),
            (
                r#"{"requests_per_window":4,"x":[0,{"y":1,"y":1}]}"#,
                "/x/1/y",
            ),
        ] {
            let (code, pointer, detail) = limit(body).unwrap_err();
            assert_eq!(
                (code.as_str(), pointer.as_str(), detail.as_str()),
                ("invalid_body", at, "is given more than once"),
                "{body}"
            );
        }
    }

    #[test]
    fn a_request_that_takes_no_body_takes_nothing_or_an_empty_object() {
        for body in ["", " \r\n", "{}", " { } "] {
            assert!(none(body.as_bytes()).is_ok(), "{body:?}");
        }
        for (body, want) in [
            (r#"{"reason":"leaked"}"#, ("invalid_body", "/reason")),
            (r#"{"":1}"#, ("invalid_body", "/")),
            ("[]", ("invalid_body", "")),
            ("null", ("invalid_body", "")),
            ("{", ("invalid_json", "-")),
            ("reason=leaked", ("invalid_json", "-")),
        ] {
            let r = none(body.as_bytes()).unwrap_err();
            let (code, pointer, detail) = refused(&r);
            assert_eq!((code.as_str(), pointer.as_str()), want, "{body}");
            if pointer.starts_with('/') {
                assert_eq!(detail, "is not a member of this body: it has none");
            }
        }
    }

    #[test]
    fn quota_suspend_and_secret_bodies_name_their_fields() {
        let quota = |body: &str| {
            read::<QuotaBody>(body.as_bytes())
                .and_then(|b| b.quota())
                .map_err(|r| refused(&r).1)
        };
        assert_eq!(
            quota(r#"{"requests":5,"per":"day"}"#),
            Ok(QuotaSpec {
                requests: 5,
                per: Period::Day
            })
        );
        assert_eq!(quota(r#"{"requests":5,"per":"week"}"#), Err("/per".into()));
        assert_eq!(quota(r#"{"requests":5,"per":7}"#), Err("/per".into()));
        assert_eq!(quota(r#"{"requests":5}"#), Err("/per".into()));
        assert_eq!(quota(r#"{"per":"day"}"#), Err("/requests".into()));
        assert_eq!(
            quota(r#"{"requests":0,"per":"month"}"#),
            Err("/requests".into())
        );
        assert_eq!(
            quota(r#"{"requests":5,"per":"day","period":"day"}"#),
            Err("/period".into())
        );
        let detail = read::<QuotaBody>(br#"{"requests":5,"pre":"day"}"#)
            .err()
            .map(|r| refused(&r).2);
        assert_eq!(
            detail.as_deref(),
            Some("is not a member of this body: it has `requests`, `per`")
        );

        let suspend = |body: &str| {
            SuspendBody::read_optional(body.as_bytes())
                .and_then(SuspendBody::reason)
                .map_err(|r| refused(&r).1)
        };
        assert_eq!(suspend(" \n"), Ok(None));
        assert_eq!(suspend(r#"{"reason":null}"#), Ok(None));
        assert_eq!(suspend(r#"{"reason":"late"}"#), Ok(Some("late".into())));
        assert_eq!(suspend(r#"{"reason":5}"#), Err("/reason".into()));
        let long = format!(r#"{{"reason":"{}"}}"#, "é".repeat(201));
        assert_eq!(suspend(&long), Err("/reason".into()));
        assert_eq!(suspend("null"), Err("".into()));
        assert_eq!(suspend(r#"{"reason":"late","by":"me"}"#), Err("/by".into()));

        let secret = |body: &str| {
            read::<SecretBody>(body.as_bytes())
                .and_then(|b| b.digest())
                .map_err(|r| refused(&r))
        };
        assert_eq!(
            secret(r#"{"key":" Bearer abc "}"#).ok(),
            Some(Digest::of(b"abc"))
        );
        assert_eq!(secret(r#"{"key":"abc"}"#).ok(), Some(Digest::of(b"abc")));
        assert_eq!(secret(r#"{"secret":"abc"}"#).unwrap_err().1, "/secret");
        for body in [r#"{}"#, r#"{"key":5}"#, r#"{"key":"  "}"#] {
            assert_eq!(secret(body).unwrap_err().1, "/key", "{body}");
        }
        assert_eq!(secret(r#"{"key":""}"#).unwrap_err().2, "must not be empty");

        // The gateway's own format: an issued secret is looked up; one cut short, or with a
        // character changed, is refused at once (400, `/key`), and never echoed.
        let issued = secret::issue().unwrap();
        let body = |k: &str| format!(r#"{{"key":"{k}"}}"#);
        assert_eq!(
            secret(&body(&issued)).ok(),
            Some(Digest::of(issued.as_bytes()))
        );
        assert_eq!(
            secret(&body(&format!("Bearer {issued}"))).ok(),
            Some(Digest::of(issued.as_bytes()))
        );
        let cut = &issued[..issued.len() - 1];
        let (code, pointer, detail) = secret(&body(cut)).unwrap_err();
        assert_eq!((code.as_str(), pointer.as_str()), ("invalid_body", "/key"));
        assert!(!detail.contains(cut), "the secret is not echoed: {detail}");
        let mut typo = issued.clone().into_bytes();
        typo[20] = if typo[20] == b'x' { b'y' } else { b'x' };
        let typo = String::from_utf8(typo).unwrap();
        assert_eq!(secret(&body(&typo)).unwrap_err().1, "/key");
    }
}
