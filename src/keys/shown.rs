//! What `check`, the admin API and the page show of the upgrades in force ([`UpgradeRow`]).

use serde::{Deserialize, Serialize};

use super::KeyChanges;
use crate::config::Plan;
use crate::policy::overrides::KeyRecord;
use crate::policy::Policy;

/// What `check`, the admin API and the page show of one upgrade.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct UpgradeRow {
    pub key: String,
    pub plan: String,
    pub plan_id: u32,
    pub replaced: String,
    pub replaced_plan_id: u32,
    pub partner: Option<String>,
    pub at_ms: u64,
}

impl KeyChanges {
    /// The upgrades in force, for the admin API and the page.
    pub(crate) fn shown(&self, policy: &Policy) -> Vec<UpgradeRow> {
        self.with_changed_records(|set| show(set.map(|(_, o)| o), &policy.config.plans))
    }
}

/// The upgrades among `records`, as shown, sorted by key name; a plan no plan has any more is
/// shown by its id.
pub(super) fn show<O: std::ops::Deref<Target = KeyRecord>>(
    records: impl Iterator<Item = O>,
    plans: &[Plan],
) -> Vec<UpgradeRow> {
    let name = |id: u32| {
        plans
            .iter()
            .find(|p| p.plan_id == id)
            .map_or_else(|| format!("plan_id {id}"), |p| p.name.clone())
    };
    let mut v: Vec<UpgradeRow> = records
        .filter_map(|o| {
            let (plan_id, replaced) = (o.plan_id?, o.replaced.unwrap_or(0));
            Some(UpgradeRow {
                key: o.key.clone(),
                plan: name(plan_id),
                plan_id,
                replaced: name(replaced),
                replaced_plan_id: replaced,
                partner: o.partner.clone(),
                at_ms: o.at_ms,
            })
        })
        .collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}
