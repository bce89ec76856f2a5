//! How the admin listener answers: problems (RFC 9457, each naming an [`AdminCode`]), typed
//! JSON answers (the views of `view.rs`), text, the page and its headers, and the small
//! readings of a request (a bearer token, a path segment). Every JSON body the listener sends
//! is written by [`json`] or [`problem_with`].

use std::sync::Arc;

use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;
use serde::Serialize;

use super::codes::AdminCode;
use super::PAGE;
use crate::digest::Digest;
use crate::edge::stream::EdgeStream;
use crate::policy::authenticate::bearer_token;
use crate::refusal;

/// Whether `value` is `Bearer <token>` for a token whose SHA-256 is `want` (compared in
/// constant time).
pub(super) fn bearer_matches(value: Option<&http::HeaderValue>, want: &Digest) -> bool {
    value
        .and_then(|v| bearer_token(v.as_bytes()))
        .is_some_and(|t| Digest::of(t).ct_eq(want))
}

/// `%XX` escapes in a path segment, decoded (a key name may hold characters a URL escapes).
pub(super) fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// The usage page, with headers that keep it to itself: nothing framed, nothing fetched but
/// this listener's own API.
pub(super) fn page(status: StatusCode) -> Response<Vec<u8>> {
    let mut r = reply(status, "text/html; charset=utf-8", PAGE.as_bytes().to_vec());
    let h = r.headers_mut();
    h.insert(
        "content-security-policy",
        http::HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    h.insert("x-frame-options", http::HeaderValue::from_static("DENY"));
    h.insert(
        "referrer-policy",
        http::HeaderValue::from_static("no-referrer"),
    );
    r
}

/// The RFC 9457 problem+json answer `code` with `detail` (the core's one writer of problems:
/// `type`, `title`, `status`, `detail`, `code`).
pub(super) fn problem(code: AdminCode, detail: &str) -> Response<Vec<u8>> {
    problem_with(code, detail, NoMembers)
}

/// No extension members (a plain [`problem`]).
#[derive(Serialize)]
struct NoMembers;

/// [`problem`] with extension members: the fields of `members`, a struct (a `ConfigRefused`'s
/// `file`, `line`, `field`; an `invalid_body`'s `errors`).
pub(super) fn problem_with(
    code: AdminCode,
    detail: &str,
    members: impl Serialize,
) -> Response<Vec<u8>> {
    let status = code.status();
    let mut body = refusal::problem(status.as_u16(), code.as_str(), code.title(), detail);
    if let (Some(b), Ok(serde_json::Value::Object(m))) =
        (body.as_object_mut(), serde_json::to_value(members))
    {
        b.extend(m);
    }
    reply(status, "application/problem+json", json_bytes(&body))
}

/// A typed answer as `application/json`.
pub(super) fn json(status: StatusCode, view: &impl Serialize) -> Response<Vec<u8>> {
    reply(status, "application/json", json_bytes(view))
}

/// `v` as JSON and a line break.
fn json_bytes(v: &impl Serialize) -> Vec<u8> {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    b
}

pub(super) fn text(status: StatusCode, body: &str) -> Response<Vec<u8>> {
    reply(
        status,
        "text/plain; charset=utf-8",
        body.as_bytes().to_vec(),
    )
}

/// 204, no body.
pub(super) fn no_content() -> Response<Vec<u8>> {
    let mut r = Response::new(Vec::new());
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

/// 405 problem `method_not_allowed`, with `Allow`.
pub(super) fn not_allowed(allow: &'static str) -> Response<Vec<u8>> {
    let mut r = problem(
        AdminCode::MethodNotAllowed,
        &format!("this path takes {allow}"),
    );
    r.headers_mut()
        .insert(ALLOW, http::HeaderValue::from_static(allow));
    r
}

pub(super) fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
) -> Response<Vec<u8>> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    r
}

/// The connection's edge state (deadlines), on HTTP/1.1.
pub(super) fn conn_of(session: &ServerSession) -> Option<Arc<crate::edge::stream::Conn>> {
    session.stream().and_then(EdgeStream::of).cloned()
}
