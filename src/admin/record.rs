//! A key's live record in words: its state as `GET /api/keys/{name}` answers it
//! ([`key_view`]), and the changes in force as the page and `tollgate top` list them
//! ([`changes`]). Key names only, never a digest.

use super::view::{ChangeRow, KeyQuotaView, KeyView, OverrideView, PreviousView};
use crate::clock::rfc3339;
use crate::keys::KeyChanges;
use crate::policy::keys::{Credential, KeyIdx, KeyState};
use crate::policy::overrides::{KeyRecord, Part};
use crate::policy::Policy;

/// The changes in `o`, the record of the key named `key`.
fn rows(key: &str, o: &KeyRecord, policy: &Policy) -> Vec<ChangeRow> {
    let row = |change: &str, detail: Option<String>, since_ms: u64, by: &str| ChangeRow {
        key: key.to_string(),
        change: change.into(),
        detail,
        since: rfc3339(since_ms),
        by: by.into(),
    };
    let mut v = Vec::new();
    if let Some(c) = &o.revoked {
        v.push(row(
            Part::Revoked.name(),
            c.reason.clone(),
            c.since_ms,
            &c.by,
        ));
    }
    if let Some(c) = &o.suspended {
        v.push(row(
            Part::Suspended.name(),
            c.reason.clone(),
            c.since_ms,
            &c.by,
        ));
    }
    if let Some(l) = &o.limit {
        let detail = format!("{} per window", l.requests_per_window);
        v.push(row(
            Part::Limit.name(),
            Some(detail),
            l.change.since_ms,
            &l.change.by,
        ));
    }
    if let Some(q) = &o.quota {
        let detail = format!("{} per {}", q.quota.requests, q.quota.per.as_str());
        v.push(row(
            Part::Quota.name(),
            Some(detail),
            q.change.since_ms,
            &q.change.by,
        ));
    }
    if let Some(id) = o.plan_id {
        let name = |id: Option<u32>| {
            id.and_then(|id| policy.plan_by_id(id))
                .map_or_else(|| "?".into(), |p| policy.config.plans[p].name.clone())
        };
        let detail = format!("{} (was {})", name(Some(id)), name(o.replaced));
        let by = o
            .partner
            .as_ref()
            .map_or_else(|| "partner".to_string(), |p| format!("partner:{p}"));
        v.push(row(Part::Plan.name(), Some(detail), o.at_ms, &by));
    }
    v
}

/// Every change in force, and every key refused by its `expires_at`, for the page and `top`.
pub(crate) fn changes(changes: &KeyChanges, policy: &Policy) -> Vec<ChangeRow> {
    // Under the change lock, over the records that show a change (kept as they change: not
    // a walk of a million issued keys' records).
    let mut v: Vec<ChangeRow> = changes.with_changed_records(|set| {
        set.filter(|(d, o)| o.issued.is_some() || policy.keys.lookup(d).is_some())
            .flat_map(|(_, o)| rows(&o.key, &o, policy))
            .collect()
    });
    // The expired keys, walked only when there are some (counted as keys change).
    let expired = policy.keys.states()[KeyState::Expired as usize];
    for (k, e) in policy.keys.iter().filter(|_| expired > 0) {
        if e.live().state() == KeyState::Expired {
            let at = policy.keys.extra(k).and_then(|x| x.expires_ms).unwrap_or(0);
            v.push(ChangeRow {
                key: e.name.as_str().to_string(),
                change: "expired".into(),
                detail: None,
                since: rfc3339(at),
                by: "config".into(),
            });
        }
    }
    v.sort_by(|a, b| b.since.cmp(&a.since).then(a.key.cmp(&b.key)));
    v.truncate(100);
    v
}

/// The state of the key `k` as `GET /api/keys/{name}` answers it.
pub(crate) fn key_view(changes: &KeyChanges, policy: &Policy, k: KeyIdx) -> KeyView {
    let e = policy.keys.get(k);
    let live_word = e.live();
    let credential = e.credential_with(live_word);
    let extra = policy.keys.extra(k);
    let (plan, partner) = match credential {
        Credential::Customer { plan, partner, .. } => (
            policy.config.plans[plan].name.clone(),
            partner.map(|p| policy.config.partners[p].name.clone()),
        ),
        Credential::Partner { partner } => (
            "partner".to_string(),
            Some(policy.config.partners[partner].name.clone()),
        ),
    };
    let record = changes.with_records(|set| set.record(&e.digest));
    // The quota in force (the key's own, live or YAML, else its plan's or the partners'),
    // with the requests charged in the period now.
    let quota = policy.quota_state(k, credential).map(|q| {
        let now_ms = policy.metering.calendar.now_ms();
        KeyQuotaView {
            requests: q.spec.requests,
            per: q.spec.per.as_str().into(),
            own: q.own,
            used: q.used,
            remaining: q.remaining,
            resets_at: rfc3339(q.spec.per.end_after(now_ms)),
        }
    });
    let issued = record.as_ref().and_then(|o| o.issued.as_ref());
    let now_ms = crate::clock::wall_ms();
    let previous_issued = issued
        .into_iter()
        .flat_map(|i| &i.previous)
        .map(|p| PreviousView {
            until: rfc3339(p.until_ms),
            state: match live_word.refused() {
                Some(crate::policy::keys::KeyRefusal::Revoked) => "revoked",
                _ if p.until_ms <= now_ms => "expired",
                _ => "active",
            }
            .into(),
        });
    let previous = policy
        .keys
        .aliases_of(k)
        .map(|a| PreviousView {
            until: rfc3339(a.until_ms),
            state: match a.refused() {
                Some(crate::policy::keys::KeyRefusal::Revoked) => "revoked",
                Some(_) => "expired",
                None => "active",
            }
            .into(),
        })
        .chain(previous_issued)
        .collect();
    let overrides = record
        .iter()
        .flat_map(|o| rows(e.name.as_str(), o, policy))
        .map(|r| OverrideView {
            change: r.change,
            detail: r.detail,
            since: r.since,
            by: r.by,
        })
        .collect();
    KeyView {
        name: e.name.as_str().to_string(),
        plan,
        partner,
        state: live_word.state().as_str().into(),
        expires_at: extra.and_then(|x| x.expires_ms).map(rfc3339),
        requests_per_window: policy.rate(credential).limit(),
        source: if policy.keys.issued_slot(k).is_some() {
            "api"
        } else {
            "config"
        }
        .into(),
        quota,
        previous,
        overrides,
    }
}
