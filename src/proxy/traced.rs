//! A recorded request's end: what its context learnt, as the record the exporter turns into
//! spans ([`crate::traces`]). Nothing here runs for a request that is not recorded.

use std::time::Instant;

use pingora::proxy::Session;

use super::Ctx;
use crate::traces::span::{Finished, Upstream, Wall};

/// The record of `ctx`'s request, ended `now`, when it is recorded.
pub(crate) fn finished(session: &Session, ctx: &mut Ctx, now: Instant) -> Option<Box<Finished>> {
    let trace = ctx.trace.as_mut()?;
    let rec = trace.recording.take()?;
    let wall = Wall::now();
    let req = session.req_header();
    let upstream = ctx.upstream_started.map(|t| Upstream {
        span_id: trace.upstream_parent,
        start_ns: wall.at(t),
        end_ns: wall.at(now),
        status: ctx.upstream_status,
    });
    let tls = session.digest().is_some_and(|d| d.ssl_digest.is_some());
    let version = match req.version {
        http::Version::HTTP_2 => "2",
        http::Version::HTTP_10 => "1.0",
        _ => "1.1",
    };
    Some(Box::new(Finished {
        trace_id: trace.trace_id,
        span_id: rec.span_id,
        parent: rec.parent,
        start_ns: wall.at(ctx.started),
        end_ns: wall.at(now),
        snap: ctx.snap.clone(),
        method: req.method.clone(),
        path: req.uri.path().to_string(),
        tls,
        version,
        client: ctx.client.map(|c| c.ip),
        route: ctx.route,
        key: ctx
            .key
            .or_else(|| ctx.not_authenticated.and_then(|n| n.key)),
        credential: ctx.credential,
        outcome: ctx.outcome,
        code: ctx.code,
        status: ctx.status,
        upstream,
        fleet_wait: rec.fleet_wait.map(|(a, b)| (wall.at(a), wall.at(b))),
    }))
}
