//! What changes while a key serves, in one word: [`KeyFlags`] and its state flags
//! ([`EXPIRED`], [`SUSPENDED`], [`REVOKED`]); and how many keys are in each state, counted as
//! the flags change ([`StateCounts`]).

use std::sync::atomic::{AtomicIsize, Ordering};

use super::credential::{KeyRefusal, KeyState};

/// A flag of [`KeyFlags`]: past `expires_at`.
pub const EXPIRED: u64 = 1 << 16;
/// A flag of [`KeyFlags`]: suspended.
pub const SUSPENDED: u64 = 1 << 17;
/// A flag of [`KeyFlags`]: revoked.
pub const REVOKED: u64 = 1 << 18;
pub(super) const FLAGS: u64 = EXPIRED | SUSPENDED | REVOKED;
pub(super) const PLAN_MASK: u64 = 0xffff;
pub(super) const LIMIT_SHIFT: u32 = 32;

/// Everything about a key that changes while it serves, in one word read once per request:
/// a plan override (bits 0–15, the plan's index + 1), the state flags ([`EXPIRED`],
/// [`SUSPENDED`], [`REVOKED`]) and a live window limit (bits 32–63). A key with no change in
/// force reads 0: the request path takes one branch for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyFlags(pub(super) u64);

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

/// How many keys are in each of a few classes (a state, a plan), by the class's index,
/// counted as keys come, go and move (every move goes through the table:
/// [`KeyTable::set_flag`](super::KeyTable::set_flag),
/// [`KeyTable::set_plan_override`](super::KeyTable::set_plan_override)): `tollgate_keys{state}`
/// and the page's plans read a few numbers, never a walk of a million keys.
#[derive(Debug, Default)]
pub(super) struct Counts(Box<[AtomicIsize]>);

impl Counts {
    /// For `classes` classes, no key in any.
    pub(super) fn new(classes: usize) -> Self {
        Self((0..classes).map(|_| AtomicIsize::new(0)).collect())
    }

    /// By state ([`KeyState::ALL`]'s order), `active` keys, every one active.
    pub(super) fn of_states(active: usize) -> Self {
        let me = Self::new(KeyState::ALL.len());
        me.add(Some(KeyState::Active as usize), active as isize);
        me
    }

    /// `n` keys more (fewer, when negative) in `class` (none: a key not counted, such as a
    /// partner key by plan).
    pub(super) fn add(&self, class: Option<usize>, n: isize) {
        if let Some(c) = class.and_then(|i| self.0.get(i)) {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// A key moved from `from` to `to`.
    pub(super) fn moved(&self, from: Option<usize>, to: Option<usize>) {
        if from != to {
            self.add(from, -1);
            self.add(to, 1);
        }
    }

    /// The counts, by class (a key moving while they are read may be seen in neither class
    /// or both).
    pub(super) fn get(&self) -> Vec<usize> {
        self.0
            .iter()
            .map(|n| usize::try_from(n.load(Ordering::Relaxed)).unwrap_or(0))
            .collect()
    }
}
