//! The immutable digest → key table ([`KeyTable`]): built per config, indexed by a hash of
//! the whole digest, and handed each remaining key's rate state on a reload (`Carry`).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;

use super::credential::Credential;
use super::entry::{Alias, Found, KeyEntry, KeyIdx, Owner};
use super::flags::{Counts, EXPIRED};
use super::issued::{Issued, NewIssued, Slot};
use crate::config::keyname::KeyName;
use crate::config::{Config, KeyExtra};
use crate::digest::Digest;
use crate::limit::RateState;

/// Digest → key table, built per config: customer keys in config order, then partner keys
/// (immutable), then the keys issued through the admin API ([`Issued`], which grows and
/// shrinks one key at a time; its key at slot `s` is at index `entries + s`).
#[derive(Debug, Default)]
pub struct KeyTable {
    entries: Box<[KeyEntry]>,
    /// The `previous` digests, looked up only when a digest is no key's in force (so keys
    /// without them cost nothing more).
    aliases: Box<[Alias]>,
    alias_index: HashTable<u32>,
    /// What the YAML gives beyond digest, plan and partner, by entry.
    extras: HashMap<KeyIdx, Box<KeyExtra>>,
    /// Instants at which an entry expires or an alias stops, sorted.
    deadlines: Box<[(u64, Found)]>,
    /// Entry positions by a hash of the whole digest ([`Digest::folded`]). (Not of its first
    /// bytes alone: digests written by hand or by a test generator, such as `000…001`,
    /// `000…002`, share those.)
    index: HashTable<KeyIdx>,
    /// Seeded per table.
    hasher: foldhash::fast::RandomState,
    /// Whether any key has (or had, since the table was built) a quota of its own: when none
    /// has, the quota step reads the plan's alone.
    own_quotas: std::sync::atomic::AtomicBool,
    /// Keys issued through the admin API.
    issued: Issued,
    /// How many of `entries` are in each state.
    states: Counts,
    /// How many of `entries` are on each plan.
    plans: Counts,
    /// The YAML's entries by a hash of their names (the admin API's lookups).
    names: HashTable<KeyIdx>,
}

impl KeyTable {
    /// Build the table for `config`. Rate state is taken over from `previous` for every digest
    /// that is in both, so a reload does not reset anyone's budget.
    pub fn build(config: &Config, previous: Option<&KeyTable>) -> Self {
        let mut carry = Carry { previous, shift: 0 };
        let mut entries = Vec::with_capacity(config.keys.len() + config.partners.len());
        let mut extras = HashMap::new();
        let mut aliases = Vec::new();
        let mut deadlines = Vec::new();
        for (i, k) in config.keys.iter().enumerate() {
            let extra = k.extra.as_deref();
            entries.push(KeyEntry {
                name: k.name.clone(),
                owner: Owner::of(Credential::Customer {
                    plan: k.plan,
                    partner: k.partner,
                    limit: extra.and_then(|e| e.limit).map_or(0, |n| n.get()),
                }),
                digest: k.digest,
                rate: carry.rate(i, &k.digest, extra),
                live: AtomicU64::new(0),
                quota: AtomicU64::new(crate::metering::pack_quota(extra.and_then(|e| e.quota))),
                issued: AtomicU32::new(0),
            });
            if let Some(e) = extra {
                let at = i as KeyIdx;
                if let Some(ms) = e.expires_ms {
                    deadlines.push((ms, Found::Key(at)));
                }
                for &(digest, until_ms) in &e.previous {
                    deadlines.push((until_ms, Found::Alias(aliases.len() as u32)));
                    aliases.push(Alias {
                        digest,
                        key: at,
                        until_ms,
                        flags: AtomicU8::new(0),
                    });
                }
                extras.insert(at, Box::new(e.clone()));
            }
        }
        for (i, p) in config.partners.iter().enumerate() {
            let at = entries.len();
            entries.push(KeyEntry {
                name: KeyName::new(&p.name),
                owner: Owner::of(Credential::Partner { partner: i }),
                digest: p.digest,
                rate: carry.rate(at, &p.digest, None),
                live: AtomicU64::new(0),
                quota: AtomicU64::new(0),
                issued: AtomicU32::new(0),
            });
        }
        deadlines.sort_unstable_by_key(|d| d.0);
        let entries = entries.into_boxed_slice();
        let hasher = foldhash::fast::RandomState::default();
        let alias_index = index_by_digest(aliases.len(), |i| &aliases[i].digest, &hasher);
        let index = index_by_digest(entries.len(), |i| &entries[i].digest, &hasher);
        let mut names = HashTable::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            let h = hasher.hash_one(e.name.as_str());
            names
                .entry(
                    h,
                    |&j: &u32| entries[j as usize].name == e.name,
                    |&j| hasher.hash_one(entries[j as usize].name.as_str()),
                )
                .or_insert(i as u32);
        }
        let yaml_keys = entries.len();
        let plans = Counts::new(config.plans.len());
        for e in entries.iter() {
            plans.add(e.configured_plan(), 1);
        }
        Self {
            entries,
            aliases: aliases.into_boxed_slice(),
            alias_index,
            extras,
            deadlines: deadlines.into_boxed_slice(),
            index,
            hasher,
            own_quotas: std::sync::atomic::AtomicBool::new(
                config
                    .keys
                    .iter()
                    .any(|k| k.extra.as_ref().is_some_and(|x| x.quota.is_some())),
            ),
            issued: Issued::after(previous.map(|p| &p.issued), config.plans.len()),
            states: Counts::of_states(yaml_keys),
            plans,
            names,
        }
    }

    /// The keys issued through the admin API.
    pub fn issued(&self) -> &Issued {
        &self.issued
    }

    /// The issued key at `k`, if `k` is one's.
    #[inline]
    pub fn issued_slot(&self, k: KeyIdx) -> Option<&Slot> {
        (k as usize)
            .checked_sub(self.entries.len())
            .and_then(|s| self.issued.slot(s as u32))
    }

    /// Put an issued key in the table (or bring it up to date: [`Issued::put`]); its index,
    /// `None` when another key issued with its name keeps the name.
    pub fn put_issued(&self, key: NewIssued<'_>) -> Option<KeyIdx> {
        if key.extra.as_ref().is_some_and(|x| x.quota.is_some()) {
            self.own_quotas.store(true, Ordering::Relaxed);
        }
        Some(self.entries.len() as KeyIdx + self.issued.put(key)?)
    }

    /// Delete the issued key at `k` (nothing for a YAML key).
    pub fn remove_issued(&self, k: KeyIdx) {
        if let Some(s) = (k as usize).checked_sub(self.entries.len()) {
            self.issued.remove(s as u32);
        }
    }

    /// What `d` names: a key's digest in force, else a `previous` digest (constant-time
    /// comparisons throughout).
    pub fn resolve(&self, d: &Digest) -> Option<Found> {
        if let Some(k) = self.lookup(d) {
            return Some(Found::Key(k));
        }
        if self.aliases.is_empty() {
            return None;
        }
        find_by_digest(&self.alias_index, &self.hasher, d, |i| {
            &self.aliases[i].digest
        })
        .map(Found::Alias)
    }

    /// The alias at `i` (an index from this table).
    pub fn alias(&self, i: u32) -> &Alias {
        &self.aliases[i as usize]
    }

    /// Every alias, with its index.
    pub fn aliases(&self) -> impl ExactSizeIterator<Item = (u32, &Alias)> + '_ {
        self.aliases.iter().enumerate().map(|(i, a)| (i as u32, a))
    }

    /// The aliases of the key `k`.
    pub fn aliases_of(&self, k: KeyIdx) -> impl Iterator<Item = &Alias> + '_ {
        self.aliases.iter().filter(move |a| a.key == k)
    }

    /// What the YAML gives the entry `k` beyond digest, plan and partner.
    pub fn extra(&self, k: KeyIdx) -> Option<&KeyExtra> {
        match self.issued_slot(k) {
            Some(_) => self.issued.extra(k - self.entries.len() as KeyIdx),
            None => self.extras.get(&k).map(|b| &**b),
        }
    }

    /// Mark what has expired at `wall_ms` (ms since the Unix epoch), and clear what has not
    /// (the wall clock may step back): whether anything changed, and the next instant at which
    /// something expires.
    pub fn expire(&self, wall_ms: u64) -> (bool, Option<u64>) {
        let mut changed = false;
        for &(at, target) in self.deadlines.iter() {
            let past = at <= wall_ms;
            changed |= match target {
                Found::Key(k) => self.set_flag(k, EXPIRED, past),
                Found::Alias(a) => self.alias(a).set_flag(EXPIRED, past),
            };
        }
        let next = self.deadlines.partition_point(|d| d.0 <= wall_ms);
        let next = self.deadlines.get(next).map(|d| d.0);
        let (lapsed, issued_next) = self.issued.lapse(wall_ms);
        let next = match (next, issued_next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        (changed | lapsed, next)
    }

    /// How many customer and partner keys are in each state, in
    /// [`KeyState::ALL`](super::KeyState::ALL)'s order: counted as their flags change
    /// ([`KeyTable::set_flag`]), read without a walk of the keys.
    pub fn states(&self) -> [usize; 4] {
        let n = summed(&self.states.get(), &self.issued.states());
        std::array::from_fn(|i| n.get(i).copied().unwrap_or(0))
    }

    /// How many customer keys are on each plan (an upgrade counts on the plan it gives), by
    /// plan index: counted as keys come, go and change plan, read without a walk.
    pub fn keys_on_plans(&self) -> Vec<usize> {
        summed(&self.plans.get(), &self.issued.plans())
    }

    /// [`KeyTable::keys_on_plans`] counted by walking every key (the tests hold the two equal).
    #[cfg(test)]
    pub(crate) fn keys_on_plans_walked(&self) -> Vec<usize> {
        let mut n = vec![0; self.plans.get().len()];
        for (_, e) in self.iter() {
            if let Some(p) = e.plan_now() {
                n[p] += 1;
            }
        }
        n
    }

    /// Put the customer key `k` on `plan` (an index into the config's plans), or back on its
    /// YAML plan (`None`), and count it there; partner keys have no plan: nothing changes.
    /// Every change of a key's plan goes through here.
    pub fn set_plan_override(&self, k: KeyIdx, plan: Option<usize>) {
        match self.entries.get(k as usize) {
            Some(e) => {
                let (from, to) = e.set_plan_override(plan);
                self.plans.moved(from, to);
            }
            None => {
                let s = k - self.entries.len() as KeyIdx;
                self.issued.set_plan_override(s, plan);
            }
        }
    }

    /// [`KeyTable::states`] counted by walking every key (the tests hold the two equal).
    #[cfg(test)]
    pub(crate) fn states_walked(&self) -> [usize; 4] {
        let mut n = [0; 4];
        for (_, e) in self.iter() {
            n[e.live().state() as usize] += 1;
        }
        n
    }

    /// Set or clear state flags ([`EXPIRED`], [`SUSPENDED`](super::SUSPENDED),
    /// [`REVOKED`](super::REVOKED)) of the key `k`, and count it in its new state: whether
    /// that changed them. Every change of a key's flags goes through here.
    pub fn set_flag(&self, k: KeyIdx, flag: u64, on: bool) -> bool {
        match self.entries.get(k as usize) {
            Some(e) => {
                let (changed, from, to) = e.set_flag(flag, on);
                self.states.moved(Some(from as usize), Some(to as usize));
                changed
            }
            None => {
                let s = k - self.entries.len() as KeyIdx;
                self.issued.set_flag(s, flag, on)
            }
        }
    }

    /// The entry with this digest; every digest comparison is constant-time.
    #[inline]
    pub fn lookup(&self, d: &Digest) -> Option<KeyIdx> {
        let found = find_by_digest(&self.index, &self.hasher, d, |i| &self.entries[i].digest);
        if found.is_some() || self.issued.is_empty() {
            return found;
        }
        self.issued
            .lookup(d)
            .map(|s| self.entries.len() as KeyIdx + s)
    }

    /// The entry at `i` (an index from this table; panics past its end).
    #[inline]
    pub fn get(&self, i: KeyIdx) -> &KeyEntry {
        match self.entries.get(i as usize) {
            Some(e) => e,
            None => &self.issued_slot(i).expect("an index of this table").entry,
        }
    }

    /// Indexes in use: customer and partner keys of the YAML, and every issued key's slot
    /// (deleted ones included: an index below this is one [`KeyTable::get`] answers).
    pub fn len(&self) -> usize {
        self.entries.len() + self.issued.slots()
    }

    /// Keys of the YAML (customer and partner keys).
    pub fn configured(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.issued.is_empty()
    }

    /// Every key with its index: the YAML's in table order, then the issued ones not deleted.
    pub fn iter(&self) -> impl Iterator<Item = (KeyIdx, &KeyEntry)> + '_ {
        let base = self.entries.len() as KeyIdx;
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i as KeyIdx, e))
            .chain(self.issued.iter().map(move |(s, x)| (base + s, &x.entry)))
    }

    /// Whether a key has (or had, since the table was built) a quota of its own, in the YAML
    /// or set live.
    #[inline]
    pub fn has_own_quotas(&self) -> bool {
        self.own_quotas.load(Ordering::Relaxed)
    }

    /// Put the quota `quota` on the key `k` as its own (`None`: its plan's again).
    pub fn set_own_quota(&self, k: KeyIdx, quota: Option<crate::config::QuotaSpec>) {
        if quota.is_some() {
            self.own_quotas.store(true, Ordering::Relaxed);
        }
        self.get(k).set_own_quota(quota);
    }

    /// The key named `name` (for the admin API and the overrides' sync, not for the request
    /// path).
    pub fn find_by_name(&self, name: &str) -> Option<KeyIdx> {
        let yaml = self
            .names
            .find(self.hasher.hash_one(name), |&i| {
                self.entries[i as usize].name.as_str() == name
            })
            .copied();
        yaml.or_else(|| {
            self.issued
                .find(name)
                .map(|s| self.entries.len() as KeyIdx + s)
        })
    }
}

/// Positions `0..n` by a hash of the whole digest at each (`digest_at`). The config refuses a
/// digest given twice; should one slip through, the first wins.
fn index_by_digest<'d>(
    n: usize,
    digest_at: impl Fn(usize) -> &'d Digest,
    hasher: &foldhash::fast::RandomState,
) -> HashTable<u32> {
    let hash = |d: &Digest| hasher.hash_one(d.folded());
    let mut index = HashTable::with_capacity(n);
    for i in 0..n {
        let d = digest_at(i);
        index
            .entry(
                hash(d),
                |&j| digest_at(j as usize) == d,
                |&j| hash(digest_at(j as usize)),
            )
            .or_insert(i as u32);
    }
    index
}

/// The position in `index` ([`index_by_digest`]) whose digest is `d`, compared in constant
/// time.
#[inline]
fn find_by_digest<'d>(
    index: &HashTable<u32>,
    hasher: &foldhash::fast::RandomState,
    d: &Digest,
    digest_at: impl Fn(usize) -> &'d Digest,
) -> Option<u32> {
    index
        .find(hasher.hash_one(d.folded()), |&i| {
            digest_at(i as usize).ct_eq(d)
        })
        .copied()
}

/// Hands each key's rate state from the previous table to the new one.
///
/// Between two reloads most keys stay where they were, or move by the keys added or removed
/// before them: the entry at the new position plus the last offset seen is tried first (one
/// sequential read; the digest decides), and only when it is another key is the digest looked
/// up (a random read, the cost of a reload with a million keys). Either way the state handed
/// over is that of the entry with the same digest, so the result is the same as looking every
/// key up.
struct Carry<'p> {
    previous: Option<&'p KeyTable>,
    /// Position in the previous table minus position in the new one, at the last key found.
    shift: isize,
}

impl Carry<'_> {
    /// The state of the key at `at` with digest `d`: the previous table's for the same
    /// digest, else (a rotation: the key's digest in force before is now one of its
    /// `previous`) the state of the key that had one of those digests.
    fn rate(&mut self, at: usize, d: &Digest, extra: Option<&KeyExtra>) -> Arc<RateState> {
        let Some(prev) = self.previous else {
            return Arc::default();
        };
        if let Some(x) = extra.filter(|x| !x.previous.is_empty()) {
            if prev.lookup(d).is_none() {
                if let Some(j) = x.previous.iter().find_map(|(p, _)| prev.lookup(p)) {
                    return Arc::clone(&prev.get(j).rate);
                }
            }
        }
        let guess = at
            .checked_add_signed(self.shift)
            .and_then(|g| prev.entries.get(g));
        if let Some(e) = guess.filter(|e| e.digest.ct_eq(d)) {
            return Arc::clone(&e.rate);
        }
        match prev.lookup(d) {
            Some(j) => {
                self.shift = j as isize - at as isize;
                Arc::clone(&prev.get(j).rate)
            }
            None => Arc::default(),
        }
    }
}

/// The YAML's entries' counts and the issued keys', class by class.
fn summed(yaml: &[usize], issued: &[usize]) -> Vec<usize> {
    (0..yaml.len().max(issued.len()))
        .map(|i| yaml.get(i).copied().unwrap_or(0) + issued.get(i).copied().unwrap_or(0))
        .collect()
}
