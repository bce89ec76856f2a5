//! The policy: one immutable snapshot of everything a decision needs, and the decision itself,
//! its steps composed in the contract's order.
//!
//! | step | module | narrows the request to | refuses with |
//! |---|---|---|---|
//! | 0. method | [`method`] | one of the methods an API is called with | 405 `method_not_allowed` (`TRACE`, `CONNECT`), 501 `not_implemented` |
//! | 0. auth-failure block | [`blocking`] (the client address: [`client`]) | a client address not blocked | 429 `too_many_auth_failures` |
//! | 1. authenticate | [`mod@authenticate`] | the caller's key entry ([`keys`]) | 401 `unauthorized` |
//! | 2. classify | [`mod@classify`] | a catalogued route ([`crate::config::routes`]) and the path to forward; a checked operation only by its own method and spelling | 400 `invalid_path`, 404 `unknown_route`, 405 `method_not_allowed` |
//! | 3. authorize | [`mod@authorize`] | a caller allowed on the route | 403 `wrong_credential`, `plan_restricted` |
//! | 4. limit | [`crate::limit`] | a request within the key's budget | 429 `rate_limited` |
//! | 4. quota | [`crate::metering`] | a request within the key's quota for its calendar period (charged) | 429 `quota_exhausted` |
//! | 5. check the body | [`body`] | a body of the spec's shape (once read) | 400 `invalid_json`, `invalid_body`, 403 `not_your_customer`, 413, 415 |
//! | 5. (its `webhook_set` `url`) | [`webhook`] | a webhook URL that cannot reach a private network (the `webhook_guard` config) | 400 `invalid_body` at `/url` |
//!
//! Steps 0–4 are [`Policy::decide_for`], on the request head; step 5 is
//! [`Policy::check_request_body`], once the body is read. Every refusal is a [`Refusal`], and
//! [`Outcome`] names how a request ended. Everything here is pure and synchronous: time comes
//! in as an argument, nothing touches the network, and the crate has no Pingora type to use,
//! so the whole decision is unit-tested and benchmarked alone. A reload builds a new `Policy`
//! from the old one (keeping rate state for keys that remain) and swaps it in whole.

pub mod authenticate;
pub mod authorize;
pub mod blocking;
pub mod body;
pub mod classify;
pub mod client;
#[cfg(test)]
mod fleet_quota_tests;
pub mod keys;
#[cfg(test)]
mod lifecycle_tests;
pub mod method;
pub mod overrides;
mod packed;
#[cfg(test)]
mod quota_tests;
pub mod versions;
pub mod webhook;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;

use crate::clock::Nanos;
use crate::config::routes::{BodyRule, Effect, RouteIdx};
use crate::config::Config;
use crate::digest::Digest;
use crate::limit::{Budget, LocalStore, Rate, Store};
use crate::metering::{Meter, Metering, PeriodAt, QuotaState, Ticket};
pub use crate::outcome::{self, Outcome};
pub use crate::refusal::{self, Code, FieldError, Refusal};
use authenticate::{authenticate_digest, AuthHeader, NotAuthenticated};
use authorize::authorize;
use blocking::{BlockStarted, FailureTable};
use body::Checked;
use classify::classify;
use client::ClientKey;
use keys::{Credential, KeyIdx, KeyTable};

/// What the policy reads of a request head.
#[derive(Clone, Copy, Debug)]
pub struct RequestHead<'a> {
    /// The method, as sent (methods are case-sensitive).
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The `Authorization` field or fields.
    pub authorization: AuthHeader<'a>,
}

/// The outcome of [`Policy::decide`], with whatever was learnt before a refusal (for headers,
/// logs and metrics).
#[derive(Debug)]
pub struct Decision<'a> {
    /// Set once the caller is authenticated.
    pub key: Option<KeyIdx>,
    /// The caller's credential as this decision read it (its plan, or partner): what the
    /// answer's rate-limit fields, the logs and the metrics name, even if an override moves
    /// the key to another plan while the request is in flight. Set whenever `key` is.
    pub credential: Option<Credential>,
    /// Set once the route is known.
    pub route: Option<RouteIdx>,
    /// The caller's budget after this decision; set whenever `key` is.
    pub budget: Option<Budget>,
    /// The caller's quota for its calendar period, if it has one; `charged` when this
    /// request was. Boxed: a decision (and each request's context) of a key without a quota
    /// carries one word for it, not the whole state.
    pub quota_state: Option<Box<QuotaState>>,
    /// The block this request's failed authentication started, if it did (for the log line).
    pub block_started: Option<BlockStarted>,
    /// A refusal that the plan's shadow mode turned into a forward (`Forwarded` otherwise).
    pub shadow: Option<Outcome>,
    /// The request to forward, or why it is refused.
    pub verdict: Result<Forward<'a>, Refusal>,
    /// The limit step is not decided yet: a shared store needs its next exchange for this key
    /// ([`Policy::decide_waiting`]). The verdict is then a placeholder 429, not to be sent,
    /// and the request is decided again with [`Decision::again`].
    pub unsettled: bool,
    /// When `unsettled`: the digest of the key presented, so that the next decision does not
    /// hash it again.
    presented: Option<Digest>,
    /// Why authentication failed, when it did (for the access line and
    /// `tollgate_key_refusals_total`; the client's 401 is the same whatever it is).
    pub not_authenticated: Option<NotAuthenticated>,
}

impl Decision<'_> {
    /// The head to decide an unsettled request again with: `req`, its key already hashed.
    pub fn again<'a>(&self, req: &RequestHead<'a>) -> RequestHead<'a> {
        RequestHead {
            authorization: self.presented.map_or(req.authorization, AuthHeader::Digest),
            ..*req
        }
    }
}

/// An admitted request: whose it is, where to send it, and whether its body must be checked
/// first.
#[derive(Debug, PartialEq, Eq)]
pub struct Forward<'a> {
    /// The caller's key.
    pub key: KeyIdx,
    /// The normalized, canonical path (without the upstream's base path or the query).
    pub path: Cow<'a, str>,
    /// The rule the body must pass before the request is forwarded; `None`: the body is
    /// forwarded unchecked.
    pub body: Option<BodyRule>,
}

/// Everything a decision needs, compiled from one config: swapped in whole on a reload.
#[derive(Debug)]
pub struct Policy {
    /// The config compiled, except its key list, which [`Policy::new`] moves into `keys`.
    pub config: Config,
    /// Every configured key, customer and partner, with its rate state.
    pub keys: KeyTable,
    /// Decides on each key's budget: budgets in this process, or shared. Carried over a reload.
    store: Arc<dyn Store>,
    /// Failed authentications per client address. Carried over a reload.
    pub failures: Arc<FailureTable>,
    /// The calendar and the queue of meters changed (quotas, the ledger). Carried over a reload.
    pub metering: Arc<Metering>,
    /// Per plan, in `config.plans` order.
    plan_limits: Vec<Limit>,
    partner_limit: Limit,
}

/// One rate-limit policy (a plan, or `partner`): its rate, and the fixed parts of its header
/// fields, built once per config rather than per request.
#[derive(Debug)]
struct Limit {
    rate: Rate,
    fields: RateFields,
}

impl Limit {
    fn new(name: &str, rate: Rate) -> Self {
        let fields = RateFields::new(name, &rate);
        Self { rate, fields }
    }
}

/// What the rate-limit header fields of one policy (a plan, or `partner`) hold whatever the
/// budget: the whole `RateLimit-Policy` value and the start of `RateLimit`.
#[derive(Debug)]
struct RateFields {
    /// `"basic";q=40;w=10`
    policy: Bytes,
    /// `"basic";r=`
    state_prefix: Box<[u8]>,
}

impl RateFields {
    fn new(name: &str, rate: &Rate) -> Self {
        Self {
            policy: Bytes::from(format!(
                "\"{name}\";q={};w={}",
                rate.limit(),
                rate.window_secs()
            )),
            state_prefix: format!("\"{name}\";r=").into_bytes().into_boxed_slice(),
        }
    }
}

impl Policy {
    /// Compile `config`. Rate state is carried over from `previous` for keys in both, and so
    /// are the budgets' store and the failed-authentication table; without a previous policy,
    /// budgets are kept in this process ([`LocalStore`]) and the table starts empty.
    pub fn new(config: Config, previous: Option<&Policy>) -> Self {
        let store = previous.map_or_else(
            || Arc::new(LocalStore) as Arc<dyn Store>,
            |p| Arc::clone(&p.store),
        );
        Self::with_store(config, previous, store)
    }

    /// Compile `config`, deciding on budgets with `store`. Rate state and the
    /// failed-authentication table are carried over from `previous`.
    ///
    /// The key list leaves `config` for the key table (with a million keys, holding both would
    /// be some 80 MB more), so `policy.config.keys` is empty; `policy.keys` has them all.
    pub fn with_store(
        mut config: Config,
        previous: Option<&Policy>,
        store: Arc<dyn Store>,
    ) -> Self {
        let window = config.limits.window;
        let plan_limits = config
            .plans
            .iter()
            .map(|p| Limit::new(&p.name, Rate::new(p.limit, window)))
            .collect();
        let partner_limit = Limit::new(PARTNER, Rate::new(config.partner_limit, window));
        let spelled = classify::spellings(&config.catalogue);
        config.catalogue.set_spellings(spelled);
        let keys = KeyTable::build(&config, previous.map(|p| &p.keys));
        let failures = previous.map_or_else(Arc::default, |p| Arc::clone(&p.failures));
        let metering = previous.map_or_else(
            || Arc::new(Metering::new(crate::clock::wall_ms())),
            |p| Arc::clone(&p.metering),
        );
        config.keys = Vec::new();
        Self {
            config,
            keys,
            store,
            failures,
            metering,
            plan_limits,
            partner_limit,
        }
    }

    /// [`Policy::decide_for`] a request whose client address is unknown (no auth-failure
    /// blocking applies).
    pub fn decide<'a>(&self, req: &RequestHead<'a>, now: Nanos) -> Decision<'a> {
        self.decide_for(req, None, now)
    }

    /// Decide on a request head from `client`: method → auth-failure block → authenticate →
    /// classify → authorize → limit.
    pub fn decide_for<'a>(
        &self,
        req: &RequestHead<'a>,
        client: Option<IpAddr>,
        now: Nanos,
    ) -> Decision<'a> {
        self.decide_waiting(req, client, now, false)
    }

    /// As [`Policy::decide_for`]; with `wait`, a shared store may leave the limit step
    /// undecided ([`Decision::unsettled`]): the caller waits for the store's next exchange
    /// (at most `cluster.timeout_ms`) and decides again, with `wait` false once the time is
    /// up.
    pub fn decide_waiting<'a>(
        &self,
        req: &RequestHead<'a>,
        client: Option<IpAddr>,
        now: Nanos,
        wait: bool,
    ) -> Decision<'a> {
        let mut d = Decision {
            unsettled: false,
            presented: None,
            not_authenticated: None,
            key: None,
            credential: None,
            route: None,
            budget: None,
            quota_state: None,
            block_started: None,
            shadow: None,
            verdict: Err(Refusal::unauthorized()),
        };
        let client = client.map(ClientKey::of);
        d.verdict = self.steps(req, client, now, wait, &mut d);
        if d.unsettled {
            // A placeholder, decided again after the wait: nothing of it is reported.
            return d;
        }
        // Refused before the limit step: the budget is reported, not spent.
        if let (Some(key), Some(credential), None) = (d.key, d.credential, d.budget) {
            let rate = self.rate(credential);
            d.budget = Some(self.store.peek(&self.keys.get(key).rate, &rate, now));
        }
        // Refused before the quota step: its state is reported, not charged.
        if let (Some(key), Some(credential), None, Err(_)) =
            (d.key, d.credential, &d.quota_state, &d.verdict)
        {
            d.quota_state = self.quota_state(key, credential).map(Box::new);
        }
        d
    }

    /// The steps of [`Policy::decide_for`], in order; each narrows the request or refuses it,
    /// and what it learns is noted in `d` for the answer's headers, logs and metrics.
    fn steps<'a>(
        &self,
        req: &RequestHead<'a>,
        client: Option<ClientKey>,
        now: Nanos,
        wait: bool,
        d: &mut Decision<'a>,
    ) -> Result<Forward<'a>, Refusal> {
        method::check_method(req.method)?;
        let blocking = client.zip(self.config.auth_failures.as_ref());
        if let Some((client, _)) = blocking {
            if let Some(secs) = self.failures.blocked(client, now) {
                return Err(too_many_auth_failures(secs));
            }
        }
        let presented = authenticate::presented(req.authorization);
        let authenticated = presented
            .as_ref()
            .map_err(|&why| why)
            .and_then(|digest| authenticate_digest(&self.keys, digest));
        let (key, live) = match authenticated {
            Ok((key, live)) => (*d.key.insert(key), live),
            Err(why) => {
                d.not_authenticated = Some(why);
                if let Some((client, p)) = blocking {
                    d.block_started = self.failures.failed(client, now, p);
                }
                return Err(Refusal::unauthorized());
            }
        };
        let entry = self.keys.get(key);
        let credential = *d.credential.insert(entry.credential_with(live));
        let classified = classify(&self.config.catalogue, req.method, req.path)?;
        let route = self.config.catalogue.get(*d.route.insert(classified.route));
        // Shadow mode: the plan's own refusals (allow-list, limit) are recorded, not enforced.
        let shadow = match credential {
            Credential::Customer { plan, .. } => self.config.plans[plan].shadow,
            Credential::Partner { .. } => false,
        };
        if let Err(r) = authorize(credential, &self.config.plans, route, classified.route) {
            if !(shadow && r.code == Code::PlanRestricted) {
                return Err(r);
            }
            d.shadow = Some(Outcome::ShadowForbidden);
        }
        let rate = self.rate(credential);
        // The quota's ticket, before the window: a request that must wait for the fleet's
        // word on its quota waits before it takes from its budget (`metering::fleet`).
        let quota = self.quota_of(key, credential).map(|(spec, own)| {
            let now_ms = self.metering.calendar.now_ms();
            let period = self.metering.calendar.period(spec.per, now_ms);
            let meter = self.metering.meter(&entry.rate, &entry.name);
            let ticket = if shadow {
                Ticket::Local
            } else {
                let fleet = &self.metering.fleet;
                meter.ticket(spec.requests, &period, fleet, rate.limit(), now_ms, wait)
            };
            (spec, own, now_ms, period, meter, ticket)
        });
        if let Some((spec, _, now_ms, period, _, Ticket::Park)) = &quota {
            // Decided again after the store's answer: a placeholder, never answered.
            self.metering.park(&entry.rate, spec.requests);
            d.unsettled = true;
            d.presented = presented.ok();
            let mut r = Refusal::new(Code::QuotaExhausted, "settling with the fleet");
            r.retry_after = Some(period.secs_left(*now_ms));
            return Err(r);
        }
        let decided = if wait {
            self.store.acquire(&entry.digest, &entry.rate, &rate, now)
        } else {
            self.store
                .acquire_now(&entry.digest, &entry.rate, &rate, now)
        };
        let undo = |quota: &Option<(_, _, _, PeriodAt, &Meter, Ticket)>| {
            if let Some((_, _, _, period, meter, ticket)) = quota {
                meter.undo(*ticket, period.id);
            }
        };
        match decided {
            Ok(quota) => d.budget = Some(quota),
            Err(denied) if denied.unsettled => {
                // The request waits for the fleet and is decided again: this refusal is never
                // answered, so its detail is not formatted.
                undo(&quota);
                d.unsettled = true;
                d.presented = presented.ok();
                let mut r = Refusal::new(Code::RateLimited, "settling with the fleet");
                r.retry_after = Some(denied.retry_after_secs);
                return Err(r);
            }
            Err(denied) if shadow => {
                d.budget = Some(denied.budget);
                d.shadow.get_or_insert(Outcome::ShadowRateLimited);
            }
            Err(denied) => {
                undo(&quota);
                d.budget = Some(denied.budget);
                return Err(rate_limited(denied));
            }
        }
        if let Some((spec, own, now_ms, period, meter, ticket)) = quota {
            let mut state = QuotaState {
                spec,
                own,
                used: 0,
                remaining: 0,
                reset_secs: period.secs_left(now_ms),
                period_secs: period.secs(),
                charged: None,
            };
            let charged = meter.charge_with(ticket, spec.requests, &period);
            self.metering.touched(&entry.rate);
            match charged {
                Ok((id, used)) => {
                    state.used = used;
                    state.remaining = spec.requests.saturating_sub(used);
                    state.charged = Some(id);
                    d.quota_state = Some(Box::new(state));
                }
                Err(used) if shadow => {
                    state.used = used;
                    d.quota_state = Some(Box::new(state));
                    d.shadow.get_or_insert(Outcome::ShadowQuotaExhausted);
                }
                Err(used) => {
                    state.used = used;
                    // Charged in a later period (the wall clock stepped back since): refused
                    // until that one ends.
                    if let Some(later) = meter.later_period(&period) {
                        state.reset_secs = later.secs_left(now_ms);
                    }
                    d.quota_state = Some(Box::new(state));
                    return Err(quota_exhausted(&state));
                }
            }
        }
        Ok(Forward {
            key,
            path: classified.path,
            body: route.body,
        })
    }

    /// Before reading a body: the query string of a checked operation names no member of its
    /// body rule ([`body::check_query`]).
    pub fn check_request_query(&self, route: RouteIdx, query: Option<&str>) -> Result<(), Refusal> {
        let route = self.config.catalogue.get(route);
        let Some(rule) = route.body else {
            return Ok(());
        };
        body::check_query(
            rule,
            query,
            route.key_field.as_deref().unwrap_or(body::API_KEY),
        )
    }

    /// Check a fully read body for the route `route` (one with a body rule, after
    /// [`Policy::decide`] admitted the request). For a partner's operation on a customer key
    /// (an `effect`), also refuse a partner acting on a key that is not its customer's, and
    /// an upgrade to a plan no plan has; what to do at the edge if the upstream accepts it
    /// ([`overrides`]).
    pub fn check_request_body(
        &self,
        key: KeyIdx,
        route: RouteIdx,
        body: &[u8],
    ) -> Result<Option<overrides::Pending>, Refusal> {
        let route = self.config.catalogue.get(route);
        let Some(rule) = route.body else {
            return Ok(None);
        };
        let checked = body::check_body_with(
            rule,
            body,
            self.config.limits.max_validated_body_bytes.get(),
            &self.config.webhook_guard,
            route.key_field.as_deref().unwrap_or(body::API_KEY),
        )?;
        let target = match checked {
            Checked::ServiceUpgrade { target, .. } | Checked::ServiceKey { target } => target,
            Checked::GroupEvent | Checked::WebhookSet => return Ok(None),
        };
        self.may_act_on(key, &target)?;
        match (route.effect, checked) {
            (Some(Effect::Upgrade), Checked::ServiceUpgrade { target, plan_id }) => self
                .upgrade(target, plan_id)
                .map(|u| Some(overrides::Pending::Upgrade(u))),
            (Some(effect), _) => Ok(Some(overrides::Pending::Lifecycle {
                effect,
                target,
                key: self.keys.lookup(&target).filter(|&k| {
                    matches!(self.keys.get(k).configured(), Credential::Customer { .. })
                }),
            })),
            (None, _) => Ok(None),
        }
    }

    /// A partner may act on its own customers only: not on another partner's, not on a key no
    /// partner manages (the operator's customers, partner keys), and not on a key the gateway
    /// does not know, for it cannot vouch for whom that key belongs to. The key is compared as
    /// the exact string the body gives (its digest): no trimming, no case folding, so another
    /// spelling of a customer key is an unknown key, and refused.
    fn may_act_on(&self, key: KeyIdx, target: &Digest) -> Result<(), Refusal> {
        let Credential::Partner { partner } = self.keys.get(key).configured() else {
            return Ok(());
        };
        let Some(t) = self.keys.lookup(target) else {
            return Err(Refusal::new(
                Code::NotYourCustomer,
                "the gateway knows no customer service with that key",
            ));
        };
        match self.keys.get(t).configured() {
            Credential::Customer {
                partner: Some(owner),
                ..
            } if owner == partner => Ok(()),
            Credential::Customer {
                partner: Some(_), ..
            } => Err(Refusal::new(
                Code::NotYourCustomer,
                "that customer service is managed by another partner",
            )),
            _ => Err(Refusal::new(
                Code::NotYourCustomer,
                "that service is managed by no partner: the operator's to change",
            )),
        }
    }

    fn limit(&self, c: Credential) -> &Limit {
        match c {
            Credential::Customer { plan, .. } => &self.plan_limits[plan],
            Credential::Partner { .. } => &self.partner_limit,
        }
    }

    /// The window rate of `c`: the key's own limit when it has one, else its plan's (or the
    /// partners').
    #[inline]
    pub fn rate(&self, c: Credential) -> Rate {
        match c {
            Credential::Customer { limit, .. } if limit != 0 => Rate::new(
                std::num::NonZeroU32::new(limit).unwrap_or(std::num::NonZeroU32::MIN),
                self.config.limits.window,
            ),
            _ => self.limit(c).rate,
        }
    }

    /// Whether this config meters anything: a quota (a plan's, `partner_quota`, a key's own in
    /// the YAML) or the ledger. (A quota set live is the overrides' to tell.)
    pub fn meters(&self) -> bool {
        self.config.ledger.is_some()
            || self.config.partner_quota.is_some()
            || self.config.plans.iter().any(|p| p.quota.is_some())
            || self.keys.has_own_quotas()
    }

    /// The quota in force for the key `k` as `credential`: its own (`true`), else its plan's
    /// or the partners'.
    #[inline]
    pub fn quota_of(
        &self,
        k: KeyIdx,
        credential: Credential,
    ) -> Option<(crate::config::QuotaSpec, bool)> {
        if self.keys.has_own_quotas() {
            if let Some(q) = self.keys.get(k).own_quota() {
                return Some((q, true));
            }
        }
        match credential {
            Credential::Customer { plan, .. } => self.config.plans[plan].quota,
            Credential::Partner { .. } => self.config.partner_quota,
        }
        .map(|q| (q, false))
    }

    /// The key's quota as it stands, without charging it (for answers refused before the
    /// quota step, and the operator's view).
    pub fn quota_state(&self, k: KeyIdx, credential: Credential) -> Option<QuotaState> {
        let (spec, own) = self.quota_of(k, credential)?;
        let now_ms = self.metering.calendar.now_ms();
        let period = self.metering.calendar.period(spec.per, now_ms);
        let used = self
            .keys
            .get(k)
            .rate
            .meter
            .get()
            .map_or(0, |m| m.used(&period));
        Some(QuotaState {
            spec,
            own,
            used,
            remaining: spec.requests.saturating_sub(used),
            reset_secs: period.secs_left(now_ms),
            period_secs: period.secs(),
            charged: None,
        })
    }

    /// The name of the caller's rate-limit policy: its plan, or `partner`.
    pub fn policy_name(&self, key: KeyIdx) -> &str {
        self.policy_name_of(self.keys.get(key).credential())
    }

    /// The name of `credential`'s rate-limit policy: its plan, or `partner`.
    pub fn policy_name_of(&self, credential: Credential) -> &str {
        match credential {
            Credential::Customer { plan, .. } => &self.config.plans[plan].name,
            Credential::Partner { .. } => PARTNER,
        }
    }

    /// The budget of `key` at `now`, without taking from it (for the operator's view).
    pub fn budget(&self, key: KeyIdx, now: Nanos) -> Budget {
        let entry = self.keys.get(key);
        let rate = self.rate(entry.credential());
        self.store.peek(&entry.rate, &rate, now)
    }

    /// The `RateLimit-Policy` and `RateLimit` field values (draft-ietf-httpapi-ratelimit-headers)
    /// for the key `key` with `credential` and `quota`, both as [`Policy::decide`] gave them:
    /// the first is shared, built with the config; the second is the only per-request
    /// allocation. A key with its own window limit has a policy of its own, named by the key
    /// (`"shop-42";q=500;w=10`), built for its answer.
    pub fn rate_limit_headers(
        &self,
        key: KeyIdx,
        credential: Credential,
        quota: &Budget,
        period: Option<&QuotaState>,
    ) -> (Bytes, Bytes) {
        let own;
        let Limit { rate, fields } = match credential {
            Credential::Customer { limit, .. } if limit != 0 => {
                let name = self.keys.get(key).name.as_str();
                own = Limit::new(name, self.rate(credential));
                &own
            }
            _ => self.limit(credential),
        };
        debug_assert_eq!(
            (quota.limit, quota.window_secs),
            (rate.limit(), rate.window_secs()),
            "a quota of another policy"
        );
        let mut remaining = itoa::Buffer::new();
        let mut reset = itoa::Buffer::new();
        let (r, t) = (
            remaining.format(quota.remaining),
            reset.format(quota.reset_secs),
        );
        // The quota's policy follows the window's: `, "basic-month";q=100000;w=2592000`.
        let quota_name = period.map(|q| {
            let name = if q.own {
                self.keys.get(key).name.as_str()
            } else {
                self.policy_name_of(credential)
            };
            (q, name, q.spec.per.as_str())
        });
        // Room for the quota's part (two numbers of at most 20 digits, labels, quotes): each
        // value is written once, without growing.
        let extra = quota_name.map_or(0, |(_, name, per)| name.len() + per.len() + 56);
        let mut state =
            Vec::with_capacity(fields.state_prefix.len() + r.len() + 3 + t.len() + extra);
        state.extend_from_slice(&fields.state_prefix);
        state.extend_from_slice(r.as_bytes());
        state.extend_from_slice(b";t=");
        state.extend_from_slice(t.as_bytes());
        let Some((q, name, per)) = quota_name else {
            return (fields.policy.clone(), Bytes::from(state));
        };
        let mut policy = Vec::with_capacity(fields.policy.len() + extra);
        policy.extend_from_slice(&fields.policy);
        let mut n = itoa::Buffer::new();
        for (out, tail) in [
            (
                &mut policy,
                [(";q=", q.spec.requests), (";w=", q.period_secs)],
            ),
            (&mut state, [(";r=", q.remaining), (";t=", q.reset_secs)]),
        ] {
            out.extend_from_slice(b", \"");
            out.extend_from_slice(name.as_bytes());
            out.push(b'-');
            out.extend_from_slice(per.as_bytes());
            out.push(b'"');
            for (label, v) in tail {
                out.extend_from_slice(label.as_bytes());
                out.extend_from_slice(n.format(v).as_bytes());
            }
        }
        (Bytes::from(policy), Bytes::from(state))
    }
}

/// The rate-limit policy name of partner keys (a reserved plan name).
const PARTNER: &str = "partner";

/// The `429 too_many_auth_failures` refusal, `secs` before the block ends.
fn too_many_auth_failures(secs: u64) -> Refusal {
    let mut r = Refusal::new(
        Code::TooManyAuthFailures,
        format!("this address is blocked after repeated failed authentications; retry in {secs} s"),
    );
    r.retry_after = Some(secs);
    r
}

/// The `429 quota_exhausted` refusal, the period's end `Retry-After` away.
fn quota_exhausted(q: &QuotaState) -> Refusal {
    let mut r = Refusal::new(
        Code::QuotaExhausted,
        format!(
            "over the quota of {} requests per {}; it starts again in {} s",
            q.spec.requests,
            q.spec.per.as_str(),
            q.reset_secs
        ),
    );
    r.retry_after = Some(q.reset_secs);
    r
}

/// The `429 rate_limited` refusal for a denial.
fn rate_limited(denied: crate::limit::Denied) -> Refusal {
    let mut r = Refusal::new(
        Code::RateLimited,
        format!(
            "over {} requests per {} seconds; retry in {} s",
            denied.budget.limit, denied.budget.window_secs, denied.retry_after_secs
        ),
    );
    r.retry_after = Some(denied.retry_after_secs);
    r
}

#[cfg(test)]
mod shadow_tests {
    use super::*;
    use crate::testing::TestConfig;

    fn head<'a>(key: &'a [u8], method: &'a str, path: &'a str) -> RequestHead<'a> {
        RequestHead {
            method,
            path,
            authorization: AuthHeader::One(key),
        }
    }

    #[test]
    fn a_shadow_plan_forwards_what_it_would_refuse_and_says_so() {
        let p = Policy::new(TestConfig::new().plan_shadow("basic", true).parse(), None);
        let hook = head(b"Bearer basic-key-1", "POST", "/v2/settings/webhook/set");
        let d = p.decide(&hook, 0);
        assert!(d.verdict.is_ok());
        assert_eq!(d.shadow, Some(Outcome::ShadowForbidden));
        let send = head(b"Bearer basic-key-1", "POST", "/v2/sendMessage/");
        for _ in 0..39 {
            let d = p.decide(&send, 0);
            assert!(d.verdict.is_ok() && d.shadow.is_none());
        }
        let d = p.decide(&send, 0);
        assert!(d.verdict.is_ok());
        assert_eq!(d.shadow, Some(Outcome::ShadowRateLimited));
        assert_eq!(d.budget.unwrap().remaining, 0);
        // Always enforced: authentication, partner routes, other plans.
        assert!(p
            .decide(&head(b"Bearer nope", "GET", "/v2/client/x"), 0)
            .verdict
            .is_err());
        let d = p.decide(
            &head(b"Bearer basic-key-1", "POST", "/v2/service/upgrade"),
            0,
        );
        assert_eq!(d.verdict.unwrap_err().code, Code::WrongCredential);
        let pro = head(b"Bearer pro-key-1", "GET", "/v2/client/x");
        for _ in 0..150 {
            p.decide(&pro, 0).verdict.unwrap();
        }
        assert_eq!(
            p.decide(&pro, 0).verdict.unwrap_err().code,
            Code::RateLimited
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    fn head<'a>(method: &'a str, path: &'a str, auth: &'a str) -> RequestHead<'a> {
        RequestHead {
            method,
            path,
            authorization: AuthHeader::One(auth.as_bytes()),
        }
    }

    fn code(d: &Decision<'_>) -> Option<Code> {
        d.verdict.as_ref().err().map(|r| r.code)
    }

    #[test]
    fn a_shared_store_may_leave_the_limit_step_to_the_caller() {
        let timing = crate::limit::Timing {
            sync_interval: std::time::Duration::from_millis(100),
            timeout: std::time::Duration::from_millis(100),
            window: std::time::Duration::from_secs(10),
        };
        let (store, _syncer) = crate::limit::SharedStore::new(timing);
        // Five replicas: Basic's 40 is too small for credit (40 / 10N = 0).
        store.set_fleet(5);
        let p = Policy::with_store(testing::config(), None, store);
        let send = head("POST", "/v2/sendMessage/", "Bearer basic-key-1");
        // Waiting allowed: no lease here, so the store is asked; nothing is decided or spent.
        let d = p.decide_waiting(&send, None, 0, true);
        assert!(d.unsettled);
        assert_eq!(
            code(&d),
            Some(Code::RateLimited),
            "a placeholder, not to be sent"
        );
        assert!(
            d.key.is_some() && d.budget.is_none(),
            "a placeholder: nothing reported"
        );
        // An earlier step still refuses first, and never waits.
        let d = p.decide_waiting(&head("GET", "/v2/x", "Bearer nope"), None, 0, true);
        assert!(!d.unsettled);
        assert_eq!(code(&d), Some(Code::Unauthorized));
        // Decided again from the key's digest (not hashed twice): the same key and route.
        let first = p.decide_waiting(&send, None, 0, true);
        let again = first.again(&send);
        assert!(matches!(again.authorization, AuthHeader::Digest(_)));
        assert_eq!((again.method, again.path), (send.method, send.path));
        // The wait is over with no answer: decided on limit / N here.
        let d = p.decide_waiting(&again, None, 0, false);
        assert!(!d.unsettled);
        assert!(d.verdict.is_ok());
        assert_eq!((d.key, d.route), (first.key, first.route));
        // A key revoked or suspended while its request waited is refused when decided again.
        let k = first.key.unwrap();
        assert!(p.keys.set_flag(k, keys::SUSPENDED, true));
        let d = p.decide_waiting(&again, None, 0, false);
        assert_eq!(code(&d), Some(Code::Unauthorized));
        // A decision that settled has nothing to carry: its head is the request's.
        let settled = p.decide(&head("POST", "/v2/sendMessage/", "Bearer pro-key-1"), 0);
        assert!(matches!(
            settled.again(&send).authorization,
            AuthHeader::One(_)
        ));
        // `decide` never waits.
        assert!(!p.decide(&send, 0).unsettled);
    }

    #[test]
    fn steps_run_in_the_contract_order() {
        let p = Policy::new(testing::config(), None);
        // Unauthenticated beats an invalid path and an unknown route.
        let d = p.decide(&head("GET", "/v2/../x", "Bearer nope"), 0);
        assert_eq!((code(&d), d.key), (Some(Code::Unauthorized), None));
        // Classify (invalid path) beats authorization.
        let d = p.decide(
            &head("POST", "/v2/settings/webhook/set/..", "Bearer basic-key-1"),
            0,
        );
        assert_eq!(code(&d), Some(Code::InvalidPath));
        // Credential kind beats the plan.
        let d = p.decide(
            &head("POST", "/v2/service/upgrade", "Bearer basic-key-1"),
            0,
        );
        assert_eq!(code(&d), Some(Code::WrongCredential));
        let d = p.decide(
            &head("POST", "/v2/settings/webhook/set", "Bearer basic-key-1"),
            0,
        );
        assert_eq!(code(&d), Some(Code::PlanRestricted));
    }

    #[test]
    fn a_blocked_address_is_refused_before_any_key_is_evaluated() {
        let cfg = testing::TestConfig::new().auth_failures(3, 60, 120).parse();
        let p = Policy::new(cfg, None);
        let attacker: IpAddr = "192.0.2.1".parse().unwrap();
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        fn send<'a>(p: &Policy, auth: &'a str, client: IpAddr, now: Nanos) -> Decision<'a> {
            p.decide_for(&head("POST", "/v2/sendMessage/", auth), Some(client), now)
        }
        const SEC: Nanos = 1_000_000_000;
        for i in 0..2 {
            let d = send(&p, "Bearer wrong", attacker, SEC);
            assert_eq!(
                (code(&d), d.block_started),
                (Some(Code::Unauthorized), None),
                "{i}"
            );
        }
        let d = send(&p, "Bearer wrong", attacker, SEC);
        assert_eq!(code(&d), Some(Code::Unauthorized));
        assert_eq!(d.block_started.map(|b| b.duration.as_secs()), Some(120));
        // Blocked: even the right key is not looked at.
        let d = send(&p, "Bearer basic-key-1", attacker, 2 * SEC);
        let r = d.verdict.as_ref().unwrap_err();
        assert_eq!(
            (r.code, r.retry_after),
            (Code::TooManyAuthFailures, Some(119))
        );
        assert_eq!((d.key, d.budget), (None, None));
        // Another address, and the same address once the block is over, are served.
        assert!(send(&p, "Bearer basic-key-1", other, 2 * SEC)
            .verdict
            .is_ok());
        assert!(send(&p, "Bearer basic-key-1", attacker, 121 * SEC)
            .verdict
            .is_ok());
        // Without a client address, or without the block in the config, nothing is counted.
        let plain = Policy::new(testing::config(), None);
        for _ in 0..10 {
            let d = plain.decide_for(&head("GET", "/", "Bearer wrong"), Some(attacker), SEC);
            assert_eq!(d.block_started, None);
        }
        assert!(plain.failures.is_empty());
    }

    #[test]
    fn refusals_before_the_limit_do_not_spend_budget_but_report_it() {
        let p = Policy::new(testing::config(), None);
        for _ in 0..100 {
            let d = p.decide(
                &head("POST", "/v2/settings/webhook/set", "Bearer basic-key-1"),
                0,
            );
            assert_eq!(d.budget.unwrap().remaining, 40);
        }
        let d = p.decide(&head("POST", "/v2/sendMessage/", "Bearer basic-key-1"), 0);
        assert_eq!(d.budget.unwrap().remaining, 39);
        let (policy, state) = p.rate_limit_headers(
            d.key.unwrap(),
            d.credential.unwrap(),
            &d.budget.unwrap(),
            None,
        );
        assert_eq!(policy, "\"basic\";q=40;w=10");
        assert_eq!(state, "\"basic\";r=39;t=1");
    }

    #[test]
    fn the_forty_first_basic_request_is_rate_limited() {
        let p = Policy::new(testing::config(), None);
        for i in 0..40 {
            let d = p.decide(&head("POST", "/v2/sendMessage/", "Bearer basic-key-1"), 0);
            assert!(d.verdict.is_ok(), "request {i}");
        }
        let d = p.decide(&head("POST", "/v2/sendMessage/", "Bearer basic-key-1"), 0);
        let r = d.verdict.unwrap_err();
        assert_eq!((r.code, r.retry_after), (Code::RateLimited, Some(1)));
        // Another key's budget is untouched.
        let d = p.decide(
            &head("POST", "/v2/sendMessage/", "Bearer standard-key-1"),
            0,
        );
        assert_eq!(d.budget.unwrap().remaining, 69);
    }

    #[test]
    fn the_answer_names_the_plan_the_decision_used_while_an_upgrade_lands() {
        // An override put on the key between the decision and the answer (another replica's
        // upgrade, read by the sync) does not change what this request's headers say.
        let p = Policy::new(testing::config(), None);
        let d = p.decide(&head("POST", "/v2/sendMessage/", "Bearer basic-key-1"), 0);
        let key = d.key.unwrap();
        let pro = p.plan_by_id(3).unwrap();
        p.keys.set_plan_override(key, Some(pro));
        let (policy, state) = p.rate_limit_headers(
            d.key.unwrap(),
            d.credential.unwrap(),
            &d.budget.unwrap(),
            None,
        );
        assert_eq!(policy, "\"basic\";q=40;w=10");
        assert_eq!(state, "\"basic\";r=39;t=1");
        assert_eq!(p.policy_name_of(d.credential.unwrap()), "basic");
        assert_eq!(
            p.policy_name(key),
            "pro",
            "the next request is decided on the new plan"
        );
    }

    #[test]
    fn partner_keys_have_their_own_limit() {
        let p = Policy::new(testing::config(), None);
        let d = p.decide(
            &head("POST", "/v2/service/upgrade", "Bearer acme-partner-key"),
            0,
        );
        assert_eq!(d.budget.unwrap().limit, 150);
        assert_eq!(p.policy_name(d.key.unwrap()), "partner");
    }

    #[test]
    fn forward_carries_the_canonical_path_and_body_rule() {
        let p = Policy::new(testing::config(), None);
        let d = p.decide(&head("POST", "/V2/sendgroup", "Bearer pro-key-1"), 0);
        let pro = p.keys.lookup(&Digest::of(b"pro-key-1")).unwrap();
        assert_eq!(
            d.verdict.unwrap(),
            Forward {
                key: pro,
                path: "/v2/sendGroup".into(),
                body: Some(BodyRule::GroupEvent)
            }
        );
    }

    #[test]
    fn partners_act_only_on_their_own_customers() {
        let p = Policy::new(testing::config(), None);
        let acme = p.keys.lookup(&Digest::of(b"acme-partner-key")).unwrap();
        let body = |k: &str| format!(r#"{{"apiKey":"{k}","planID":3}}"#);
        let upgrade = p.config.catalogue.find("service_upgrade").unwrap();
        let ok = |k: &str| p.check_request_body(acme, upgrade, body(k).as_bytes());
        assert!(ok("acme-customer-key").is_ok());
        // Another partner's customer, the operator's customers, a partner's own key.
        for k in [
            "globex-customer-key",
            "basic-key-1",
            "pro-key-1",
            "globex-partner-key",
            "acme-partner-key",
        ] {
            assert_eq!(ok(k).unwrap_err().code, Code::NotYourCustomer, "{k}");
        }
        // A key the gateway does not know, and every other spelling of another partner's
        // customer key (the comparison is of the exact string), are refused too.
        for k in [
            "some-key-the-gateway-does-not-know",
            " globex-customer-key",
            "globex-customer-key ",
            "Bearer globex-customer-key",
            "GLOBEX-CUSTOMER-KEY",
            r"globex-customer-key\n",
            r"globex-customer-key\u0000",
            r"globex\u002dcustomer-key",
        ] {
            assert_eq!(ok(k).unwrap_err().code, Code::NotYourCustomer, "{k:?}");
        }
    }

    #[test]
    fn unknown_keys_leave_no_state() {
        let p = Policy::new(testing::config(), None);
        let before = p.keys.len();
        for i in 0..1000 {
            let auth = format!("Bearer unknown-{i}");
            let _ = p.decide(&head("POST", "/v2/sendMessage/", &auth), 0);
        }
        assert_eq!(p.keys.len(), before);
    }

    #[test]
    fn reload_keeps_budgets_of_remaining_keys_and_applies_new_limits() {
        let old = Policy::new(testing::config(), None);
        for _ in 0..40 {
            assert!(old
                .decide(&head("POST", "/v2/sendMessage/", "Bearer basic-key-1"), 0)
                .verdict
                .is_ok());
        }
        let new = Policy::new(testing::config(), Some(&old));
        let d = new.decide(&head("POST", "/v2/sendMessage/", "Bearer basic-key-1"), 0);
        assert_eq!(code(&d), Some(Code::RateLimited));
        // A fresh build without the old policy starts from full.
        let fresh = Policy::new(testing::config(), None);
        assert!(fresh
            .decide(&head("POST", "/v2/sendMessage/", "Bearer basic-key-1"), 0)
            .verdict
            .is_ok());
    }
}
