//! The answers of the process and the listener's lists: `POST /reload` ([`ReloadView`]),
//! `GET /api/blocks` ([`BlocksView`]), `GET /api/overrides` ([`OverridesView`]) and `GET
//! /api/ledger` as JSON ([`LedgerView`]); and the members some problems add to the core's
//! problem object ([`ConfigRefusedAt`], [`FieldErrors`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer};
use utoipa::ToSchema;

use crate::keys::UpgradeRow;

/// One blocked address, as `GET /api/blocks`, the usage page and `tollgate top` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct BlockRow {
    /// The address, or the IPv6 /64 it stands for (`2001:db8:1:2::/64`).
    pub address: String,
    /// When the block began, RFC 3339 UTC.
    pub since: String,
    /// When it ends unless released, RFC 3339 UTC.
    pub until: String,
    /// Failed authentications counted from the address (those that started the block).
    pub failures: u32,
    /// `gateway` (wrong API keys) or `admin` (wrong admin tokens).
    pub listener: String,
}

/// `POST /reload`, when the new config is in force. Fields in name order, as on the wire
/// (the README shows this answer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct ReloadView {
    pub file: String,
    /// Keys, partner keys included.
    pub keys: usize,
    pub plans: Vec<String>,
    /// The process settings that changed and take a restart.
    pub restart_required: Vec<String>,
    /// Routes of the catalogue (the catch-all not counted).
    pub routes: usize,
    /// Always `reloaded`.
    pub status: String,
}

/// `GET /api/blocks`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct BlocksView {
    #[serde(serialize_with = "in_name_order")]
    pub blocks: Vec<BlockRow>,
}

/// `GET /api/overrides`: the partner upgrades in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct OverridesView {
    #[serde(serialize_with = "in_name_order")]
    pub overrides: Vec<UpgradeRow>,
}

/// `GET /api/ledger` as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct LedgerView {
    /// The first day, `YYYY-MM-DD`.
    pub from: String,
    #[serde(serialize_with = "in_name_order")]
    pub rows: Vec<LedgerRow>,
    /// The last day, inclusive.
    pub to: String,
}

/// `rows`, each with its members in name order: how these lists have always been written
/// (through a `serde_json::Value`, whose objects are sorted maps), where `/api/usage` writes
/// the same rows in the order their structs declare.
fn in_name_order<T: Serialize, S: Serializer>(rows: &[T], s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(rows)
        .map_err(serde::ser::Error::custom)?
        .serialize(s)
}

/// One key's day in the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct LedgerRow {
    pub day: String,
    pub key: String,
    pub partner: Option<String>,
    pub plan: String,
    /// `forwarded`, the upstream columns, one column per refusal code
    /// ([`crate::admin::ledger::header`] after `partner`), by name.
    #[serde(flatten)]
    pub counts: BTreeMap<&'static str, u64>,
}

/// The members a refused reload adds to its `config_refused` problem: where the error is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct ConfigRefusedAt {
    pub file: String,
    /// 1-based, when the error sits at a line.
    pub line: Option<usize>,
    /// The field path (`keys[2].sha256`); empty for the file as a whole.
    pub field: String,
}

/// The member an `invalid_body` problem adds: the fields that broke, as the request path's
/// refusals list them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct FieldErrors {
    pub errors: Vec<FieldErrorView>,
}

/// One field that broke: a JSON Pointer (RFC 6901) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct FieldErrorView {
    pub pointer: String,
    pub detail: String,
}
