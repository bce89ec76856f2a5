//! What the keeper remembers between passes: every meter allocated and its place, the meters
//! to visit again, and the ledger counts the store did not take.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::book::Delta;
use crate::metering::Held;

/// What the keeper remembers between passes.
#[derive(Default)]
pub(super) struct Kept {
    /// Every meter allocated, with the quota word last kept.
    pub(super) meters: Vec<(Held, (u32, u64))>,
    /// Where each meter is in `meters`, by the address of its rate state.
    pub(super) at: PlaceMap,
    /// Meters (places in `meters`) visited by the next pass whether changed or not: those
    /// over their quota (a give-back elsewhere must be seen, and the gauge counts them), and
    /// those whose quota count was not kept (it is sent again).
    pub(super) watch: BTreeSet<usize>,
    /// Ledger counts taken from the meters that the store did not take (it failed): sent
    /// again with the next pass, one entry per day and key however long the store fails.
    pub(super) unsent: Vec<Delta>,
    /// The last day whose old rows were dropped.
    pub(super) pruned: u32,
    /// Passes since meters no policy holds were last looked for (a look reads every meter:
    /// once a minute, not every pass).
    pub(super) since_drop: u32,
    /// With `cluster` and `state.path`: meters whose count the fleet answered since the last
    /// pass, to keep at `state.path` (what a restart decides on while Redis is down).
    pub(super) to_disk: BTreeSet<usize>,
}

/// A map keyed by a meter's address or place (looked up for every meter a tick visits: a
/// fast hash).
pub(super) type PlaceMap<V = usize> = HashMap<usize, V, foldhash::fast::RandomState>;

/// Passes (seconds) between two looks for meters no policy holds any more.
pub(super) const DROP_EVERY: u32 = 60;

impl Kept {
    /// Hold the meter of `state` (with the quota word `word` kept, if it is new: nothing for
    /// a meter first seen changed, the book's for one restored): its place in `meters`.
    pub(super) fn hold(&mut self, state: Held, word: (u32, u64)) -> usize {
        let key = Arc::as_ptr(&state) as *const () as usize;
        *self.at.entry(key).or_insert_with(|| {
            self.meters.push((state, word));
            self.meters.len() - 1
        })
    }

    /// Drop the meters no policy holds any more (keys gone from the config), their counts
    /// kept: the places of the others move, `at` and `watch` with them.
    pub(super) fn drop_unheld(&mut self) {
        // Read once: a reload may let go of a rate state meanwhile.
        let held: Vec<bool> = self
            .meters
            .iter()
            .map(|(s, _)| Arc::strong_count(s) > 1)
            .collect();
        if held.iter().all(|&h| h) {
            return;
        }
        let mut moved = Vec::with_capacity(held.len());
        let mut n = 0;
        for &h in &held {
            moved.push(h.then(|| {
                n += 1;
                n - 1
            }));
        }
        let mut i = 0;
        self.meters.retain(|_| {
            i += 1;
            held[i - 1]
        });
        self.watch = self.watch.iter().filter_map(|&at| moved[at]).collect();
        self.at = self
            .meters
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (Arc::as_ptr(s) as *const () as usize, i))
            .collect();
    }
}

/// Keep `deltas` for the next pass, merged by day and key (so a long failure holds one entry
/// per day and active key, not one per pass).
pub(super) fn stash(unsent: &mut Vec<Delta>, deltas: Vec<Delta>) {
    let mut at: HashMap<(u32, String), usize> = unsent
        .iter()
        .enumerate()
        .map(|(i, d)| ((d.day, d.key.clone()), i))
        .collect();
    for d in deltas {
        match at.get(&(d.day, d.key.clone())) {
            Some(&i) => {
                let into = &mut unsent[i];
                into.plan = d.plan;
                into.partner = d.partner;
                for (col, n) in d.counts {
                    match into.counts.iter_mut().find(|(c, _)| *c == col) {
                        Some((_, m)) => *m += n,
                        None => into.counts.push((col, n)),
                    }
                }
            }
            None => {
                at.insert((d.day, d.key.clone()), unsent.len());
                unsent.push(d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meters_no_policy_holds_are_dropped_and_the_places_move_with_them() {
        let mut states: Vec<Arc<crate::limit::RateState>> =
            (0..3).map(|_| Arc::default()).collect();
        let mut kept = Kept::default();
        for s in &states {
            kept.hold(Arc::clone(s) as Held, (0, 0));
        }
        kept.watch.extend([0, 2]);
        kept.drop_unheld();
        assert_eq!(kept.meters.len(), 3, "every one still held");
        let gone = Arc::as_ptr(&states[0]) as usize;
        let last = Arc::as_ptr(&states[2]) as usize;
        drop(states.remove(0));
        kept.drop_unheld();
        assert_eq!(kept.meters.len(), 2);
        assert!(!kept.at.contains_key(&gone));
        assert_eq!(kept.at[&last], 1);
        assert_eq!(kept.watch, BTreeSet::from([1]));
    }

    fn delta(day: u32, key: &str, counts: &[(&'static str, u64)]) -> Delta {
        Delta {
            day,
            key: key.into(),
            plan: "basic".into(),
            partner: None,
            counts: counts.to_vec(),
        }
    }

    #[test]
    fn counts_not_kept_wait_merged_by_day_and_key() {
        let mut unsent = Vec::new();
        for _ in 0..100 {
            stash(
                &mut unsent,
                vec![
                    delta(7, "a", &[("upstream_2xx", 2)]),
                    delta(7, "b", &[("rate_limited", 1)]),
                ],
            );
        }
        stash(&mut unsent, vec![delta(8, "a", &[("upstream_5xx", 1)])]);
        stash(&mut unsent, vec![delta(7, "a", &[("quota_exhausted", 3)])]);
        assert_eq!(unsent.len(), 3, "one entry per day and key");
        assert_eq!(
            unsent[0].counts,
            vec![("upstream_2xx", 200), ("quota_exhausted", 3)]
        );
        assert_eq!(unsent[1].counts, vec![("rate_limited", 100)]);
        assert_eq!((unsent[2].day, unsent[2].key.as_str()), (8, "a"));
    }
}
