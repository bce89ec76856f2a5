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
//! The table is built for up to millions of keys: an entry is 104 bytes with its name inline
//! ([`KeyName`]), plus the 24-byte rate-state allocation, and the index is a
//! [`hashbrown::HashTable`] of `u32` positions (a control byte and a position per bucket, at
//! most 7/8 full): about 146 bytes of heap per key in all (docs/benchmarks/history.md). `cargo bench -p tollgate-core --bench keys` measures it
//! (docs/keyscale.md).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;

use crate::config::keyname::KeyName;
use crate::config::{Config, KeyExtra};
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
        /// The key's own window limit (`requests_per_window` of the key, or set live); 0: its
        /// plan's.
        limit: u32,
    },
    /// A partner key (index into `Config::partners`).
    Partner {
        /// The partner's index into `Config::partners`.
        partner: usize,
    },
}

/// The state of a key, as the admin API and `tollgate_keys{state}` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyState {
    /// Authenticates.
    Active,
    /// Past its `expires_at` (or, for a `previous` digest, its `until`).
    Expired,
    /// Suspended by an operator or its partner, until resumed.
    Suspended,
    /// Revoked for good.
    Revoked,
}

impl KeyState {
    /// Every state, in the gauge's order.
    pub const ALL: [KeyState; 4] = [
        KeyState::Active,
        KeyState::Expired,
        KeyState::Suspended,
        KeyState::Revoked,
    ];

    /// `active`, `expired`, `suspended` or `revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Active => "active",
            KeyState::Expired => "expired",
            KeyState::Suspended => "suspended",
            KeyState::Revoked => "revoked",
        }
    }
}

/// Why a bearer token did not authenticate (`tollgate_key_refusals_total{reason}`); the client
/// gets the same 401 whatever it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRefusal {
    /// No key, a malformed one, or one no entry has.
    Unknown,
    /// An expired key, or a `previous` digest past its `until`.
    Expired,
    /// A suspended key.
    Suspended,
    /// A revoked key (or digest).
    Revoked,
}

impl KeyRefusal {
    /// `unknown`, `expired`, `suspended` or `revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyRefusal::Unknown => "unknown",
            KeyRefusal::Expired => "expired",
            KeyRefusal::Suspended => "suspended",
            KeyRefusal::Revoked => "revoked",
        }
    }
}

/// A flag of [`KeyFlags`]: past `expires_at`.
pub const EXPIRED: u64 = 1 << 16;
/// A flag of [`KeyFlags`]: suspended.
pub const SUSPENDED: u64 = 1 << 17;
/// A flag of [`KeyFlags`]: revoked.
pub const REVOKED: u64 = 1 << 18;
const FLAGS: u64 = EXPIRED | SUSPENDED | REVOKED;
const PLAN_MASK: u64 = 0xffff;
const LIMIT_SHIFT: u32 = 32;

/// Everything about a key that changes while it serves, in one word read once per request:
/// a plan override (bits 0–15, the plan's index + 1), the state flags ([`EXPIRED`],
/// [`SUSPENDED`], [`REVOKED`]) and a live window limit (bits 32–63). A key with no change in
/// force reads 0: the request path takes one branch for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyFlags(u64);

impl KeyFlags {
    /// Whether anything but [`EXPIRED`] is in force: a plan override, a suspension, a
    /// revocation or a live limit (what a change kept elsewhere can lift).
    #[inline]
    pub fn changed_beyond_expiry(self) -> bool {
        self.0 & !EXPIRED != 0
    }
    /// Whether nothing is in force.
    #[inline]
    pub fn is_plain(self) -> bool {
        self.0 == 0
    }

    /// Why the key is refused, if it is (revoked first, then suspended, then expired).
    #[inline]
    pub fn refused(self) -> Option<KeyRefusal> {
        if self.0 & FLAGS == 0 {
            None
        } else if self.0 & REVOKED != 0 {
            Some(KeyRefusal::Revoked)
        } else if self.0 & SUSPENDED != 0 {
            Some(KeyRefusal::Suspended)
        } else {
            Some(KeyRefusal::Expired)
        }
    }

    /// The state these flags make.
    pub fn state(self) -> KeyState {
        match self.refused() {
            None | Some(KeyRefusal::Unknown) => KeyState::Active,
            Some(KeyRefusal::Expired) => KeyState::Expired,
            Some(KeyRefusal::Suspended) => KeyState::Suspended,
            Some(KeyRefusal::Revoked) => KeyState::Revoked,
        }
    }

    /// The plan override, if any (a plan index).
    #[inline]
    pub fn plan(self) -> Option<usize> {
        match self.0 & PLAN_MASK {
            0 => None,
            p => Some(p as usize - 1),
        }
    }

    /// The live window limit, if any.
    #[inline]
    pub fn limit(self) -> Option<u32> {
        match (self.0 >> LIMIT_SHIFT) as u32 {
            0 => None,
            n => Some(n),
        }
    }
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
    /// What changes while it serves ([`KeyFlags`]): set when the table is built from the changes
    /// kept, when a change is made here or read from another replica, and when its
    /// `expires_at` passes (one atomic store: the very next request sees it).
    live: AtomicU64,
    /// The key's own quota in force ([`crate::metering::pack_quota`]): the live one, else the
    /// YAML's; 0: its plan's (or the partners').
    quota: AtomicU64,
}

/// The plan override value of a plan index.
fn plan_bits(plan: Option<usize>) -> u64 {
    plan.map_or(0, |p| (p as u64 + 1) & PLAN_MASK)
}

impl KeyEntry {
    /// What is in force now (read once per request).
    #[inline]
    pub fn live(&self) -> KeyFlags {
        KeyFlags(self.live.load(Ordering::Relaxed))
    }

    /// Who the key belongs to now: the YAML's credential with any plan override applied.
    #[inline]
    pub fn credential(&self) -> Credential {
        self.credential_with(self.live())
    }

    /// The credential with `live` applied (a plan override, a live limit).
    #[inline]
    pub fn credential_with(&self, live: KeyFlags) -> Credential {
        match self.configured {
            Credential::Customer {
                plan,
                partner,
                limit,
            } if !live.is_plain() => Credential::Customer {
                plan: live.plan().unwrap_or(plan),
                partner,
                limit: live.limit().unwrap_or(limit),
            },
            configured => configured,
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
        self.live().plan()
    }

    /// Put a customer key on `plan` (an index into the config's plans), or back on its
    /// YAML plan (`None`). Partner keys have no plan: nothing changes.
    pub fn set_plan_override(&self, plan: Option<usize>) {
        if matches!(self.configured, Credential::Customer { .. }) {
            self.update(|v| (v & !PLAN_MASK) | plan_bits(plan));
        }
    }

    /// Set or clear state flags ([`EXPIRED`], [`SUSPENDED`], [`REVOKED`]); whether that
    /// changed them.
    pub fn set_flag(&self, flag: u64, on: bool) -> bool {
        let flag = flag & FLAGS;
        let before = self.update(|v| if on { v | flag } else { v & !flag });
        before & flag != if on { flag } else { 0 }
    }

    /// Set a customer key's live window limit, or take it off (`None`: the YAML's).
    pub fn set_live_limit(&self, limit: Option<u32>) {
        if matches!(self.configured, Credential::Customer { .. }) {
            let bits = u64::from(limit.unwrap_or(0)) << LIMIT_SHIFT;
            self.update(|v| (v & !(u64::MAX << LIMIT_SHIFT)) | bits);
        }
    }

    /// The key's own quota in force (`None`: its plan's, or the partners').
    #[inline]
    pub fn own_quota(&self) -> Option<crate::config::QuotaSpec> {
        crate::metering::unpack_quota(self.quota.load(Ordering::Relaxed))
    }

    /// Set the key's own quota in force: the live one, else the YAML's (`None`: its plan's).
    /// (Through [`KeyTable::set_own_quota`], which notes that a key has one.)
    fn set_own_quota(&self, quota: Option<crate::config::QuotaSpec>) {
        self.quota
            .store(crate::metering::pack_quota(quota), Ordering::Relaxed);
    }

    /// Change the word; what it was.
    fn update(&self, f: impl Fn(u64) -> u64) -> u64 {
        match self
            .live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(f(v)))
        {
            Ok(v) | Err(v) => v,
        }
    }
}

/// A `previous` digest of a key (rotation): it authenticates as its key until `until_ms`.
#[derive(Debug)]
pub struct Alias {
    /// The earlier digest.
    pub digest: Digest,
    /// The key it authenticates as.
    pub key: KeyIdx,
    /// Until when (ms since the Unix epoch).
    pub until_ms: u64,
    /// [`EXPIRED`] and [`REVOKED`], shifted down by 16.
    flags: AtomicU8,
}

impl Alias {
    /// Why this digest is refused, whatever its key's state, if it is.
    pub fn refused(&self) -> Option<KeyRefusal> {
        KeyFlags(u64::from(self.flags.load(Ordering::Relaxed)) << 16).refused()
    }

    /// Set or clear [`EXPIRED`] or [`REVOKED`]; whether that changed them.
    pub fn set_flag(&self, flag: u64, on: bool) -> bool {
        let bit = ((flag & (EXPIRED | REVOKED)) >> 16) as u8;
        let before = if on {
            self.flags.fetch_or(bit, Ordering::Relaxed)
        } else {
            self.flags.fetch_and(!bit, Ordering::Relaxed)
        };
        before & bit != if on { bit } else { 0 }
    }
}

/// What a digest names in a [`KeyTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// A key's digest in force.
    Key(KeyIdx),
    /// A `previous` digest (an index into the table's aliases).
    Alias(u32),
}

/// Index of an entry in its [`KeyTable`].
pub type KeyIdx = u32;

/// Immutable digest → key table, built per config: customer keys in config order, then
/// partner keys.
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
                configured: Credential::Customer {
                    plan: k.plan,
                    partner: k.partner,
                    limit: extra.and_then(|e| e.limit).map_or(0, |n| n.get()),
                },
                digest: k.digest,
                rate: carry.rate(i, &k.digest, extra),
                live: AtomicU64::new(0),
                quota: AtomicU64::new(crate::metering::pack_quota(extra.and_then(|e| e.quota))),
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
                configured: Credential::Partner { partner: i },
                digest: p.digest,
                rate: carry.rate(at, &p.digest, None),
                live: AtomicU64::new(0),
                quota: AtomicU64::new(0),
            });
        }
        deadlines.sort_unstable_by_key(|d| d.0);
        let entries = entries.into_boxed_slice();
        let hasher = foldhash::fast::RandomState::default();
        let alias_index = index_by_digest(aliases.len(), |i| &aliases[i].digest, &hasher);
        let index = index_by_digest(entries.len(), |i| &entries[i].digest, &hasher);
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
        self.extras.get(&k).map(|b| &**b)
    }

    /// Mark what has expired at `wall_ms` (ms since the Unix epoch), and clear what has not
    /// (the wall clock may step back): whether anything changed, and the next instant at which
    /// something expires.
    pub fn expire(&self, wall_ms: u64) -> (bool, Option<u64>) {
        let mut changed = false;
        for &(at, target) in self.deadlines.iter() {
            let past = at <= wall_ms;
            changed |= match target {
                Found::Key(k) => self.get(k).set_flag(EXPIRED, past),
                Found::Alias(a) => self.alias(a).set_flag(EXPIRED, past),
            };
        }
        let next = self.deadlines.partition_point(|d| d.0 <= wall_ms);
        (changed, self.deadlines.get(next).map(|d| d.0))
    }

    /// How many customer and partner keys are in each state, in [`KeyState::ALL`]'s order.
    pub fn states(&self) -> [usize; 4] {
        let mut n = [0; 4];
        for e in self.entries.iter() {
            n[e.live().state() as usize] += 1;
        }
        n
    }

    /// The entry with this digest; every digest comparison is constant-time.
    pub fn lookup(&self, d: &Digest) -> Option<KeyIdx> {
        find_by_digest(&self.index, &self.hasher, d, |i| &self.entries[i].digest)
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

    /// The entry named `name` (a scan: for the admin API and the overrides' sync, not for the
    /// request path).
    pub fn find_by_name(&self, name: &str) -> Option<KeyIdx> {
        self.iter()
            .find(|(_, e)| e.name.as_str() == name)
            .map(|(k, _)| k)
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
