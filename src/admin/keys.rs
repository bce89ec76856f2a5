//! `/api/keys/…`: keys that change live, by the operator (the router hands these here).
//!
//! | request | answer |
//! |---|---|
//! | `GET /api/keys/{name}` | 200, the key's state ([`KeyView`](super::view::KeyView)); never a digest |
//! | `POST /api/keys/{name}/suspend` (body optional: `{"reason": "..."}`) | 200, the key's state |
//! | `POST /api/keys/{name}/resume` | 200 (409 `key_revoked` for a revoked key) |
//! | `POST /api/keys/{name}/revoke` | 200: every digest of the key in force, refused for good |
//! | `POST /api/keys/revoke` with `{"key": "<the secret>"}` | 200 `{"name": ..., "state": "revoked"}`; 404 for a key no entry has |
//! | `PUT /api/keys/{name}/limit` with `{"requests_per_window": N}`, `DELETE` | 200 |
//! | `PUT /api/keys/{name}/quota` with `{"requests": N, "per": "day"\|"month"}`, `DELETE` | 200 |
//!
//! Unknown name: 404 `unknown_key`. A bad body: 400 `invalid_body` with `errors`
//! (`{pointer, detail}`), as the gateway's own refusals ([`super::body`]); it is checked
//! before the name is looked up. A change the store cannot keep: 503 `change_not_kept`, and
//! nothing is applied anywhere. Every change is counted in
//! `tollgate_admin_changes_total{action,result}` and logged once (by `admin`; never a key).
//! The secret of the leak path is hashed at once and never logged or echoed.

use http::{Response, StatusCode};

use super::body::{read, LimitBody, QuotaBody, Refused, SecretBody, SuspendBody};
use super::codes::AdminCode;
use super::record::key_view;
use super::reply::{json, problem};
use super::view::RevokedView;
use super::Admin;
use crate::fleet_store::StoreError;
use crate::keys::KeyChanges;
use crate::keys::{ChangeError, KeepError, KeyRef};
use crate::policy::overrides::{Action, ChangeKind, ChangeRefused};

/// A change to a key, as its path and method name it; its body, when it takes one, is read by
/// [`KeyOp::action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum KeyOp {
    /// `POST …/suspend`, body optional.
    Suspend,
    /// `POST …/resume`.
    Resume,
    /// `POST …/revoke`.
    Revoke,
    /// `PUT …/limit`, with a [`LimitBody`].
    SetLimit,
    /// `DELETE …/limit`.
    ClearLimit,
    /// `PUT …/quota`, with a [`QuotaBody`].
    SetQuota,
    /// `DELETE …/quota`.
    ClearQuota,
}

impl KeyOp {
    /// Its kind of change (the `action` label of `tollgate_admin_changes_total`: the path's
    /// last segment).
    pub(super) fn kind(self) -> ChangeKind {
        match self {
            KeyOp::Suspend => ChangeKind::Suspend,
            KeyOp::Resume => ChangeKind::Resume,
            KeyOp::Revoke => ChangeKind::Revoke,
            KeyOp::SetLimit | KeyOp::ClearLimit => ChangeKind::Limit,
            KeyOp::SetQuota | KeyOp::ClearQuota => ChangeKind::Quota,
        }
    }

    /// The change the operation and its body ask for, or the 400. `resume`, `revoke` and the
    /// `DELETE`s read no body.
    fn action(self, body: &[u8]) -> Result<Action, Refused> {
        Ok(match self {
            KeyOp::Suspend => Action::Suspend(SuspendBody::read_optional(body)?.reason()?),
            KeyOp::Resume => Action::Resume,
            KeyOp::Revoke => Action::Revoke,
            KeyOp::SetLimit => Action::Limit(Some(read::<LimitBody>(body)?.requests_per_window()?)),
            KeyOp::ClearLimit => Action::Limit(None),
            KeyOp::SetQuota => Action::Quota(Some(read::<QuotaBody>(body)?.quota()?)),
            KeyOp::ClearQuota => Action::Quota(None),
        })
    }

    /// Its row of the router's `ROUTES`.
    pub(crate) fn row(self) -> (&'static str, &'static str) {
        match self {
            KeyOp::Suspend => ("POST", "/api/keys/{name}/suspend"),
            KeyOp::Resume => ("POST", "/api/keys/{name}/resume"),
            KeyOp::Revoke => ("POST", "/api/keys/{name}/revoke"),
            KeyOp::SetLimit => ("PUT", "/api/keys/{name}/limit"),
            KeyOp::ClearLimit => ("DELETE", "/api/keys/{name}/limit"),
            KeyOp::SetQuota => ("PUT", "/api/keys/{name}/quota"),
            KeyOp::ClearQuota => ("DELETE", "/api/keys/{name}/quota"),
        }
    }
}

/// `GET /api/keys/{name}`: with `cluster`, a name this replica has no key of is looked up
/// in the fleet's store first (a key another replica issued moments ago, not polled here
/// yet, is found at once, as a change by name finds it: docs/cluster.md, "Two replicas at
/// once").
pub(super) async fn show_found(changes: &KeyChanges, name: &str) -> Response<Vec<u8>> {
    if changes
        .live()
        .load()
        .policy
        .keys
        .find_by_name(name)
        .is_none()
    {
        changes.look_up(name).await;
    }
    show(changes, name)
}

/// The key named `name`'s state, as this replica has it.
pub(super) fn show(changes: &KeyChanges, name: &str) -> Response<Vec<u8>> {
    let snap = changes.live().load();
    let Some(k) = snap.policy.keys.find_by_name(name) else {
        return unknown_key(name);
    };
    json(StatusCode::OK, &key_view(changes, &snap.policy, k))
}

/// `op` on the key named `name`, by the operator: its body read, then the change made where
/// it is kept, then the key's state.
pub(super) async fn change(admin: &Admin, name: &str, op: KeyOp, body: &[u8]) -> Response<Vec<u8>> {
    let action = match op.action(body) {
        Ok(action) => action,
        Err(refused) => {
            admin.live.metrics().admin_change(op.kind(), false);
            return *refused;
        }
    };
    let done = admin
        .changes
        .change(KeyRef::Name(name), action, "admin", false)
        .await;
    admin.live.metrics().admin_change(op.kind(), done.is_ok());
    match done {
        Ok(name) => show(&admin.changes, &name),
        Err(e) => change_error(e, name),
    }
}

/// `POST /api/keys/revoke` with `{"key": "<the secret>"}`: the leak path. The secret is
/// hashed here and dropped; it is never logged, echoed or kept.
pub(super) async fn revoke_secret(admin: &Admin, body: &[u8]) -> Response<Vec<u8>> {
    let digest = match read::<SecretBody>(body).and_then(|b| b.digest()) {
        Ok(d) => d,
        Err(refused) => {
            admin.live.metrics().admin_change(ChangeKind::Revoke, false);
            return *refused;
        }
    };
    let done = admin
        .changes
        .change(KeyRef::Digest(&digest), Action::Revoke, "admin", false)
        .await;
    admin
        .live
        .metrics()
        .admin_change(ChangeKind::Revoke, done.is_ok());
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
            "no key authenticates with that secret (a secret a rotation replaced stops at the end of its overlap, and needs no revocation after it)",
        ),
        Err(e) => change_error(e, "(by secret)"),
    }
}

fn unknown_key(name: &str) -> Response<Vec<u8>> {
    problem(
        AdminCode::UnknownKey,
        &format!("no key or partner is named `{name}` (in the config or issued)"),
    )
}

/// The answer to a change that was not made.
pub(super) fn change_error(e: ChangeError, name: &str) -> Response<Vec<u8>> {
    let (code, detail) = match e {
        ChangeError::NotFound | ChangeError::Refused(ChangeRefused::Deleted) => {
            return unknown_key(name)
        }
        ChangeError::Refused(r) => (
            match r {
                ChangeRefused::Revoked => AdminCode::KeyRevoked,
                ChangeRefused::NotACustomerKey => AdminCode::NotACustomerKey,
                // Only a partner's resume meets it; the operator's own changes never do.
                ChangeRefused::SuspendedByOperator => AdminCode::SuspendedByOperator,
                ChangeRefused::DefinedInConfig => AdminCode::DefinedInConfig,
                ChangeRefused::Deleted => AdminCode::UnknownKey,
                ChangeRefused::KeyExists(_) => AdminCode::KeyExists,
                // A reload between the request's check and the change.
                ChangeRefused::NotInConfig(_) => AdminCode::InvalidBody,
            },
            r.to_string(),
        ),
        ChangeError::NotKept(KeepError::Redis(StoreError::NotReplicated)) => (
            AdminCode::ChangeNotKept,
            "the Redis master took the change but no replica confirmed it within timeout_ms, so \
             a failover could lose it: it may still take effect; retry it (repeating a change \
             that took effect changes nothing more)"
                .to_string(),
        ),
        ChangeError::NotKept(why) => (
            AdminCode::ChangeNotKept,
            format!(
                "{why}; nothing was changed, on this replica or any other: retry when the store \
                 is back"
            ),
        ),
    };
    problem(code, &detail)
}
