//! Keys issued through the admin API: `POST /api/keys` (a new key), `POST
//! /api/keys/{name}/rotate` (a new secret, the old one kept for an overlap), `DELETE
//! /api/keys/{name}` (revoked and forgotten).
//!
//! | request | answer |
//! |---|---|
//! | `POST /api/keys` with [`CreateBody`] | 201: `key` (the secret, shown this once; none when the caller gave `sha256`) beside the key's state ([`IssuedView`]) |
//! | `POST /api/keys/{name}/rotate`, body optional `{"overlap_seconds": N}` | 200: the new `key` beside the key's state |
//! | `DELETE /api/keys/{name}` | 204 |
//!
//! A name or a digest a key has (or had: a revoked digest never authenticates again) is 409
//! `key_exists`; `rotate` and `DELETE` of a key of the YAML are 409 `defined_in_config`; a bad
//! field (an unknown plan or partner too) is 400 `invalid_body` naming it; a change the store
//! cannot keep is 503 `change_not_kept`, made nowhere. The secret is drawn here from the
//! operating system's CSPRNG ([`crate::keys::secret`]), hashed at once, and never logged or
//! kept: only its digest is.

use http::{Response, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::{broken, invalid, read, Body, QuotaBody, Refused};
use super::codes::AdminCode;
use super::keys::change_error;
use super::record::key_view;
use super::reply::{json, no_content, problem};
use super::view::KeyView;
use super::Admin;
use crate::clock::{parse_rfc3339_utc, wall_ms};
use crate::config::{is_valid_name, MAX_REQUESTS_PER_WINDOW, NAME_RULE};
use crate::digest::Digest;
use crate::keys::secret;
use crate::keys::{ChangeError, Records};
use crate::policy::keys::KeyIdx;
use crate::policy::overrides::{ChangeKind, ChangeRefused, KeyRecords, NewKey};
use crate::policy::Policy;

/// The longest overlap a rotation takes: a year.
const MAX_OVERLAP_SECONDS: u64 = 365 * 24 * 3600;

/// The overlap of a rotation that names none: a day.
const DEFAULT_OVERLAP_SECONDS: u64 = 24 * 3600;

/// `POST /api/keys`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateBody {
    /// The key's name ([`is_valid_name`]), no key's (YAML or issued).
    name: Option<String>,
    /// A plan's name.
    plan: Option<String>,
    /// A partner's name: the partner that manages the key.
    partner: Option<String>,
    /// RFC 3339, in the future: from then on the key is refused.
    expires_at: Option<String>,
    /// The key's own window limit.
    requests_per_window: Option<u64>,
    /// The key's own quota.
    quota: Option<QuotaBody>,
    /// The SHA-256 of a secret the caller keeps (64 hex): the answer then holds no secret.
    sha256: Option<String>,
}

/// `POST /api/keys/{name}/rotate`: optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RotateBody {
    /// How long the secret replaced still authenticates, in seconds (default 86400; 0: not
    /// at all).
    overlap_seconds: Option<u64>,
}

impl Body for CreateBody {
    fn rule(pointer: &str) -> String {
        match pointer {
            "/name" => format!("must be {NAME_RULE} (required)"),
            "/plan" => "must be the name of a plan of the config in force (required)".into(),
            "/partner" => "is the name of a partner of the config in force".into(),
            "/expires_at" => {
                "is an RFC 3339 instant in UTC, in the future, such as `2027-01-01T00:00:00Z`"
                    .into()
            }
            "/requests_per_window" => {
                format!("is an integer from 1 to {MAX_REQUESTS_PER_WINDOW}, as a plan's")
            }
            "/sha256" => "is 64 hex characters: the SHA-256 of the secret".into(),
            p if p.starts_with("/quota/per") => "must be `day` or `month` (required)".into(),
            p if p.starts_with("/quota") => {
                "is an object: `requests` (1 to 10^12) and `per` (`day` or `month`)".into()
            }
            _ => "is not a field of a new key".into(),
        }
    }
}

impl Body for RotateBody {
    fn rule(_: &str) -> String {
        format!("is a whole number of seconds from 0 to {MAX_OVERLAP_SECONDS}")
    }
}

/// A key issued or rotated: its secret, shown this once (none when the caller gave
/// `sha256`), beside its state.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct IssuedView {
    /// The secret. Shown this once: the gateway keeps only its digest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(flatten)]
    pub view: KeyView,
}

impl CreateBody {
    /// The key asked for against `policy`, and its digest with the secret when the gateway
    /// draws it; or the 400 naming the field.
    fn key(self, policy: &Policy) -> Result<(NewKey, Digest, Option<String>), Refused> {
        let name = self
            .name
            .filter(|n| is_valid_name(n))
            .ok_or_else(|| broken::<Self>("/name"))?;
        let plan = self.plan.ok_or_else(|| broken::<Self>("/plan"))?;
        if policy.config.plan(&plan).is_none() {
            return Err(invalid(
                "/plan",
                &format!("names no plan: `{plan}` is not one of the config in force"),
            ));
        }
        if let Some(p) = &self.partner {
            if !policy.config.partners.iter().any(|x| &x.name == p) {
                return Err(invalid(
                    "/partner",
                    &format!("names no partner: `{p}` is not one of the config in force"),
                ));
            }
        }
        let partner = self.partner;
        let expires_ms = match self.expires_at {
            None => None,
            Some(t) => Some(
                parse_rfc3339_utc(&t)
                    .filter(|&ms| ms > wall_ms())
                    .ok_or_else(|| broken::<Self>("/expires_at"))?,
            ),
        };
        let requests_per_window = match self.requests_per_window {
            None => None,
            Some(n) => Some(
                u32::try_from(n)
                    .ok()
                    .filter(|n| (1..=MAX_REQUESTS_PER_WINDOW).contains(n))
                    .ok_or_else(|| broken::<Self>("/requests_per_window"))?,
            ),
        };
        let quota = match self.quota {
            None => None,
            Some(q) => Some(q.quota().map_err(|_| {
                let at = if q
                    .requests
                    .is_some_and(|n| (1..=crate::config::MAX_QUOTA_REQUESTS).contains(&n))
                {
                    "/quota/per"
                } else {
                    "/quota/requests"
                };
                broken::<Self>(at)
            })?),
        };
        let (digest, secret) = match self.sha256 {
            Some(hex) => (
                Digest::from_hex(&hex)
                    .filter(|_| hex.len() == 64)
                    .ok_or_else(|| broken::<Self>("/sha256"))?,
                None,
            ),
            None => {
                let s = draw("issued")?;
                (Digest::of(s.as_bytes()), Some(s))
            }
        };
        let key = NewKey {
            name,
            plan,
            partner,
            expires_ms,
            requests_per_window,
            quota,
        };
        Ok((key, digest, secret))
    }
}

/// `POST /api/keys`.
pub(super) async fn create(admin: &Admin, body: &[u8]) -> Response<Vec<u8>> {
    let asked = read::<CreateBody>(body).and_then(|b| b.key(&admin.live.load().policy));
    let (key, digest, secret) = match asked {
        Ok(k) => k,
        Err(refused) => {
            admin.live.metrics().admin_change(ChangeKind::Create, false);
            return *refused;
        }
    };
    let asked = key.clone();
    let done = admin
        .changes
        .make(
            ChangeKind::Create,
            &key.name,
            Box::new(move |policy, set| {
                Ok(policy.issue(&asked, digest, "admin", wall_ms(), set)?)
            }),
        )
        .await;
    admin
        .live
        .metrics()
        .admin_change(ChangeKind::Create, done.is_ok());
    match done {
        Ok(()) => issued(admin, &key.name, secret, StatusCode::CREATED),
        Err(e) => change_error(e, &key.name),
    }
}

/// `POST /api/keys/{name}/rotate`.
pub(super) async fn rotate(admin: &Admin, name: &str, body: &[u8]) -> Response<Vec<u8>> {
    let asked = overlap_seconds(body).and_then(|overlap| Ok((overlap, draw("rotated")?)));
    let (overlap, secret) = match asked {
        Ok(x) => x,
        Err(refused) => {
            admin.live.metrics().admin_change(ChangeKind::Rotate, false);
            return *refused;
        }
    };
    let digest = Digest::of(secret.as_bytes());
    let done = change_named(admin, ChangeKind::Rotate, name, move |policy, k, set| {
        policy.rotate(k, digest, overlap * 1000, wall_ms(), set)
    })
    .await;
    match done {
        Ok(()) => issued(admin, name, Some(secret), StatusCode::OK),
        Err(e) => change_error(e, name),
    }
}

/// `DELETE /api/keys/{name}`.
pub(super) async fn delete(admin: &Admin, name: &str) -> Response<Vec<u8>> {
    let done = change_named(admin, ChangeKind::Delete, name, move |policy, k, set| {
        policy.delete(k, "admin", wall_ms(), set)
    })
    .await;
    match done {
        Ok(()) => no_content(),
        Err(e) => change_error(e, name),
    }
}

/// The operator's change of `kind` to the key named `name` (`make` turns the policy, the
/// key's index and the records in force into what to keep), made and counted.
async fn change_named(
    admin: &Admin,
    kind: ChangeKind,
    name: &str,
    make: impl Fn(&Policy, KeyIdx, &KeyRecords) -> Result<Records, ChangeRefused>
        + Send
        + Sync
        + 'static,
) -> Result<(), ChangeError> {
    let make = std::sync::Arc::new(make);
    let once = || {
        let (named, make) = (name.to_string(), std::sync::Arc::clone(&make));
        admin.changes.make(
            kind,
            name,
            Box::new(move |policy, set| {
                let k = policy
                    .keys
                    .find_by_name(&named)
                    .ok_or(ChangeError::NotFound)?;
                Ok(make(policy, k, set)?)
            }),
        )
    };
    let mut done = once().await;
    // Issued by another replica moments ago, and not polled here yet: found through its
    // name's claim in Redis, then made.
    if matches!(done, Err(ChangeError::NotFound)) && admin.changes.look_up(name).await {
        done = once().await;
    }
    admin.live.metrics().admin_change(kind, done.is_ok());
    done
}

/// The overlap a rotation's body asks for (none: a day), in seconds; or the 400.
fn overlap_seconds(body: &[u8]) -> Result<u64, Refused> {
    let b = if body.iter().all(u8::is_ascii_whitespace) {
        RotateBody::default()
    } else {
        read::<RotateBody>(body)?
    };
    match b.overlap_seconds {
        None => Ok(DEFAULT_OVERLAP_SECONDS),
        Some(s) if s <= MAX_OVERLAP_SECONDS => Ok(s),
        Some(_) => Err(broken::<RotateBody>("/overlap_seconds")),
    }
}

/// A new secret from the operating system's CSPRNG, or the 503 saying nothing was `done`.
fn draw(done: &str) -> Result<String, Refused> {
    secret::issue().map_err(|e| {
        Box::new(problem(
            AdminCode::ChangeNotKept,
            &format!("the operating system gave no random bytes ({e}): nothing was {done}"),
        ))
    })
}

/// The key named `name` as just issued or rotated, with its secret.
fn issued(admin: &Admin, name: &str, key: Option<String>, status: StatusCode) -> Response<Vec<u8>> {
    let snap = admin.live.load();
    let Some(k) = snap.policy.keys.find_by_name(name) else {
        // Deleted (or a reload dropped it) between the change and this answer.
        return problem(AdminCode::UnknownKey, &format!("`{name}` is gone already"));
    };
    let view = key_view(&admin.changes, &snap.policy, k);
    json(status, &IssuedView { key, view })
}
