//! Every record in force, by the key's digest ([`KeyRecords`]), held compactly: a key issued
//! through the admin API whose record holds nothing but its issued part (almost all of a
//! million issued keys) is held in a few words ([`Slim`]; in the tree's node itself, beside
//! the digest, when it has no expiry, limit or quota of its own: [`Plain`]), not as a whole
//! [`KeyRecord`] (a node entry of 168 bytes, its `IssuedKey` boxed in 256, its name and `by`
//! allocated).
//! Readers are handed the record itself ([`Cow`]): borrowed when it is held whole, made
//! again when it is slim, always the record that was put (a property test holds the two to
//! each other). docs/keyscale.md, "The set of records made slim", has the measurements.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroU64};

use super::record::{IssuedKey, KeyRecord, ADMIN};
use crate::config::keyname::KeyName;
use crate::config::QuotaSpec;
use crate::digest::Digest;
use crate::metering::{pack_quota, unpack_quota};

/// Every record kept, by the key's digest.
///
/// A B-tree, not a hash map: it grows a node at a time, where a hash map of a million records
/// doubles at once under the change lock (a create waited 1.2 s at 458,753 records:
/// docs/keyscale.md, "Records made compact").
#[derive(Clone, Default)]
pub struct KeyRecords {
    map: BTreeMap<Digest, Held>,
    /// Every digest an issued key's record holds besides the one it is kept under (a
    /// rotated key's digest in force, and each it had before), with how many records hold
    /// it so: so that no digest a key has or had is issued again ([`KeyRecords::holds`]).
    /// Only rotated keys have any.
    others: BTreeMap<Digest, u32>,
}

/// Two sets are equal when their records are: the index of other digests is made from them.
impl PartialEq for KeyRecords {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl Eq for KeyRecords {}

/// One record as the set holds it.
#[derive(Clone, PartialEq, Eq)]
enum Held {
    /// An issued key with nothing else in force, in the plain shape most have, and no expiry,
    /// limit or quota of its own: its name and [`Slim::since`]'s word, in place.
    Plain(Plain),
    /// An issued key in the plain shape with an expiry, a limit or a quota of its own.
    Slim(Box<Slim>),
    /// Any other record.
    Whole(Box<KeyRecord>),
}

/// A [`Slim`] record whose other words are zero (no expiry, limit or quota of its own):
/// held in the set's node itself.
#[derive(Clone, PartialEq, Eq)]
struct Plain {
    name: KeyName,
    /// [`Slim::since`].
    since: u64,
}

/// An issued key's record that holds its issued part alone, issued by `admin` with no
/// reason, never rotated, managed by no partner: the record is this and its digest, which is
/// the key's `id` and the digest in force. Its instants and small numbers share two words
/// ([`Slim::pack`]); a record whose values do not fit them as they are (an instant past the
/// year 2109, a plan id or a limit past 2^22 - 1, a limit or expiry of zero) is held whole.
#[derive(Clone, PartialEq, Eq)]
struct Slim {
    name: KeyName,
    /// When it was issued, and its `plan_id` in the high bits.
    since: u64,
    /// When it expires (0: never), and its own `requests_per_window` in the high bits (0:
    /// its plan's).
    expires: u64,
    /// [`pack_quota`]'s word (0: none): a quota it cannot hold as it is is held whole.
    quota: u64,
}

/// Bits of an instant (ms since the Unix epoch: until the year 2109) in a slim record's word.
const INSTANT_BITS: u32 = 42;
/// The largest number a slim record's word holds beside an instant.
const SMALL_MAX: u64 = (1 << (64 - INSTANT_BITS)) - 1;

// The entry of a plain key in the tree: 32 bytes of digest and this, 64 bytes, so that a leaf
// of 11 entries (720 bytes) takes mimalloc's class of 768 (at 80 bytes an entry: 896; at 88,
// 1,024). The name's own tag tells the three kinds apart.
const _: () = assert!(std::mem::size_of::<Held>() <= 32);

impl Slim {
    /// `o`, kept under `digest`, in a few words, when it has the plain shape.
    fn of(digest: &Digest, o: &KeyRecord) -> Option<Slim> {
        let KeyRecord {
            key,
            plan_id: None,
            replaced: None,
            partner: None,
            at_ms: 0,
            suspended: None,
            revoked: None,
            limit: None,
            quota: None,
            issued: Some(i),
            yaml: None,
        } = o
        else {
            return None;
        };
        let plain = i.id == *digest
            && i.digest == i.id
            && i.previous.is_empty()
            && i.partner.is_none()
            && i.change.by == ADMIN
            && i.change.reason.is_none()
            && i.rotated_ms.is_none();
        if !plain {
            return None;
        }
        // Zero is "none" in the words: an expiry or a limit of zero is held whole.
        let expires_ms = match i.expires_ms {
            None => 0,
            Some(ms) => NonZeroU64::new(ms)?.get(),
        };
        let requests_per_window = match i.requests_per_window {
            None => 0,
            Some(n) => NonZeroU32::new(n)?.get(),
        };
        let quota = pack_quota(i.quota);
        if unpack_quota(quota) != i.quota {
            return None;
        }
        Some(Slim {
            name: KeyName::new(key),
            since: Self::pack(i.change.since_ms, i.plan_id)?,
            expires: Self::pack(expires_ms, requests_per_window)?,
            quota,
        })
    }

    /// An instant and a small number in one word, when both fit.
    fn pack(instant_ms: u64, small: u32) -> Option<u64> {
        let small = u64::from(small);
        (instant_ms >> INSTANT_BITS == 0 && small <= SMALL_MAX)
            .then_some(instant_ms | small << INSTANT_BITS)
    }

    /// [`Slim::pack`]'s instant and small number.
    fn unpack(word: u64) -> (u64, u32) {
        let small = (word >> INSTANT_BITS) as u32;
        (word & ((1 << INSTANT_BITS) - 1), small)
    }
}

/// A slim record's words, wherever they are held ([`Held::Plain`] or [`Held::Slim`]).
#[derive(Clone, Copy)]
struct Words<'a> {
    name: &'a KeyName,
    since: u64,
    expires: u64,
    quota: u64,
}

impl<'a> Words<'a> {
    /// The record again, as it was put under `digest`.
    fn record(self, digest: &Digest) -> KeyRecord {
        let p = self.parts();
        KeyRecord {
            issued: Some(Box::new(IssuedKey {
                expires_ms: p.expires_ms,
                requests_per_window: p.requests_per_window,
                quota: p.quota,
                ..IssuedKey::plain(*digest, p.plan_id, Slim::unpack(self.since).0)
            })),
            ..KeyRecord::named(p.name)
        }
    }

    /// Its parts, its words unpacked.
    fn parts(self) -> PlainIssued<'a> {
        let (_, plan_id) = Slim::unpack(self.since);
        let (expires_ms, requests_per_window) = Slim::unpack(self.expires);
        PlainIssued {
            name: self.name.as_str(),
            plan_id,
            expires_ms: (expires_ms != 0).then_some(expires_ms),
            requests_per_window: (requests_per_window != 0).then_some(requests_per_window),
            quota: unpack_quota(self.quota),
        }
    }
}

impl Held {
    fn of(digest: &Digest, o: KeyRecord) -> Held {
        match Slim::of(digest, &o) {
            Some(Slim {
                name,
                since,
                expires: 0,
                quota: 0,
            }) => Held::Plain(Plain { name, since }),
            Some(slim) => Held::Slim(Box::new(slim)),
            None => Held::Whole(Box::new(o)),
        }
    }

    /// What it holds: a slim record's words (in place or boxed), or the record.
    fn view(&self) -> View<'_> {
        match self {
            Held::Plain(p) => View::Slim(Words {
                name: &p.name,
                since: p.since,
                expires: 0,
                quota: 0,
            }),
            Held::Slim(s) => View::Slim(Words {
                name: &s.name,
                since: s.since,
                expires: s.expires,
                quota: s.quota,
            }),
            Held::Whole(o) => View::Whole(o),
        }
    }

    fn record(&self, digest: &Digest) -> Cow<'_, KeyRecord> {
        match self.view() {
            View::Slim(w) => Cow::Owned(w.record(digest)),
            View::Whole(o) => Cow::Borrowed(o),
        }
    }

    fn into_record(self, digest: &Digest) -> KeyRecord {
        match self {
            Held::Whole(o) => *o,
            slim => slim.record(digest).into_owned(),
        }
    }
}

/// What a [`Held`] holds, as its readers take it.
enum View<'a> {
    Slim(Words<'a>),
    Whole(&'a KeyRecord),
}

/// A record in the form the set holds it, made before the set is: a start from the fleet's
/// copy gathers a million records, each of which becomes this as it is parsed (a plain
/// issued key's in a few words), so that the whole records are let go one by one instead of
/// all being held until the set is built ([`KeyRecords`]'s `FromIterator<(Digest, Compact)>`).
#[derive(Clone, PartialEq, Eq)]
pub struct Compact(Held);

impl Compact {
    /// `o`, to be kept under `digest`.
    pub fn of(digest: &Digest, o: KeyRecord) -> Self {
        Self(Held::of(digest, o))
    }

    /// Merge `other` into it ([`KeyRecord::merge`]): made whole, merged, held again.
    pub fn merge(&mut self, digest: &Digest, other: KeyRecord) {
        let held = std::mem::replace(&mut self.0, Held::Whole(Box::default()));
        let mut o = held.into_record(digest);
        o.merge(other);
        self.0 = Held::of(digest, o);
    }

    /// The record, as it was put.
    pub fn record(&self, digest: &Digest) -> Cow<'_, KeyRecord> {
        self.0.record(digest)
    }
}

/// A record as the set holds it, read in place ([`KeyRecords::held`]): a plain issued key's
/// parts (no record made again: a start puts back a million of them), or the record itself.
#[derive(Debug)]
pub enum HeldRecord<'a> {
    /// An issued key whose record holds its issued part alone, in the plain shape: issued
    /// by `admin` with no reason, never rotated, managed by no partner, its digest its `id`.
    Plain(PlainIssued<'a>),
    /// Any other record.
    Whole(&'a KeyRecord),
}

/// The parts of a plain issued key's record ([`HeldRecord::Plain`]).
#[derive(Debug, Clone, Copy)]
pub struct PlainIssued<'a> {
    /// The key's name.
    pub name: &'a str,
    /// Its plan, by `plan_id`.
    pub plan_id: u32,
    /// When it expires (ms since the Unix epoch).
    pub expires_ms: Option<u64>,
    /// Its own window limit.
    pub requests_per_window: Option<u32>,
    /// Its own quota.
    pub quota: Option<QuotaSpec>,
}

/// What a reload checks of an issued key ([`check_issued`](super::check_issued)), read where
/// it is held: no record made again.
#[derive(Debug)]
pub struct IssuedView<'a> {
    /// The key's name.
    pub name: &'a str,
    /// Its plan, by `plan_id`.
    pub plan_id: u32,
    /// The partner that manages it.
    pub partner: Option<&'a str>,
    /// Every digest of the key (as [`IssuedKey::digests`]).
    pub digests: Vec<Digest>,
}

impl KeyRecords {
    /// No record.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many records.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Whether a record is kept under `digest`.
    pub fn contains_key(&self, digest: &Digest) -> bool {
        self.map.contains_key(digest)
    }

    /// Whether any record holds `digest`: kept under it (a key's, or a revocation), or as
    /// an issued key's digest in force or one it had before a rotation.
    pub fn holds(&self, digest: &Digest) -> bool {
        self.map.contains_key(digest) || self.others.contains_key(digest)
    }

    /// The record under `digest`.
    pub fn get(&self, digest: &Digest) -> Option<Cow<'_, KeyRecord>> {
        Some(self.map.get(digest)?.record(digest))
    }

    /// The record under `digest`, owned.
    pub fn record(&self, digest: &Digest) -> Option<KeyRecord> {
        self.get(digest).map(Cow::into_owned)
    }

    /// Put `o` under `digest`; the record it replaces.
    pub fn insert(&mut self, digest: Digest, o: KeyRecord) -> Option<KeyRecord> {
        let others = others_of(&digest, &o);
        let before = self
            .map
            .insert(digest, Held::of(&digest, o))
            .map(|h| h.into_record(&digest));
        if let Some(b) = &before {
            unindex(&mut self.others, &digest, b);
        }
        for d in others {
            *self.others.entry(d).or_default() += 1;
        }
        before
    }

    /// Take the record under `digest` out.
    pub fn remove(&mut self, digest: &Digest) -> Option<KeyRecord> {
        let before = self.map.remove(digest)?.into_record(digest);
        unindex(&mut self.others, digest, &before);
        Some(before)
    }

    /// Every record, in the order of their digests.
    pub fn iter(&self) -> impl Iterator<Item = (&Digest, Cow<'_, KeyRecord>)> + '_ {
        self.map.iter().map(|(d, h)| (d, h.record(d)))
    }

    /// Every record as it is held, in the order of their digests: a plain issued key's parts
    /// read in place, any other record borrowed.
    pub fn held(&self) -> impl Iterator<Item = (&Digest, HeldRecord<'_>)> + '_ {
        self.map.iter().map(|(d, h)| {
            let held = match h.view() {
                View::Slim(w) => HeldRecord::Plain(w.parts()),
                View::Whole(o) => HeldRecord::Whole(o),
            };
            (d, held)
        })
    }

    /// The record under `digest` when it is held slim (an issued key's issued part alone, in
    /// the plain shape), made again; `None` for any other record, or none.
    pub fn slim(&self, digest: &Digest) -> Option<KeyRecord> {
        match self.map.get(digest)?.view() {
            View::Slim(w) => Some(w.record(digest)),
            View::Whole(_) => None,
        }
    }

    /// The records held slim ([`KeyRecords::slim`]) among the first `n` records after the
    /// digest `after` (from the first when `None`), in order; and the last digest looked at,
    /// to go on from (`None` once every record was looked at). A walk of a million records
    /// in steps, so that readers wait for a step, not the walk.
    pub fn slim_after(
        &self,
        after: Option<&Digest>,
        n: usize,
    ) -> (Vec<(Digest, KeyRecord)>, Option<Digest>) {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut last = None;
        let mut slim = Vec::new();
        for (d, h) in self.map.range((from, Bound::Unbounded)).take(n) {
            last = Some(*d);
            if let View::Slim(w) = h.view() {
                slim.push((*d, w.record(d)));
            }
        }
        (slim, last)
    }

    /// Every digest, in order.
    pub fn keys(&self) -> impl Iterator<Item = &Digest> + '_ {
        self.map.keys()
    }

    /// The records held whole, in the order of their digests: every record but a plain
    /// issued key's that holds nothing else, so every one that holds an upgrade, a
    /// suspension, a revocation, a live limit or quota. Read in place: a count of those over
    /// a million issued keys makes none again.
    pub fn whole(&self) -> impl Iterator<Item = (&Digest, &KeyRecord)> + '_ {
        self.map.iter().filter_map(|(d, h)| match h.view() {
            View::Slim(_) => None,
            View::Whole(o) => Some((d, o)),
        })
    }

    /// How many records issue a key: counted without making any again.
    pub fn issued_count(&self) -> usize {
        self.map
            .values()
            .filter(|h| match h.view() {
                View::Slim(_) => true,
                View::Whole(o) => o.issued.is_some(),
            })
            .count()
    }

    /// Every issued key's name, plan, partner and digests, read where they are held.
    pub fn issued(&self) -> impl Iterator<Item = IssuedView<'_>> + '_ {
        self.map.iter().filter_map(|(d, h)| match h.view() {
            View::Slim(w) => Some(IssuedView {
                name: w.name.as_str(),
                plan_id: Slim::unpack(w.since).1,
                partner: None,
                digests: vec![*d],
            }),
            View::Whole(o) => {
                let i = o.issued.as_deref()?;
                Some(IssuedView {
                    name: o.key.as_str(),
                    plan_id: i.plan_id,
                    partner: i.partner.as_deref(),
                    digests: i.digests(),
                })
            }
        })
    }
}

/// The digests `o`, kept under `digest`, holds besides it: an issued key's in force and
/// those it had (none for a key never rotated).
fn others_of(digest: &Digest, o: &KeyRecord) -> Vec<Digest> {
    match o.issued.as_deref() {
        Some(i) if !i.previous.is_empty() || i.digest != *digest || i.id != *digest => {
            i.digests().into_iter().filter(|d| d != digest).collect()
        }
        _ => Vec::new(),
    }
}

/// Take out of `others` the digests `o`, which was kept under `digest`, held besides it.
fn unindex(others: &mut BTreeMap<Digest, u32>, digest: &Digest, o: &KeyRecord) {
    for d in others_of(digest, o) {
        if let std::collections::btree_map::Entry::Occupied(mut n) = others.entry(d) {
            *n.get_mut() -= 1;
            if *n.get() == 0 {
                n.remove();
            }
        }
    }
}

impl KeyRecords {
    /// Built in one go from `map`, the index of other digests made from its whole records
    /// (a slim one is an issued key never rotated: its one digest is the one it is under).
    fn of_map(map: BTreeMap<Digest, Held>) -> Self {
        let mut others = BTreeMap::new();
        for (d, h) in &map {
            if let View::Whole(o) = h.view() {
                for x in others_of(d, o) {
                    *others.entry(x).or_default() += 1;
                }
            }
        }
        Self { map, others }
    }
}

impl FromIterator<(Digest, KeyRecord)> for KeyRecords {
    /// Built in one go: from records in their digests' order the tree's nodes are full. A
    /// digest given twice keeps its last record, as [`KeyRecords::insert`] would.
    fn from_iter<I: IntoIterator<Item = (Digest, KeyRecord)>>(iter: I) -> Self {
        Self::of_map(
            iter.into_iter()
                .map(|(d, o)| (d, Held::of(&d, o)))
                .collect(),
        )
    }
}

impl FromIterator<(Digest, Compact)> for KeyRecords {
    /// Built in one go, as from whole records (the same order and the same rule for a digest
    /// given twice).
    fn from_iter<I: IntoIterator<Item = (Digest, Compact)>>(iter: I) -> Self {
        Self::of_map(iter.into_iter().map(|(d, c)| (d, c.0)).collect())
    }
}

impl IntoIterator for KeyRecords {
    type Item = (Digest, KeyRecord);
    type IntoIter = Box<dyn Iterator<Item = (Digest, KeyRecord)>>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.map.into_iter().map(|(d, h)| {
            let o = h.into_record(&d);
            (d, o)
        }))
    }
}

impl<'a> IntoIterator for &'a KeyRecords {
    type Item = (&'a Digest, Cow<'a, KeyRecord>);
    type IntoIter = Box<dyn Iterator<Item = Self::Item> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl std::fmt::Debug for KeyRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;
