//! Per-request state: what each step learnt, for the later steps, the answer's headers, the
//! access line and the metrics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderValue;

use crate::config::routes::RouteIdx;
use crate::edge::stream::Conn;
use crate::limit::Budget;
use crate::metering::{self, Column, QuotaState};
use crate::policy::authenticate::NotAuthenticated;
use crate::policy::client::Client;
use crate::policy::keys::{Credential, KeyIdx};
use crate::policy::overrides::Pending;
use crate::policy::Outcome;
use crate::runtime::live::Snapshot;

/// Per-request state (Pingora's `CTX`).
pub(crate) struct Ctx {
    /// When the request head was in (Pingora makes the context just after reading it).
    pub started: Instant,
    /// The request's id: the client's own well-formed `X-Request-Id`, or one made here. A
    /// header value, so the upstream and the answer get it without a copy.
    pub request_id: HeaderValue,
    /// The config that decided this request: policy, upstream and metric handles together
    /// (a reload mid-request changes none of them for this request).
    pub snap: Option<Arc<Snapshot>>,
    pub key: Option<KeyIdx>,
    /// The caller's credential (plan or partner) as the decision read it.
    pub credential: Option<Credential>,
    pub route: Option<RouteIdx>,
    /// The caller's window budget after the decision (the `RateLimit` fields).
    pub budget: Option<Budget>,
    /// The key's quota for its calendar period, as the decision left it (`charged` until
    /// given back).
    pub quota_state: Option<Box<QuotaState>>,
    pub outcome: Outcome,
    /// The status sent to the client (0 when none was).
    pub status: u16,
    /// The HTTP/1.1 connection this request came on, shared with its edge stream (deadlines,
    /// request count); `None` on HTTP/2.
    pub conn: Option<Arc<Conn>>,
    /// The client's address (the peer, or from a trusted proxy's `X-Forwarded-For`).
    pub client: Option<Client>,
    /// The body length the request declared, when it did.
    pub declared: Option<u64>,
    /// Path and query to send upstream, when they differ from the request's (`None`: send the
    /// request target as it came).
    pub upstream_path: Option<String>,
    /// Length of a body read and checked before forwarding.
    pub checked_body: Option<usize>,
    /// The checked body needs new framing upstream (its request came chunked, or with a
    /// `Content-Length` not spelled as the plain decimal length).
    pub reframe_body: bool,
    /// Bytes streamed so far for an unchecked body.
    pub streamed: u64,
    pub upstream_started: Option<Instant>,
    pub upstream_elapsed: Option<Duration>,
    /// The upstream's status, once the head of its answer came (0: none came). It alone
    /// decides whether a forwarded request stays charged to its quota and which ledger column
    /// it lands in, whatever happens after (the client leaves, the body is cut): the rule in
    /// docs/configuration.md, "Quotas".
    pub upstream_status: u16,
    /// A partner's operation on a customer key whose body was checked (an upgrade, a
    /// suspension, ...): applied if the upstream accepts it.
    pub pending: Option<Pending>,
    /// The plan change an accepted upgrade made (`from->to`), for the access line.
    pub upgraded: Option<String>,
    /// The lifecycle change an accepted partner operation made (`partner_suspend`, ...), for
    /// the access line.
    pub changed: Option<&'static str>,
    /// Why authentication failed, when it did (the access line's `reason`, and the key's name
    /// for a known key that is refused).
    pub not_authenticated: Option<NotAuthenticated>,
    /// The refusal's code, when the gateway answered one.
    pub code: Option<crate::policy::Code>,
    /// The request's trace, with `tracing` on ([`crate::traces::Trace`]).
    pub trace: Option<crate::traces::Trace>,
    /// An HTTP/2 request's place among the streams in flight (given back when the request
    /// ends: [`crate::edge::conns::ConnLimiter::admit_stream`]).
    pub stream_place: Option<crate::edge::conns::ConnGuard>,
}

impl Ctx {
    /// Give back this request's quota charge, if it has one, unless the upstream's status
    /// keeps it: a request refused after the quota step, or one the upstream did not serve (a
    /// 5xx, or no status at all), is given back; one it answered 1xx–4xx stays charged,
    /// whatever happened after (the rule in docs/configuration.md, "Quotas"). At most once:
    /// every place a request can end calls it.
    pub(crate) fn give_back_quota(&mut self) {
        if (100..500).contains(&self.upstream_status) {
            return;
        }
        let (Some(s), Some(k), Some(q)) = (&self.snap, self.key, self.quota_state.as_mut()) else {
            return;
        };
        if let Some(id) = q.charged.take() {
            let state = &s.policy.keys.get(k).rate;
            if let Some(m) = state.meter.get() {
                m.give_back(id);
                s.policy.metering.touched(state);
            }
            q.remaining = (q.remaining + 1).min(q.spec.requests);
        }
    }

    /// Count this request in its key's ledger (a request of no key is not counted).
    pub(crate) fn count_in_ledger(&self, s: &Snapshot) {
        let (Some(k), Some(c)) = (self.key, self.credential) else {
            return;
        };
        // Answered by the upstream: its status decides, whatever came after (an HTTP/2 client
        // that resets its stream mid-answer is the gateway's 400, not a refusal), as it
        // decides the quota's give-back. Refused by the gateway: the refusal's column. Else
        // no status came: `upstream_failed`, as for the gateway's own 502 and 504.
        let column = match self.code {
            _ if self.upstream_status != 0 => Column::upstream(self.upstream_status),
            Some(code) if Column::shown(code) => Column::Refused(code),
            _ => Column::UpstreamFailed,
        };
        let (plan, partner, partner_key) = match c {
            Credential::Customer { plan, partner, .. } => (Some(plan), partner, false),
            Credential::Partner { partner } => (None, Some(partner), true),
        };
        let policy = &s.policy;
        let entry = policy.keys.get(k);
        let who = metering::who(s.generation as u32, plan, partner, partner_key);
        let day = metering::day_of(policy.metering.calendar.now_ms());
        policy
            .metering
            .meter(&entry.rate, &entry.name)
            .count(day, column, who);
        policy.metering.touched(&entry.rate);
    }

    pub(crate) fn new() -> Self {
        Self {
            started: Instant::now(),
            request_id: HeaderValue::from_static(""),
            snap: None,
            key: None,
            credential: None,
            route: None,
            budget: None,
            quota_state: None,
            outcome: Outcome::Forwarded,
            status: 0,
            conn: None,
            client: None,
            declared: None,
            upstream_path: None,
            checked_body: None,
            reframe_body: false,
            streamed: 0,
            upstream_started: None,
            upstream_elapsed: None,
            upstream_status: 0,
            pending: None,
            upgraded: None,
            changed: None,
            not_authenticated: None,
            code: None,
            trace: None,
            stream_place: None,
        }
    }

    /// The route id for logs and metrics (`-` before classification).
    pub(crate) fn route_id(&self) -> &str {
        match (&self.snap, self.route) {
            (Some(s), Some(r)) => &s.policy.config.catalogue.get(r).id,
            _ => "-",
        }
    }

    /// The caller's plan (or `partner`) for logs and metrics (`-` before authentication), as
    /// the decision read it.
    pub(crate) fn plan(&self) -> &str {
        match (&self.snap, self.credential) {
            (Some(s), Some(c)) => s.policy.policy_name_of(c),
            _ => "-",
        }
    }

    /// The operator's name for the caller's key (`-` before authentication, or when the key
    /// is unknown); never the key. A known key refused as expired, suspended or revoked is
    /// named (the client's 401 does not say so; the operator's log does).
    pub(crate) fn key_name(&self) -> &str {
        let key = self
            .key
            .or_else(|| self.not_authenticated.and_then(|n| n.key));
        match (&self.snap, key) {
            (Some(s), Some(k)) => &s.policy.keys.get(k).name,
            _ => "-",
        }
    }

    /// Why authentication failed, for the access line (`None` when it did not).
    pub(crate) fn reason(&self) -> Option<&'static str> {
        self.not_authenticated.map(|n| n.reason.as_str())
    }

    /// The upstream leg's duration, closed now if it is still open.
    pub(crate) fn close_upstream_leg(&mut self) {
        if let (Some(t), None) = (self.upstream_started, self.upstream_elapsed) {
            self.upstream_elapsed = Some(t.elapsed());
        }
    }
}

impl Default for Ctx {
    fn default() -> Self {
        Self::new()
    }
}
