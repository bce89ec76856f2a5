//! `GET /api/usage`: what the operator's view shows ([`UsageView`]), built from the live
//! snapshot and the usage counts: the config in force, the busiest keys of the last minute,
//! the overrides, the shared budgets' state and the latest refusals. Key *names* only: never a
//! key, a digest or a body.

use http::{Response, StatusCode};

use super::reply::json;
use super::view::{
    AllowView, BlockRow, ClusterView, ConfigView, KeyRefusals, KeyRow, LastReloadView, PlanView,
    RefusalRow, TimelinePoint, UsageView,
};
use super::Admin;
use crate::clock::Clock;
use crate::config::Allow;
use crate::keys::KeyChanges;
use crate::limit::SharedStore;
use crate::policy::keys::{Credential, KeyIdx};
use crate::policy::{Code, Policy};
use crate::runtime::live::LivePolicy;
use crate::usage::KeyCounts;

/// Keys listed when no search narrows them.
const BUSIEST: usize = 20;
/// Keys listed at most for a search.
const FOUND: usize = 50;

/// `GET /api/usage?key=…`.
pub(super) fn answer(admin: &Admin, query: Option<&str>) -> Response<Vec<u8>> {
    let search = match super::query::read(query, "/api/usage") {
        Ok(params) => params
            .into_iter()
            .find(|(k, _)| *k == "key")
            .map(|(_, v)| v),
        Err(refused) => return *refused,
    };
    let view = usage_view(
        &admin.changes,
        admin.clock.as_ref(),
        admin.cluster.as_deref(),
        search.as_deref(),
        admin.blocks(),
    );
    json(StatusCode::OK, &view)
}

/// The view of `/api/usage`; `search` narrows the keys to names that contain it (any case).
/// `blocks` are the blocked addresses ([`super::blocks::rows`]).
pub(crate) fn usage_view(
    changes: &KeyChanges,
    clock: &dyn Clock,
    cluster: Option<&SharedStore>,
    search: Option<&str>,
    blocks: Vec<BlockRow>,
) -> UsageView {
    let live = changes.live();
    let snap = live.load();
    let policy = &snap.policy;
    let now_ms = live.usage().now_ms();
    let needle = search.map(str::to_lowercase).filter(|s| !s.is_empty());
    let now = clock.now();
    let keys = rows(live, policy, now_ms, needle.as_deref())
        .iter()
        .map(|(k, c)| key_row(policy, *k, c, now))
        .collect();
    UsageView {
        generated_at_ms: now_ms,
        config: config_view(live, policy),
        search: needle,
        keys,
        anonymous_requests: live.usage().anonymous(now_ms / 1000),
        overrides: changes.shown(policy),
        cluster: cluster.map(|c| cluster_view(c, policy)),
        refusals: refusals(live, policy),
        blocks,
        key_changes: super::record::changes(changes, policy),
        timeline: timeline(live, now_ms),
    }
}

/// The last 10 minutes by outcome, per 10 s.
fn timeline(live: &LivePolicy, now_ms: u64) -> Vec<TimelinePoint> {
    live.usage()
        .timeline(now_ms)
        .into_iter()
        .map(|(at_ms, counts)| TimelinePoint {
            at_ms,
            counts: crate::policy::Outcome::ALL
                .iter()
                .zip(counts)
                .map(|(o, n)| (o.as_str().to_string(), n))
                .collect(),
        })
        .collect()
}

/// The keys to list, busiest first: the busiest of the last minute, or those whose name holds
/// `needle` (also without a request this minute).
fn rows(
    live: &LivePolicy,
    policy: &Policy,
    now_ms: u64,
    needle: Option<&str>,
) -> Vec<(KeyIdx, KeyCounts)> {
    let counted = live.usage().keys(now_ms / 1000);
    let mut rows: Vec<(KeyIdx, KeyCounts)> = match needle {
        None => counted.into_iter().take(BUSIEST).collect(),
        Some(n) => {
            let matches = |k: KeyIdx| holds(policy.keys.get(k).name.as_bytes(), n.as_bytes());
            let mut rows: Vec<(KeyIdx, KeyCounts)> =
                counted.into_iter().filter(|(k, _)| matches(*k)).collect();
            for (k, _) in policy.keys.iter() {
                if rows.len() >= FOUND {
                    break;
                }
                if matches(k) && !rows.iter().any(|(r, _)| *r == k) {
                    rows.push((k, KeyCounts::default()));
                }
            }
            rows.truncate(FOUND);
            rows
        }
    };
    rows.sort_by(|a, b| b.1.requests.cmp(&a.1.requests).then(a.0.cmp(&b.0)));
    rows
}

/// Whether the key name `name` holds `needle` (lowercased), whatever the name's case: what
/// `name.to_lowercase().contains(needle)` says, since names are ASCII (`is_valid_name`), without
/// a lowercased copy of each of a million names for one search.
fn holds(name: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || name
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

fn config_view(live: &LivePolicy, policy: &Policy) -> ConfigView {
    let (last, started_ms) = live.last_reload();
    // Keys on each plan (upgrades included), counted as keys change: no walk of the keys.
    let on_plan = policy.keys.keys_on_plans();
    let plans = policy
        .config
        .plans
        .iter()
        .enumerate()
        .map(|(i, p)| PlanView {
            name: p.name.clone(),
            plan_id: p.plan_id,
            limit: p.limit.get(),
            quota: p.quota,
            allow: match &p.allow {
                Allow::All => AllowView::Keyword("all".into()),
                Allow::Only(ids) => AllowView::Routes(
                    ids.iter()
                        .map(|&r| policy.config.catalogue.get(r).id.clone())
                        .collect(),
                ),
            },
            shadow: p.shadow,
            keys: on_plan[i],
        })
        .collect();
    ConfigView {
        file: live.path().display().to_string(),
        started_at_ms: started_ms,
        last_reload: last.map(|r| LastReloadView {
            at_ms: r.at_ms,
            result: if r.error.is_none() {
                "success"
            } else {
                "error"
            }
            .into(),
            error: r.error,
        }),
        window_seconds: policy.config.limits.window.get(),
        keys: policy.keys.len() - policy.config.partners.len(),
        partners: policy.config.partners.len(),
        partner_limit: policy.config.partner_limit.get(),
        plans,
    }
}

fn cluster_view(store: &SharedStore, policy: &Policy) -> ClusterView {
    let cfg = policy.config.process.cluster.as_ref();
    ClusterView {
        store_up: store.is_up(),
        replicas: store.fleet(),
        redis: cfg.map(|c| c.redacted_url()),
        key_prefix: cfg.map(|c| c.key_prefix.clone()),
        sync_interval_ms: cfg.map(|c| c.sync_interval.as_millis() as u64),
    }
}

fn refusals(live: &LivePolicy, policy: &Policy) -> Vec<RefusalRow> {
    live.usage()
        .refusals()
        .iter()
        .map(|r| {
            let code = Code::ALL.get(usize::from(r.code)).copied();
            RefusalRow {
                at_ms: r.at_ms,
                key: r
                    .key
                    .filter(|k| (*k as usize) < policy.keys.len())
                    .map(|k| policy.keys.get(k).name.as_str().to_string()),
                route: r.route.map(|i| policy.config.catalogue.get(i).id.clone()),
                code: code.map(|c| c.as_str().to_string()),
                status: code.map(Code::status),
            }
        })
        .collect()
}

fn key_row(policy: &Policy, k: KeyIdx, c: &KeyCounts, now: u64) -> KeyRow {
    let entry = policy.keys.get(k);
    let partner = match entry.credential() {
        Credential::Customer { partner, .. } => partner,
        Credential::Partner { partner } => Some(partner),
    };
    let budget = policy.budget(k, now);
    KeyRow {
        key: entry.name.as_str().to_string(),
        plan: policy.policy_name(k).to_string(),
        partner: partner.map(|p| policy.config.partners[p].name.clone()),
        overridden: entry.plan_override().is_some(),
        requests: c.requests,
        admitted: c.admitted,
        refusals: KeyRefusals {
            rate_limited: c.rate_limited,
            quota_exhausted: c.quota_exhausted,
            forbidden: c.forbidden,
            invalid: c.invalid,
        },
        shadowed: c.shadowed,
        budget_left: budget.remaining,
        limit: budget.limit,
        state: entry.live().state().as_str().to_string(),
        codes: Code::ALL
            .iter()
            .zip(c.codes)
            .filter(|(_, n)| *n > 0)
            .map(|(code, n)| (code.as_str().to_string(), n))
            .collect(),
        quota: policy
            .quota_state(k, entry.credential())
            .map(|q| super::view::QuotaView {
                requests: q.spec.requests,
                per: q.spec.per.as_str().to_string(),
                used: q.used,
                left: q.remaining,
            }),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::holds;

    proptest! {
        /// For any valid name and any search, what the lowercased copy said.
        #[test]
        fn a_search_finds_the_names_the_lowercased_copy_found(
            name in "[A-Za-z0-9_.-]{1,64}",
            needle in "([A-Za-z0-9_.-]|\\PC){0,6}",
        ) {
            let needle = needle.to_lowercase();
            prop_assert_eq!(
                holds(name.as_bytes(), needle.as_bytes()),
                name.to_lowercase().contains(&needle)
            );
        }

        /// A piece of the name, in any case, is found.
        #[test]
        fn a_piece_of_the_name_is_found(name in "[A-Za-z0-9_.-]{1,64}", a in 0usize..64, n in 1usize..8) {
            let a = a % name.len();
            let piece = name[a..(a + n).min(name.len())].to_lowercase();
            prop_assert!(holds(name.as_bytes(), piece.as_bytes()));
        }
    }
}
