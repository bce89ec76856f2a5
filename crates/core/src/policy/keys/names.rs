//! The names of a segment's keys in order ([`Names`]): the admin API's pages, and a key found
//! by its name.
//!
//! A slot's name never changes and is held in the slot, so the order keeps slot numbers, not
//! names: a vector of them in their names' order, 4 bytes a key, where a `BTreeMap` of names
//! to slot numbers held some 35 bytes a key (a 24-byte name and a number, eleven to a leaf in
//! a 384-byte class). A name put since is held in a small tree beside it until there are
//! [`Names::MERGE_AT`] such names (or names taken out), and then the two are merged in one
//! pass: each new name's place found by a binary search, the vector copied once around them.
//! At a million keys that is some 20 searches' worth of slots read for each name put, and
//! 4 MB copied once every few thousand changes, not a 4 MB move for each.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use crate::config::keyname::KeyName;

/// Where a name is ([`Names::locate`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Place {
    /// Put since the last merge, in slot .0.
    Recent(u32),
    /// In the vector at position .0, slot .1.
    Sorted(u32, u32),
    /// Nowhere: the name is free.
    Free,
}

impl Place {
    /// The slot of the name, if any.
    pub(super) fn slot(self) -> Option<u32> {
        match self {
            Place::Recent(s) | Place::Sorted(_, s) => Some(s),
            Place::Free => None,
        }
    }
}

/// The names of a segment's keys not deleted, in order, each to its slot; the slots' names
/// read through a function the caller hands each call (the segment's slots).
#[derive(Debug, Default)]
pub(super) struct Names {
    /// Slots, in their names' order, as of the last merge; some taken out since (`holes`).
    sorted: Vec<u32>,
    /// Positions in `sorted` of the slots taken out since the last merge.
    holes: BTreeSet<u32>,
    /// Names put since the last merge.
    recent: BTreeMap<KeyName, u32>,
    /// Names put, or taken out, before a merge (a test's small number; else
    /// [`Names::MERGE_AT`]).
    merge_at: Option<usize>,
}

impl Names {
    /// Names put or taken out between two merges.
    const MERGE_AT: usize = 4096;

    /// Names that merge after `merge_at` changes (tests reach the merge with a few keys).
    #[cfg(test)]
    fn merging_at(merge_at: usize) -> Self {
        Self {
            merge_at: Some(merge_at),
            ..Self::default()
        }
    }

    /// Whether no name is held.
    pub(super) fn is_empty(&self) -> bool {
        self.recent.is_empty() && self.sorted.len() == self.holes.len()
    }

    /// Names in order with no name twice, in place of none: what a start puts back, all
    /// at once.
    pub(super) fn fill(&mut self, names: impl IntoIterator<Item = u32>) {
        debug_assert!(self.is_empty());
        self.fill_anew(names.into_iter().collect());
    }

    /// `sorted` (slots in their names' order) in place of everything held.
    fn fill_anew(&mut self, mut sorted: Vec<u32>) {
        sorted.shrink_to_fit();
        self.sorted = sorted;
        self.holes.clear();
        self.recent.clear();
    }

    /// Names put, or taken out, between two merges.
    fn merge_at(&self) -> usize {
        self.merge_at.unwrap_or(Self::MERGE_AT)
    }

    /// Names in order with no name twice (`more`: a fill's, [`Names::fill`]) put beside
    /// those held, at once: a name held already stays with the slot that holds it when
    /// `keeps(held, new)`, else it is given to the slot `more` has for it. The slots that
    /// lost a name so (held before, or in `more`).
    pub(super) fn extend_sorted<'s>(
        &mut self,
        more: Vec<(KeyName, u32)>,
        name_of: impl Fn(u32) -> &'s KeyName,
        keeps: impl Fn(u32, u32) -> bool,
    ) -> Vec<u32> {
        if self.is_empty() {
            self.fill(more.into_iter().map(|(_, s)| s));
            return Vec::new();
        }
        if more.len() < self.merge_at() {
            return more
                .into_iter()
                .filter_map(|(name, s)| {
                    let place = self.locate(&name, &name_of);
                    match place.slot() {
                        Some(held) if keeps(held, s) => Some(s),
                        _ => self.give(name, s, place, &name_of),
                    }
                })
                .collect();
        }
        // Many: one pass over both, in order (each name held read once).
        let mut held = self
            .after(None, usize::MAX, &name_of)
            .into_iter()
            .peekable();
        let mut merged = Vec::with_capacity(self.sorted.len() + self.recent.len() + more.len());
        let mut displaced = Vec::new();
        for (name, s) in more {
            let mut new = Some(s);
            while let Some(h) = held.next_if(|&h| *name_of(h) <= name) {
                if *name_of(h) == name {
                    if !keeps(h, s) {
                        displaced.push(h);
                        continue;
                    }
                    displaced.push(s);
                    new = None;
                }
                merged.push(h);
            }
            merged.extend(new);
        }
        merged.extend(held);
        self.fill_anew(merged);
        displaced
    }

    /// Where the name `name` is: its slot, if any, and where that is held.
    pub(super) fn locate<'s>(&self, name: &KeyName, name_of: impl Fn(u32) -> &'s KeyName) -> Place {
        if let Some(&s) = self.recent.get(name) {
            return Place::Recent(s);
        }
        match self.position(name, &name_of) {
            Some(at) => Place::Sorted(at, self.sorted[at as usize]),
            None => Place::Free,
        }
    }

    /// The slot of the name `name`.
    pub(super) fn get<'s>(
        &self,
        name: &KeyName,
        name_of: impl Fn(u32) -> &'s KeyName,
    ) -> Option<u32> {
        self.locate(name, name_of).slot()
    }

    /// `name`, found at `place` ([`Names::locate`], nothing changed since), given to slot
    /// `s`; the slot it was given to before, if any.
    pub(super) fn give<'s>(
        &mut self,
        name: KeyName,
        s: u32,
        place: Place,
        name_of: impl Fn(u32) -> &'s KeyName,
    ) -> Option<u32> {
        if let Place::Sorted(at, _) = place {
            self.holes.insert(at);
        }
        self.recent.insert(name, s);
        self.merge_when_due(&name_of);
        place.slot()
    }

    /// `name` given to slot `s`; the slot it was given to before, if any.
    #[cfg(test)]
    pub(super) fn insert<'s>(
        &mut self,
        name: KeyName,
        s: u32,
        name_of: impl Fn(u32) -> &'s KeyName,
    ) -> Option<u32> {
        let place = self.locate(&name, &name_of);
        self.give(name, s, place, name_of)
    }

    /// `name` taken out; the slot it was given to, if any.
    pub(super) fn remove<'s>(
        &mut self,
        name: &KeyName,
        name_of: impl Fn(u32) -> &'s KeyName,
    ) -> Option<u32> {
        let place = self.locate(name, &name_of);
        match place {
            Place::Recent(_) => {
                self.recent.remove(name);
            }
            Place::Sorted(at, _) => {
                self.holes.insert(at);
            }
            Place::Free => {}
        }
        self.merge_when_due(&name_of);
        place.slot()
    }

    /// Up to `n` slots in their names' order, from the first name after `after` (from the
    /// first with `None`).
    pub(super) fn after<'s>(
        &self,
        after: Option<&KeyName>,
        n: usize,
        name_of: impl Fn(u32) -> &'s KeyName,
    ) -> Vec<u32> {
        let from = after.map_or(0, |a| self.sorted.partition_point(|&s| name_of(s) <= a));
        let mut old = (from..self.sorted.len())
            .filter(|&at| !self.holes.contains(&(at as u32)))
            .map(|at| self.sorted[at])
            .peekable();
        let bound = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut new = self.recent.range((bound, Bound::Unbounded)).peekable();
        let mut out = Vec::with_capacity(n.min(self.sorted.len() + self.recent.len()));
        while out.len() < n {
            let take_old = match (old.peek(), new.peek()) {
                (Some(&s), Some((name, _))) => name_of(s) < *name,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => break,
            };
            match take_old {
                true => out.extend(old.next()),
                false => out.extend(new.next().map(|(_, &s)| s)),
            }
        }
        out
    }

    /// The position in `sorted` of the slot that holds `name`, not taken out.
    fn position<'s>(&self, name: &KeyName, name_of: &impl Fn(u32) -> &'s KeyName) -> Option<u32> {
        let first = self.sorted.partition_point(|&s| name_of(s) < name);
        // Of slots of one name, all but one at most were taken out (a name given again).
        (first..self.sorted.len())
            .take_while(|&at| name_of(self.sorted[at]) == name)
            .map(|at| at as u32)
            .find(|at| !self.holes.contains(at))
    }

    /// The names put since the last merge merged with the vector, and the holes closed, once
    /// there are enough of them.
    fn merge_when_due<'s>(&mut self, name_of: &impl Fn(u32) -> &'s KeyName) {
        let at = self.merge_at();
        if self.recent.len() < at && self.holes.len() < at {
            return;
        }
        let recent = std::mem::take(&mut self.recent);
        let holes = std::mem::take(&mut self.holes);
        let old = std::mem::take(&mut self.sorted);
        let mut merged = Vec::with_capacity(old.len() - holes.len() + recent.len());
        let mut holes = holes.into_iter().peekable();
        let mut kept_to = |merged: &mut Vec<u32>, from: usize, to: usize| {
            let mut at = from;
            while let Some(&h) = holes.peek().filter(|&&h| (h as usize) < to) {
                merged.extend_from_slice(&old[at..h as usize]);
                at = h as usize + 1;
                holes.next();
            }
            merged.extend_from_slice(&old[at..to]);
        };
        let mut from = 0;
        for (name, s) in recent {
            let to = from + old[from..].partition_point(|&t| *name_of(t) < name);
            kept_to(&mut merged, from, to);
            merged.push(s);
            from = to;
        }
        kept_to(&mut merged, from, old.len());
        self.sorted = merged;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// A change to the names: a name of 12 put (in a new slot) or taken out, or a page read.
    #[derive(Clone, Debug)]
    enum Op {
        Put(u8),
        Remove(u8),
        Page(Option<u8>, u8),
        /// Names in order, each in a new slot, put at once (a fill's).
        Extend(std::collections::BTreeSet<u8>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..12u8).prop_map(Op::Put),
            2 => (0..12u8).prop_map(Op::Remove),
            1 => (proptest::option::of(0..12u8), 1..6u8).prop_map(|(a, n)| Op::Page(a, n)),
            1 => proptest::collection::btree_set(0..12u8, 0..8).prop_map(Op::Extend),
        ]
    }

    fn name(n: u8) -> KeyName {
        // Names of two lengths, so that a shorter one sorts before its own extension.
        KeyName::new(&format!("{}{}", "k".repeat(usize::from(n % 3)), n))
    }

    /// Each of `ns`'s names in a new slot of `slots`, in name order.
    fn in_new_slots(
        slots: &mut Vec<KeyName>,
        ns: &std::collections::BTreeSet<u8>,
    ) -> Vec<(KeyName, u32)> {
        let mut put: Vec<(KeyName, u32)> = ns
            .iter()
            .map(|&n| {
                slots.push(name(n));
                (name(n), slots.len() as u32 - 1)
            })
            .collect();
        put.sort();
        put
    }

    proptest! {
        /// Whatever is put, taken out and read, in any order, merging after any number of
        /// changes (or filled at once first), the names are those of a plain ordered map of
        /// names to slots: the same slot for each name, the same pages.
        #[test]
        fn the_names_are_an_ordered_map_of_names(
            merge_at in 1..6usize,
            filled in proptest::collection::btree_set(0..12u8, 0..8),
            ops in proptest::collection::vec(op(), 0..80),
        ) {
            let mut slots: Vec<KeyName> = Vec::new();
            let mut model: BTreeMap<KeyName, u32> = BTreeMap::new();
            let mut names = Names::merging_at(merge_at);
            let first = in_new_slots(&mut slots, &filled);
            model.extend(first.iter().cloned());
            names.fill(first.into_iter().map(|(_, s)| s));
            for op in ops {
                match op {
                    Op::Put(n) => {
                        slots.push(name(n));
                        let s = slots.len() as u32 - 1;
                        let of = |s: u32| &slots[s as usize];
                        prop_assert_eq!(names.insert(name(n), s, of), model.insert(name(n), s));
                    }
                    Op::Extend(ns) => {
                        let more = in_new_slots(&mut slots, &ns);
                        // A name held stays where this rule says (any rule: the caller's).
                        let keeps = |held: u32, new: u32| (held + new).is_multiple_of(3);
                        let mut displaced: Vec<u32> = more
                            .iter()
                            .filter_map(|(n, s)| match model.get(n) {
                                Some(&h) if keeps(h, *s) => Some(*s),
                                _ => model.insert(n.clone(), *s),
                            })
                            .collect();
                        displaced.sort_unstable();
                        let of = |s: u32| &slots[s as usize];
                        let mut got = names.extend_sorted(more, of, keeps);
                        got.sort_unstable();
                        prop_assert_eq!(got, displaced);
                    }
                    Op::Remove(n) => {
                        let of = |s: u32| &slots[s as usize];
                        prop_assert_eq!(names.remove(&name(n), of), model.remove(&name(n)));
                    }
                    Op::Page(after, n) => {
                        let of = |s: u32| &slots[s as usize];
                        let after = after.map(name);
                        let want: Vec<u32> = match &after {
                            None => model.values().copied().take(n.into()).collect(),
                            Some(a) => model
                                .range((Bound::Excluded(a), Bound::Unbounded))
                                .map(|(_, &s)| s)
                                .take(n.into())
                                .collect(),
                        };
                        prop_assert_eq!(names.after(after.as_ref(), n.into(), of), want);
                    }
                }
                let of = |s: u32| &slots[s as usize];
                for n in 0..12u8 {
                    prop_assert_eq!(names.get(&name(n), of), model.get(&name(n)).copied());
                }
                prop_assert_eq!(names.is_empty(), model.is_empty());
            }
        }
    }

    /// A merge keeps the vector in order and closes its holes: after as many changes as
    /// trigger one, nothing is left beside it.
    #[test]
    fn a_merge_leaves_one_vector_in_order() {
        let slots: Vec<KeyName> = (0..10).map(|i| KeyName::new(&format!("n{i}"))).collect();
        let of = |s: u32| &slots[s as usize];
        let mut names = Names::merging_at(3);
        names.fill([0, 2, 4, 6]);
        names.remove(&slots[2], of);
        names.insert(slots[5].clone(), 5, of);
        assert_eq!((names.holes.len(), names.recent.len()), (1, 1));
        names.insert(slots[1].clone(), 1, of);
        names.insert(slots[9].clone(), 9, of);
        assert!(names.holes.is_empty() && names.recent.is_empty());
        assert_eq!(names.sorted, [0, 1, 4, 5, 6, 9]);
    }
}
