//! `/api/keys`: keys that change live, by the operator (`admin/mod.rs` routes here).
//!
//! | request | answer |
//! |---|---|
//! | `GET /api/keys/{name}` | 200, the key's state ([`KeyView`]); never a digest |
//! | `POST /api/keys/{name}/suspend` (body optional: `{"reason": "..."}`) | 200, the key's state |
//! | `POST /api/keys/{name}/resume` | 200 (409 `key_revoked` for a revoked key) |
//! | `POST /api/keys/{name}/revoke` | 200: every digest of the key in force, refused for good |
//! | `POST /api/keys/revoke` with `{"key": "<the secret>"}` | 200 `{"name": ..., "state": "revoked"}`; 404 for a key no entry has |
//! | `PUT /api/keys/{name}/limit` with `{"requests_per_window": N}`, `DELETE` | 200 |
//! | `PUT /api/keys/{name}/quota` with `{"requests": N, "per": "day"\|"month"}`, `DELETE` | 200 |
//!
//! Unknown name: 404 `unknown_key`. A bad body: 400 `invalid_body` with `errors`
//! (`{pointer, detail}`), as the gateway's own refusals. A change the store cannot keep: 503
//! `change_not_kept`, and nothing is applied anywhere. Every change is counted in
//! `tollgate_admin_changes_total{action,result}` and logged once (by `admin`; never a key).
//! The secret of the leak path is hashed at once and never logged or echoed.

use http::{Method, Response, StatusCode};

use super::body::{read, LimitBody, QuotaBody, Refused, SecretBody, SuspendBody};
use super::codes::AdminCode;
use super::reply::{json, not_allowed, percent_decode, problem};
use super::view::{ChangeRow, KeyQuotaView, KeyView, OverrideView, PreviousView, RevokedView};
use super::Admin;
use crate::clock::rfc3339;
use crate::overrides::{ChangeError, KeepError, Target};
use crate::policy::keys::{Credential, KeyIdx};
use crate::policy::overrides::{Action, ChangeRefused, Override};
use crate::policy::Policy;
use crate::redis::StoreError;
use crate::runtime::live::LivePolicy;

/// The answer to a request under `/api/keys/` (`rest` is the path after it).
pub(crate) async fn route(
    admin: &Admin,
    method: &Method,
    rest: &str,
    body: &[u8],
) -> Response<Vec<u8>> {
    let mut parts = rest.splitn(2, '/');
    let name = percent_decode(parts.next().unwrap_or(""));
    let action = parts.next();
    match (action, method) {
        (None, m) if name == "revoke" && m == Method::POST => revoke_secret(admin, body).await,
        (None, m) if m == Method::GET || m == Method::HEAD => show(&admin.live, &name),
        (None, _) => not_allowed("GET, HEAD"),
        (Some("suspend" | "resume" | "revoke"), m) if m != Method::POST => not_allowed("POST"),
        (Some("limit" | "quota"), m) if m != Method::PUT && m != Method::DELETE => {
            not_allowed("PUT, DELETE")
        }
        (Some(a), m) => {
            let action = match parse_action(a, m, body) {
                Ok(action) => action,
                Err(r) => {
                    if let Some(label) = label(a) {
                        admin.live.metrics().admin_change(label, false);
                    }
                    return *r;
                }
            };
            change(admin, &name, action).await
        }
    }
}

/// The metric label of an action path segment; other paths are 404 and count nowhere.
fn label(segment: &str) -> Option<&'static str> {
    ["suspend", "resume", "revoke", "limit", "quota"]
        .into_iter()
        .find(|&l| l == segment)
}

/// The action a path segment and body ask for ([`super::body`]), or the 400/404 answer.
fn parse_action(segment: &str, method: &Method, body: &[u8]) -> Result<Action, Refused> {
    let delete = method == Method::DELETE;
    match segment {
        "suspend" => Ok(Action::Suspend(SuspendBody::read_optional(body)?.reason()?)),
        "resume" => Ok(Action::Resume),
        "revoke" => Ok(Action::Revoke),
        "limit" if delete => Ok(Action::Limit(None)),
        "limit" => Ok(Action::Limit(Some(
            read::<LimitBody>(body)?.requests_per_window()?,
        ))),
        "quota" if delete => Ok(Action::Quota(None)),
        "quota" => Ok(Action::Quota(Some(read::<QuotaBody>(body)?.quota()?))),
        _ => Err(Box::new(problem(
            AdminCode::NoKeyOperation,
            "the operations are suspend, resume, revoke, limit and quota",
        ))),
    }
}

fn unknown_key(name: &str) -> Response<Vec<u8>> {
    problem(
        AdminCode::UnknownKey,
        &format!("no key or partner is named `{name}` in the config in force"),
    )
}

/// Make `action` on the key named `name`, by the operator.
async fn change(admin: &Admin, name: &str, action: Action) -> Response<Vec<u8>> {
    let label = action.name();
    let done = admin
        .overrides
        .change(&admin.live, Target::Name(name), action, "admin", false)
        .await;
    admin.live.metrics().admin_change(label, done.is_ok());
    match done {
        Ok(name) => show(&admin.live, &name),
        Err(e) => change_error(e, name),
    }
}

fn change_error(e: ChangeError, name: &str) -> Response<Vec<u8>> {
    match e {
        ChangeError::NotFound => unknown_key(name),
        ChangeError::Refused(r @ ChangeRefused::Revoked) => problem(AdminCode::KeyRevoked, &r.to_string(),
        ),
        ChangeError::Refused(r @ ChangeRefused::NotACustomerKey) => problem(AdminCode::NotACustomerKey, &r.to_string(),
        ),
        // Only a partner's resume meets it; the operator's own changes never do.
        ChangeError::Refused(r @ ChangeRefused::SuspendedByOperator) => problem(AdminCode::SuspendedByOperator, &r.to_string(),
        ),
        ChangeError::NotKept(KeepError::Redis(StoreError::NotReplicated)) => problem(AdminCode::ChangeNotKept, "the Redis master took the change but no replica confirmed it within timeout_ms, so a failover could lose it: it may still take effect; retry it (repeating a change that took effect changes nothing more)",
        ),
        ChangeError::NotKept(why) => problem(AdminCode::ChangeNotKept, &format!("{why}; nothing was changed, on this replica or any other: retry when the store is back"),
        ),
    }
}

/// `POST /api/keys/revoke` with `{"key": "<the secret>"}`: the leak path. The secret is
/// hashed here and dropped; it is never logged, echoed or kept.
async fn revoke_secret(admin: &Admin, body: &[u8]) -> Response<Vec<u8>> {
    let digest = match read::<SecretBody>(body).and_then(|b| b.digest()) {
        Ok(d) => d,
        Err(r) => {
            admin.live.metrics().admin_change("revoke", false);
            return *r;
        }
    };
    let done = admin
        .overrides
        .change(
            &admin.live,
            Target::Digest(&digest),
            Action::Revoke,
            "admin",
            false,
        )
        .await;
    admin.live.metrics().admin_change("revoke", done.is_ok());
    match done {
        Ok(name) => json(
            StatusCode::OK,
            &RevokedView {
                name,
                state: "revoked".into(),
            },
        ),
        Err(ChangeError::NotFound) => problem(
            AdminCode::UnknownSecret,
            "no key in the config in force has that secret (nor had it as a previous one)",
        ),
        Err(e) => change_error(e, "(by secret)"),
    }
}

/// `GET /api/keys/{name}`.
fn show(live: &LivePolicy, name: &str) -> Response<Vec<u8>> {
    let snap = live.load();
    let Some(k) = snap.policy.keys.find_by_name(name) else {
        return unknown_key(name);
    };
    json(StatusCode::OK, &key_view(live, &snap.policy, k))
}

/// The changes of `record` on the key `key`.
fn rows(key: &str, o: &Override, policy: &Policy) -> Vec<ChangeRow> {
    let row = |change: &str, detail: Option<String>, since_ms: u64, by: &str| ChangeRow {
        key: key.to_string(),
        change: change.into(),
        detail,
        since: rfc3339(since_ms),
        by: by.into(),
    };
    let mut v = Vec::new();
    if let Some(c) = &o.revoked {
        v.push(row("revoked", c.reason.clone(), c.since_ms, &c.by));
    }
    if let Some(c) = &o.suspended {
        v.push(row("suspended", c.reason.clone(), c.since_ms, &c.by));
    }
    if let Some(l) = &o.limit {
        let detail = format!("{} per window", l.requests_per_window);
        v.push(row("limit", Some(detail), l.change.since_ms, &l.change.by));
    }
    if let Some(q) = &o.quota {
        let detail = format!("{} per {}", q.quota.requests, q.quota.per.as_str());
        v.push(row("quota", Some(detail), q.change.since_ms, &q.change.by));
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
        v.push(row("upgrade", Some(detail), o.at_ms, &by));
    }
    v
}

/// Every change in force, and every key refused by its `expires_at`, for the page and `top`.
pub(crate) fn changes(live: &LivePolicy, policy: &Policy) -> Vec<ChangeRow> {
    let mut v: Vec<ChangeRow> = live.with_overrides(|set| {
        set.iter()
            .filter_map(|(d, o)| policy.keys.lookup(d).map(|_| (o.key.clone(), o)))
            .flat_map(|(key, o)| rows(&key, o, policy))
            .collect()
    });
    for (k, e) in policy.keys.iter() {
        if e.live().state() == crate::policy::keys::KeyState::Expired {
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
pub(crate) fn key_view(live: &LivePolicy, policy: &Policy, k: KeyIdx) -> KeyView {
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
    let record = live.with_overrides(|set| set.get(&e.digest).cloned());
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
        quota,
        previous,
        overrides,
    }
}
