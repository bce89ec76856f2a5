//! The gateway's own answers: one writer for every refusal, whether the policy refused the
//! request ([`send`] from `request_filter`) or proxying it failed ([`for_error`], then [`send`]
//! from `fail_to_proxy`).
//!
//! Every answer is RFC 9457 `application/problem+json` with `Cache-Control: no-store`,
//! `X-Request-Id`, `WWW-Authenticate` on a 401, `Retry-After` on a 429, `Allow` on a 405, and the rate-limit
//! header fields when the caller is known. Upstream failures: cannot connect, connect timeout,
//! TLS failure, a reset or a malformed answer are `502 upstream_unavailable`; no answer within
//! `read_timeout` is `504 upstream_timeout`.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE};
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use pingora::{Error, ErrorSource, ErrorType, Result};

use super::context::Ctx;
use super::head::header_value;
use crate::policy::body::too_large;
use crate::policy::{Code, Refusal};

/// Answer `refusal` on `session`, and note it in `ctx` for the access line and the metrics.
///
/// A request refused before its body was read is not read or drained: the connection closes
/// after the answer. So does every connection while the process drains or hands over
/// (`closing`).
pub(crate) async fn send(
    session: &mut Session,
    ctx: &mut Ctx,
    refusal: &Refusal,
    closing: bool,
) -> Result<()> {
    // Refused after its quota was charged (its body, or no answer from the upstream): given
    // back; not when the upstream answered (its body then failed): that status decides.
    ctx.give_back_quota();
    ctx.outcome = refusal.code.outcome();
    ctx.code = Some(refusal.code);
    ctx.status = refusal.status();
    // The code only: a detail can quote the request (a body field, a header).
    tracing::debug!(
        target: "tollgate::policy",
        request_id = super::head::id_str(&ctx.request_id),
        code = refusal.code.as_str(),
        "refused"
    );
    if !session.is_body_done() || closing {
        session.set_keepalive(None);
    }
    let body = Bytes::from(refusal.problem_json());
    let resp = problem_header(ctx, refusal, body.len())?;
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

fn problem_header(ctx: &Ctx, refusal: &Refusal, body_len: usize) -> Result<ResponseHeader> {
    let mut resp = ResponseHeader::build(refusal.status(), Some(8))?;
    resp.insert_header(CONTENT_TYPE, "application/problem+json")?;
    resp.insert_header(CONTENT_LENGTH, itoa::Buffer::new().format(body_len))?;
    resp.insert_header(CACHE_CONTROL, "no-store")?;
    // Names Pingora has no title-case spelling for are written as strings, so the client sees
    // them capitalized.
    resp.insert_header("X-Request-Id", ctx.request_id.clone())?;
    if refusal.code == Code::Unauthorized {
        resp.insert_header("WWW-Authenticate", "Bearer realm=\"tollgate\"")?;
    }
    if let Some(s) = refusal.retry_after {
        resp.insert_header("Retry-After", itoa::Buffer::new().format(s))?;
    }
    if let Some(allow) = &refusal.allow {
        resp.insert_header("Allow", allow.as_ref())?;
    }
    rate_limit_headers(ctx, &mut resp)?;
    Ok(resp)
}

/// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers), when the caller
/// is known: on every answer to an authenticated request, the gateway's or the upstream's.
pub(crate) fn rate_limit_headers(ctx: &Ctx, resp: &mut ResponseHeader) -> Result<()> {
    if let (Some(s), Some(k), Some(c), Some(q)) = (&ctx.snap, ctx.key, ctx.credential, &ctx.budget)
    {
        let (policy, state) = s
            .policy
            .rate_limit_headers(k, c, q, ctx.quota_state.as_deref());
        resp.insert_header("RateLimit-Policy", header_value(policy)?)?;
        resp.insert_header("RateLimit", header_value(state)?)?;
    }
    Ok(())
}

/// Whether `e` is the client taking too long over the answer (an HTTP/2 stream's
/// `send_timeout`): timed out, whatever was written of it.
pub(crate) fn client_too_slow(e: &Error) -> bool {
    matches!(
        (e.etype(), e.esource()),
        (ErrorType::WriteTimedout, ErrorSource::Downstream)
    )
}

/// The refusal that answers a failure to proxy, or `None` when there is nobody to answer (the
/// client went away). Never formats `e` itself: its context can hold raw request or response
/// bytes.
pub(crate) fn for_error(e: &Error, ctx: &Ctx) -> Option<Refusal> {
    match (e.etype(), e.esource()) {
        (ErrorType::HTTPStatus(413), _) => Some(too_large(
            ctx.snap
                .as_ref()
                .map_or(0, |s| s.policy.config.limits.max_body_bytes.get()),
        )),
        (ErrorType::ReadTimedout | ErrorType::WriteTimedout, ErrorSource::Upstream) => Some(
            Refusal::new(Code::UpstreamTimeout, "the upstream did not answer in time"),
        ),
        (_, ErrorSource::Upstream) => Some(Refusal::new(
            Code::UpstreamUnavailable,
            "the upstream could not be reached or broke the connection",
        )),
        // The client took too long over the answer: no answer reaches it.
        _ if client_too_slow(e) => None,
        // The client left, or reset its HTTP/2 stream or connection: no answer reaches it.
        (
            ErrorType::ReadError
            | ErrorType::WriteError
            | ErrorType::ConnectionClosed
            | ErrorType::H2Error,
            ErrorSource::Downstream,
        ) => None,
        (_, ErrorSource::Downstream) => Some(Refusal::new(
            Code::BadRequest,
            "the request could not be read",
        )),
        _ => Some(Refusal::new(
            Code::UpstreamUnavailable,
            "the request could not be proxied",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(etype: ErrorType, source: ErrorSource) -> Option<Code> {
        let e = match source {
            ErrorSource::Upstream => Error::new_up(etype),
            ErrorSource::Downstream => Error::new_down(etype),
            _ => Error::new_in(etype),
        };
        for_error(&e, &Ctx::new()).map(|r| r.code)
    }

    #[test]
    fn failures_map_to_the_contract_codes() {
        use ErrorSource::{Downstream, Internal, Upstream};
        assert_eq!(
            code(ErrorType::ReadTimedout, Upstream),
            Some(Code::UpstreamTimeout)
        );
        assert_eq!(
            code(ErrorType::WriteTimedout, Upstream),
            Some(Code::UpstreamTimeout)
        );
        for t in [
            ErrorType::ConnectRefused,
            ErrorType::ConnectTimedout,
            ErrorType::ConnectionClosed,
            ErrorType::TLSHandshakeFailure,
            ErrorType::InvalidHTTPHeader,
        ] {
            assert_eq!(code(t, Upstream), Some(Code::UpstreamUnavailable));
        }
        assert_eq!(
            code(ErrorType::HTTPStatus(413), Downstream),
            Some(Code::BodyTooLarge)
        );
        for t in [
            ErrorType::ReadError,
            ErrorType::WriteError,
            ErrorType::ConnectionClosed,
            ErrorType::H2Error,
            ErrorType::WriteTimedout,
        ] {
            let name = format!("{t:?}");
            assert_eq!(code(t, Downstream), None, "{name}");
        }
        assert_eq!(
            code(ErrorType::InvalidHTTPHeader, Downstream),
            Some(Code::BadRequest)
        );
        assert_eq!(
            code(ErrorType::InternalError, Internal),
            Some(Code::UpstreamUnavailable)
        );
    }
}
