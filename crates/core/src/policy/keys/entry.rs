//! One key of the table ([`KeyEntry`]): its name, credential, digest, budget and what
//! changes while it serves; a `previous` digest of a key ([`Alias`]); and what a digest names
//! ([`Found`], [`KeyIdx`]).

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use super::credential::{Credential, KeyRefusal, KeyState};
use super::flags::{KeyFlags, EXPIRED, FLAGS, LIMIT_SHIFT, PLAN_MASK, REVOKED};
use crate::config::keyname::KeyName;
use crate::digest::Digest;
use crate::limit::RateState;

/// One key in a [`KeyTable`](super::KeyTable): its name, who it belongs to, its digest and its
/// budget.
#[derive(Debug)]
pub struct KeyEntry {
    /// The operator's label for logs and metrics; never the key.
    pub name: KeyName,
    /// Who the key belongs to as the YAML says ([`KeyEntry::configured`]);
    /// [`KeyEntry::credential`] is what applies.
    pub(super) owner: Owner,
    /// The SHA-256 of the key.
    pub digest: Digest,
    /// The key's rate-limit state, carried over a reload that keeps the digest.
    pub rate: Arc<RateState>,
    /// What changes while it serves ([`KeyFlags`]): set when the table is built from the changes
    /// kept, when a change is made here or read from another replica, and when its
    /// `expires_at` passes (one atomic store: the very next request sees it).
    pub(super) live: AtomicU64,
    /// The key's own quota in force ([`crate::metering::pack_quota`]): the live one, else the
    /// YAML's; 0: its plan's (or the partners').
    pub(super) quota: AtomicU64,
    /// An issued key's word (0 for a key of the YAML): [`GONE`] once it is deleted (its slot
    /// stays until the table is built again, and no digest finds it), and below that bit the
    /// position + 1 of what it was issued with beyond plan and partner in its segment's list
    /// (0: nothing). Here rather than in the slot: the entry's layout leaves room for it.
    pub(super) issued: AtomicU32,
}

/// [`KeyEntry::issued`]'s bit of a deleted key.
pub(super) const GONE: u32 = 1 << 31;

// A key's entry, a million of them: the owner packed (a `Credential` is 32 bytes).
const _: () = assert!(std::mem::size_of::<KeyEntry>() <= 96);

/// A [`Credential`] in 12 bytes: a plan's or partner's index, the managing partner's index + 1
/// (0: none; [`PARTNER_KEY`]: a partner key), the key's own limit. Indexes past `u32::MAX - 1`
/// (four billion plans or partners, more than any config a process can hold) are not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Owner {
    index: u32,
    partner: u32,
    limit: u32,
}

/// [`Owner::partner`] of a partner key.
const PARTNER_KEY: u32 = u32::MAX;

impl Owner {
    /// `c`, packed.
    pub(super) fn of(c: Credential) -> Self {
        let index = |i: usize| u32::try_from(i).unwrap_or(PARTNER_KEY - 1);
        match c {
            Credential::Customer {
                plan,
                partner,
                limit,
            } => Owner {
                index: index(plan),
                partner: partner.map_or(0, |p| index(p).saturating_add(1).min(PARTNER_KEY - 1)),
                limit,
            },
            Credential::Partner { partner } => Owner {
                index: index(partner),
                partner: PARTNER_KEY,
                limit: 0,
            },
        }
    }

    /// The credential packed.
    #[inline]
    fn credential(self) -> Credential {
        match self.partner {
            PARTNER_KEY => Credential::Partner {
                partner: self.index as usize,
            },
            p => Credential::Customer {
                plan: self.index as usize,
                partner: p.checked_sub(1).map(|p| p as usize),
                limit: self.limit,
            },
        }
    }
}

/// The plan override value of a plan index.
fn plan_bits(plan: Option<usize>) -> u64 {
    plan.map_or(0, |p| (p as u64 + 1) & PLAN_MASK)
}

impl KeyEntry {
    /// Who the key belongs to as the YAML (or its issue) says; [`KeyEntry::credential`] is
    /// what applies.
    #[inline]
    pub fn configured(&self) -> Credential {
        self.owner.credential()
    }

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
        match self.configured() {
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
        match self.configured() {
            Credential::Customer { plan, .. } => Some(plan),
            Credential::Partner { .. } => None,
        }
    }

    /// The plan override in force, if any (a plan index).
    pub fn plan_override(&self) -> Option<usize> {
        self.live().plan()
    }

    /// Put a customer key on `plan` (an index into the config's plans), or back on its
    /// YAML plan (`None`). Partner keys have no plan: nothing changes. The plan it was on and
    /// the plan it is on. (Through
    /// [`KeyTable::set_plan_override`](super::KeyTable::set_plan_override), which counts the
    /// keys on each plan.)
    pub(super) fn set_plan_override(&self, plan: Option<usize>) -> (Option<usize>, Option<usize>) {
        let Credential::Customer { plan: yaml, .. } = self.configured() else {
            return (None, None);
        };
        let before = self.update(|v| (v & !PLAN_MASK) | plan_bits(plan));
        (
            Some(KeyFlags(before).plan().unwrap_or(yaml)),
            Some(plan.unwrap_or(yaml)),
        )
    }

    /// The plan it is on now (an upgrade's, else the YAML's); `None` for a partner key.
    pub(super) fn plan_now(&self) -> Option<usize> {
        self.configured_plan()
            .map(|yaml| self.plan_override().unwrap_or(yaml))
    }

    /// Set or clear state flags ([`EXPIRED`], [`SUSPENDED`](super::SUSPENDED), [`REVOKED`]):
    /// whether that changed them, and the key's state before and after. (Through
    /// [`KeyTable::set_flag`](super::KeyTable::set_flag), which counts the keys in each
    /// state.)
    pub(super) fn set_flag(&self, flag: u64, on: bool) -> (bool, KeyState, KeyState) {
        let flag = flag & FLAGS;
        let set = |v: u64| if on { v | flag } else { v & !flag };
        let before = self.update(set);
        (
            before & flag != if on { flag } else { 0 },
            KeyFlags(before).state(),
            KeyFlags(set(before)).state(),
        )
    }

    /// Set a customer key's live window limit, or take it off (`None`: the YAML's).
    pub fn set_live_limit(&self, limit: Option<u32>) {
        if matches!(self.configured(), Credential::Customer { .. }) {
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
    /// (Through [`KeyTable::set_own_quota`](super::KeyTable::set_own_quota), which notes that a
    /// key has one.)
    pub(super) fn set_own_quota(&self, quota: Option<crate::config::QuotaSpec>) {
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
    pub(super) flags: AtomicU8,
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

/// What a digest names in a [`KeyTable`](super::KeyTable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// A key's digest in force.
    Key(KeyIdx),
    /// A `previous` digest (an index into the table's aliases).
    Alias(u32),
}

/// Index of an entry in its [`KeyTable`](super::KeyTable).
pub type KeyIdx = u32;
