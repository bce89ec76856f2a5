//! Which issued key a digest authenticates as ([`Digests`]): each key's own digest (the one
//! it was issued with, its id) through the lock-free index of slot numbers (`index.rs`), the
//! few digests a rotation adds through a lock-free map asked only when it holds any. Readers
//! never wait; the segment's writers (one at a time, under its book's lock) change one entry.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::index::DigestIndex;
use crate::digest::Digest;

/// A digest as a map key: hashed by its fold, compared in constant time.
#[derive(Clone, Copy)]
struct CtDigest(Digest);

impl PartialEq for CtDigest {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0)
    }
}

impl Eq for CtDigest {}

impl Hash for CtDigest {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.folded());
    }
}

/// The digests that authenticate, each to its key's slot. Each call is handed `id_of`, the
/// digest a slot was issued with (the segment's slots hold it).
pub(super) struct Digests {
    /// Each key's own digest, while it authenticates.
    own: DigestIndex,
    /// The other digests that authenticate (a rotation's new one, and its old ones in their
    /// overlap).
    rotated: papaya::HashMap<CtDigest, u32, foldhash::fast::RandomState>,
    /// Digests in `rotated` (the request path asks it only when there are some).
    rotated_n: AtomicUsize,
}

impl Default for Digests {
    fn default() -> Self {
        Self {
            own: DigestIndex::default(),
            rotated: papaya::HashMap::with_hasher(foldhash::fast::RandomState::default()),
            rotated_n: AtomicUsize::new(0),
        }
    }
}

impl Digests {
    /// Room for `more` keys' own digests.
    pub(super) fn reserve(&self, more: usize, id_of: impl Fn(u32) -> Digest) {
        self.own.reserve(more, id_of);
    }

    /// The slot `d` authenticates as, if any; `is_own` says whether a slot was issued with
    /// `d` (compared in constant time).
    #[inline]
    pub(super) fn get(&self, d: &Digest, is_own: impl Fn(u32, &Digest) -> bool) -> Option<u32> {
        match self.own.get(d, is_own) {
            Some(s) => Some(s),
            None if self.rotated_n.load(Ordering::Acquire) == 0 => None,
            None => self.rotated.pin().get(&CtDigest(*d)).copied(),
        }
    }

    /// `d` made to find slot `s`: in the index when it is the slot's own digest, else among
    /// the rotated ones.
    pub(super) fn insert(&self, d: Digest, s: u32, id_of: impl Fn(u32) -> Digest) {
        if d == id_of(s) {
            self.own.insert(&d, s, id_of);
            return;
        }
        // Counted first: a reader that finds no count finds nothing to miss.
        self.rotated_n.fetch_add(1, Ordering::AcqRel);
        if self.rotated.pin().insert(CtDigest(d), s).is_some() {
            self.rotated_n.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// `d` taken out if it finds slot `s` (another key may have taken it since); whether it
    /// did.
    pub(super) fn remove(&self, d: Digest, s: u32, id_of: impl Fn(u32) -> Digest) -> bool {
        if d == id_of(s) {
            return self.own.remove_if(&d, s);
        }
        let took = self
            .rotated
            .pin()
            .remove_if(&CtDigest(d), |_, &at| at == s)
            .is_ok_and(|r| r.is_some());
        if took {
            self.rotated_n.fetch_sub(1, Ordering::AcqRel);
        }
        took
    }
}
