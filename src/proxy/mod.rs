//! The Pingora adapter: the `ProxyHttp` service that puts the policy on the wire.
//!
//! This layer is thin on purpose: it reads the request head, runs the steps of the request path
//! in order ([`Gateway`]'s `request_filter`, through `admit`) and then forwards, or answers the
//! refusal itself. In Pingora's idiom, `request_filter` returning `Ok(true)` means "already
//! answered": nothing of such a request reaches the upstream.
//!
//! | module | concern |
//! |---|---|
//! | [`context`] | the per-request state |
//! | [`head`] | framing, `Authorization`, request ids, `X-Forwarded-For`, the upstream target (pure) |
//! | [`body`] | checked bodies read before forwarding; streamed bodies counted |
//! | [`answer`] | the one writer of the gateway's own answers, refusals and proxy failures alike |
//! | [`upstream`] | the upstream peer |
//! | [`traced`] | a recorded request's end, for the exporter ([`crate::traces`]) |
//!
//! Pingora retries only what cannot have reached the upstream, or idempotent requests.

pub(crate) mod answer;
pub(crate) mod body;
pub(crate) mod context;
pub(crate) mod head;
pub(crate) mod traced;
pub(crate) mod upstream;

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::HttpModules;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType, Result};

use crate::clock::Clock;
use crate::edge::conns::{Caps, ConnLimiter, Refused};
use crate::edge::stream::EdgeStream;
use crate::keys::KeyChanges;
use crate::policy::overrides::Pending;
use crate::policy::{Forward, Refusal, RequestHead};
use crate::runtime::lifecycle::Health;
use crate::runtime::live::LivePolicy;
use crate::runtime::logging::AccessLine;
use crate::runtime::metrics::Record;
pub(crate) use context::Ctx;
use head::RequestIds;

/// Why the request path stopped before forwarding: a refusal to answer, or a failure of the
/// connection itself (which Pingora handles).
pub(crate) enum Stop {
    Refuse(Refusal),
    /// Refused without an answer: the HTTP/2 stream reset with `REFUSED_STREAM` (RFC 9113
    /// §8.7: not processed, safe to retry), when even the answers being written are at their
    /// cap ([`Gateway::admit_stream`]). Recorded with the refusal's code.
    Shed(Refusal),
    Fail(Box<Error>),
}

impl From<Refusal> for Stop {
    fn from(r: Refusal) -> Self {
        Stop::Refuse(r)
    }
}

impl From<Box<Error>> for Stop {
    fn from(e: Box<Error>) -> Self {
        Stop::Fail(e)
    }
}

/// The gateway service.
pub(crate) struct Gateway {
    live: Arc<LivePolicy>,
    health: Arc<Health>,
    clock: Arc<dyn Clock>,
    /// The owner of the changes to keys: a partner's upgrade or lifecycle operation the
    /// upstream accepted is made through it.
    changes: Arc<KeyChanges>,
    ids: RequestIds,
    /// With shared budgets: how a request without a lease waits for the store.
    settling: Option<Arc<crate::shared::Settling>>,
    /// With `tracing`: the exporter's handle (off: no trace is begun, headers pass as they came).
    traces: Option<Arc<crate::traces::Tracer>>,
    /// The HTTP/2 requests in flight, under the connections' caps ([`Gateway::admit_stream`]).
    streams: Arc<ConnLimiter>,
    /// The HTTP/2 requests refused for `streams`' caps whose answer is being written, under
    /// the same caps ([`Gateway::admit_stream`]).
    refusing: Arc<ConnLimiter>,
}

impl Gateway {
    pub(crate) fn new(
        changes: Arc<KeyChanges>,
        health: Arc<Health>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            live: Arc::clone(changes.live()),
            health,
            clock,
            changes,
            ids: RequestIds::new(),
            settling: None,
            traces: None,
            streams: ConnLimiter::new(),
            refusing: ConnLimiter::new(),
        }
    }

    /// Requests are traced (the `tracing` block) through `tracer`.
    pub(crate) fn with_traces(mut self, tracer: Arc<crate::traces::Tracer>) -> Self {
        self.traces = Some(tracer);
        self
    }

    /// Budgets are shared: a request whose key has no lease here waits with `settling`.
    pub(crate) fn with_settling(mut self, settling: Arc<crate::shared::Settling>) -> Self {
        self.settling = Some(settling);
        self
    }

    /// The request path, in order. Each step narrows the request or stops it; what a step
    /// learns goes into `ctx` for the answer, the access line and the metrics. (Admitting the
    /// connection and its deadlines came before: [`crate::edge`].)
    pub(crate) async fn admit(&self, session: &mut Session, ctx: &mut Ctx) -> Result<(), Stop> {
        let snap = Arc::clone(ctx.snap.insert(self.live.load()));
        ctx.request_id = self.ids.of(&session.req_header().headers);
        if let Some(t) = &self.traces {
            ctx.trace = t.begin(&session.req_header().headers);
        }
        self.begin(session, ctx);
        self.admit_stream(session, ctx)?;
        // The `server:` settings: those the connection was accepted under on HTTP/1.1 (it
        // keeps them for its life, as its stream does), the config in force on HTTP/2.
        let edge = ctx
            .conn
            .as_ref()
            .map_or(&*snap.policy.config.server, |c| c.settings());
        head::check_framing(session.req_header())?;
        let raw = session
            .as_downstream()
            .as_http1()
            .map(|h1| h1.get_headers_raw_bytes().len());
        head::check_size(session.req_header(), raw, edge)?;
        ctx.client = head::client(session.client_addr(), &session.req_header().headers, edge);
        head::strip_upgrade(session.req_header_mut());
        let forward = self.decide(session, ctx, &snap.policy).await?;
        ctx.upstream_path =
            head::upstream_target(session.req_header(), &snap.target.base_path, &forward.path);
        let (key, rule) = (forward.key, forward.body);
        body::check(session, ctx, &snap.policy, key, rule).await?;
        Ok(())
    }

    /// A request head is in: tell its HTTP/1.1 connection (the body deadline starts now), and
    /// answer the connection's last request with `Connection: close`. (An HTTP/2 connection's
    /// deadlines come from its frames: [`crate::edge::h2scan`].)
    fn begin(&self, session: &mut Session, ctx: &mut Ctx) {
        let Some(conn) = session.stream().and_then(EdgeStream::of).cloned() else {
            // HTTP/2: a stream's answer waits on the client's flow-control window, not on the
            // socket; a client that grants none for `send_timeout` loses the stream. Pingora's
            // HTTP/2 session has no way back to its connection, so a stream takes the settings
            // in force when it opens.
            if let Some(s) = &ctx.snap {
                session.set_write_timeout(Some(s.policy.config.server.send_timeout));
            }
            return;
        };
        let body_follows = !session.is_body_done();
        let n = conn.head_done(ctx.started, body_follows);
        if n >= conn.settings().max_requests_per_connection.get() {
            session.set_keepalive(None);
        }
        ctx.conn = Some(conn);
    }

    /// An HTTP/2 request takes a place among the streams in flight, under the caps of the
    /// connections (`server.max_connections`, `max_connections_per_ip`), held until it ends:
    /// over either, `503 too_many_streams` (nginx's `limit_conn` counts each HTTP/2 request
    /// as a connection). An HTTP/1.1 request's connection holds its place already.
    ///
    /// The refusal's answer waits on the client's flow-control window like any other (a
    /// client that grants none holds it until `send_timeout`), so it takes a place too,
    /// among the refusals being written, under the same caps; over them, the stream is reset
    /// unanswered ([`Stop::Shed`]). What one address holds in streams is so bounded by its
    /// cap, twice: the requests in flight, and the refusals.
    fn admit_stream(&self, session: &Session, ctx: &mut Ctx) -> Result<(), Stop> {
        if ctx.conn.is_some() || session.as_downstream().as_http1().is_some() {
            return Ok(());
        }
        let Some(snap) = &ctx.snap else {
            return Ok(());
        };
        let limits = &snap.policy.config.server;
        let peer = match session.client_addr() {
            Some(pingora::protocols::l4::socket::SocketAddr::Inet(a)) => Some(a.ip()),
            _ => None,
        };
        let caps = Caps::gateway(limits);
        match self.streams.admit_stream(peer, caps, limits) {
            Ok(place) => {
                ctx.stream_place = Some(place);
                Ok(())
            }
            Err(why) => {
                // Who asked, for the access line (a flood's address is the first thing an
                // operator looks for).
                ctx.client =
                    head::client(session.client_addr(), &session.req_header().headers, limits);
                let (cap, from, field) = match why {
                    Refused::MaxConnectionsPerIp => (
                        limits.max_connections_per_ip.map_or(0, |n| n.get()),
                        " from this address",
                        "server.max_connections_per_ip",
                    ),
                    _ => (limits.max_connections.get(), "", "server.max_connections"),
                };
                let mut r = Refusal::new(
                    crate::policy::Code::TooManyStreams,
                    format!(
                        "{cap} HTTP/2 requests{from} are in flight already ({field}); retry \
                         when one ends"
                    ),
                );
                r.retry_after = Some(1);
                match self.refusing.admit_stream(peer, caps, limits) {
                    Ok(place) => {
                        ctx.stream_place = Some(place);
                        Err(Stop::Refuse(r))
                    }
                    Err(_) => Err(Stop::Shed(r)),
                }
            }
        }
    }

    /// Steps 0–4 ([`Policy::decide_for`](crate::policy::Policy::decide_for)): auth-failure
    /// block → authenticate → classify → authorize → limit.
    async fn decide<'s>(
        &self,
        session: &'s Session,
        ctx: &mut Ctx,
        policy: &crate::policy::Policy,
    ) -> Result<Forward<'s>, Refusal> {
        let req = session.req_header();
        let head = RequestHead {
            method: req.method.as_str(),
            path: req.uri.path(),
            authorization: head::auth_header(&req.headers),
        };
        let client = ctx.client.map(|c| c.ip);
        let mut decision = policy.decide_waiting(&head, client, self.clock.now(), true);
        if decision.unsettled {
            let again = decision.again(&head);
            // A recorded request's wait is its `fleet_wait` span.
            let from = ctx
                .trace
                .as_ref()
                .is_some_and(crate::traces::Trace::sampled)
                .then(Instant::now);
            decision = Box::pin(self.settled(policy, &again, client)).await;
            if let (Some(from), Some(t)) = (from, ctx.trace.as_mut()) {
                if let Some(rec) = t.recording.as_mut() {
                    rec.fleet_wait = Some((from, Instant::now()));
                }
            }
        }
        if let Some(why) = decision.not_authenticated {
            self.live.metrics().key_refused(why.reason);
            ctx.not_authenticated = Some(why);
        }
        if let Some(b) = decision.block_started {
            self.live
                .metrics()
                .set_auth_blocked_ips(policy.failures.blocked_count());
            tracing::warn!(
                target: "tollgate::edge",
                client = %b.key.display(),
                seconds = b.duration.as_secs(),
                "address blocked after repeated failed authentications"
            );
        }
        ctx.key = decision.key;
        ctx.credential = decision.credential;
        ctx.route = decision.route;
        ctx.budget = decision.budget;
        ctx.quota_state = decision.quota_state;
        if let (Some(shadow), Ok(_)) = (decision.shadow, &decision.verdict) {
            // Forwarded, and recorded as what the plan would have refused (shadow mode).
            ctx.outcome = shadow;
        }
        decision.verdict
    }

    /// A request that its key's lease could not decide: wait for the shared store's exchange
    /// that carries it (at most `cluster.timeout_ms` in all) and decide again; with no answer
    /// in time, decide on what this replica knows (`limit / N`). `head` is the first
    /// decision's [`again`](crate::policy::Decision::again): its key is not hashed twice.
    /// Boxed at the call: only these requests carry this future's state.
    async fn settled<'s>(
        &self,
        policy: &crate::policy::Policy,
        head: &RequestHead<'s>,
        client: Option<std::net::IpAddr>,
    ) -> crate::policy::Decision<'s> {
        let Some(settling) = &self.settling else {
            return policy.decide_waiting(head, client, self.clock.now(), false);
        };
        let deadline = tokio::time::Instant::now() + settling.timeout();
        loop {
            let answered = settling.wait(deadline).await;
            let wait = answered && tokio::time::Instant::now() < deadline;
            let d = policy.decide_waiting(head, client, self.clock.now(), wait);
            if !d.unsettled {
                return d;
            }
        }
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    /// No downstream modules. Pingora's default adds its response-compression module switched
    /// off (level 0), which still builds a context and runs three filters on every request;
    /// Tollgate never compresses (answers pass through with the upstream's encoding).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    fn new_ctx(&self) -> Ctx {
        Ctx::new()
    }

    /// The request path ([`Gateway::admit`]). `Ok(true)`: answered here, nothing goes upstream.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        match self.admit(session, ctx).await {
            Ok(()) => Ok(false),
            Err(Stop::Refuse(r)) => {
                answer::send(session, ctx, &r, self.health.closing()).await?;
                Ok(true)
            }
            Err(Stop::Shed(r)) => {
                session
                    .as_downstream_mut()
                    .shutdown_with_reason(h2::Reason::REFUSED_STREAM);
                ctx.outcome = r.code.outcome();
                ctx.code = Some(r.code);
                // No answer: the stream is reset, and nothing is written after it.
                let mut e = Error::new_down(ErrorType::H2Error);
                e.set_context("HTTP/2 stream reset unanswered (REFUSED_STREAM)");
                Err(e)
            }
            Err(Stop::Fail(e)) => Err(e),
        }
    }

    /// Unchecked bodies stream through; count them against `max_body_bytes`.
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        chunk: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if end_of_stream {
            if let Some(conn) = &ctx.conn {
                conn.body_done();
            }
        }
        body::count_streamed(ctx, chunk.as_ref())
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        // Set by `request_filter` for every request.
        let snap = ctx
            .snap
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no upstream target"))?;
        let peer = upstream::peer(&snap.target);
        ctx.upstream_started = Some(Instant::now());
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        up: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(path) = ctx.upstream_path.take() {
            let uri: http::Uri = path.parse().map_err(|_| {
                Error::explain(ErrorType::InternalError, "upstream path does not parse")
            })?;
            up.set_uri(uri);
        }
        if let Some(s) = &ctx.snap {
            up.insert_header(HOST, s.target.host.as_str())?;
        }
        up.insert_header("X-Request-Id", ctx.request_id.clone())?;
        let xff = head::forwarded_for(&up.headers, ctx.client.as_ref())?;
        up.insert_header("X-Forwarded-For", xff)?;
        let pass = ctx
            .snap
            .as_ref()
            .map_or(&[][..], |s| &s.policy.config.upstream.pass_headers[..]);
        for name in head::dropped(&up.headers, pass) {
            up.remove_header(&name);
        }
        if let Some(t) = &ctx.trace {
            t.propagate(up)?;
        }
        match (ctx.checked_body, ctx.declared) {
            (Some(n), _) if ctx.reframe_body => {
                up.remove_header(&TRANSFER_ENCODING);
                up.insert_header(CONTENT_LENGTH, itoa::Buffer::new().format(n))?;
            }
            // A streamed body goes under its length as a plain number (`00012` is `12`).
            (None, Some(n)) if !head::framed_as(&up.headers, n as usize) => {
                up.insert_header(CONTENT_LENGTH, itoa::Buffer::new().format(n))?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(t) = ctx.upstream_started {
            ctx.upstream_elapsed = Some(t.elapsed());
        }
        if resp.status == http::StatusCode::SWITCHING_PROTOCOLS {
            // Never a tunnel: upgrades are not forwarded, so a 101 is an upstream gone wrong.
            let mut e = Error::new_up(ErrorType::InvalidHTTPHeader);
            e.set_context("the upstream answered 101 Switching Protocols");
            return Err(e);
        }
        ctx.status = resp.status.as_u16();
        ctx.upstream_status = ctx.status;
        if self.health.closing() {
            session.set_keepalive(None);
        }
        if resp.status.is_success() {
            // A partner's upgrade the upstream accepted: in force from the next request, and
            // kept before the partner hears of it (an acknowledged upgrade is a kept one).
            match (ctx.pending.take(), &ctx.snap, ctx.key) {
                // Boxed: only these rare requests carry the keeping's future (kilobytes), not
                // every answer's response_filter.
                (Some(Pending::Upgrade(upgrade)), Some(snap), Some(key)) => {
                    ctx.upgraded =
                        Box::pin(self.changes.upgraded(&snap.policy, &upgrade, key)).await;
                }
                // Only on a customer key this config has (`key`): never on a partner's key.
                (
                    Some(Pending::Lifecycle {
                        effect,
                        target,
                        key: Some(_),
                    }),
                    Some(snap),
                    Some(key),
                ) => {
                    let by = format!("partner:{}", snap.policy.keys.get(key).name);
                    ctx.changed = Box::pin(self.changes.partner_effect(effect, &target, &by)).await;
                }
                _ => {}
            }
        }
        // A 5xx is not served: given back (the quota counts what the provider served).
        ctx.give_back_quota();
        resp.insert_header("X-Request-Id", ctx.request_id.clone())?;
        answer::rate_limit_headers(ctx, resp)
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        ctx.close_upstream_leg();
        let Some(refusal) = answer::for_error(e, ctx) else {
            ctx.status = 0;
            // A client that took too long over the answer (HTTP/1.1's deadlines, or an
            // HTTP/2 stream's `send_timeout`): timed out, whatever was written before (as
            // HTTP/1.1's are).
            if answer::client_too_slow(e) || ctx.conn.as_ref().is_some_and(|c| c.timed_out()) {
                ctx.outcome = crate::policy::Outcome::Timeout;
            }
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        };
        if session.response_written().is_none() {
            // Whatever happened, this connection is not reused.
            let _ = answer::send(session, ctx, &refusal, true).await;
        } else {
            ctx.outcome = refusal.code.outcome();
            ctx.code = Some(refusal.code);
            ctx.status = refusal.status();
        }
        FailToProxy {
            error_code: refusal.status(),
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        // Pingora's own error line can carry raw bytes; our access line covers the request.
        true
    }

    /// Step 7 — record: one access line and the metrics, for every request that got this far.
    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        // One reading of the clock for the duration, the idle deadline and the usage counts.
        let now = Instant::now();
        let total = now.saturating_duration_since(ctx.started);
        if let Some(conn) = &ctx.conn {
            conn.exchange_done(now);
        }
        if ctx.status != 0 {
            self.live.metrics().response(ctx.status);
        }
        // Admitted, and no answer came from the upstream (it was not reached, it timed out,
        // the client left before it answered): given back.
        ctx.give_back_quota();
        if let Some(s) = &ctx.snap {
            if s.policy.config.ledger.is_some() {
                ctx.count_in_ledger(s);
            }
            let usage = self.live.usage();
            usage.record(
                s.generation,
                usage.ms_at(now),
                ctx.key,
                ctx.route,
                ctx.outcome,
                ctx.code.map(|c| c as u8),
            );
            s.meters.record(&Record {
                route: ctx.route,
                credential: ctx.credential,
                outcome: ctx.outcome,
                total_seconds: total.as_secs_f64(),
                upstream_seconds: ctx.upstream_elapsed.map(|d| d.as_secs_f64()),
            });
        }
        let trace_id = ctx
            .trace
            .as_ref()
            .filter(|t| t.sampled())
            .map(crate::traces::Trace::id_hex);
        AccessLine {
            request_id: head::id_str(&ctx.request_id),
            trace_id: trace_id.as_ref().and_then(|t| std::str::from_utf8(t).ok()),
            client: ctx.client.map(|c| c.ip),
            method: session.req_header().method.as_str(),
            route: ctx.route_id(),
            key: ctx.key_name(),
            plan: ctx.plan(),
            status: ctx.status,
            outcome: ctx.outcome.as_str(),
            duration: total,
            upstream: ctx.upstream_elapsed,
            upgrade: ctx.upgraded.as_deref(),
            change: ctx.changed,
            reason: ctx.reason(),
        }
        .log();
        if let Some(tracer) = &self.traces {
            if let Some(f) = traced::finished(session, ctx, now) {
                tracer.finish(f);
            }
        }
    }
}
