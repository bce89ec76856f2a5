//! The Prometheus metrics of the contract (the request path's record step), served on the admin
//! listener.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `tollgate_requests_total` | counter | `route`, `plan`, `outcome` |
//! | `tollgate_responses_total` | counter | `class` (`1xx` … `5xx`) |
//! | `tollgate_request_duration_seconds` | histogram | `route` |
//! | `tollgate_upstream_duration_seconds` | histogram | `route` |
//! | `tollgate_config_reloads_total` | counter | `result` (`success`, `error`) |
//! | `tollgate_keys` | gauge | `state` (`active`, `expired`, `suspended`, `revoked`) |
//! | `tollgate_key_refusals_total` | counter | `reason` (`unknown`, `expired`, `suspended`, `revoked`) |
//! | `tollgate_admin_changes_total` | counter | `action` (`suspend`, `resume`, `revoke`, `limit`, `quota`, `upgrade`, `partner_suspend`, `partner_resume`, `partner_delete`), `result` (`applied`, `refused`) |
//! | `tollgate_connections` | gauge | `listener` (`http`, `tls`) |
//! | `tollgate_connections_refused_total` | counter | `reason` (`max_connections`, `max_connections_per_ip`) |
//! | `tollgate_auth_blocked_ips` | gauge | — |
//! | `tollgate_plan_overrides` | gauge | — |
//! | `tollgate_quota_exhausted_keys` | gauge | — |
//! | `tollgate_build_info` | gauge (1) | `version` |
//!
//! Labels are route ids and plan names from the config, `partner` for partner keys, and `none`
//! before the route or the caller is known; never a raw path or a key, so the number of series
//! is bounded by the config, whatever clients send.
//!
//! Label handles are resolved once: [`Meters`] holds, for one config, a cell per
//! (route, plan, outcome) that looks its series up on first use and keeps it, so a request
//! costs one array index and an atomic add, with no hashing of label strings. A reload builds
//! new `Meters` over the same metric families, so counts carry on across reloads.

use std::sync::OnceLock;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::config::routes::RouteIdx;
use crate::policy::keys::{Credential, KeyRefusal, KeyState};
use crate::policy::overrides::ChangeKind;
use crate::policy::{Outcome, Policy};

/// Histogram buckets for a proxy, in seconds: 100 µs (a refusal answered at the edge) to
/// 60 s (past the longest sensible upstream read timeout).
pub const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// The label value for a route or plan that is not known (yet) for a request.
pub const NONE: &str = "none";

/// The metric families, registered in a registry of their own (not the process-global one).
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    responses: [IntCounter; 5],
    request_duration: HistogramVec,
    upstream_duration: HistogramVec,
    reload_success: IntCounter,
    reload_error: IntCounter,
    keys: [IntGauge; 4],
    key_refusals: [IntCounter; 4],
    admin_changes: IntCounterVec,
    connections: IntGaugeVec,
    connections_refused: IntCounterVec,
    auth_blocked_ips: IntGauge,
    plan_overrides: IntGauge,
    quota_exhausted_keys: IntGauge,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "tollgate_requests_total",
                "Requests by route id, plan and how they ended.",
            ),
            &["route", "plan", "outcome"],
        )
        .expect("valid metric");
        let responses_vec = IntCounterVec::new(
            Opts::new(
                "tollgate_responses_total",
                "Answers sent to clients (the gateway's own and the upstream's) by status class.",
            ),
            &["class"],
        )
        .expect("valid metric");
        let responses =
            ["1xx", "2xx", "3xx", "4xx", "5xx"].map(|c| responses_vec.with_label_values(&[c]));
        let histogram = |name: &str, help: &str| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()),
                &["route"],
            )
            .expect("valid metric")
        };
        let request_duration = histogram(
            "tollgate_request_duration_seconds",
            "Time from the request head to the end of the answer, by route id.",
        );
        let upstream_duration = histogram(
            "tollgate_upstream_duration_seconds",
            "Time from choosing the upstream to its response head (or failure), by route id.",
        );
        let reloads = IntCounterVec::new(
            Opts::new(
                "tollgate_config_reloads_total",
                "Config reloads (SIGHUP or POST /reload) by result.",
            ),
            &["result"],
        )
        .expect("valid metric");
        let keys_vec = IntGaugeVec::new(
            Opts::new(
                "tollgate_keys",
                "Keys in the config in force (customer and partner), by state.",
            ),
            &["state"],
        )
        .expect("valid metric");
        let keys = KeyState::ALL.map(|s| keys_vec.with_label_values(&[s.as_str()]));
        let refusals_vec = IntCounterVec::new(
            Opts::new(
                "tollgate_key_refusals_total",
                "Presented keys that did not authenticate, by reason (the client's 401 is the same for all).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let key_refusals = [
            KeyRefusal::Unknown,
            KeyRefusal::Expired,
            KeyRefusal::Suspended,
            KeyRefusal::Revoked,
        ]
        .map(|r| refusals_vec.with_label_values(&[r.as_str()]));
        let admin_changes = IntCounterVec::new(
            Opts::new(
                "tollgate_admin_changes_total",
                "Changes to keys by the admin API and partners' operations, by action and result.",
            ),
            &["action", "result"],
        )
        .expect("valid metric");
        let build = IntGaugeVec::new(
            Opts::new("tollgate_build_info", "The running build; always 1."),
            &["version"],
        )
        .expect("valid metric");
        build.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let connections = IntGaugeVec::new(
            Opts::new(
                "tollgate_connections",
                "Open downstream connections by listener.",
            ),
            &["listener"],
        )
        .expect("valid metric");
        let connections_refused = IntCounterVec::new(
            Opts::new(
                "tollgate_connections_refused_total",
                "Connections closed at accept time by a cap, by reason.",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let auth_blocked_ips = IntGauge::new(
            "tollgate_auth_blocked_ips",
            "Client addresses blocked after repeated failed authentications.",
        )
        .expect("valid metric");
        let plan_overrides = IntGauge::new(
            "tollgate_plan_overrides",
            "Customer keys on a plan a partner's upgrade gave them (not the YAML's).",
        )
        .expect("valid metric");
        let quota_exhausted_keys = IntGauge::new(
            "tollgate_quota_exhausted_keys",
            "Keys refused for their quota in the period now (over their quota).",
        )
        .expect("valid metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(responses_vec),
            Box::new(request_duration.clone()),
            Box::new(upstream_duration.clone()),
            Box::new(reloads.clone()),
            Box::new(keys_vec),
            Box::new(refusals_vec),
            Box::new(admin_changes.clone()),
            Box::new(build),
            Box::new(connections.clone()),
            Box::new(connections_refused.clone()),
            Box::new(auth_blocked_ips.clone()),
            Box::new(plan_overrides.clone()),
            Box::new(quota_exhausted_keys.clone()),
        ] {
            registry.register(c).expect("metric names are distinct");
        }
        Self {
            registry,
            requests,
            responses,
            request_duration,
            upstream_duration,
            reload_success: reloads.with_label_values(&["success"]),
            reload_error: reloads.with_label_values(&["error"]),
            keys,
            key_refusals,
            admin_changes,
            connections,
            connections_refused,
            auth_blocked_ips,
            plan_overrides,
            quota_exhausted_keys,
        }
    }

    /// `tollgate_quota_exhausted_keys`.
    pub fn set_quota_exhausted_keys(&self, n: usize) {
        self.quota_exhausted_keys.set(n as i64);
    }

    /// `tollgate_connections{listener}`.
    pub fn connections(&self, listener: &str) -> IntGauge {
        self.connections.with_label_values(&[listener])
    }

    /// `tollgate_connections_refused_total{reason}`.
    pub fn connections_refused(&self, reason: &str) -> IntCounter {
        self.connections_refused.with_label_values(&[reason])
    }

    /// `tollgate_plan_overrides`: the upgrades in force.
    pub fn set_plan_overrides(&self, n: usize) {
        self.plan_overrides.set(n as i64);
    }

    /// `tollgate_keys{state}`: `policy`'s keys by state.
    pub fn set_key_states(&self, policy: &Policy) {
        for (g, n) in self.keys.iter().zip(policy.keys.states()) {
            g.set(n as i64);
        }
    }

    /// `tollgate_key_refusals_total{reason}`.
    pub fn key_refused(&self, reason: KeyRefusal) {
        let i = match reason {
            KeyRefusal::Unknown => 0,
            KeyRefusal::Expired => 1,
            KeyRefusal::Suspended => 2,
            KeyRefusal::Revoked => 3,
        };
        self.key_refusals[i].inc();
    }

    /// `tollgate_admin_changes_total{action,result}`: a change applied, or refused (any 4xx,
    /// or 503 when it could not be kept).
    pub fn admin_change(&self, kind: ChangeKind, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.admin_changes
            .with_label_values(&[kind.as_str(), result])
            .inc();
    }

    /// `tollgate_auth_blocked_ips`.
    pub fn set_auth_blocked_ips(&self, n: usize) {
        self.auth_blocked_ips.set(n as i64);
    }

    /// Register another family (the cluster's, when `cluster` is configured).
    pub fn register(&self, c: Box<dyn prometheus::core::Collector>) {
        self.registry
            .register(c)
            .expect("metric names are distinct");
    }

    /// Everything, in the Prometheus text exposition format.
    pub fn render(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Writing to a Vec cannot fail, and every family here is well-formed.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }

    /// Count a reload attempt.
    pub fn reloaded(&self, ok: bool) {
        if ok {
            self.reload_success.inc();
        } else {
            self.reload_error.inc();
        }
    }

    /// Count an answer sent to a client, by its status class.
    pub fn response(&self, status: u16) {
        if let Some(c) = (status / 100)
            .checked_sub(1)
            .and_then(|i| self.responses.get(usize::from(i)))
        {
            c.inc();
        }
    }

    /// The label handles for `policy`'s routes and plans; sets `tollgate_keys` to its key count.
    pub fn meters(&self, policy: &Policy) -> Meters {
        let config = &policy.config;
        self.set_key_states(policy);
        let mut routes: Vec<String> = config
            .catalogue
            .routes()
            .iter()
            .map(|r| r.id.clone())
            .collect();
        routes.push(NONE.into());
        let mut plans: Vec<String> = config.plans.iter().map(|p| p.name.clone()).collect();
        plans.push("partner".into());
        plans.push(NONE.into());
        let cells = routes.len() * plans.len() * Outcome::ALL.len();
        Meters {
            requests: self.requests.clone(),
            request_duration: self.request_duration.clone(),
            upstream_duration: self.upstream_duration.clone(),
            counters: (0..cells).map(|_| OnceLock::new()).collect(),
            durations: (0..routes.len()).map(|_| OnceLock::new()).collect(),
            upstream_durations: (0..routes.len()).map(|_| OnceLock::new()).collect(),
            routes,
            plans,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Label handles for one config: one cell per series, resolved on first use.
pub struct Meters {
    requests: IntCounterVec,
    request_duration: HistogramVec,
    upstream_duration: HistogramVec,
    /// Route ids in catalogue order, then `none`.
    routes: Vec<String>,
    /// Plan names in config order, then `partner`, then `none`.
    plans: Vec<String>,
    /// `[route][plan][outcome]`, flattened.
    counters: Box<[OnceLock<IntCounter>]>,
    durations: Box<[OnceLock<Histogram>]>,
    upstream_durations: Box<[OnceLock<Histogram>]>,
}

impl Meters {
    fn route_slot(&self, route: Option<RouteIdx>) -> usize {
        route
            .filter(|&r| r < self.routes.len() - 1)
            .unwrap_or(self.routes.len() - 1)
    }

    /// The plan slot of a caller with `credential` (`none` when unauthenticated).
    fn plan_slot(&self, credential: Option<Credential>) -> usize {
        let partner = self.plans.len() - 2;
        match credential {
            Some(Credential::Customer { plan, .. }) if plan < partner => plan,
            Some(Credential::Partner { .. }) => partner,
            _ => partner + 1,
        }
    }

    /// Record one finished request: its count and its durations. (Its status class is counted
    /// by [`Metrics::response`], which needs no config.)
    pub fn record(&self, r: &Record) {
        let route = self.route_slot(r.route);
        let plan = self.plan_slot(r.credential);
        let outcome = r.outcome as usize;
        let i = (route * self.plans.len() + plan) * Outcome::ALL.len() + outcome;
        self.counters[i]
            .get_or_init(|| {
                self.requests.with_label_values(&[
                    self.routes[route].as_str(),
                    self.plans[plan].as_str(),
                    r.outcome.as_str(),
                ])
            })
            .inc();
        self.durations[route]
            .get_or_init(|| {
                self.request_duration
                    .with_label_values(&[self.routes[route].as_str()])
            })
            .observe(r.total_seconds);
        if let Some(up) = r.upstream_seconds {
            self.upstream_durations[route]
                .get_or_init(|| {
                    self.upstream_duration
                        .with_label_values(&[self.routes[route].as_str()])
                })
                .observe(up);
        }
    }
}

/// What [`Meters::record`] needs to know of a finished request.
#[derive(Clone, Copy, Debug)]
pub struct Record {
    pub route: Option<RouteIdx>,
    /// The caller's credential as the decision read it (`None`: unauthenticated).
    pub credential: Option<Credential>,
    pub outcome: Outcome,
    pub total_seconds: f64,
    pub upstream_seconds: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::authenticate::AuthHeader;
    use crate::policy::RequestHead;

    fn text(m: &Metrics) -> String {
        String::from_utf8(m.render()).unwrap()
    }

    fn policy() -> Policy {
        Policy::new(tollgate_core::testing::config(), None)
    }

    /// The record of `key` calling `POST path`, as decided by `p`.
    fn decided(
        p: &Policy,
        key: &str,
        path: &str,
        outcome: Outcome,
        total_seconds: f64,
        upstream_seconds: Option<f64>,
    ) -> Record {
        let auth = format!("Bearer {key}");
        let head = RequestHead {
            method: "POST",
            path,
            authorization: AuthHeader::One(auth.as_bytes()),
        };
        let d = p.decide(&head, 0);
        Record {
            route: d.route,
            credential: d.credential,
            outcome,
            total_seconds,
            upstream_seconds,
        }
    }

    #[test]
    fn records_by_route_plan_and_outcome_with_no_series_before_use() {
        let m = Metrics::new();
        let p = policy();
        let meters = m.meters(&p);
        let out = text(&m);
        assert!(out.contains("tollgate_keys{state=\"active\"} 7"), "{out}");
        assert!(out.contains("tollgate_build_info{version="), "{out}");
        assert!(!out.contains("tollgate_requests_total{"), "{out}");

        let rec = decided(
            &p,
            "basic-key-1",
            "/v2/sendMessage/",
            Outcome::Forwarded,
            0.002,
            Some(0.001),
        );
        meters.record(&rec);
        meters.record(&rec);
        meters.record(&Record {
            route: None,
            credential: None,
            outcome: Outcome::Unauthorized,
            total_seconds: 0.0001,
            upstream_seconds: None,
        });
        let out = text(&m);
        assert!(
            out.contains(
                r#"tollgate_requests_total{outcome="forwarded",plan="basic",route="send_message"} 2"#
            ),
            "{out}"
        );
        assert!(
            out.contains(
                r#"tollgate_requests_total{outcome="unauthorized",plan="none",route="none"} 1"#
            ),
            "{out}"
        );
        assert!(
            out.contains(r#"tollgate_upstream_duration_seconds_count{route="send_message"} 2"#),
            "{out}"
        );
        assert!(
            out.contains(r#"tollgate_request_duration_seconds_bucket{route="none",le="0.0001"} 1"#),
            "{out}"
        );
        assert!(
            !out.contains(r#"tollgate_upstream_duration_seconds_count{route="none"}"#),
            "{out}"
        );
    }

    #[test]
    fn partner_keys_are_labelled_partner_and_counts_survive_new_meters() {
        let m = Metrics::new();
        let p = policy();
        let rec = decided(
            &p,
            "acme-partner-key",
            "/v2/service/upgrade",
            Outcome::Invalid,
            0.001,
            None,
        );
        m.meters(&p).record(&rec);
        // A reload builds new meters over the same families: the count goes on.
        m.meters(&p).record(&rec);
        let out = text(&m);
        assert!(
            out.contains(
                r#"tollgate_requests_total{outcome="invalid",plan="partner",route="service_upgrade"} 2"#
            ),
            "{out}"
        );
    }

    #[test]
    fn responses_by_class_and_reloads_by_result() {
        let m = Metrics::new();
        for s in [200, 204, 429, 502, 99, 600] {
            m.response(s);
        }
        m.reloaded(true);
        m.reloaded(false);
        m.reloaded(false);
        let out = text(&m);
        for line in [
            r#"tollgate_responses_total{class="2xx"} 2"#,
            r#"tollgate_responses_total{class="4xx"} 1"#,
            r#"tollgate_responses_total{class="5xx"} 1"#,
            r#"tollgate_config_reloads_total{result="success"} 1"#,
            r#"tollgate_config_reloads_total{result="error"} 2"#,
        ] {
            assert!(out.contains(line), "{line} missing in {out}");
        }
    }
}
