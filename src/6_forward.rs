//! Step 6 — forward: the Pingora `ProxyHttp` service that puts the policy on the wire.
//!
//! This layer is thin on purpose. It reads the request head, calls [`Policy::decide`] (steps
//! 1–4) and, for routes with a body rule, reads and checks the body (step 5) *before* any
//! upstream connection exists; then it forwards, or answers the refusal itself as
//! `application/problem+json`. In Pingora's idiom, `request_filter` returning `Ok(true)` means
//! "already answered": nothing of such a request reaches the upstream.
//!
//! Bodies:
//! - routes with a body rule must say `Content-Type: application/json` (else 415); a declared
//!   `Content-Length` over `max_validated_body_bytes` is 413 before anything is read, a chunked
//!   body is 413 as soon as the count passes the cap; the checked bytes are replayed upstream
//!   from Pingora's retry buffer (so the upstream receives exactly what was checked);
//! - other routes stream through unbuffered, 413 once past `max_body_bytes` (declared lengths
//!   are refused up front; a chunked stream is cut when it crosses the cap).
//!
//! Upstream errors: cannot connect, connect timeout, TLS failure, a reset or a malformed answer
//! are `502 upstream_unavailable`; no answer within `read_timeout` is `504 upstream_timeout`.
//! Pingora retries only what cannot have reached the upstream, or idempotent requests.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use http::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::modules::http::HttpModules;
use pingora::protocols::l4::socket::SocketAddr as PeerAddr;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::utils::tls::{parse_x509, WrappedX509};
use pingora::{Error, ErrorSource, ErrorType, Result};

use crate::authenticate::{AuthHeader, KeyIdx};
use crate::check_body::{check_content_type, check_declared_length, too_large};
use crate::clock::Clock;
use crate::config::{Scheme, Upstream};
use crate::lifecycle::Health;
use crate::limit::Quota;
use crate::live::{LivePolicy, Snapshot};
use crate::metrics::Record;
use crate::policy::RequestHead;
use crate::refusal::{Code, Refusal};
use crate::routes::RouteIdx;

const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Where and how to reach the upstream, resolved once per config (not per request).
pub struct Target {
    addr: SocketAddr,
    tls: bool,
    sni: String,
    /// `Host` sent upstream: the base URL's authority.
    host: String,
    base_path: String,
    ca: Option<Arc<[WrappedX509]>>,
    connect_timeout: Duration,
    read_timeout: Duration,
}

impl Target {
    /// Resolve the upstream host and load the CA file, if any.
    pub fn new(u: &Upstream) -> std::result::Result<Self, String> {
        let addr = (u.host.as_str(), u.port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve upstream host `{}`: {e}", u.host))?
            .next()
            .ok_or_else(|| format!("upstream host `{}` has no address", u.host))?;
        let ca = match &u.ca_file {
            None => None,
            Some(path) => Some(load_ca(path)?),
        };
        Ok(Self {
            addr,
            tls: u.scheme == Scheme::Https,
            sni: if u.scheme == Scheme::Https {
                u.host.clone()
            } else {
                String::new()
            },
            host: u.authority.clone(),
            base_path: u.base_path.clone(),
            ca,
            connect_timeout: u.connect_timeout,
            read_timeout: u.read_timeout,
        })
    }
}

fn load_ca(path: &std::path::Path) -> std::result::Result<Arc<[WrappedX509]>, String> {
    let file = std::fs::File::open(path)
        .map_err(|e| format!("cannot read CA file {}: {e}", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let mut certs = Vec::new();
    for c in rustls_pemfile::certs(&mut reader) {
        let c = c.map_err(|e| format!("bad certificate in {}: {e}", path.display()))?;
        certs.push(WrappedX509::new(c.to_vec(), parse_x509));
    }
    if certs.is_empty() {
        return Err(format!("no certificate in CA file {}", path.display()));
    }
    Ok(Arc::from(certs))
}

/// How a request ended, for logs and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    #[default]
    Forwarded,
    Unauthorized,
    Forbidden,
    RateLimited,
    Invalid,
    NotFound,
    UpstreamError,
}

impl Outcome {
    /// Every outcome, in discriminant order.
    pub const ALL: [Outcome; 7] = [
        Outcome::Forwarded,
        Outcome::Unauthorized,
        Outcome::Forbidden,
        Outcome::RateLimited,
        Outcome::Invalid,
        Outcome::NotFound,
        Outcome::UpstreamError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Forbidden => "forbidden",
            Outcome::RateLimited => "rate_limited",
            Outcome::Invalid => "invalid",
            Outcome::NotFound => "not_found",
            Outcome::UpstreamError => "upstream_error",
        }
    }

    fn of(code: Code) -> Self {
        match code {
            Code::Unauthorized => Outcome::Unauthorized,
            Code::PlanRestricted | Code::WrongCredential | Code::NotYourCustomer => {
                Outcome::Forbidden
            }
            Code::UnknownRoute => Outcome::NotFound,
            Code::RateLimited => Outcome::RateLimited,
            Code::UpstreamUnavailable | Code::UpstreamTimeout => Outcome::UpstreamError,
            Code::InvalidPath
            | Code::InvalidJson
            | Code::InvalidBody
            | Code::BodyTooLarge
            | Code::UnsupportedMediaType
            | Code::BadRequest => Outcome::Invalid,
        }
    }
}

/// Per-request state.
pub struct Ctx {
    pub started: Instant,
    pub request_id: String,
    /// The config that decided this request: policy, upstream and metric handles together
    /// (a reload mid-request changes none of them for this request).
    pub snap: Option<Arc<Snapshot>>,
    pub key: Option<KeyIdx>,
    pub route: Option<RouteIdx>,
    pub quota: Option<Quota>,
    pub outcome: Outcome,
    pub status: u16,
    /// Path and query to send upstream, when they differ from the request's (`None`: send the
    /// request target as it came).
    upstream_path: Option<String>,
    /// Length of a body read and checked in `request_filter`.
    checked_body: Option<usize>,
    /// The checked body needs new framing upstream (its request came chunked, or with a
    /// `Content-Length` not spelled as the plain decimal length).
    reframe_body: bool,
    /// Bytes streamed so far for an unchecked body.
    streamed: u64,
    pub upstream_started: Option<Instant>,
    pub upstream_elapsed: Option<Duration>,
}

impl Ctx {
    /// The route id for logs and metrics (`-` before classification).
    pub fn route_id(&self) -> &str {
        match (&self.snap, self.route) {
            (Some(s), Some(r)) => &s.policy.config.catalogue.get(r).id,
            _ => "-",
        }
    }

    /// The caller's plan (or `partner`) for logs and metrics (`-` before authentication).
    pub fn plan(&self) -> &str {
        match (&self.snap, self.key) {
            (Some(s), Some(k)) => s.policy.policy_name(k),
            _ => "-",
        }
    }

    /// The operator's name for the caller's key (`-` before authentication); never the key.
    pub fn key_name(&self) -> &str {
        match (&self.snap, self.key) {
            (Some(s), Some(k)) => &s.policy.keys.get(k).name,
            _ => "-",
        }
    }
}

/// The gateway service.
pub struct Gateway {
    live: Arc<LivePolicy>,
    health: Arc<Health>,
    clock: Arc<dyn Clock>,
    id_seed: u64,
    id_counter: AtomicU64,
}

impl Gateway {
    pub fn new(live: Arc<LivePolicy>, health: Arc<Health>, clock: Arc<dyn Clock>) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let id_seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        Self {
            live,
            health,
            clock,
            id_seed,
            id_counter: AtomicU64::new(0),
        }
    }

    pub fn live(&self) -> &Arc<LivePolicy> {
        &self.live
    }

    fn request_id(&self, headers: &HeaderMap) -> String {
        if let Some(v) = headers.get(X_REQUEST_ID) {
            let b = v.as_bytes();
            let ok = !b.is_empty()
                && b.len() <= 128
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.' | b':'));
            if ok {
                // Checked to be ASCII above.
                return String::from_utf8_lossy(b).into_owned();
            }
        }
        let n = self.id_counter.fetch_add(1, Ordering::Relaxed);
        hex_id(self.id_seed, n)
    }

    /// Answer `refusal` as problem+json, with the rate-limit headers when the caller is known.
    async fn refuse(&self, session: &mut Session, ctx: &mut Ctx, refusal: Refusal) -> Result<bool> {
        ctx.outcome = Outcome::of(refusal.code);
        ctx.status = refusal.status();
        // The code only: a detail can quote the request (a body field, a header).
        tracing::debug!(
            target: "tollgate::policy",
            request_id = %ctx.request_id,
            code = refusal.code.as_str(),
            "refused"
        );
        // Anything refused before its body was read: do not read or drain it, close instead.
        // Draining or upgrading: ask the client to go elsewhere for its next request.
        if !session.is_body_done() || self.health.closing() {
            session.set_keepalive(None);
        }
        let body = Bytes::from(refusal.problem_json());
        let resp = self.problem_header(ctx, &refusal, body.len())?;
        session.write_response_header(Box::new(resp), false).await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
    }

    fn problem_header(
        &self,
        ctx: &Ctx,
        refusal: &Refusal,
        body_len: usize,
    ) -> Result<ResponseHeader> {
        let mut resp = ResponseHeader::build(refusal.status(), Some(8))?;
        resp.insert_header(CONTENT_TYPE, "application/problem+json")?;
        resp.insert_header(CONTENT_LENGTH, body_len.to_string())?;
        resp.insert_header("Cache-Control", "no-store")?;
        resp.insert_header("X-Request-Id", ctx.request_id.as_str())?;
        if refusal.code == Code::Unauthorized {
            resp.insert_header("WWW-Authenticate", "Bearer realm=\"tollgate\"")?;
        }
        if let Some(s) = refusal.retry_after {
            resp.insert_header("Retry-After", s.to_string())?;
        }
        add_rate_limit_headers(ctx, &mut resp)?;
        Ok(resp)
    }
}

/// A generated request id: 32 lower-case hex digits, the process's random seed then a counter
/// (`{seed:016x}{n:016x}`, without `fmt`: this runs for every request).
fn hex_id(seed: u64, n: u64) -> String {
    let mut raw = [0u8; 16];
    raw[..8].copy_from_slice(&seed.to_be_bytes());
    raw[8..].copy_from_slice(&n.to_be_bytes());
    let mut id = [0u8; 32];
    hex::encode_to_slice(raw, &mut id).expect("32 digits for 16 bytes");
    String::from_utf8_lossy(&id).into_owned()
}

fn add_rate_limit_headers(ctx: &Ctx, resp: &mut ResponseHeader) -> Result<()> {
    if let (Some(s), Some(k), Some(q)) = (&ctx.snap, ctx.key, &ctx.quota) {
        let (policy, state) = s.policy.rate_limit_headers(k, q);
        resp.insert_header("RateLimit-Policy", header_value(policy)?)?;
        resp.insert_header("RateLimit", header_value(state)?)?;
    }
    Ok(())
}

/// `X-Forwarded-For` for the upstream: the values that came, then the client's address.
fn forwarded_for(prior: &HeaderMap, client: Option<&PeerAddr>) -> Result<HeaderValue> {
    let mut v: Vec<u8> = Vec::with_capacity(48);
    for p in prior.get_all(X_FORWARDED_FOR) {
        v.extend_from_slice(p.as_bytes());
        v.extend_from_slice(b", ");
    }
    match client {
        Some(PeerAddr::Inet(SocketAddr::V4(a))) => {
            let mut n = itoa::Buffer::new();
            for (i, o) in a.ip().octets().into_iter().enumerate() {
                if i > 0 {
                    v.push(b'.');
                }
                v.extend_from_slice(n.format(o).as_bytes());
            }
        }
        Some(PeerAddr::Inet(a)) => v.extend_from_slice(a.ip().to_string().as_bytes()),
        // A Unix socket has no address to give: keep what came (without the trailing ", ").
        _ => v.truncate(v.len().saturating_sub(2)),
    }
    header_value(Bytes::from(v))
}

/// A header value built without a copy (the bytes are still checked).
fn header_value(b: Bytes) -> Result<HeaderValue> {
    HeaderValue::from_maybe_shared(b)
        .map_err(|_| Error::explain(ErrorType::InternalError, "not a header value"))
}

fn auth_header(headers: &HeaderMap) -> AuthHeader<'_> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    match (values.next(), values.next()) {
        (None, _) => AuthHeader::Missing,
        (Some(v), None) => AuthHeader::One(v.as_bytes()),
        _ => AuthHeader::Many,
    }
}

/// Requests whose framing or target a server could read two ways. (Pingora itself refuses
/// differing `Content-Length`s, two `Host`s and non-chunked transfer codings with a bare 400,
/// and reads `Transfer-Encoding` + `Content-Length` as chunked and then closes the connection,
/// per RFC 9112 section 6.3, before any filter runs.)
fn check_framing(req: &RequestHeader) -> std::result::Result<(), Refusal> {
    let h = &req.headers;
    if !h.contains_key(HOST) && req.uri.authority().is_none() {
        return Err(Refusal::new(Code::BadRequest, "the request has no Host"));
    }
    if h.get_all(CONTENT_LENGTH).iter().count() > 1 {
        return Err(Refusal::new(
            Code::BadRequest,
            "the request has more than one Content-Length",
        ));
    }
    Ok(())
}

fn declared_length(h: &HeaderMap) -> std::result::Result<Option<u64>, Refusal> {
    match h.get(CONTENT_LENGTH) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Some)
            .ok_or_else(|| Refusal::new(Code::BadRequest, "the Content-Length is not a number")),
    }
}

/// Whether a request's own framing already says exactly `n` bytes: no `Transfer-Encoding`, and
/// its one `Content-Length` (two are refused earlier) is `n` in plain decimal, as Tollgate
/// would write it. Then the checked body goes upstream under the client's own header.
fn framed_as(h: &HeaderMap, n: usize) -> bool {
    !h.contains_key(TRANSFER_ENCODING)
        && h.get(CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() == itoa::Buffer::new().format(n).as_bytes())
}

/// Read the whole body, keeping it in Pingora's retry buffer for the upstream. `None` when it
/// passes `cap` (reading stops there).
async fn read_body(session: &mut Session, cap: u64) -> Result<Option<Bytes>> {
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

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = Ctx;

    /// No downstream modules. Pingora's default adds its response-compression module switched
    /// off (level 0), which still builds a context and runs three filters on every request;
    /// Tollgate never compresses (answers pass through with the upstream's encoding).
    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    fn new_ctx(&self) -> Ctx {
        Ctx {
            started: Instant::now(),
            request_id: String::new(),
            snap: None,
            key: None,
            route: None,
            quota: None,
            outcome: Outcome::Forwarded,
            status: 0,
            upstream_path: None,
            checked_body: None,
            reframe_body: false,
            streamed: 0,
            upstream_started: None,
            upstream_elapsed: None,
        }
    }

    /// The request path: framing, then the policy (authenticate → classify → authorize →
    /// limit), then the body checks. `Ok(true)` = answered here, nothing goes upstream.
    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let snap = self.live.load();
        let policy = &snap.policy;
        ctx.request_id = self.request_id(&session.req_header().headers);
        ctx.snap = Some(Arc::clone(&snap));
        if let Err(r) = check_framing(session.req_header()) {
            return self.refuse(session, ctx, r).await;
        }

        let req = session.req_header();
        let head = RequestHead {
            method: req.method.as_str(),
            path: req.uri.path(),
            authorization: auth_header(&req.headers),
        };
        let decision = policy.decide(&head, self.clock.now());
        ctx.key = decision.key;
        ctx.route = decision.route;
        ctx.quota = decision.quota;
        let forward = match decision.verdict {
            Ok(f) => f,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let target = &snap.target;
        // Rewrite the target only when it changes: a base path, a normalized or re-spelt path,
        // an absolute-form target (`POST http://host/v2/...`). Otherwise Pingora sends the
        // request line's own bytes, so they must be exactly the path (and query) decided on.
        let as_it_came = target.base_path.is_empty()
            && forward.path == req.uri.path()
            && req
                .uri
                .path_and_query()
                .is_some_and(|pq| pq.as_str().as_bytes() == req.raw_path());
        if !as_it_came {
            let mut path = String::with_capacity(target.base_path.len() + forward.path.len() + 16);
            path.push_str(&target.base_path);
            path.push_str(&forward.path);
            if let Some(q) = req.uri.query() {
                path.push('?');
                path.push_str(q);
            }
            ctx.upstream_path = Some(path);
        }
        let body_rule = forward.body;
        let declared = match declared_length(&req.headers) {
            Ok(n) => n,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let limits = policy.config.limits;

        let Some(rule) = body_rule else {
            if let Err(r) = check_declared_length(declared, limits.max_body_bytes.get()) {
                return self.refuse(session, ctx, r).await;
            }
            return Ok(false);
        };
        // Step 5, before any upstream connection: media type, declared size, read, check.
        let cap = limits.max_validated_body_bytes.get();
        let pre = check_content_type(req.headers.get(CONTENT_TYPE).map(|v| v.as_bytes()))
            .and_then(|()| check_declared_length(declared, cap));
        if let Err(r) = pre {
            return self.refuse(session, ctx, r).await;
        }
        let Some(body) = read_body(session, cap).await? else {
            return self.refuse(session, ctx, too_large(cap)).await;
        };
        let key = ctx.key.expect("an admitted request is authenticated");
        if let Err(r) = policy.check_request_body(key, rule, &body) {
            return self.refuse(session, ctx, r).await;
        }
        ctx.checked_body = Some(body.len());
        ctx.reframe_body = !framed_as(&session.req_header().headers, body.len());
        Ok(false)
    }

    /// Unchecked bodies stream through; count them against `max_body_bytes`.
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if ctx.checked_body.is_some() {
            return Ok(());
        }
        if let (Some(b), Some(s)) = (body.as_ref(), ctx.snap.as_ref()) {
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

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        // Set by `request_filter` for every request.
        let snap = ctx
            .snap
            .as_ref()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "no upstream target"))?;
        let t = &snap.target;
        let mut peer = HttpPeer::new(t.addr, t.tls, t.sni.clone());
        peer.options.connection_timeout = Some(t.connect_timeout);
        peer.options.total_connection_timeout = Some(t.connect_timeout);
        peer.options.read_timeout = Some(t.read_timeout);
        peer.options.write_timeout = Some(t.read_timeout);
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        if t.tls {
            peer.options.verify_cert = true;
            peer.options.verify_hostname = true;
            peer.options.ca = t.ca.clone();
        }
        ctx.upstream_started = Some(Instant::now());
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
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
        up.insert_header("X-Request-Id", ctx.request_id.as_str())?;
        let xff = forwarded_for(&up.headers, session.client_addr())?;
        up.insert_header("X-Forwarded-For", xff)?;
        if let (Some(n), true) = (ctx.checked_body, ctx.reframe_body) {
            up.remove_header(&TRANSFER_ENCODING);
            up.insert_header(CONTENT_LENGTH, itoa::Buffer::new().format(n))?;
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
        ctx.status = resp.status.as_u16();
        if self.health.closing() {
            session.set_keepalive(None);
        }
        resp.insert_header("X-Request-Id", ctx.request_id.as_str())?;
        add_rate_limit_headers(ctx, resp)
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        // Never format `e` itself: its context can hold raw request or response bytes.
        let refusal = match (e.etype(), e.esource()) {
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
            (_, ErrorSource::Downstream) => {
                if matches!(
                    e.etype(),
                    ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed
                ) {
                    None // the client went away: nobody to answer
                } else {
                    Some(Refusal::new(
                        Code::BadRequest,
                        "the request could not be read",
                    ))
                }
            }
            _ => Some(Refusal::new(
                Code::UpstreamUnavailable,
                "the request could not be proxied",
            )),
        };
        if ctx.upstream_started.is_some() && ctx.upstream_elapsed.is_none() {
            ctx.upstream_elapsed = ctx.upstream_started.map(|t| t.elapsed());
        }
        let Some(refusal) = refusal else {
            ctx.status = 0;
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        };
        let status = refusal.status();
        ctx.outcome = Outcome::of(refusal.code);
        ctx.status = status;
        if session.response_written().is_none() {
            session.set_keepalive(None);
            let body = Bytes::from(refusal.problem_json());
            if let Ok(resp) = self.problem_header(ctx, &refusal, body.len()) {
                if session
                    .write_response_header(Box::new(resp), false)
                    .await
                    .is_ok()
                {
                    let _ = session.write_response_body(Some(body), true).await;
                }
            }
        }
        FailToProxy {
            error_code: status,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(&self, _session: &Session, _ctx: &Ctx, _error: &Error) -> bool {
        // Pingora's own error line can carry raw bytes; our access line covers the request.
        true
    }

    /// Step 7 — record: one access line and the metrics, for every request that got this far.
    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Ctx) {
        let total = ctx.started.elapsed();
        if ctx.status != 0 {
            self.live.metrics().response(ctx.status);
        }
        if let Some(s) = &ctx.snap {
            s.meters.record(
                &s.policy,
                &Record {
                    route: ctx.route,
                    key: ctx.key,
                    outcome: ctx.outcome,
                    total_seconds: total.as_secs_f64(),
                    upstream_seconds: ctx.upstream_elapsed.map(|d| d.as_secs_f64()),
                },
            );
        }
        // Never the key, the Authorization header, the path, the query or a body.
        tracing::info!(
            target: "tollgate::access",
            request_id = %ctx.request_id,
            method = session.req_header().method.as_str(),
            route = ctx.route_id(),
            key = ctx.key_name(),
            plan = ctx.plan(),
            status = ctx.status,
            outcome = ctx.outcome.as_str(),
            duration_ms = total.as_secs_f64() * 1e3,
            upstream_ms = ctx.upstream_elapsed.map(|d| d.as_secs_f64() * 1e3),
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_request_ids_are_the_seed_then_the_counter_in_hex() {
        for (seed, n) in [
            (0, 0),
            (1, 2),
            (u64::MAX, 0x0123_4567_89ab_cdef),
            (0xdead_beef, 42),
        ] {
            assert_eq!(hex_id(seed, n), format!("{seed:016x}{n:016x}"));
        }
    }

    #[test]
    fn a_checked_body_keeps_its_framing_only_when_it_is_exact() {
        let h = |pairs: &[(HeaderName, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(k.clone(), HeaderValue::from_static(v));
            }
            m
        };
        assert!(framed_as(&h(&[(CONTENT_LENGTH, "152")]), 152));
        assert!(framed_as(&h(&[(CONTENT_LENGTH, "0")]), 0));
        assert!(!framed_as(&h(&[(CONTENT_LENGTH, "0152")]), 152));
        assert!(!framed_as(&h(&[(CONTENT_LENGTH, "151")]), 152));
        assert!(!framed_as(&h(&[]), 152));
        assert!(!framed_as(
            &h(&[(CONTENT_LENGTH, "152"), (TRANSFER_ENCODING, "chunked")]),
            152
        ));
        assert!(!framed_as(&h(&[(TRANSFER_ENCODING, "chunked")]), 152));
    }

    #[test]
    fn forwarded_for_appends_the_client_to_what_came() {
        let v4 = PeerAddr::Inet("192.0.2.10:5000".parse().unwrap());
        let v6 = PeerAddr::Inet("[2001:db8::1]:443".parse().unwrap());
        let mut h = HeaderMap::new();
        let got = |h: &HeaderMap, c: Option<&PeerAddr>| {
            forwarded_for(h, c).unwrap().to_str().unwrap().to_string()
        };
        assert_eq!(got(&h, Some(&v4)), "192.0.2.10");
        assert_eq!(got(&h, Some(&v6)), "2001:db8::1");
        assert_eq!(got(&h, None), "");
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("203.0.113.9"));
        h.append(
            X_FORWARDED_FOR,
            HeaderValue::from_static("198.51.100.7, 10.0.0.1"),
        );
        assert_eq!(
            got(&h, Some(&v4)),
            "203.0.113.9, 198.51.100.7, 10.0.0.1, 192.0.2.10"
        );
        assert_eq!(got(&h, None), "203.0.113.9, 198.51.100.7, 10.0.0.1");
        for ip in ["0.0.0.0", "255.255.255.255", "10.200.3.40"] {
            let a = PeerAddr::Inet(format!("{ip}:1").parse().unwrap());
            assert_eq!(got(&HeaderMap::new(), Some(&a)), ip);
        }
    }
}
