//! The answers of `/api/keys/…`: a key's state ([`KeyView`], never a digest), the leak path's
//! [`RevokedView`], and the change rows the page and `top` list ([`ChangeRow`]).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One change in force on a key, as the admin API and the page show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct ChangeRow {
    /// The key's name.
    pub key: String,
    /// `suspended`, `revoked`, `limit`, `quota`, `upgrade`, or `expired` (its `expires_at`).
    pub change: String,
    /// What it sets, in words (`500 per window`, `pro (was basic)`, the operator's reason).
    pub detail: Option<String>,
    /// When, as RFC 3339 (UTC).
    pub since: String,
    /// `admin`, `partner:<name>`, or `config`.
    pub by: String,
}

/// A key's state, as `GET /api/keys/{name}` and every change to a key answer it: never a
/// digest. Fields in name order, as on the wire (see [`super`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct KeyView {
    /// RFC 3339 (UTC), when the key has one.
    pub expires_at: Option<String>,
    pub name: String,
    /// The changes in force on it.
    pub overrides: Vec<OverrideView>,
    /// The partner that manages it (a partner key: the partner itself).
    pub partner: Option<String>,
    /// Its plan now, or `partner` for a partner key.
    pub plan: String,
    /// Its earlier digests (rotation): when each stops, and its state.
    pub previous: Vec<PreviousView>,
    /// The quota in force, `null` without one.
    pub quota: Option<KeyQuotaView>,
    /// The window limit in force.
    pub requests_per_window: u32,
    /// Where the key comes from: `config` (the YAML) or `api` (issued by the admin API).
    pub source: String,
    /// `active`, `expired`, `suspended` or `revoked`.
    pub state: String,
}

/// `GET /api/keys`: one page of keys in name order, and the cursor of the next (`null` on
/// the last page).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct KeyPage {
    pub keys: Vec<KeyView>,
    pub next: Option<String>,
}

/// The quota in force on a key (its own, live or YAML, else its plan's or the partners'),
/// with the requests charged in the period now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct KeyQuotaView {
    /// The key's own, not its plan's.
    pub own: bool,
    /// `day` or `month`.
    pub per: String,
    pub remaining: u64,
    pub requests: u64,
    /// When the period ends, RFC 3339 (UTC).
    pub resets_at: String,
    pub used: u64,
}

/// An earlier digest of a key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct PreviousView {
    /// `active`, `expired` or `revoked`.
    pub state: String,
    /// RFC 3339 (UTC).
    pub until: String,
}

/// One change in force on a key ([`ChangeRow`] without the key's name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct OverrideView {
    pub by: String,
    pub change: String,
    pub detail: Option<String>,
    pub since: String,
}

/// `POST /api/keys/revoke`: the key the secret was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct RevokedView {
    pub name: String,
    /// Always `revoked`.
    pub state: String,
}
