//! Keys issued through the admin API ([`Issued`]): a segment beside the YAML's compiled table
//! that grows and shrinks one key at a time, so that a sign-up, a rotation or a deletion costs
//! the same with ten keys as with a million (no rebuild of the table, no walk of every key).
//!
//! Each issued key is a [`KeyEntry`] like a YAML key's (the same rate state, meter, flags and
//! quota word: the request path cannot tell them apart), in a slot of an append-only vector
//! ([`boxcar::Vec`]: a slot never moves, so a reader holds `&KeyEntry` without a lock).
//! The digest each key was issued with finds its slot through a lock-free index of slot
//! numbers (`index.rs`: readers never wait on a writer, a writer changes one word, 8 bytes a
//! word where a map of digests cost some 59 a key); the digests a rotation adds, few, through
//! a lock-free map (`digests.rs`). A deleted key's slot stays (marked gone and revoked; its
//! digests leave the map) until the table is next built, at a reload or a restart.
//!
//! Names (in order as slot numbers: `names.rs`) and the instants at which something lapses
//! (an `expires_at`, the end of a rotation's overlap) are for writers and the admin API only,
//! under one mutex.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::credential::{Credential, KeyState};
use super::digests::Digests;
use super::entry::{KeyEntry, Owner, GONE};
use super::flags::{Counts, EXPIRED, REVOKED};
use super::names::Names;
use crate::config::keyname::KeyName;
use crate::config::KeyExtra;
use crate::digest::Digest;
use crate::limit::RateState;

/// One issued key.
#[derive(Debug)]
pub struct Slot {
    /// The key, as the request path reads it. Its `digest` is the one it was issued with (its
    /// id in every store), which after a rotation no longer authenticates.
    pub entry: KeyEntry,
}

// A million slots: the entry's own word says a key was deleted and where what it was issued
// with beyond plan and partner is (`KeyEntry::issued`, in room the entry's layout leaves
// free), so a slot is its entry alone, 104 bytes in `boxcar`'s entry (112 with a pointer).
const _: () = assert!(std::mem::size_of::<Slot>() <= 96);

impl Slot {
    /// Whether the key was deleted.
    pub fn is_gone(&self) -> bool {
        self.entry.issued.load(Ordering::Relaxed) & GONE != 0
    }
}

/// What an issued key is made of when it is put in the segment.
#[derive(Debug)]
pub struct NewIssued<'a> {
    /// Its name.
    pub name: &'a str,
    /// The digest it was issued with.
    pub id: Digest,
    /// Its plan and partner (indexes into this config's), and its own limit (0: its plan's).
    pub credential: Credential,
    /// Expiry, own limit, own quota.
    pub extra: Option<KeyExtra>,
    /// The digests that authenticate now, each until when (`u64::MAX`: for good).
    pub digests: &'a [(Digest, u64)],
    /// Now (ms since the Unix epoch): a key put here past its expiry is expired at once.
    pub now_ms: u64,
}

/// Something that lapses at an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Lapse {
    /// The key expires.
    Key(u32),
    /// An earlier digest stops authenticating.
    Digest(u32, [u8; 32]),
}

/// What writers share.
#[derive(Default)]
struct Book {
    /// Names of the keys not deleted, in order (the admin API's pages), as slot numbers
    /// (`names.rs`).
    names: Names,
    /// While a start or a reload fills an empty segment ([`Issued::reserve`]): the names of
    /// the keys put since `names` was last brought up to date, in the order they were put.
    /// They go in `names` at once, sorted (`Issued::sorted`), when anything reads or changes
    /// the names, and when the fill ends ([`Issued::settle`]): a million keys put back in
    /// their digests' order cost one sort instead of a million searches.
    unsorted: Vec<(KeyName, u32)>,
    /// Keys put now go to `unsorted`.
    filling: bool,
    /// The digests each key has in the map, for the keys that have others than the one they
    /// were issued with (a rotation); a key not here has that one alone (a million keys never
    /// rotated cost nothing here).
    digests: HashMap<u32, Vec<Digest>>,
    /// What lapses when, in order.
    lapses: BTreeSet<(u64, Lapse)>,
    /// The ids of keys that lost their name to another key issued with it (two replicas
    /// issued one name while Redis had forgotten the first: [`Issued::keeps_name`]), for the
    /// caller to take ([`Issued::take_lost`]) and delete where the keys are kept.
    lost: Vec<Digest>,
}

/// The keys issued through the admin API (see the module's docs).
pub struct Issued {
    slots: boxcar::Vec<Slot>,
    /// What keys were issued with beyond plan and partner (expiry, limit, quota), for the
    /// keys that have any: a slot names its own ([`KeyEntry::issued`]).
    extras: boxcar::Vec<KeyExtra>,
    /// The digests that authenticate, each to its slot (`digests.rs`).
    digests: Digests,
    /// Keys not deleted.
    live: AtomicU64,
    /// How many keys not deleted are in each state.
    states: Counts,
    /// How many keys not deleted are on each plan.
    plans: Counts,
    book: Mutex<Book>,
    /// The rate state of the previous table's issued keys, by id, for the keys put here
    /// again (a reload keeps every issued key's budget).
    inherited: Mutex<HashMap<Digest, Arc<RateState>>>,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("slots", &self.slots.count())
            .field("live", &self.len())
            .finish_non_exhaustive()
    }
}

impl Default for Issued {
    fn default() -> Self {
        Self {
            slots: boxcar::Vec::new(),
            extras: boxcar::Vec::new(),
            digests: Digests::default(),
            live: AtomicU64::new(0),
            states: Counts::of_states(0),
            plans: Counts::default(),
            book: Mutex::default(),
            inherited: Mutex::default(),
        }
    }
}

impl Issued {
    /// An empty segment for a config of `plans` plans, that hands each key of `previous` put
    /// here again its rate state.
    pub fn after(previous: Option<&Issued>, plans: usize) -> Self {
        let me = Self {
            plans: Counts::new(plans),
            ..Self::default()
        };
        if let Some(p) = previous.filter(|p| !p.is_empty()) {
            let mut carry = me.inherited_mut();
            for (_, s) in p.slots.iter().filter(|(_, s)| !s.is_gone()) {
                carry.insert(s.entry.digest, Arc::clone(&s.entry.rate));
            }
        }
        me
    }

    /// What writers share, the names up to date.
    fn book(&self) -> MutexGuard<'_, Book> {
        let mut book = self.book_as_is();
        self.sorted(&mut book);
        book
    }

    /// What writers share, the names maybe not up to date (`unsorted`).
    fn book_as_is(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The names put while filling ([`Book::unsorted`]) put in `names`: a name put twice is
    /// the key's that [`Issued::keeps_name`] says, the other deleted, as [`Issued::put`]
    /// does one key at a time.
    fn sorted(&self, book: &mut Book) {
        if book.unsorted.is_empty() {
            return;
        }
        let mut new = std::mem::take(&mut book.unsorted);
        new.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<(KeyName, u32)> = Vec::with_capacity(new.len());
        for (name, s) in new {
            match kept.last_mut() {
                Some(last) if last.0 == name => {
                    let lost = match self.keeps_name(last.1, s) {
                        true => s,
                        false => std::mem::replace(&mut last.1, s),
                    };
                    self.lose(book, lost);
                    self.refind(book, last.1);
                }
                _ => kept.push((name, s)),
            }
        }
        let keeps = |held: u32, new: u32| self.keeps_name(held, new);
        for lost in book.names.extend_sorted(kept, |t| self.name_of(t), keeps) {
            self.lose(book, lost);
            if let Some(w) = book.names.get(self.name_of(lost), |t| self.name_of(t)) {
                self.refind(book, w);
            }
        }
    }

    /// The digests of the key in slot `s` found as its own again (a key that lost its name
    /// to it may have been put later, with a digest of the two: a filled segment then holds
    /// what one filled a key at a time would).
    fn refind(&self, book: &Book, s: u32) {
        match book.digests.get(&s) {
            Some(held) => held.iter().for_each(|&d| self.find_as(d, s)),
            None => self.find_as(self.id_of(s), s),
        }
    }

    /// Whether the key in slot `held` keeps its name from the key in slot `new`, issued
    /// with the same name and another id: the smaller id keeps it. Two live keys of one
    /// name happen only when two replicas issued it while Redis had forgotten the first
    /// (docs/cluster.md, "Two replicas at once"); whatever order each replica learns of
    /// them in, every replica (and every start) settles on the same one.
    fn keeps_name(&self, held: u32, new: u32) -> bool {
        self.id_of(held) < self.id_of(new)
    }

    /// Whether the key in slot `s` was issued as `key` is (plan, partner, limit, expiry,
    /// quota: what an issue sets once).
    fn issued_as(&self, s: u32, key: &NewIssued<'_>) -> bool {
        self.slots[s as usize].entry.configured() == key.credential
            && self.extra(s) == key.extra.as_ref()
    }

    /// The key in slot `s` lost its name: taken out, its id noted for the caller.
    fn lose(&self, book: &mut Book, s: u32) {
        if self.forget(&mut book.digests, s) {
            book.lost.push(self.id_of(s));
        }
    }

    /// The ids of the keys that lost their name to another key since this was last asked
    /// (the smaller id keeps a name): out of this table, still live where they are kept.
    pub fn take_lost(&self) -> Vec<Digest> {
        let mut lost = std::mem::take(&mut self.book_as_is().lost);
        // A key put again after it lost (a whole read) loses again.
        lost.sort_unstable();
        lost.dedup();
        lost
    }

    /// The name of the key in slot `s`.
    fn name_of(&self, s: u32) -> &KeyName {
        &self.slots[s as usize].entry.name
    }

    fn inherited_mut(&self) -> MutexGuard<'_, HashMap<Digest, Arc<RateState>>> {
        self.inherited
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Room for `more` keys, made now rather than as they come (a start or a reload that
    /// puts back a million keys grows each structure once, not twenty times). Made in an
    /// empty segment, it starts a fill: the names of the keys put are sorted in at once, when
    /// read or at the end ([`Issued::settle`]), not one by one (`Book::unsorted`). A fill
    /// puts each key once (a set's records).
    pub fn reserve(&self, more: usize) {
        if self.is_empty() {
            self.book_as_is().filling = true;
        }
        self.slots.reserve(more);
        self.digests.reserve(more, |s| self.id_of(s));
    }

    /// Keys not deleted.
    pub fn len(&self) -> usize {
        self.live.load(Ordering::Relaxed) as usize
    }

    /// Whether no key was ever put here (one load: the request path asks this first).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.slots.count() == 0
    }

    /// Slots, deleted ones included (an issued key's index in its table is the YAML's
    /// entries plus its slot).
    #[inline]
    pub fn slots(&self) -> usize {
        self.slots.count()
    }

    /// The slot at `i`.
    #[inline]
    pub fn slot(&self, i: u32) -> Option<&Slot> {
        self.slots.get(i as usize)
    }

    /// What the key in slot `s` was issued with beyond plan and partner, if anything.
    pub fn extra(&self, s: u32) -> Option<&KeyExtra> {
        let at = self.slot(s)?.entry.issued.load(Ordering::Relaxed) & !GONE;
        self.extras.get(at.checked_sub(1)? as usize)
    }

    /// The slot a digest authenticates as, if any.
    #[inline]
    pub fn lookup(&self, d: &Digest) -> Option<u32> {
        let own = |s: u32, d: &Digest| {
            self.slots
                .get(s as usize)
                .is_some_and(|slot| slot.entry.digest.ct_eq(d))
        };
        self.digests.get(d, own)
    }

    /// The digest slot `s` was issued with (its key's id: what the index holds it under).
    fn id_of(&self, s: u32) -> Digest {
        self.slots[s as usize].entry.digest
    }

    /// `d` made to find slot `s`: in the index when it is the slot's own digest, else among
    /// the rotated ones.
    fn find_as(&self, d: Digest, s: u32) {
        self.digests.insert(d, s, |t| self.id_of(t));
    }

    /// `d` taken out if it finds slot `s` (another key may have taken it since); whether it
    /// did.
    fn unfind(&self, d: Digest, s: u32) -> bool {
        self.digests.remove(d, s, |t| self.id_of(t))
    }

    /// The slot of the key named `name` (not deleted).
    pub fn find(&self, name: &str) -> Option<u32> {
        self.book()
            .names
            .get(&KeyName::new(name), |s| self.name_of(s))
    }

    /// Up to `n` slots in name order, from the first name after `after` (from the first with
    /// `None`).
    pub fn names_after(&self, after: Option<&str>, n: usize) -> Vec<u32> {
        let after = after.map(KeyName::new);
        self.book()
            .names
            .after(after.as_ref(), n, |s| self.name_of(s))
    }

    /// Every slot not deleted, with its index.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Slot)> + '_ {
        self.slots
            .iter()
            .filter(|(_, s)| !s.is_gone())
            .map(|(i, s)| (i as u32, s))
    }

    /// Put the key `key` here, or bring the key of that name up to date with it (its digests
    /// and what lapses: a rotation); its slot. What a slot was issued with (plan, partner,
    /// expiry, limit, quota, id) does not change: a key of the same name with another id is
    /// a new slot, and the one with the larger id loses the name (`None` when
    /// `key` does). (A key deleted is taken out before another takes its name.)
    pub fn put(&self, mut key: NewIssued<'_>) -> Option<u32> {
        let mut book = self.book_as_is();
        let book = &mut *book;
        // Filling, a key whose id no key has yet (every key of a start): its name sorted in
        // later. (Its id known: a rotation, its name found now.)
        if book.filling && self.lookup(&key.id).is_none() {
            let s = self.push(&mut key, &mut book.lapses);
            book.unsorted.push((KeyName::new(key.name), s));
            self.put_digests(book, s, &key, false);
            return Some(s);
        }
        self.sorted(book);
        let name = KeyName::new(key.name);
        // The key of this id under another name (a caller's digest issued under two names
        // while Redis had forgotten the first: one field in Redis, which keeps the later
        // issue): taken out with its name, as a whole read would.
        if let Some(t) = self
            .lookup(&key.id)
            .filter(|&t| self.id_of(t) == key.id && *self.name_of(t) != name)
        {
            if self.forget(&mut book.digests, t) {
                book.names.remove(self.name_of(t), |u| self.name_of(u));
            }
        }
        // The name's key, if any: this one again (a rotation), or another, deleted when this
        // one takes its name.
        let place = book.names.locate(&name, |t| self.name_of(t));
        let (at, known) = match place.slot() {
            Some(s) if self.id_of(s) == key.id && self.issued_as(s, &key) => (s, true),
            Some(s) if self.id_of(s) < key.id => {
                book.lost.push(key.id);
                return None;
            }
            _ => {
                // Another key of that name, if any, loses it to this one; the same key
                // issued otherwise (its id given by the caller on two replicas while Redis
                // had forgotten the first, the later issue kept there) is put anew.
                let s = self.push(&mut key, &mut book.lapses);
                if let Some(old) = book.names.give(name, s, place, |t| self.name_of(t)) {
                    match self.id_of(old) == key.id {
                        true => {
                            self.forget(&mut book.digests, old);
                        }
                        false => self.lose(book, old),
                    }
                }
                (s, false)
            }
        };
        self.put_digests(book, at, &key, known);
        Some(at)
    }

    /// The digests of `key`, in slot `at`, put in the map (those it no longer has taken out,
    /// when it was `known` there), and what lapses of them.
    fn put_digests(&self, book: &mut Book, at: u32, key: &NewIssued<'_>, known: bool) {
        let before = match book.digests.remove(&at) {
            Some(held) => held,
            None if known => vec![key.id],
            None => Vec::new(),
        };
        for d in &before {
            if !key.digests.iter().any(|(n, _)| n == d) {
                self.unfind(*d, at);
            }
        }
        for &(d, until) in key.digests {
            self.find_as(d, at);
            if until != u64::MAX {
                book.lapses.insert((until, Lapse::Digest(at, d.0)));
            }
        }
        // A key with no digest but the one it was issued with (most keys) has no list.
        if !matches!(key.digests, [(d, _)] if *d == key.id) {
            book.digests
                .insert(at, key.digests.iter().map(|&(d, _)| d).collect());
        }
    }

    /// A new slot for `key` (its name not yet in the book), counted, its expiry set.
    fn push(&self, key: &mut NewIssued<'_>, lapses: &mut BTreeSet<(u64, Lapse)>) -> u32 {
        let expires = key.extra.as_ref().and_then(|x| x.expires_ms);
        let rate = {
            let mut inherited = self.inherited_mut();
            match inherited.is_empty() {
                true => None,
                false => inherited.remove(&key.id),
            }
        }
        .unwrap_or_default();
        let quota = crate::metering::pack_quota(key.extra.as_ref().and_then(|x| x.quota));
        // Pushed before the slot that names it: a reader that finds the slot finds it. (A
        // position the word cannot name, past 2^31 keys with extras, some 200 GB, is named as
        // none rather than as another key's.)
        let extra = key.extra.take().map_or(0, |x| {
            let at = self.extras.push(x) + 1;
            u32::try_from(at).ok().filter(|&at| at < GONE).unwrap_or(0)
        });
        let s = self.slots.push(Slot {
            entry: KeyEntry {
                name: KeyName::new(key.name),
                owner: Owner::of(key.credential),
                digest: key.id,
                rate,
                live: AtomicU64::new(0),
                quota: AtomicU64::new(quota),
                issued: AtomicU32::new(extra),
            },
        }) as u32;
        self.live.fetch_add(1, Ordering::Relaxed);
        self.states.add(Some(KeyState::Active as usize), 1);
        self.plans.add(key.credential.plan(), 1);
        match expires {
            Some(ms) if ms <= key.now_ms => {
                self.set_flag(s, EXPIRED, true);
            }
            Some(ms) => {
                lapses.insert((ms, Lapse::Key(s)));
            }
            None => {}
        }
        s
    }

    /// Set or clear state flags of the key in slot `s` (see
    /// [`KeyTable::set_flag`](super::KeyTable::set_flag)); a deleted key is counted in no
    /// state.
    pub(super) fn set_flag(&self, s: u32, flag: u64, on: bool) -> bool {
        let slot = &self.slots[s as usize];
        let (changed, from, to) = slot.entry.set_flag(flag, on);
        if !slot.is_gone() {
            self.states.moved(Some(from as usize), Some(to as usize));
        }
        changed
    }

    /// Put the key in slot `s` on `plan`, or back on the plan it was issued on (see
    /// [`KeyTable::set_plan_override`](super::KeyTable::set_plan_override)).
    pub(super) fn set_plan_override(&self, s: u32, plan: Option<usize>) {
        let slot = &self.slots[s as usize];
        let (from, to) = slot.entry.set_plan_override(plan);
        if !slot.is_gone() {
            self.plans.moved(from, to);
        }
    }

    /// How many keys not deleted are on each plan, by plan index.
    pub(super) fn plans(&self) -> Vec<usize> {
        self.plans.get()
    }

    /// How many keys not deleted are in each state, in [`KeyState::ALL`]'s order.
    pub(super) fn states(&self) -> Vec<usize> {
        self.states.get()
    }

    /// Delete the key in slot `s`: no digest finds it, its name is free again; it stays
    /// revoked for whoever still holds its entry.
    pub fn remove(&self, s: u32) {
        let mut book = self.book();
        let book = &mut *book;
        if self.forget(&mut book.digests, s) {
            book.names.remove(self.name_of(s), |t| self.name_of(t));
        }
    }

    /// Take the key in slot `s` out: no digest finds it, it is counted nowhere; whether it
    /// was not out already. Its name is the caller's to free (or to give another key).
    fn forget(&self, digests: &mut HashMap<u32, Vec<Digest>>, s: u32) -> bool {
        let slot = &self.slots[s as usize];
        if slot.entry.issued.fetch_or(GONE, Ordering::Relaxed) & GONE != 0 {
            return false;
        }
        // Gone first: no change counts it any more.
        let (_, was, _) = slot.entry.set_flag(REVOKED, true);
        self.states.add(Some(was as usize), -1);
        self.plans.add(slot.entry.plan_now(), -1);
        self.live.fetch_sub(1, Ordering::Relaxed);
        let held = digests
            .remove(&s)
            .unwrap_or_else(|| vec![slot.entry.digest]);
        for d in held {
            self.unfind(d, s);
        }
        true
    }

    /// Apply what has lapsed at `wall_ms` (an expiry, an overlap's end); whether anything
    /// did, and the next instant at which something lapses. Each lapse is applied once, in
    /// order: the work is what lapsed, whatever the number of keys.
    pub fn lapse(&self, wall_ms: u64) -> (bool, Option<u64>) {
        let mut book = self.book_as_is();
        let mut changed = false;
        while let Some(&(at, what)) = book.lapses.first() {
            if at > wall_ms {
                break;
            }
            book.lapses.pop_first();
            match what {
                Lapse::Key(s) => changed |= self.set_flag(s, EXPIRED, true),
                Lapse::Digest(s, bytes) => {
                    let d = Digest(bytes);
                    changed |= self.unfind(d, s);
                    if let Some(held) = book.digests.get_mut(&s) {
                        held.retain(|h| *h != d);
                    }
                }
            }
        }
        (changed, book.lapses.first().map(|l| l.0))
    }

    /// The rate states handed over by the previous table and not taken (keys deleted since)
    /// are let go, and any fill ends ([`Issued::reserve`]).
    pub fn settle(&self) {
        self.inherited_mut().clear();
        let mut book = self.book_as_is();
        self.sorted(&mut book);
        book.filling = false;
    }
}
