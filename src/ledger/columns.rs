//! The ledger's columns as the keeper names them: the refusal codes it shows, a meter's
//! counts by column name, and the plan and partner a row names.

use crate::metering::{self, Column, COLUMNS};
use crate::runtime::live::Snapshot;

/// The columns the ledger shows, in its order: the upstream ones, then the refusal codes.
pub(crate) fn shown_columns() -> impl Iterator<Item = Column> {
    Column::ALL.into_iter().filter(|c| c.is_shown())
}

/// The counts that are not zero, by column name.
pub(super) fn named(counts: &[u32; COLUMNS]) -> Vec<(&'static str, u64)> {
    Column::ALL
        .iter()
        .zip(counts)
        .filter(|(_, &n)| n != 0)
        .map(|(c, &n)| (c.name(), u64::from(n)))
        .collect()
}

/// The plan and partner names of a meter's key, as it was counted ([`metering::who`]).
pub(super) fn who(snap: &Snapshot, w: u64, name: &str) -> (String, Option<String>) {
    let p = &snap.policy;
    let (generation, plan, partner, partner_key) = metering::who_parts(w);
    if u64::from(generation) == snap.generation & 0xFFFF_FFFF {
        let plan = match (partner_key, plan) {
            (true, _) => "partner".to_string(),
            (false, Some(i)) => p
                .config
                .plans
                .get(i)
                .map_or("none", |x| &x.name)
                .to_string(),
            (false, None) => "none".to_string(),
        };
        let partner = partner.and_then(|i| p.config.partners.get(i).map(|x| x.name.clone()));
        return (plan, partner);
    }
    // Counted under an earlier config (a reload since): as the config in force has the key.
    match p.keys.find_by_name(name) {
        Some(k) => {
            let e = p.keys.get(k);
            match e.credential() {
                crate::policy::keys::Credential::Customer { plan, partner, .. } => (
                    p.config.plans[plan].name.clone(),
                    partner.map(|i| p.config.partners[i].name.clone()),
                ),
                crate::policy::keys::Credential::Partner { partner } => (
                    "partner".to_string(),
                    Some(p.config.partners[partner].name.clone()),
                ),
            }
        }
        None => ("none".to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_count_has_a_column_name_the_ledger_shows_or_one_it_never_counts() {
        let mut counts = [0u32; COLUMNS];
        counts
            .iter_mut()
            .enumerate()
            .for_each(|(i, c)| *c = i as u32 + 1);
        let names = named(&counts);
        assert_eq!(names.len(), COLUMNS);
        let shown = crate::admin::ledger::header();
        for (name, _) in &names {
            let is_shown = shown.contains(name);
            let never_a_keys = matches!(
                *name,
                "unauthorized" | "too_many_streams" | "upstream_unavailable" | "upstream_timeout"
            );
            assert!(is_shown != never_a_keys, "{name}");
        }
    }
}
