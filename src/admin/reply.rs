//! How the admin listener answers: problems (RFC 9457), JSON, text, the page and its headers,
//! and the small readings of a request (a bearer token, a path segment).

use std::sync::Arc;

use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;

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

/// An RFC 9457 problem+json answer of the admin listener (the core's one writer of problems).
pub(super) fn problem(
    status: StatusCode,
    code: &str,
    title: &str,
    detail: &str,
) -> Response<Vec<u8>> {
    let body = refusal::problem(status.as_u16(), code, title, detail);
    reply(status, "application/problem+json", json_bytes(&body))
}

pub(super) fn json_bytes(v: &impl serde::Serialize) -> Vec<u8> {
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

pub(super) fn not_allowed(allow: &'static str) -> Response<Vec<u8>> {
    let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
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
