//! Request bodies on the wire.
//!
//! - Routes with a body rule: one `Content-Type` field (else 400), `application/json` (else
//!   415); a query string that names none of the body rule's members (else 400
//!   `invalid_body`, [`crate::policy::body::check_query`]); a declared
//!   `Content-Length` over `max_validated_body_bytes` is 413 before anything is read, a chunked
//!   body is 413 as soon as the count passes the cap; then the body is read whole, *before* any
//!   upstream connection exists, within `server.body_timeout_seconds` of the head (else 408
//!   `request_timeout`, on HTTP/1.1 and HTTP/2 alike), and checked ([`crate::policy::body`]). The checked bytes are
//!   replayed upstream from Pingora's retry buffer, so the upstream receives exactly what was
//!   checked.
//! - Other routes: a declared length over `max_body_bytes` is 413 up front; the body streams
//!   through unbuffered, counted ([`count_streamed`]), and the exchange is cut with 413 when a
//!   chunked stream crosses the cap.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

use super::context::Ctx;
use super::head::{declared_length, framed_as};
use super::Stop;
use crate::config::routes::BodyRule;
use crate::policy::body::{check_content_type, check_declared_length, too_large};
use crate::policy::keys::KeyIdx;
use crate::policy::{Code, Policy, Refusal};

/// Step 5: check the body of a request `policy` admitted for `key`, by its route's rule if it
/// has one.
pub(crate) async fn check(
    session: &mut Session,
    ctx: &mut Ctx,
    policy: &Policy,
    key: KeyIdx,
    rule: Option<BodyRule>,
) -> Result<(), Stop> {
    let limits = policy.config.limits;
    let req = session.req_header();
    let declared = declared_length(&req.headers)?;
    ctx.declared = declared;
    if rule.is_none() {
        check_declared_length(declared, limits.max_body_bytes.get())?;
        return Ok(());
    }
    let cap = limits.max_validated_body_bytes.get();
    // One type: a server behind that reads the second (a form) would parse what was not
    // checked. `Content_Type` is one too: CGI, WSGI and Rack servers read `_` as `-`.
    let types = req
        .headers
        .iter()
        .filter(|(n, _)| {
            super::head::as_servers_read(n.as_str().as_bytes()).eq(CONTENT_TYPE.as_str().bytes())
        })
        .count();
    if types > 1 {
        return Err(Refusal::new(
            Code::BadRequest,
            "this operation takes one Content-Type field: application/json",
        )
        .into());
    }
    check_content_type(req.headers.get(CONTENT_TYPE).map(|v| v.as_bytes()))?;
    // A route with a body rule was classified: `ctx.route` is set.
    let route = ctx
        .route
        .ok_or_else(|| Refusal::new(Code::InvalidBody, "no route"))?;
    policy.check_request_query(route, req.uri.query())?;
    check_declared_length(declared, cap)?;
    // The whole body within `body_timeout` of the head (which Pingora had just read when
    // this request's context was made): else 408, and nothing is forwarded. On HTTP/1.1 the
    // connection's own setting, so this deadline is the one its stream keeps.
    let within = ctx
        .conn
        .as_ref()
        .map_or(policy.config.server.body_timeout, |c| {
            c.settings().body_timeout
        });
    let deadline = ctx.started + within;
    let read = tokio::time::timeout_at(deadline.into(), read_whole(session, cap)).await;
    let body = match read {
        Ok(Ok(Some(body))) => body,
        Ok(Ok(None)) => return Err(too_large(cap).into()),
        // The edge stream ends a body read at the same deadline.
        Ok(Err(_)) | Err(_) if Instant::now() >= deadline => {
            return Err(request_timeout(within).into())
        }
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => return Err(request_timeout(within).into()),
    };
    if let Some(conn) = &ctx.conn {
        conn.body_done();
    }
    ctx.pending = policy.check_request_body(key, route, &body)?;
    ctx.checked_body = Some(body.len());
    ctx.reframe_body = !framed_as(&session.req_header().headers, body.len());
    Ok(())
}

/// The `408 request_timeout` refusal.
fn request_timeout(within: std::time::Duration) -> Refusal {
    Refusal::new(
        Code::RequestTimeout,
        format!(
            "the request body did not arrive within {} s",
            within.as_secs()
        ),
    )
}

/// Read the whole body, keeping it in Pingora's retry buffer for the upstream. `None` when it
/// passes `cap` (reading stops there).
async fn read_whole(session: &mut Session, cap: u64) -> Result<Option<Bytes>> {
    session.enable_retry_buffering();
    let mut buf = BytesMut::new();
    while let Some(chunk) = session
        .read_request_body()
        .await
        .map_err(|e| e.into_down())?
    {
        buf.extend_from_slice(&chunk);
        if buf.len() as u64 > cap {
            return Ok(None);
        }
    }
    Ok(Some(buf.freeze()))
}

/// Count a streamed (unchecked) body chunk against `max_body_bytes`; past it, the exchange ends
/// with 413.
pub(crate) fn count_streamed(ctx: &mut Ctx, chunk: Option<&Bytes>) -> Result<()> {
    if ctx.checked_body.is_some() {
        return Ok(());
    }
    if let (Some(b), Some(s)) = (chunk, ctx.snap.as_ref()) {
        ctx.streamed += b.len() as u64;
        if ctx.streamed > s.policy.config.limits.max_body_bytes.get() {
            return Error::e_explain(
                ErrorType::HTTPStatus(413),
                "request body over max_body_bytes",
            );
        }
    }
    Ok(())
}
