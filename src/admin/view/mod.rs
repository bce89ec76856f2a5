//! Every JSON answer of the admin listener as one typed schema, serialized by
//! [`super::reply::json`]; the fields keep the names (and the nulls) the contract gives them.
//!
//! | file | answers |
//! |---|---|
//! | `view/mod.rs` | `GET /api/usage`: the operator's view, [`UsageView`] |
//! | `view/keys.rs` | `/api/keys/…`: [`KeyView`] (a key's state, also the answer to each change), [`KeyPage`] (`GET /api/keys`), [`RevokedView`]; [`ChangeRow`] |
//! | `view/answers.rs` | [`ReloadView`], [`BlocksView`] (and [`BlockRow`]), [`OverridesView`], [`LedgerView`]; the members some problems add ([`ConfigRefusedAt`], [`FieldErrors`]) |
//!
//! Member order: the answers that were `serde_json::Value` maps before they had a view
//! (every one but `/api/usage`) write their members in name order, as they always did (the
//! README shows `POST /reload`'s); their views declare their fields in that order, and their
//! lists of rows that `/api/usage` shares are written through [`answers`]' `in_name_order`.
//! `/api/usage` writes its members in the order its structs declare.
//!
//! The operator's view is what `GET /api/usage` serializes, what `tollgate top` deserializes,
//! and the names the page's script reads. A field renamed here is renamed for all three (a
//! round-trip test keeps the first two together; the page test reads the served JSON).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

mod answers;
mod keys;

use crate::keys::UpgradeRow;
pub(crate) use answers::{
    BlockRow, BlocksView, ConfigRefusedAt, FieldErrorView, FieldErrors, LedgerRow, LedgerView,
    OverridesView, ReloadView,
};
pub(crate) use keys::{
    ChangeRow, KeyPage, KeyQuotaView, KeyView, OverrideView, PreviousView, RevokedView,
};

/// `GET /api/usage`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct UsageView {
    /// When the view was made, in ms since the Unix epoch.
    pub generated_at_ms: u64,
    pub config: ConfigView,
    /// The `?key=` search, lower-cased, when one narrowed the keys.
    pub search: Option<String>,
    /// The busiest keys of the last minute (or those the search found).
    pub keys: Vec<KeyRow>,
    /// Requests of the last minute without a known key.
    pub anonymous_requests: u64,
    /// The partner upgrades in force.
    pub overrides: Vec<UpgradeRow>,
    /// Shared budgets' state, with the `cluster` block.
    pub cluster: Option<ClusterView>,
    /// The latest refusals, newest first.
    pub refusals: Vec<RefusalRow>,
    /// The addresses auth-failure blocking holds now (`GET /api/blocks`).
    #[serde(default)]
    pub blocks: Vec<BlockRow>,
    /// Keys changed live (suspended, revoked, a limit or quota of their own, upgraded) and
    /// keys past their `expires_at`, newest first.
    #[serde(default)]
    pub key_changes: Vec<ChangeRow>,
    /// The last 10 minutes, one point per 10 s, oldest first: always 60 points.
    #[serde(default)]
    pub timeline: Vec<TimelinePoint>,
}

/// Ten seconds of the timeline: when they start, and the requests of each outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct TimelinePoint {
    /// The start of the 10 s, in ms since the Unix epoch.
    pub at_ms: u64,
    /// Requests by outcome (every outcome, 0 included).
    #[serde(flatten)]
    pub counts: std::collections::BTreeMap<String, u64>,
}

/// The config in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct ConfigView {
    pub file: String,
    pub started_at_ms: u64,
    pub last_reload: Option<LastReloadView>,
    pub window_seconds: u32,
    /// Customer keys.
    pub keys: usize,
    pub partners: usize,
    pub partner_limit: u32,
    pub plans: Vec<PlanView>,
}

/// The last reload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct LastReloadView {
    pub at_ms: u64,
    /// `success` or `error`.
    pub result: String,
    pub error: Option<String>,
}

/// One plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct PlanView {
    pub name: String,
    pub plan_id: u32,
    pub limit: u32,
    pub allow: AllowView,
    pub shadow: bool,
    /// Customer keys on the plan now, overrides included.
    pub keys: usize,
    /// Its quota (`{requests, per}`), if it has one.
    #[serde(default)]
    #[schema(value_type = Option<QuotaSpecSchema>)]
    pub quota: Option<crate::config::QuotaSpec>,
}

/// A plan's allow-list: `"all"`, or the route ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum AllowView {
    Keyword(String),
    Routes(Vec<String>),
}

/// One key's last minute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct KeyRow {
    pub key: String,
    /// Its plan (or `partner`) now.
    pub plan: String,
    pub partner: Option<String>,
    /// Whether a partner's upgrade put it on that plan.
    #[serde(rename = "override")]
    pub overridden: bool,
    pub requests: u64,
    pub admitted: u64,
    pub refusals: KeyRefusals,
    /// Forwarded though its plan would have refused them (shadow mode).
    pub shadowed: u64,
    pub budget_left: u32,
    pub limit: u32,
    /// `active`, `expired`, `suspended` or `revoked`.
    #[serde(default)]
    pub state: String,
    /// Its refusals of the last minute by code (`plan_restricted`, `wrong_credential`, ...),
    /// those with a count.
    #[serde(default)]
    pub codes: std::collections::BTreeMap<String, u64>,
    /// Its quota in force, with what the period has used and left; `None` without one.
    #[serde(default)]
    pub quota: Option<QuotaView>,
}

/// A key's quota as the operator's view shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct QuotaView {
    pub requests: u64,
    /// `day` or `month`.
    pub per: String,
    pub used: u64,
    pub left: u64,
}

/// A key's refusals of the last minute, by outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct KeyRefusals {
    pub rate_limited: u64,
    /// `429 quota_exhausted`: an outcome of its own, as in `tollgate_requests_total`.
    #[serde(default)]
    pub quota_exhausted: u64,
    pub forbidden: u64,
    pub invalid: u64,
}

/// Shared budgets' state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct ClusterView {
    pub store_up: bool,
    pub replicas: u32,
    /// The store's URL without its password.
    pub redis: Option<String>,
    pub key_prefix: Option<String>,
    pub sync_interval_ms: Option<u64>,
}

/// One refusal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub(crate) struct RefusalRow {
    pub at_ms: u64,
    /// The key's name, when the caller was known.
    pub key: Option<String>,
    pub route: Option<String>,
    pub code: Option<String>,
    pub status: Option<u16>,
}

/// A quota (`{requests, per}`), as a plan's and a key's are written (the core's `QuotaSpec`,
/// whose crate derives no schemas): its schema only.
#[derive(ToSchema)]
#[schema(as = QuotaSpec)]
#[allow(dead_code)]
pub(crate) struct QuotaSpecSchema {
    requests: u64,
    per: PeriodSchema,
}

/// A calendar period in UTC (the core's `Period`).
#[derive(ToSchema)]
#[schema(as = Period)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub(crate) enum PeriodSchema {
    Day,
    Month,
}
