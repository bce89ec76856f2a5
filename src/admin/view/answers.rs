//! The answers of the process and the listener's lists: `POST /reload` ([`ReloadView`]),
//! `GET /api/blocks` ([`BlocksView`]), `GET /api/overrides` ([`OverridesView`]) and `GET
//! /api/ledger` as JSON ([`LedgerView`]); and the members some problems add to the core's
//! problem object ([`ConfigRefusedAt`], [`FieldErrors`]).

use serde::{Deserialize, Serialize};

use crate::overrides::Shown;

/// One blocked address, as `GET /api/blocks`, the usage page and `tollgate top` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// `POST /reload`, when the new config is in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReloadView {
    /// Always `reloaded`.
    pub status: String,
    pub file: String,
    /// Keys, partner keys included.
    pub keys: usize,
    pub plans: Vec<String>,
    /// Routes of the catalogue (the catch-all not counted).
    pub routes: usize,
    /// The process settings that changed and take a restart.
    pub restart_required: Vec<String>,
}

/// `GET /api/blocks`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BlocksView {
    pub blocks: Vec<BlockRow>,
}

/// `GET /api/overrides`: the partner upgrades in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OverridesView {
    pub overrides: Vec<Shown>,
}

/// `GET /api/ledger` as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct LedgerView {
    /// The first day, `YYYY-MM-DD`.
    pub from: String,
    /// The last day, inclusive.
    pub to: String,
    pub rows: Vec<LedgerRow>,
}

/// One key's day in the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct LedgerRow {
    pub day: String,
    pub key: String,
    pub plan: String,
    pub partner: Option<String>,
    /// `forwarded`, the upstream columns, one column per refusal code
    /// ([`crate::admin::ledger::header`] after `partner`).
    #[serde(flatten)]
    pub counts: Counts,
}

/// Named counts, written as members in their order.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct Counts(pub Vec<(&'static str, u64)>);

impl Serialize for Counts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

/// The members a refused reload adds to its `config_refused` problem: where the error is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ConfigRefusedAt {
    pub file: String,
    /// 1-based, when the error sits at a line.
    pub line: Option<usize>,
    /// The field path (`keys[2].sha256`); empty for the file as a whole.
    pub field: String,
}

/// The member an `invalid_body` problem adds: the fields that broke, as the request path's
/// refusals list them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct FieldErrors {
    pub errors: Vec<FieldErrorView>,
}

/// One field that broke: a JSON Pointer (RFC 6901) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct FieldErrorView {
    pub pointer: String,
    pub detail: String,
}
