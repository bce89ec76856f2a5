//! The set of changes in force ([`KeyChanges`]'s own): put on the policy in force by each
//! change, on every config compiled by a reload ([`KeyHook`]), and at a start from what was
//! kept ([`put_kept_in_force`]). Readers borrow it ([`KeyChanges::with_records`]).

use std::borrow::Cow;
use std::collections::BTreeSet;

use super::KeyChanges;
use crate::config::{Config, ConfigError};
use crate::digest::Digest;
use crate::policy::overrides::{Change, Drop, Dropped, KeyRecord, KeyRecords, Part};
use crate::policy::Policy;
use crate::runtime::live::KeyHook;
use crate::runtime::metrics::Metrics;
use crate::sync::Locked;

/// The records in force; how many of them hold an upgrade (`tollgate_plan_overrides`); and
/// which of them show a change beyond the key they issue (a suspension, a revocation, a live
/// limit or quota, an upgrade: the rows of the usage page and of `GET /api/overrides`), all
/// kept as the records change: a scrape or a page reads them without a walk of the set under
/// its lock, which holds a record for each of a million issued keys.
pub(super) struct InForce {
    records: KeyRecords,
    upgrades: usize,
    showing: BTreeSet<Digest>,
}

impl InForce {
    pub(super) fn new(records: KeyRecords) -> Self {
        let mut me = Self {
            records,
            upgrades: 0,
            showing: BTreeSet::new(),
        };
        me.recounted();
        me
    }

    /// `o` in force under `d` (taken out when it holds nothing).
    fn put(&mut self, d: Digest, o: &KeyRecord) {
        let before = if o.is_empty() {
            self.records.remove(&d)
        } else {
            self.records.insert(d, o.clone())
        };
        let was = before.is_some_and(|r| r.has(Part::Plan));
        let is = !o.is_empty() && o.has(Part::Plan);
        self.upgrades = self.upgrades + usize::from(is) - usize::from(was);
        if shows_a_change(o) {
            self.showing.insert(d);
        } else {
            self.showing.remove(&d);
        }
    }

    /// The records changed in place, wholesale: counted again.
    fn recounted(&mut self) {
        self.upgrades = upgrades(&self.records);
        self.showing = self
            .records
            .whole()
            .filter(|(_, o)| shows_a_change(o))
            .map(|(d, _)| *d)
            .collect();
    }

    /// The records that show a change, in their digests' order.
    fn showing(&self) -> impl Iterator<Item = (&Digest, Cow<'_, KeyRecord>)> {
        self.showing
            .iter()
            .filter_map(|d| Some((d, self.records.get(d)?)))
    }
}

/// Whether a record shows a change beyond the key it issues.
fn shows_a_change(o: &KeyRecord) -> bool {
    Part::ALL.into_iter().any(|p| p != Part::Issued && o.has(p))
}

impl KeyChanges {
    /// Read the records in force.
    pub(crate) fn with_records<R>(&self, f: impl FnOnce(&KeyRecords) -> R) -> R {
        f(&self.in_force.locked().records)
    }

    /// Read the records in force that show a change beyond the key they issue (see
    /// [`InForce`]), in their digests' order: as many as there are changes, not keys.
    pub(crate) fn with_changed_records<R>(
        &self,
        f: impl for<'a> FnOnce(&mut dyn Iterator<Item = (&'a Digest, Cow<'a, KeyRecord>)>) -> R,
    ) -> R {
        f(&mut self.in_force.locked().showing())
    }

    /// Change the records in force for a while: `f` must leave them as it found them (the
    /// batch of changes tries each on the set, then puts it back: `batch.rs`).
    pub(super) fn with_records_for_a_while<R>(&self, f: impl FnOnce(&mut KeyRecords) -> R) -> R {
        f(&mut self.in_force.locked().records)
    }

    /// Set the gauges that count what the keys are (`tollgate_keys`,
    /// `tollgate_plan_overrides`), when the metrics are read, from counts kept as the keys
    /// change (the table's by state, the set's of upgrades): no walk of the keys.
    pub(crate) fn refresh_gauges(&self) {
        self.live.refresh_key_states();
        let n = self.in_force.locked().upgrades;
        self.live.metrics().set_plan_overrides(n);
    }

    /// Put records just kept in force: in the set every later snapshot is compiled with, and
    /// on the policy in force now, serialized with reloads (no reload compiled before the
    /// change replaces the policy after it).
    pub(super) fn put_records(&self, changes: &[(Digest, Part, KeyRecord)]) {
        self.live.serialized(|snap| {
            let mut in_force = self.in_force.locked();
            // A key deleted leaves its name before another key issued with it comes (two
            // live keys of one name are a contest: `names_lost`).
            let deletions_first = changes
                .iter()
                .filter(|(_, _, o)| o.issued.is_none())
                .chain(changes.iter().filter(|(_, _, o)| o.issued.is_some()));
            for (d, _, o) in deletions_first {
                // With `cluster`, the fleet's copy takes as text first what it made from
                // the record about to change.
                if let Some(fleet) = self.fleet() {
                    fleet.before_change(d, &in_force.records);
                }
                in_force.put(*d, o);
                snap.policy.apply_record(d, o);
            }
            // A name issued twice: the key that lost it is deleted where the set is kept
            // by the next whole read, which sees both (`names_lost`).
            let lost = snap.policy.keys.issued().take_lost();
            if !lost.is_empty() {
                tracing::warn!(target: "tollgate::keys", keys = lost.len(), "a name was issued twice while the cluster store had forgotten the first: the smaller id keeps it; the set is read whole next");
                if let Some(fleet) = self.fleet() {
                    fleet.forget_version();
                }
            }
        });
    }

    /// Put `set` (every record kept, as another replica may have changed any) in force in
    /// place of the set in force, moved, never copied; what the policy in force drops of it
    /// is taken out of `set` and returned (to be logged and forgotten where it is kept).
    ///
    /// Only what was changed before this config was compiled is its to drop (the later
    /// decision wins): a record with a part dropped that another replica changed after it
    /// (during a rolling reload, when this replica's YAML gives the key another plan, or has
    /// no plan the change names) stays in `set` as it came, not applied here, and is not
    /// returned, so that nothing forgets it; the reload that brings this replica's YAML up to
    /// date puts it in force. The records a change sent here puts in force
    /// ([`KeyChanges::put_records`]) are kept in the set the same way.
    pub(super) fn replace_records(&self, mut set: KeyRecords) -> Vec<Drop> {
        let (before, drops) = self.live.serialized(|snap| {
            let mut drops = snap.policy.apply_overrides(&set);
            drops.extend(names_lost(&snap.policy, &set));
            drops.retain(|d| {
                let later = d.why != Dropped::NameTaken
                    && d.parts.iter().any(|&p| {
                        d.before
                            .changed_ms(p)
                            .is_some_and(|at| at > snap.compiled_ms)
                    });
                if !later {
                    match &d.after {
                        Some(o) => set.insert(d.digest, o.clone()),
                        None => set.remove(&d.digest),
                    };
                }
                !later
            });
            // Counted before the lock is taken: readers wait for the swap only.
            let fresh = InForce::new(set);
            let before = std::mem::replace(&mut *self.in_force.locked(), fresh);
            (before, drops)
        });
        // The set replaced is let go outside the locks.
        drop(before);
        drops
    }
}

impl KeyHook for KeyChanges {
    fn check(&self, config: &Config) -> Result<(), ConfigError> {
        self.with_records(|set| crate::policy::overrides::check_issued(config, set))
    }

    /// Put the set in force on `new`: what no longer applies is dropped and forgotten where
    /// it is kept; a key `new` has that `old` lacked may have changes kept that this replica
    /// could not match before ([`KeyChanges::learned_keys`]).
    fn compiled(&self, new: &Policy, old: &Policy) {
        let dropped = {
            let mut in_force = self.in_force.locked();
            let mut drops = new.apply_overrides(&in_force.records);
            drops.extend(names_lost(new, &in_force.records));
            if let Some(fleet) = self.fleet() {
                for d in &drops {
                    fleet.dropped(&d.digest, &d.before, &in_force.records);
                }
            }
            settle_drops(new, &mut in_force.records, &drops, self.live.metrics());
            in_force.recounted();
            self.live.metrics().set_plan_overrides(in_force.upgrades);
            drops
        };
        if !dropped.is_empty() {
            self.forget(&dropped);
        }
        if learned_keys(new, old) {
            self.learned_keys();
        }
    }
}

/// At a start, the records kept from before put on `policy` as they come, in batches in the
/// order of their digests, about `records` of them: the set they make, once every batch is in
/// force (handed to [`KeyChanges::new`]).
pub(crate) fn put_kept_in_force(
    policy: &Policy,
    kept: impl IntoIterator<Item = Vec<(Digest, KeyRecord)>>,
    records: usize,
    metrics: &Metrics,
) -> KeyRecords {
    let mut kept = kept.into_iter();
    let first = kept.next().unwrap_or_default();
    // In the order of their digests, the records are in no order of their own: the first
    // batch's share of issued keys is the whole set's, near enough to make room for them at
    // once (and none for a set of other changes).
    let issued = first.iter().filter(|(_, o)| o.issued.is_some()).count();
    let issued = records.saturating_mul(issued) / first.len().max(1);
    let mut applying = policy.applying(issued);
    // Built in one go from records in order (the tree's nodes full), each batch made slim
    // as it is put in force: the whole records of a batch are let go before the next.
    let mut set: KeyRecords = std::iter::once(first)
        .chain(kept)
        .flat_map(|batch| {
            for (d, o) in &batch {
                applying.record(d, o);
            }
            batch
        })
        .collect();
    let mut drops = applying.finish();
    drops.extend(names_lost(policy, &set));
    settle_drops(policy, &mut set, &drops, metrics);
    set
}

/// The issued keys of `set` that lost their name to another key of `set` issued with it
/// when put on `policy` (`Issued::keeps_name`: the smaller id keeps it), each as a deletion
/// to keep: its record without its key, its id revoked for good (a secret that was a key's
/// never becomes another's), by `cluster`. Only a contest `set` itself shows: the name's
/// key here is live in `set` too, with the smaller id.
fn names_lost(policy: &Policy, set: &KeyRecords) -> Vec<Drop> {
    let keys = &policy.keys;
    let now_ms = crate::runtime::live::unix_ms();
    keys.issued()
        .take_lost()
        .into_iter()
        .filter_map(|id| {
            let before = set.record(&id).filter(|o| o.issued.is_some())?;
            let winner = keys.get(keys.find_by_name(&before.key)?).digest;
            let live = set.get(&winner).is_some_and(|o| o.issued.is_some());
            if !live || winner >= id {
                return None;
            }
            let mut after = before.clone();
            after.issued = None;
            after.revoked.get_or_insert_with(|| {
                Box::new(Change {
                    since_ms: now_ms,
                    by: "cluster".into(),
                    reason: Some(Dropped::NameTaken.as_str().into()),
                })
            });
            Some(Drop {
                digest: id,
                before,
                after: Some(after),
                parts: vec![Part::Issued],
                why: Dropped::NameTaken,
            })
        })
        .collect()
}

/// What no longer applies to `policy` taken out of `set` (one log line each), and the gauge
/// of the keys' states set.
fn settle_drops(policy: &Policy, set: &mut KeyRecords, drops: &[Drop], metrics: &Metrics) {
    for d in drops {
        match &d.after {
            Some(o) => set.insert(d.digest, o.clone()),
            None => set.remove(&d.digest),
        };
        log_drop(d);
    }
    metrics.set_key_states(policy);
}

/// One log line for what a config or a read of the set dropped: an issued key that lost its
/// name at `warn`, any other drop at `info`.
pub(super) fn log_drop(d: &Drop) {
    if d.why == Dropped::NameTaken {
        tracing::warn!(target: "tollgate::keys", key = %d.before.key, reason = d.why.as_str(), "issued key deleted");
        return;
    }
    let parts: Vec<&str> = d.parts.iter().map(|p| p.name()).collect();
    tracing::info!(
        target: "tollgate::overrides",
        key = %d.before.key,
        dropped = %parts.join(","),
        reason = d.why.as_str(),
        "override dropped"
    );
}

/// The records of `set` that hold an upgrade (`tollgate_plan_overrides`).
fn upgrades(set: &KeyRecords) -> usize {
    set.whole().filter(|(_, o)| o.has(Part::Plan)).count()
}

/// Whether `new` authenticates a digest `old` did not (a key or an alias the reload added).
fn learned_keys(new: &Policy, old: &Policy) -> bool {
    let keys = &new.keys;
    keys.iter()
        .map(|(_, e)| e.digest)
        .chain(keys.aliases().map(|(_, a)| a.digest))
        .any(|d| old.keys.resolve(&d).is_none())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::keys::Keeping;
    use crate::policy::authenticate::AuthHeader;
    use crate::policy::{Code, RequestHead};
    use crate::runtime::live::LivePolicy;
    use tollgate_core::testing::TestConfig;

    /// A whole read of the fleet's set (`replace_records`) drops only what was changed
    /// before this config was compiled: a suspension another replica made later, under a
    /// YAML that gives the key another plan than this replica's does yet (a rolling reload),
    /// is neither applied nor dropped (nothing forgets it), and the reload that brings this
    /// replica that YAML puts it in force.
    #[test]
    fn a_whole_read_drops_only_what_was_changed_before_its_config() {
        use crate::policy::overrides::{Change, KeyRecord};
        let dir = tempfile::tempdir().unwrap();
        // The replica that made the suspension records the key's YAML there.
        let newer = dir.path().join("newer.yaml");
        TestConfig::new().write(&newer);
        let there = LivePolicy::new(Config::load(&newer).unwrap(), Arc::default()).unwrap();
        let there = &there.load().policy;
        let yaml = there.fingerprint(there.keys.find_by_name("pro-1").unwrap());
        let path = dir.path().join("gw.yaml");
        TestConfig::new().key_plan("pro-1", "basic").write(&path);
        let live = Arc::new(LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap());
        let changes = KeyChanges::new(Keeping::memory(), Arc::clone(&live), KeyRecords::new());
        let compiled = live.load().compiled_ms;
        let suspended = |since_ms| {
            let mut o = KeyRecord::named("pro-1");
            o.yaml = Some(yaml.clone());
            o.suspended = Some(Box::new(Change {
                since_ms,
                by: "admin".into(),
                reason: None,
            }));
            o
        };
        let d = Digest::of(b"pro-key-1");
        let pro = |live: &LivePolicy| {
            let head = RequestHead {
                method: "GET",
                path: "/v2/client/getStatus",
                authorization: AuthHeader::One(b"Bearer pro-key-1"),
            };
            live.load()
                .policy
                .decide(&head, 0)
                .verdict
                .map(|_| ())
                .map_err(|r| r.code)
        };

        // Changed before this config: the config's to drop.
        let drops = changes.replace_records(KeyRecords::from_iter([(d, suspended(compiled - 1))]));
        assert_eq!(drops.len(), 1);
        assert_eq!(changes.with_records(|set| set.len()), 0);

        // Changed after it, elsewhere: kept, not applied, not dropped.
        let later = suspended(compiled + 60_000);
        let drops = changes.replace_records(KeyRecords::from_iter([(d, later.clone())]));
        assert!(drops.is_empty(), "{drops:?}");
        assert_eq!(changes.with_records(|set| set.record(&d)), Some(later));
        assert_eq!(pro(&live), Ok(()), "not in force under this YAML");

        // The reload that brings this replica the YAML puts the suspension in force.
        TestConfig::new().write(&path);
        live.reload().unwrap();
        assert_eq!(pro(&live), Err(Code::Unauthorized));
    }

    /// A change made while a reload runs is on the policy in force after it: the change
    /// takes the reload's lock, so the config the reload compiled (and handed to the owner)
    /// cannot replace the policy after the change was put on it. The hook below makes the
    /// change at the worst moment, between the owner's `compiled` and the swap, and lets it
    /// run to its end there if it can (200 ms): without the lock, it could and was lost.
    #[test]
    fn a_change_made_during_a_reload_is_on_the_policy_after_it() {
        use std::sync::{mpsc, OnceLock};

        use crate::policy::overrides::{Change, KeyRecord};

        struct Racer {
            changes: OnceLock<Arc<KeyChanges>>,
            change: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
        }
        impl KeyHook for Racer {
            fn check(&self, config: &Config) -> Result<(), ConfigError> {
                self.changes.get().unwrap().check(config)
            }
            fn compiled(&self, new: &Policy, old: &Policy) {
                let changes = Arc::clone(self.changes.get().unwrap());
                changes.compiled(new, old);
                let (done, finished) = mpsc::channel();
                let t = std::thread::spawn(move || {
                    let mut o = KeyRecord::named("basic-1");
                    o.revoked = Some(Box::new(Change {
                        since_ms: 1,
                        by: "admin".into(),
                        reason: None,
                    }));
                    changes.put_records(&[(Digest::of(b"basic-key-1"), Part::Revoked, o)]);
                    let _ = done.send(());
                });
                let _ = finished.recv_timeout(std::time::Duration::from_millis(200));
                *self.change.lock().unwrap() = Some(t);
            }
        }

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.yaml");
        TestConfig::new().write(&path);
        let live = Arc::new(LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap());
        let racer = Arc::new(Racer {
            changes: OnceLock::new(),
            change: std::sync::Mutex::new(None),
        });
        // The racer is the reload's hook (the first one set stays), and calls the owner.
        live.hook(Arc::downgrade(&racer) as std::sync::Weak<dyn KeyHook>);
        let changes = KeyChanges::new(Keeping::memory(), Arc::clone(&live), KeyRecords::new());
        let _ = racer.changes.set(Arc::clone(&changes));

        live.reload().unwrap();
        let change = racer.change.lock().unwrap().take().unwrap();
        change.join().unwrap();
        let head = RequestHead {
            method: "GET",
            path: "/v2/client/getStatus",
            authorization: AuthHeader::One(b"Bearer basic-key-1"),
        };
        let verdict = live.load().policy.decide(&head, 0).verdict;
        assert_eq!(
            verdict.map(|_| ()).map_err(|r| r.code),
            Err(Code::Unauthorized)
        );
    }

    proptest::proptest! {
        /// The count of upgrades kept beside the records is the count of the records that
        /// hold one, and the records kept as showing a change are those a walk finds,
        /// whatever changes come: upgrades given and taken back, other parts, a record
        /// emptied.
        #[test]
        fn the_upgrades_counted_as_they_change_are_the_records_that_hold_one(
            steps in proptest::collection::vec((0u8..6, 0u8..3), 0..60),
        ) {
            use crate::policy::overrides::{Change, KeyRecord};
            let mut in_force = InForce::new(KeyRecords::new());
            for (key, what) in steps {
                let d = Digest::of(&[key]);
                let mut o = KeyRecord::named("k");
                match what {
                    0 => {}
                    1 => {
                        o.plan_id = Some(3);
                        o.replaced = Some(1);
                        o.at_ms = 1;
                    }
                    _ => {
                        o.suspended = Some(Box::new(Change {
                            since_ms: 1,
                            by: "admin".into(),
                            reason: None,
                        }));
                    }
                }
                in_force.put(d, &o);
                proptest::prop_assert_eq!(in_force.upgrades, upgrades(&in_force.records));
                let walked: Vec<Digest> = in_force
                    .records
                    .iter()
                    .filter(|(_, o)| shows_a_change(o))
                    .map(|(d, _)| *d)
                    .collect();
                let kept: Vec<Digest> = in_force.showing().map(|(d, _)| *d).collect();
                proptest::prop_assert_eq!(kept, walked);
            }
        }
    }
}
