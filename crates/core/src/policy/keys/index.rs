//! The issued keys' digests, each to its slot ([`DigestIndex`]): the YAML table's index
//! (`table.rs`, a hashbrown table of positions whose digests are read from the entries) made
//! lock-free for a segment that changes one key at a time.
//!
//! One array of 64-bit words, open addressing with linear probing: a word is a slot number
//! (plus one; 0 is an empty word) and 32 more bits of the digest's hash, so that a probe reads
//! a slot's digest only when those bits match. The digest itself is not held here: the caller
//! says whether slot `s` has digest `d` (the slot holds the digest it was issued with), so a
//! million keys cost 8 bytes a word, at most three quarters full, where a map holding each
//! digest beside its slot cost some 59 bytes a key (`papaya`'s boxed entry of 36 bytes and
//! its slots).
//!
//! Readers never wait: they read the array in force ([`arc_swap`]) and load its words. A
//! writer (one at a time: a mutex the request path never takes) changes one word in place (a
//! key put, replaced or taken out, left as a tombstone so that no probe chain breaks), or
//! builds a bigger array and swaps it in; readers still on the old one finish there, and it
//! is freed when the last lets it go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use arc_swap::ArcSwap;

use crate::digest::Digest;

/// A word no key has ever held.
const EMPTY: u64 = 0;
/// A word whose key was taken out (its slot half 0, unlike every key's).
const TOMB: u64 = u64::MAX << 32;
/// The fewest words an array has.
const MIN_WORDS: usize = 16;

/// One array of words (a power of two of them).
struct Words(Box<[AtomicU64]>);

impl Words {
    fn new(n: usize) -> Self {
        Self((0..n).map(|_| AtomicU64::new(EMPTY)).collect())
    }

    fn mask(&self) -> usize {
        self.0.len() - 1
    }
}

/// The word for slot `s` under a hash whose high half is `h >> 32`.
fn word(h: u64, s: u32) -> u64 {
    (h & (u64::MAX << 32)) | (u64::from(s) + 1)
}

/// The words from the home of a digest hashed to `h` on, with their positions, to the first
/// empty one (included): the words a lookup of it reads. At least a quarter of the words are
/// empty, so this ends well before the bound of one pass over them.
fn probe(words: &Words, h: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
    let mask = words.mask();
    let mut ended = false;
    (0..=mask).map_while(move |k| {
        if ended {
            return None;
        }
        let i = (h as usize).wrapping_add(k) & mask;
        let w = words.0[i].load(Ordering::Acquire);
        ended = w == EMPTY;
        Some((i, w))
    })
}

/// The slot a key's word names (`None`: empty or a tombstone).
fn slot_of(w: u64) -> Option<u32> {
    (w as u32).checked_sub(1)
}

/// Words in use, for the writer.
#[derive(Default)]
struct Used {
    live: usize,
    tombs: usize,
}

/// Digest → slot, for the issued keys' digests (see the module's docs).
pub(super) struct DigestIndex {
    words: ArcSwap<Words>,
    hasher: foldhash::fast::RandomState,
    used: Mutex<Used>,
}

impl Default for DigestIndex {
    fn default() -> Self {
        Self {
            words: ArcSwap::from_pointee(Words::new(MIN_WORDS)),
            hasher: foldhash::fast::RandomState::default(),
            used: Mutex::default(),
        }
    }
}

impl DigestIndex {
    fn hash(&self, d: &Digest) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(d.folded())
    }

    /// The slot whose digest is `d`, `has(s, d)` saying whether slot `s` has it.
    #[inline]
    pub(super) fn get(&self, d: &Digest, has: impl Fn(u32, &Digest) -> bool) -> Option<u32> {
        let words = self.words.load();
        let h = self.hash(d);
        let found = probe(&words, h)
            .filter(|&(_, w)| (w ^ h) >> 32 == 0)
            .find_map(|(_, w)| slot_of(w).filter(|&s| has(s, d)));
        found
    }

    /// Put `d` → `s` (replacing what `d` named); `digest_of(t)` is the digest slot `t` was
    /// put under (every slot here is, by the caller's rule, under one digest: its own).
    pub(super) fn insert(&self, d: &Digest, s: u32, digest_of: impl Fn(u32) -> Digest) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        self.room(&mut used, 1, &digest_of);
        let words = self.words.load();
        let h = self.hash(d);
        // `d` replaced where it is found, else put in the first tombstone on its way, else in
        // the empty word that ends the way (there is one: `room` leaves a quarter empty).
        let mut free = None;
        for (i, w) in probe(&words, h) {
            match slot_of(w) {
                Some(t) if (w ^ h) >> 32 == 0 && digest_of(t) == *d => {
                    words.0[i].store(word(h, s), Ordering::Release);
                    return;
                }
                Some(_) => {}
                None => {
                    free.get_or_insert((i, w));
                }
            }
        }
        if let Some((at, was)) = free {
            if was == TOMB {
                used.tombs -= 1;
            }
            used.live += 1;
            words.0[at].store(word(h, s), Ordering::Release);
        }
    }

    /// Take `d` out if it names slot `s`; whether it did.
    pub(super) fn remove_if(&self, d: &Digest, s: u32) -> bool {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let words = self.words.load();
        let h = self.hash(d);
        // Slot `s` is under one digest: its word is the one to take out.
        let Some((at, _)) = probe(&words, h).find(|&(_, w)| w == word(h, s)) else {
            return false;
        };
        words.0[at].store(TOMB, Ordering::Release);
        used.live -= 1;
        used.tombs += 1;
        true
    }

    /// Room for `more` keys beyond those here, made now (a start reserves for all it puts).
    pub(super) fn reserve(&self, more: usize, digest_of: impl Fn(u32) -> Digest) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        self.room(&mut used, more, &digest_of);
    }

    /// Keys here.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .live
    }

    /// Words in the array in force (its memory is 8 bytes each).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.words.load().0.len()
    }

    /// With `more` words taken, the array in force would be over three quarters full
    /// (tombstones count: they lengthen probes): a new one, for twice the keys, without the
    /// tombstones.
    fn room(&self, used: &mut Used, more: usize, digest_of: &impl Fn(u32) -> Digest) {
        let old = self.words.load_full();
        if (used.live + used.tombs + more) * 4 <= old.0.len() * 3 {
            return;
        }
        let n = ((used.live + more) * 2).next_power_of_two().max(MIN_WORDS);
        let new = Words::new(n);
        for w in old.0.iter().map(|w| w.load(Ordering::Relaxed)) {
            let Some(s) = slot_of(w) else { continue };
            let h = self.hash(&digest_of(s));
            // No tombstone and no key twice here: the word a probe ends at is free.
            if let Some((i, _)) = probe(&new, h).last() {
                new.0[i].store(word(h, s), Ordering::Relaxed);
            }
        }
        used.tombs = 0;
        // The new array's words are published with it.
        self.words.store(std::sync::Arc::new(new));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn d(i: u32) -> Digest {
        Digest::of(&i.to_le_bytes())
    }

    /// Slots 0..n, slot `s` under digest `ids[s]`.
    fn index_over(ids: &[Digest]) -> impl Fn(u32) -> Digest + '_ {
        |s| ids[s as usize]
    }

    #[test]
    fn a_million_keys_take_eight_bytes_a_word_and_are_each_found() {
        let n = 1_000_000u32;
        let ids: Vec<Digest> = (0..n).map(d).collect();
        let index = DigestIndex::default();
        index.reserve(n as usize, index_over(&ids));
        for s in 0..n {
            index.insert(&ids[s as usize], s, index_over(&ids));
        }
        assert_eq!(index.capacity(), 1 << 21, "reserved once, not grown");
        let has = |s: u32, x: &Digest| ids[s as usize].ct_eq(x);
        for s in (0..n).step_by(997) {
            assert_eq!(index.get(&ids[s as usize], has), Some(s));
        }
        assert_eq!(index.get(&d(n + 1), has), None);
    }

    /// A reader never misses a key put before it looked, while a writer grows the array
    /// under it (from 16 words to 2^16) and takes other keys out.
    #[test]
    fn readers_find_every_key_put_while_the_array_grows() {
        let n = 40_000u32;
        let ids: Vec<Digest> = (0..n).map(d).collect();
        let index = DigestIndex::default();
        let put = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for s in 0..n {
                    index.insert(&ids[s as usize], s, index_over(&ids));
                    put.store(s + 1, Ordering::Release);
                    // Every third key put before this one taken out again: tombstones too.
                    if s % 3 == 2 {
                        assert!(index.remove_if(&ids[s as usize - 1], s - 1));
                    }
                }
            });
            scope.spawn(|| {
                let has = |s: u32, x: &Digest| ids[s as usize].ct_eq(x);
                let mut probe = 0u32;
                // Until the writer is done, then once more over what it put.
                loop {
                    let done = put.load(Ordering::Acquire);
                    if done == 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    // A key put and never taken out is found; one put last may be the
                    // next taken out, so it is not asked.
                    let s = probe % done;
                    probe = probe.wrapping_add(7919);
                    if s % 3 != 1 && s + 1 < done {
                        assert_eq!(index.get(&ids[s as usize], has), Some(s), "key {s}");
                    }
                    if done == n && probe > 4 * n {
                        break;
                    }
                }
            });
        });
        assert_eq!(index.len(), (n - n / 3) as usize);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Put(u8),
        Remove(u8),
        Reserve(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => any::<u8>().prop_map(Op::Put),
            3 => any::<u8>().prop_map(Op::Remove),
            1 => any::<u8>().prop_map(Op::Reserve),
        ]
    }

    proptest! {
        /// Puts, removals and reservations in any order find what a plain map finds; slot
        /// `s` is under digest `ids[s]` alone (the rule the segment keeps: a slot is under its
        /// own digest), and several slots share a digest, so puts replace one another.
        #[test]
        fn the_index_finds_what_a_plain_map_finds(ops in proptest::collection::vec(op(), 0..600)) {
            // Few digests, so that puts, replacements and removals meet; slot s ↔ digest s % 64.
            let ids: Vec<Digest> = (0..256).map(|s| d(s % 64)).collect();
            let index = DigestIndex::default();
            let mut model: HashMap<u32, u32> = HashMap::new(); // digest number → slot
            for op in ops {
                match op {
                    Op::Put(s) => {
                        let s = u32::from(s);
                        index.insert(&ids[s as usize], s, index_over(&ids));
                        model.insert(s % 64, s);
                    }
                    Op::Remove(s) => {
                        let s = u32::from(s);
                        let took = index.remove_if(&ids[s as usize], s);
                        let named = model.get(&(s % 64)) == Some(&s);
                        prop_assert_eq!(took, named);
                        if named {
                            model.remove(&(s % 64));
                        }
                    }
                    Op::Reserve(m) => index.reserve(usize::from(m), index_over(&ids)),
                }
                prop_assert_eq!(index.len(), model.len());
            }
            let has = |s: u32, x: &Digest| ids[s as usize].ct_eq(x);
            for k in 0..64u32 {
                prop_assert_eq!(index.get(&d(k), has), model.get(&k).copied());
            }
            prop_assert!(index.len() * 4 <= index.capacity() * 3);
        }
    }
}
