//! Keys: the digest of each key, the operator's name for it, and the immutable table that
//! finds an entry by digest.
//!
//! Keys are secrets, so the gateway never holds one: the config carries SHA-256 digests, the
//! presented token is hashed ([`mod@super::authenticate`]), and the digest is looked up in an
//! immutable [`KeyTable`] that a reload swaps whole. The table is indexed by a hash of the
//! digest (seeded per table); every comparison of a stored digest with the presented one is of
//! all 32 bytes, in constant time ([`subtle`]).
//!
//! Each entry owns its rate-limit state (an `Arc`, so a reload can hand the same state to the
//! new table for a key that remains: a request still deciding on the old table spends from the
//! same budget as one on the new table). Which store decides on that state is the policy's
//! ([`crate::limit::Store`]).
//!
//! The table is built for up to millions of keys: an entry is 96 bytes with its name inline
//! ([`KeyName`]), plus the 24-byte rate-state allocation, and the index is a
//! [`hashbrown::HashTable`] of `u32` positions (a control byte and a position per bucket, at
//! most 7/8 full): about 130 bytes per key in all. `cargo bench -p tollgate-core --bench keys` measures it
//! (docs/keyscale.md).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;

use crate::config::keyname::KeyName;
use crate::config::Config;
pub use crate::digest::Digest;
use crate::limit::RateState;

/// Who a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A customer key on a plan (index into `Config::plans`), maybe managed by a partner.
    Customer {
        /// The plan's index into `Config::plans`.
        plan: usize,
        /// The managing partner's index into `Config::partners`; `None`: no partner manages it.
        partner: Option<usize>,
    },
    /// A partner key (index into `Config::partners`).
    Partner {
        /// The partner's index into `Config::partners`.
        partner: usize,
    },
}

/// One key in a [`KeyTable`]: its name, who it belongs to, its digest and its budget.
#[derive(Debug)]
pub struct KeyEntry {
    /// The operator's label for logs and metrics; never the key.
    pub name: KeyName,
    /// Who the key belongs to as the YAML says; [`KeyEntry::credential`] is what applies.
    pub configured: Credential,
    /// The SHA-256 of the key.
    pub digest: Digest,
    /// The key's rate-limit state, carried over a reload that keeps the digest.
    pub rate: Arc<RateState>,
    /// A partner's upgrade in force for this customer key: the plan's index, or
    /// [`NO_OVERRIDE`]. Set when the table is built from the overrides, and when an upgrade
    /// succeeds (one atomic store: the very next request sees it).
    plan_override: AtomicU32,
}

/// [`KeyEntry`]'s `plan_override` when there is none.
pub const NO_OVERRIDE: u32 = u32::MAX;

impl KeyEntry {
    /// Who the key belongs to now: the YAML's credential with any plan override applied.
    #[inline]
    pub fn credential(&self) -> Credential {
        match self.configured {
            Credential::Customer { plan, partner } => {
                let o = self.plan_override.load(Ordering::Relaxed);
                Credential::Customer {
                    plan: if o == NO_OVERRIDE { plan } else { o as usize },
                    partner,
                }
            }
            partner => partner,
        }
    }

    /// The plan index the YAML gives a customer key.
    pub fn configured_plan(&self) -> Option<usize> {
        match self.configured {
            Credential::Customer { plan, .. } => Some(plan),
            Credential::Partner { .. } => None,
        }
    }

    /// The plan override in force, if any (a plan index).
    pub fn plan_override(&self) -> Option<usize> {
        let o = self.plan_override.load(Ordering::Relaxed);
        (o != NO_OVERRIDE).then_some(o as usize)
    }

    /// Put a customer key on `plan` (an index into the config's plans), or back on its
    /// YAML plan (`None`). Partner keys have no plan: nothing changes.
    pub fn set_plan_override(&self, plan: Option<usize>) {
        if matches!(self.configured, Credential::Customer { .. }) {
            let v = plan.map_or(NO_OVERRIDE, |p| p as u32);
            self.plan_override.store(v, Ordering::Relaxed);
        }
    }
}

/// Index of an entry in its [`KeyTable`].
pub type KeyIdx = u32;

/// Immutable digest → key table, built per config: customer keys in config order, then
/// partner keys.
#[derive(Debug, Default)]
pub struct KeyTable {
    entries: Box<[KeyEntry]>,
    /// Entry positions by a hash of the whole digest ([`Digest::folded`]). (Not of its first
    /// bytes alone: digests written by hand or by a test generator, such as `000…001`,
    /// `000…002`, share those.)
    index: HashTable<KeyIdx>,
    /// Seeded per table.
    hasher: foldhash::fast::RandomState,
}

impl KeyTable {
    /// Build the table for `config`. Rate state is taken over from `previous` for every digest
    /// that is in both, so a reload does not reset anyone's budget.
    pub fn build(config: &Config, previous: Option<&KeyTable>) -> Self {
        let mut carry = Carry { previous, shift: 0 };
        let mut entries = Vec::with_capacity(config.keys.len() + config.partners.len());
        for (i, k) in config.keys.iter().enumerate() {
            entries.push(KeyEntry {
                name: k.name.clone(),
                configured: Credential::Customer {
                    plan: k.plan,
                    partner: k.partner,
                },
                digest: k.digest,
                rate: carry.rate(i, &k.digest),
                plan_override: AtomicU32::new(NO_OVERRIDE),
            });
        }
        for (i, p) in config.partners.iter().enumerate() {
            let at = entries.len();
            entries.push(KeyEntry {
                name: KeyName::new(&p.name),
                configured: Credential::Partner { partner: i },
                digest: p.digest,
                rate: carry.rate(at, &p.digest),
                plan_override: AtomicU32::new(NO_OVERRIDE),
            });
        }
        let entries = entries.into_boxed_slice();
        let hasher = foldhash::fast::RandomState::default();
        let hash = |d: &Digest| hasher.hash_one(d.folded());
        let mut index = HashTable::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            // The config refuses a digest given twice; should one slip through, the first wins.
            index
                .entry(
                    hash(&e.digest),
                    |&j| entries[j as usize].digest == e.digest,
                    |&j| hash(&entries[j as usize].digest),
                )
                .or_insert(i as KeyIdx);
        }
        Self {
            entries,
            index,
            hasher,
        }
    }

    /// The entry with this digest; every digest comparison is constant-time.
    pub fn lookup(&self, d: &Digest) -> Option<KeyIdx> {
        self.index
            .find(self.hasher.hash_one(d.folded()), |&i| {
                self.entries[i as usize].digest.ct_eq(d)
            })
            .copied()
    }

    /// The entry at `i` (an index from this table; panics past its end).
    pub fn get(&self, i: KeyIdx) -> &KeyEntry {
        &self.entries[i as usize]
    }

    /// Entries: customer keys and partner keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry with its index, in table order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (KeyIdx, &KeyEntry)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i as KeyIdx, e))
    }

    /// The entry named `name` (a scan: for the admin API and the overrides' sync, not for the
    /// request path).
    pub fn find_by_name(&self, name: &str) -> Option<KeyIdx> {
        self.iter()
            .find(|(_, e)| e.name.as_str() == name)
            .map(|(k, _)| k)
    }
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
    fn rate(&mut self, at: usize, d: &Digest) -> Arc<RateState> {
        let Some(prev) = self.previous else {
            return Arc::default();
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_that_differ_in_one_byte_resolve_by_the_full_digest() {
        let mut cfg = crate::testing::config();
        // Synthetic digests (`000…000`, `000…001`, …) share all but their last byte.
        for (i, k) in cfg.keys.iter_mut().enumerate() {
            k.digest = Digest([0; 32]);
            k.digest.0[31] = i as u8;
        }
        let table = KeyTable::build(&cfg, None);
        for (i, k) in cfg.keys.iter().enumerate() {
            assert_eq!(table.lookup(&k.digest), Some(i as KeyIdx));
        }
        let mut c = Digest([0; 32]);
        c.0[31] = 200;
        assert_eq!(table.lookup(&c), None);
        c.0[31] = 0;
        c.0[0] = 1;
        assert_eq!(table.lookup(&c), None);
    }

    #[test]
    fn many_keys_are_all_found_and_others_are_not() {
        let mut cfg = crate::testing::config();
        let spec = cfg.keys[0].clone();
        cfg.keys = (0..5000)
            .map(|i| crate::config::KeySpec {
                name: KeyName::new(&format!("k{i}")),
                digest: Digest::of(format!("key-{i}").as_bytes()),
                ..spec.clone()
            })
            .collect();
        let table = KeyTable::build(&cfg, None);
        assert_eq!(table.len(), 5000 + cfg.partners.len());
        for i in 0..5000u32 {
            let d = Digest::of(format!("key-{i}").as_bytes());
            assert_eq!(table.lookup(&d), Some(i));
            assert_eq!(table.get(i).name, format!("k{i}").as_str());
            assert!(table
                .lookup(&Digest::of(format!("other-{i}").as_bytes()))
                .is_none());
        }
        let acme = table.lookup(&Digest::of(b"acme-partner-key")).unwrap();
        assert_eq!(
            table.get(acme).credential(),
            Credential::Partner { partner: 0 }
        );
    }

    #[test]
    fn reload_carries_rate_state_by_digest_whatever_moved() {
        let mut cfg = crate::testing::config();
        let spec = cfg.keys[0].clone();
        let key = |i: u32| crate::config::KeySpec {
            name: KeyName::new(&format!("k{i}")),
            digest: Digest::of(format!("key-{i}").as_bytes()),
            ..spec.clone()
        };
        cfg.keys = (0..100).map(key).collect();
        let old = KeyTable::build(&cfg, None);
        // Removed at the front, added in the middle, moved from the middle to the end, and the
        // partners after all of them.
        let mut keys: Vec<_> = (3..100).filter(|&i| i != 50).map(key).collect();
        keys.insert(20, key(1000));
        keys.insert(21, key(1001));
        keys.push(key(50));
        let mut cfg2 = cfg.clone();
        cfg2.keys = keys;
        let new = KeyTable::build(&cfg2, Some(&old));
        assert_eq!(new.len(), cfg2.keys.len() + cfg2.partners.len());
        for i in 0..new.len() as KeyIdx {
            let e = new.get(i);
            match old.lookup(&e.digest) {
                Some(o) => assert!(Arc::ptr_eq(&old.get(o).rate, &e.rate), "{}", e.name),
                None => {
                    assert!(e.name == "k1000" || e.name == "k1001", "{}", e.name);
                    assert_eq!(Arc::strong_count(&e.rate), 1);
                }
            }
        }
    }

    #[test]
    fn reload_carries_rate_state_for_remaining_keys_only() {
        let cfg = crate::testing::config();
        let old = KeyTable::build(&cfg, None);
        let mut cfg2 = cfg.clone();
        cfg2.keys.remove(0);
        let new = KeyTable::build(&cfg2, Some(&old));
        let kept = &cfg2.keys[0].digest;
        let (o, n) = (old.lookup(kept).unwrap(), new.lookup(kept).unwrap());
        assert!(Arc::ptr_eq(&old.get(o).rate, &new.get(n).rate));
        let gone = &cfg.keys[0].digest;
        assert!(new.lookup(gone).is_none());
    }
}
