//! `GET /api/usage`: what the operator's view shows, as JSON (the page `GET /` and
//! `tollgate top` read it): the config in force, the busiest keys of the last minute, the
//! overrides, the cluster's state and the latest refusals. Key *names* only: never a key, a
//! digest or a body.

use serde_json::{json, Value};

use crate::clock::Clock;
use crate::config::Allow;
use crate::limit::SharedStore;
use crate::policy::keys::{Credential, KeyIdx};
use crate::policy::{Code, Policy};
use crate::runtime::live::LivePolicy;
use crate::runtime::usage::KeyCounts;

/// Keys listed when no search narrows them.
const BUSIEST: usize = 20;
/// Keys listed at most for a search.
const FOUND: usize = 50;

/// The JSON of `/api/usage`; `search` narrows the keys to names that contain it (any case).
pub fn usage_json(
    live: &LivePolicy,
    clock: &dyn Clock,
    cluster: Option<&SharedStore>,
    search: Option<&str>,
) -> Value {
    let snap = live.load();
    let policy = &snap.policy;
    let now_ms = live.usage().now_ms();
    let counted = live.usage().keys(now_ms / 1000);
    let needle = search.map(str::to_lowercase).filter(|s| !s.is_empty());
    let mut rows: Vec<(KeyIdx, KeyCounts)> = match &needle {
        None => counted.into_iter().take(BUSIEST).collect(),
        Some(n) => {
            let mut rows: Vec<(KeyIdx, KeyCounts)> = counted
                .into_iter()
                .filter(|(k, _)| policy.keys.get(*k).name.as_str().to_lowercase().contains(n))
                .collect();
            // Keys that match but had no request counted this minute show too.
            for k in 0..policy.keys.len() as KeyIdx {
                if rows.len() >= FOUND {
                    break;
                }
                let name = policy.keys.get(k).name.as_str().to_lowercase();
                if name.contains(n) && !rows.iter().any(|(r, _)| *r == k) {
                    rows.push((k, KeyCounts::default()));
                }
            }
            rows.truncate(FOUND);
            rows
        }
    };
    rows.sort_by(|a, b| b.1.requests.cmp(&a.1.requests).then(a.0.cmp(&b.0)));
    let now = clock.now();
    let keys: Vec<Value> = rows
        .iter()
        .map(|(k, c)| key_row(policy, *k, c, now))
        .collect();
    let refusals: Vec<Value> = live
        .usage()
        .refusals()
        .iter()
        .map(|r| {
            let code = Code::ALL.get(usize::from(r.code)).copied();
            json!({
                "at_ms": r.at_ms,
                "key": r.key.filter(|k| (*k as usize) < policy.keys.len()).map(|k| policy.keys.get(k).name.as_str().to_string()),
                "route": r.route.map(|i| policy.config.catalogue.get(i).id.clone()),
                "code": code.map(Code::as_str),
                "status": code.map(|c| crate::policy::Refusal::new(c, "").status()),
            })
        })
        .collect();
    let (last, started_ms) = live.last_reload();
    let customers = policy.keys.len() - policy.config.partners.len();
    // Keys on each plan (overrides included), in one pass over the keys.
    let mut on_plan = vec![0usize; policy.config.plans.len()];
    for k in 0..policy.keys.len() as KeyIdx {
        if let Credential::Customer { plan, .. } = policy.keys.get(k).credential() {
            on_plan[plan] += 1;
        }
    }
    let plans: Vec<Value> = policy
        .config
        .plans
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let allow = match &p.allow {
                Allow::All => json!("all"),
                Allow::Only(ids) => json!(ids
                    .iter()
                    .map(|&r| policy.config.catalogue.get(r).id.as_str())
                    .collect::<Vec<_>>()),
            };
            json!({
                "name": p.name,
                "plan_id": p.plan_id,
                "limit": p.limit.get(),
                "allow": allow,
                "shadow": p.shadow,
                "keys": on_plan[i],
            })
        })
        .collect();
    let cluster = cluster.map(|c| {
        let cfg = policy.config.cluster.as_ref();
        json!({
            "store_up": c.is_up(),
            "replicas": c.fleet(),
            "redis": cfg.map(|c| c.redacted_url()),
            "key_prefix": cfg.map(|c| c.key_prefix.clone()),
            "sync_interval_ms": cfg.map(|c| c.sync_interval.as_millis() as u64),
        })
    });
    let overrides = crate::overrides::PlanOverrides::shown(live, policy);
    json!({
        "generated_at_ms": now_ms,
        "config": {
            "file": live.path().display().to_string(),
            "started_at_ms": started_ms,
            "last_reload": last.map(|r| json!({
                "at_ms": r.at_ms,
                "result": if r.error.is_none() { "success" } else { "error" },
                "error": r.error,
            })),
            "window_seconds": policy.config.limits.window.get(),
            "keys": customers,
            "partners": policy.config.partners.len(),
            "partner_limit": policy.config.partner_limit.get(),
            "plans": plans,
        },
        "search": needle,
        "keys": keys,
        "anonymous_requests": live.usage().anonymous(now_ms / 1000),
        "overrides": overrides,
        "cluster": cluster,
        "refusals": refusals,
    })
}

fn key_row(policy: &Policy, k: KeyIdx, c: &KeyCounts, now: u64) -> Value {
    let entry = policy.keys.get(k);
    let partner = match entry.credential() {
        Credential::Customer { partner, .. } => partner,
        Credential::Partner { partner } => Some(partner),
    };
    let budget = policy.budget(k, now);
    json!({
        "key": entry.name.as_str(),
        "plan": policy.policy_name(k),
        "partner": partner.map(|p| policy.config.partners[p].name.as_str()),
        "override": entry.plan_override().is_some(),
        "requests": c.requests,
        "admitted": c.admitted,
        "refusals": {
            "rate_limited": c.rate_limited,
            "forbidden": c.forbidden,
            "invalid": c.invalid,
        },
        "shadowed": c.shadowed,
        "budget_left": budget.remaining,
        "limit": budget.limit,
    })
}
