//! A compact hash index of positions into the caller's own array.
//!
//! The key table and the config's duplicate checks need "find the entry with this digest (or
//! name)" over up to millions of entries. A `HashMap<K, u32>` would store every key a second
//! time (a 32-byte digest plus a `u32` is a 40-byte slot). This index stores, per slot, only a
//! one-byte tag (8 bits of the hash) and the position (`u32`), in two arrays, in an
//! open-addressing table kept at most half full, and asks the caller whether the entry at a
//! position is the one wanted: 5 bytes per slot, 10–20 bytes per entry, two allocations, no
//! per-entry heap.
//!
//! Lookups probe linearly from the slot the low bits of the hash pick. The tags are a small
//! array (2 MiB for a million entries) that mostly stays in cache; a position is read, and the
//! caller's entry looked at, only when a tag matches (one time in 255 for a slot of another
//! entry). So a miss — an unknown key — rarely leaves the tag array, and a hit reads one
//! position and one entry. The caller supplies the hash and the comparison (for a digest, a
//! constant-time one).

/// Positions `0..u32::MAX - 1` of the caller's entries, by hash.
#[derive(Debug, Clone, Default)]
pub struct SlotIndex {
    /// `0`: an empty slot; otherwise the tag of the entry in it (never 0).
    tags: Box<[u8]>,
    positions: Box<[u32]>,
    len: usize,
}

/// The largest number of positions an index can hold.
pub const MAX_POSITIONS: usize = u32::MAX as usize - 1;

/// The tag of `hash`: its top byte, never 0 (which marks an empty slot).
fn tag(hash: u64) -> u8 {
    ((hash >> 56) as u8).max(1)
}

impl SlotIndex {
    /// An index for up to `n` positions, never more than half full.
    ///
    /// # Panics
    /// When `n` is above [`MAX_POSITIONS`].
    pub fn with_capacity(n: usize) -> Self {
        assert!(n <= MAX_POSITIONS, "{n} positions do not fit a u32 index");
        let size = n.saturating_mul(2).next_power_of_two().max(8);
        Self {
            tags: vec![0; size].into_boxed_slice(),
            positions: vec![0; size].into_boxed_slice(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Probe from the slot `hash` picks until `is` holds for a position whose tag matches
    /// (`Ok`: that position) or an empty slot ends the probe (`Err`: that slot). A table at most
    /// half full always has an empty slot, so the probe ends.
    fn probe(&self, hash: u64, mut is: impl FnMut(u32) -> bool) -> Result<u32, usize> {
        let mask = self.tags.len() - 1;
        let want = tag(hash);
        let mut slot = hash as usize & mask;
        loop {
            let t = self.tags[slot];
            if t == 0 {
                return Err(slot);
            }
            if t == want && is(self.positions[slot]) {
                return Ok(self.positions[slot]);
            }
            slot = (slot + 1) & mask;
        }
    }

    /// The first position with this `hash` for which `is` holds.
    pub fn find(&self, hash: u64, is: impl FnMut(u32) -> bool) -> Option<u32> {
        if self.tags.is_empty() {
            return None;
        }
        self.probe(hash, is).ok()
    }

    /// Add `pos` under `hash`, unless a position for which `is` holds is already there: then
    /// that position is returned and nothing changes.
    ///
    /// # Panics
    /// When more positions are inserted than the index was made for.
    pub fn insert(&mut self, hash: u64, pos: u32, is: impl FnMut(u32) -> bool) -> Result<(), u32> {
        assert!((pos as usize) <= MAX_POSITIONS);
        let slot = match self.probe(hash, is) {
            Ok(other) => return Err(other),
            Err(free) => free,
        };
        assert!(
            self.len < self.tags.len() / 2,
            "SlotIndex is full: made for fewer positions"
        );
        self.tags[slot] = tag(hash);
        self.positions[slot] = pos;
        self.len += 1;
        Ok(())
    }

    /// Bytes held (for the key-scale measurements).
    pub fn heap_bytes(&self) -> usize {
        self.tags.len() + self.positions.len() * std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_was_inserted_and_refuses_duplicates() {
        let items = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let hash = |s: &str| u64::from(s.as_bytes()[0]) % 3; // many collisions on purpose
        let mut idx = SlotIndex::with_capacity(items.len());
        for (i, s) in items.iter().enumerate() {
            idx.insert(hash(s), i as u32, |p| items[p as usize] == *s)
                .unwrap();
        }
        assert_eq!(idx.len(), items.len());
        for (i, s) in items.iter().enumerate() {
            assert_eq!(
                idx.find(hash(s), |p| items[p as usize] == *s),
                Some(i as u32)
            );
        }
        assert_eq!(idx.find(hash("z"), |p| items[p as usize] == "z"), None);
        // A second "c" is refused with the position of the first.
        let mut more = items.to_vec();
        more.push("c");
        let mut idx2 = SlotIndex::with_capacity(more.len());
        let mut dup = None;
        for (i, s) in more.iter().enumerate() {
            if let Err(first) = idx2.insert(hash(s), i as u32, |p| more[p as usize] == *s) {
                dup = Some((i, first));
            }
        }
        assert_eq!(dup, Some((10, 2)));
    }

    #[test]
    fn empty_and_wrapping() {
        let idx = SlotIndex::default();
        assert_eq!(idx.find(7, |_| true), None);
        let mut idx = SlotIndex::with_capacity(3);
        // Every hash lands on the last slot, so probing wraps around to the start.
        for p in 0..3 {
            idx.insert(u64::MAX, p, |q| q == p).unwrap();
        }
        for p in 0..3 {
            assert_eq!(idx.find(u64::MAX, |q| q == p), Some(p));
        }
        assert_eq!(idx.heap_bytes(), 8 * 5);
    }

    #[test]
    fn equal_tags_and_slots_still_ask_the_caller() {
        // Every entry has the same hash: each probe matches the tag, `is` decides.
        let mut idx = SlotIndex::with_capacity(4);
        for p in 0..4 {
            idx.insert(42, p, |q| q == p).unwrap();
        }
        assert_eq!(idx.insert(42, 9, |q| q == 2), Err(2));
        let mut asked = Vec::new();
        assert_eq!(
            idx.find(42, |q| {
                asked.push(q);
                q == 3
            }),
            Some(3)
        );
        assert_eq!(asked, [0, 1, 2, 3]);
        // A different tag on the same slot is skipped without asking.
        let mut asked = 0;
        assert_eq!(
            idx.find(42 | 7 << 56, |_| {
                asked += 1;
                true
            }),
            None
        );
        assert_eq!(asked, 0);
        // Position 0 and the largest position are stored like any other.
        let mut idx = SlotIndex::with_capacity(2);
        idx.insert(5, 0, |_| false).unwrap();
        idx.insert(6, MAX_POSITIONS as u32, |_| false).unwrap();
        assert_eq!(idx.find(5, |p| p == 0), Some(0));
        assert_eq!(
            idx.find(6, |p| p == MAX_POSITIONS as u32),
            Some(MAX_POSITIONS as u32)
        );
    }

    #[test]
    #[should_panic(expected = "full")]
    fn more_than_the_capacity_panics() {
        let mut idx = SlotIndex::with_capacity(1);
        for p in 0..5 {
            let _ = idx.insert(u64::from(p), p, |_| false);
        }
    }
}
