//! The order of the changes kept for keys: how the copies that replicas hold, and the one in
//! the store where they meet, merge into one, whatever order they meet in.
//!
//! Each part of a digest's record ([`Part`]) is kept on its own under a *field* (a hash of
//! the digest, then the part's suffix), as a [`Kept`]: a version and the part as JSON. A part
//! taken out (a resume, a limit or quota cleared, an upgrade taken back, a reload's drop) is
//! kept too, as a *tombstone*: a record holding no part, with the version of its removal, so
//! that a later removal beats an earlier change wherever the two meet. Two copies of one
//! field merge by [`Kept::replaces`]:
//!
//! | part | the copy kept |
//! |---|---|
//! | a revocation | a revocation, whatever the versions: it is never undone; of two, the earlier (the one kept first) |
//! | any other | the later version; on a tie, the larger text (every copy picks the same one) |
//!
//! Merging is therefore commutative, associative and idempotent: copies that met in any order,
//! any number of times, hold the same ([`merge`]; the property tests below check it). The store
//! applies the same rule in its scripts, so a store that lost its data and is put back by every
//! replica ends as if nothing was lost.
//!
//! Versions are readings of a hybrid logical clock ([`Hlc`]): the wall clock in µs (ms × 1000
//! and a counter), never behind a version the replica has seen. A change made after another
//! was seen is later, whatever the two replicas' clocks say; the store's write script also
//! moves a change past the version it replaces ([`Kept`] is what it answers).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use super::overrides::{KeyRecord, Part};
use super::packed::Packed;

/// A kept part's version: a [`Hlc`] reading.
pub type Version = u64;

/// Digits of a version as kept (zero-padded, so that the texts order as the numbers do).
pub const VERSION_DIGITS: usize = super::packed::VERSION_DIGITS;

/// The largest version: a Lua number (a double) holds it exactly, as the store's scripts
/// compare and add to it (µs since the Unix epoch reach it in the year 2255).
pub const MAX_VERSION: Version = (1 << 53) - 1;

/// Fields as a store holds them, by name (a field's name is a digest's hash and a part's
/// suffix). A B-tree, not a hash map: a replica's copy holds a field for each of a million
/// issued keys, and a hash map doubles at once, under the copy's lock that every change
/// takes (a create waited over a second at some 917,000 keys: docs/keyscale.md), where a
/// B-tree grows a node at a time, in less memory a field.
pub type Fields = BTreeMap<String, Kept>;

/// One part of a digest's record as it is kept: `<version>|<JSON>` (a record written before
/// versions, plain JSON, reads as version 0). The text is held packed (`policy/packed.rs`:
/// a million issued keys' parts in a replica's copy) and given back byte for byte.
#[derive(Clone, PartialEq, Eq)]
pub struct Kept {
    /// When it was made, in the order of changes.
    pub version: Version,
    /// The text kept, version included: what the store holds, byte for byte.
    text: Packed,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kept")
            .field("version", &self.version)
            .field("raw", &self.raw())
            .finish()
    }
}

impl Kept {
    /// The kept form of `record` (one part, or none: a tombstone) at `version`.
    pub fn new(version: Version, record: &KeyRecord) -> Self {
        let json = serde_json::to_string(record).expect("a record serializes");
        Self::of_json(version, &json)
    }

    /// The text [`Kept::new`] keeps for `record` at `version` (its [`Kept::raw`]), made
    /// without packing it first.
    pub fn raw_of(version: Version, record: &KeyRecord) -> String {
        let json = serde_json::to_string(record).expect("a record serializes");
        format!(
            "{:0width$}|{json}",
            version.min(MAX_VERSION),
            width = VERSION_DIGITS
        )
    }

    /// `json` at `version`.
    pub fn of_json(version: Version, json: &str) -> Self {
        let version = version.min(MAX_VERSION);
        Self {
            version,
            text: Packed::versioned(json),
        }
    }

    /// A kept text as the store holds it; `None` when it is neither form.
    pub fn parse(raw: &str) -> Option<Self> {
        let version = Self::version_of(raw)?;
        Some(Self {
            version,
            text: Packed::pack(raw, version),
        })
    }

    /// The text kept, version included: what the store holds, byte for byte.
    pub fn raw(&self) -> String {
        self.text.text(self.version)
    }

    /// The version of a kept text as the store holds it; `None` when it is neither form.
    pub fn version_of(raw: &str) -> Option<Version> {
        match raw.as_bytes().get(VERSION_DIGITS) {
            Some(b'|')
                if raw.as_bytes()[..VERSION_DIGITS]
                    .iter()
                    .all(u8::is_ascii_digit) =>
            {
                raw[..VERSION_DIGITS].parse().ok()
            }
            _ if raw.starts_with('{') => Some(0),
            _ => None,
        }
    }

    /// The JSON part of a kept text.
    fn json_of(raw: &str) -> &str {
        match raw.split_once('|') {
            Some((v, json)) if v.len() == VERSION_DIGITS => json,
            _ => raw,
        }
    }

    /// The record a kept text holds (one part, or none); `None` when its JSON is not a record.
    pub fn record_of(raw: &str) -> Option<KeyRecord> {
        serde_json::from_str(Self::json_of(raw)).ok()
    }

    /// The record it holds (one part, or none); `None` when its JSON is not a record.
    pub fn record(&self) -> Option<KeyRecord> {
        Self::record_of(&self.raw())
    }

    /// Whether it holds no part: a removal.
    pub fn is_tombstone(&self) -> bool {
        self.record().is_none_or(|o| o.is_empty())
    }

    /// Whether it holds a revocation.
    fn revokes(&self) -> bool {
        self.record().is_some_and(|o| o.revoked.is_some())
    }

    /// Whether this copy of a field of `part` replaces `current` (see the module's table).
    pub fn replaces(&self, part: Part, current: &Kept) -> bool {
        let (mine, theirs) = (self.raw(), current.raw());
        let later = (self.version, &mine) > (current.version, &theirs);
        if part != Part::Revoked {
            return later;
        }
        match (self.revokes(), current.revokes()) {
            (true, false) => true,
            (false, true) => false,
            // The earliest revocation: the one every copy keeps, whichever came first.
            (true, true) => (self.version, &mine) < (current.version, &theirs),
            (false, false) => later,
        }
    }
}

/// The part a field kept in the store holds: a 32-character hash of the digest, then the
/// part's suffix; `None` for any other name (the store's own marks).
pub fn part_of_field(field: &str) -> Option<Part> {
    let (_, suffix) = field.split_at_checked(32)?;
    Part::of_suffix(suffix)
}

/// Merge the copy `from` into `into`, field by field ([`Kept::replaces`]); the fields that
/// changed in `into`. Fields that name no part are ignored.
pub fn merge(
    into: &mut HashMap<String, Kept>,
    from: impl IntoIterator<Item = (String, Kept)>,
) -> Vec<String> {
    let mut changed = Vec::new();
    for (field, kept) in from {
        let Some(part) = part_of_field(&field) else {
            continue;
        };
        let replace = into.get(&field).is_none_or(|cur| kept.replaces(part, cur));
        if replace {
            changed.push(field.clone());
            into.insert(field, kept);
        }
    }
    changed
}

/// A hybrid logical clock: each reading later than the last one given and than every version
/// seen, and otherwise the wall clock (ms × 1000, so that a thousand changes fit in one ms).
#[derive(Debug, Default)]
pub struct Hlc {
    last: AtomicU64,
}

impl Hlc {
    /// A version for a change made at the wall clock's `wall_ms`.
    pub fn next(&self, wall_ms: u64) -> Version {
        let floor = wall_ms.saturating_mul(1000).min(MAX_VERSION);
        let mut cur = self.last.load(Ordering::Acquire);
        loop {
            let v = floor.max(cur.saturating_add(1)).min(MAX_VERSION);
            match self
                .last
                .compare_exchange_weak(cur, v, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return v,
                Err(actual) => cur = actual,
            }
        }
    }

    /// A version seen (in the store, or another replica's): later readings are past it.
    pub fn observe(&self, v: Version) {
        self.last.fetch_max(v.min(MAX_VERSION), Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::overrides::Change;

    /// The text made without packing is the one kept, for versions of every width and the
    /// largest.
    #[test]
    fn a_text_made_at_once_is_the_one_kept() {
        let mut o = KeyRecord::named("k");
        o.suspended = Some(Box::new(Change {
            since_ms: 1,
            by: "admin".into(),
            reason: Some("a \"reason\"".into()),
        }));
        for v in [0, 7, 1_700_000_000_000_123, MAX_VERSION, u64::MAX] {
            for r in [&o, &KeyRecord::named("k")] {
                assert_eq!(Kept::raw_of(v, r), Kept::new(v, r).raw(), "{v}");
            }
        }
    }

    fn field(suffix: &str) -> String {
        format!("{}{suffix}", "a".repeat(32))
    }

    fn suspended(v: Version, since_ms: u64) -> Kept {
        let o = KeyRecord {
            suspended: Some(Box::new(Change {
                since_ms,
                by: "admin".into(),
                reason: None,
            })),
            ..KeyRecord::named("k")
        };
        Kept::new(v, &o)
    }

    #[test]
    fn a_later_resume_beats_an_earlier_suspension_and_a_revocation_stays() {
        let f = field(":s");
        let mut a = HashMap::from([(f.clone(), suspended(5, 1))]);
        let resume = Kept::new(6, &KeyRecord::named("k"));
        assert!(resume.is_tombstone());
        let b = HashMap::from([(f.clone(), resume.clone())]);
        // Either order: the resume.
        let mut c = b.clone();
        merge(&mut a, b);
        merge(&mut c, HashMap::from([(f.clone(), suspended(5, 1))]));
        assert_eq!(a[&f], resume);
        assert_eq!(c[&f], resume);

        let r = field(":r");
        let revoked = |v: Version, since_ms: u64| {
            Kept::new(
                v,
                &KeyRecord {
                    revoked: Some(Box::new(Change {
                        since_ms,
                        by: "admin".into(),
                        reason: None,
                    })),
                    ..KeyRecord::named("k")
                },
            )
        };
        let mut kept = HashMap::from([(r.clone(), revoked(3, 3))]);
        let changed = merge(
            &mut kept,
            [
                (r.clone(), revoked(9, 9)),
                (r.clone(), Kept::new(10, &KeyRecord::named("k"))),
            ],
        );
        assert!(changed.is_empty());
        assert_eq!(kept[&r], revoked(3, 3), "the first revocation stays");
        // Met the other way round: the same one.
        let mut other = HashMap::from([(r.clone(), revoked(9, 9))]);
        merge(&mut other, [(r.clone(), revoked(3, 3))]);
        assert_eq!(other[&r], revoked(3, 3));
    }

    #[test]
    fn a_kept_text_reads_back_and_plain_json_is_version_0() {
        let k = suspended(1_796_083_200_000_123, 7);
        assert!(k.raw().starts_with("1796083200000123|{"));
        assert_eq!(Kept::parse(&k.raw()), Some(k.clone()));
        assert_eq!(k.record().unwrap().suspended.unwrap().since_ms, 7);
        let legacy = Kept::parse(r#"{"key":"k","plan_id":2}"#).unwrap();
        assert_eq!(legacy.version, 0);
        assert_eq!(legacy.record().unwrap().plan_id, Some(2));
        assert!(k.replaces(Part::Suspended, &legacy));
        for bad in ["", "12|{}", "x|{}", "0000000000000001"] {
            assert_eq!(Kept::parse(bad), None, "{bad:?}");
        }
        assert_eq!(part_of_field(&field(":q")), Some(Part::Quota));
        assert_eq!(part_of_field(&field("")), Some(Part::Plan));
        assert_eq!(part_of_field("~epoch"), None);
    }

    /// A million issued keys' parts are held in a replica's copy: each packed in under two
    /// fifths of its text, and read back as it was.
    #[test]
    fn an_issued_keys_part_is_held_in_under_two_fifths_of_its_text() {
        use crate::digest::Digest;
        use crate::policy::overrides::IssuedKey;
        let id = Digest::of(b"k");
        let o = KeyRecord {
            issued: Some(Box::new(IssuedKey::plain(id, 2, 1_796_083_200_000))),
            ..KeyRecord::named("shop-0000001")
        };
        let k = Kept::new(1_796_083_200_000_123, &o);
        let raw = k.raw();
        assert_eq!(Kept::parse(&raw), Some(k.clone()));
        assert_eq!(k.record(), Some(o));
        assert!(
            k.text.len() * 5 < raw.len() * 2,
            "{} of {}",
            k.text.len(),
            raw.len()
        );
    }

    #[test]
    fn the_clock_moves_past_what_it_saw_and_never_back() {
        let c = Hlc::default();
        let a = c.next(1_000);
        assert_eq!(a, 1_000_000);
        assert_eq!(c.next(1_000), 1_000_001, "same ms: one more");
        assert_eq!(c.next(999), 1_000_002, "a clock stepped back: still later");
        c.observe(5_000_000);
        assert_eq!(
            c.next(1_001),
            5_000_001,
            "later than what another replica wrote"
        );
        assert_eq!(c.next(6_000), 6_000_000);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// A copy: a few fields of a few parts, each a change or a tombstone at a small version
        /// (so that ties happen).
        fn copy() -> impl Strategy<Value = Vec<(String, Kept)>> {
            let one = (0u8..3, 0usize..5, 0u64..6, any::<bool>(), 0u64..3).prop_map(
                |(digest, part, version, tombstone, since)| {
                    let part = Part::ALL[part];
                    let field = format!(
                        "{}{}",
                        char::from(b'a' + digest).to_string().repeat(32),
                        part.suffix()
                    );
                    let mut o = KeyRecord::named("k");
                    if !tombstone {
                        let c = Change {
                            since_ms: since,
                            by: "admin".into(),
                            reason: None,
                        };
                        match part {
                            Part::Plan => o.plan_id = Some(since as u32 + 1),
                            Part::Suspended => o.suspended = Some(Box::new(c)),
                            Part::Revoked => o.revoked = Some(Box::new(c)),
                            Part::Limit => {
                                o.limit = Some(Box::new(crate::policy::overrides::LimitChange {
                                    requests_per_window: since as u32 + 1,
                                    change: c,
                                }))
                            }
                            Part::Quota | Part::Issued => o.yaml = Some(since.to_string()),
                        }
                    }
                    (field, Kept::new(version, &o))
                },
            );
            proptest::collection::vec(one, 0..8)
        }

        fn merged(copies: &[&Vec<(String, Kept)>]) -> HashMap<String, Kept> {
            let mut into = HashMap::new();
            for c in copies {
                merge(&mut into, (*c).clone());
            }
            into
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

            /// Copies met in any order, any number of times, hold the same.
            #[test]
            fn merging_is_a_join(a in copy(), b in copy(), c in copy()) {
                let abc = merged(&[&a, &b, &c]);
                prop_assert_eq!(&abc, &merged(&[&c, &a, &b]));
                prop_assert_eq!(&abc, &merged(&[&b, &c, &a, &b, &a]));
                // Associative: (a ∪ b) ∪ c = a ∪ (b ∪ c).
                let mut bc = merged(&[&b, &c]);
                merge(&mut bc, a.clone());
                prop_assert_eq!(&abc, &bc);
            }

            /// What the merge keeps of a field: a revocation whenever any copy has one (the
            /// earliest); otherwise the latest version.
            #[test]
            fn a_revocation_is_never_undone_and_otherwise_the_latest_wins(a in copy(), b in copy()) {
                let all = merged(&[&a, &b]);
                for (f, k) in a.iter().chain(&b) {
                    let kept = &all[f];
                    if f.ends_with(":r") && k.revokes() {
                        prop_assert!(kept.revokes(), "{} undone", f);
                        prop_assert!(kept.version <= k.version);
                    } else if !f.ends_with(":r") {
                        prop_assert!(kept.version >= k.version);
                    }
                }
            }
        }
    }
}
