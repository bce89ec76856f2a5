//! The set of records in force read back as it was put, whatever shape each record has.

use proptest::prelude::*;

use super::*;
use crate::policy::overrides::{LimitChange, Part, PreviousDigest};

fn issued(d: Digest) -> KeyRecord {
    KeyRecord {
        issued: Some(Box::new(IssuedKey::plain(d, 2, 1_700_000_000_000))),
        ..KeyRecord::named("acct-1")
    }
}

/// An instant: small, the largest a slim record's word holds, one past it, the last.
fn any_instant() -> impl Strategy<Value = u64> {
    let last = (1 << INSTANT_BITS) - 1;
    prop_oneof![
        0u64..3,
        Just(1_700_000_000_000),
        Just(last),
        Just(last + 1),
        Just(u64::MAX)
    ]
}

/// A plan id or limit: small, the largest a slim record's word holds, one past it, the last.
fn any_small() -> impl Strategy<Value = u32> {
    let last = SMALL_MAX as u32;
    prop_oneof![0u32..3, Just(last), Just(last + 1), Just(u32::MAX)]
}

/// A record of every shape: plain issued keys (with and without an expiry, a limit, a
/// quota, zeros and values past what the slim form's words hold among them, and the
/// same of its plan id and instant), and each way one stops being plain.
fn any_record() -> impl Strategy<Value = (Digest, KeyRecord)> {
    (
        (any::<[u8; 4]>(), 0u8..12, any_small(), any_instant()),
        proptest::option::of(any_instant()),
        proptest::option::of(any_small()),
        proptest::option::of(0u64..3),
        "[a-z0-9-]{1,40}",
    )
        .prop_map(
            |((seed, shape, plan_id, since_ms), expires, limit, quota, name)| {
                let d = Digest::of(&seed);
                let mut o = issued(d);
                o.key = name;
                let i = o.issued.as_deref_mut().unwrap();
                i.plan_id = plan_id;
                i.change.since_ms = since_ms;
                i.expires_ms = expires;
                i.requests_per_window = limit;
                // A quota the slim form holds, its largest, and one past it (held whole).
                i.quota = quota.map(|q| QuotaSpec {
                    requests: [1_000, crate::config::MAX_QUOTA_REQUESTS][..]
                        .get(q as usize)
                        .copied()
                        .unwrap_or(crate::config::MAX_QUOTA_REQUESTS + 1),
                    per: crate::config::Period::Month,
                });
                match shape {
                    0 => i.id = Digest::of(b"another"),
                    1 => i.digest = Digest::of(b"rotated"),
                    2 => i.previous.push(PreviousDigest {
                        digest: Digest::of(b"before"),
                        until_ms: 5,
                    }),
                    3 => i.partner = Some("acme".into()),
                    4 => i.change.by = "partner:acme".into(),
                    5 => i.change.reason = Some("why".into()),
                    6 => i.rotated_ms = Some(7),
                    7 => o.yaml = Some("fp".into()),
                    8 => {
                        o.limit = Some(Box::new(LimitChange {
                            requests_per_window: 3,
                            change: i.change.clone(),
                        }))
                    }
                    9 => o.issued = None,
                    _ => {}
                }
                if o.is_empty() {
                    o.at_ms = 9;
                    o.plan_id = Some(1);
                }
                (d, o)
            },
        )
}

proptest! {
    /// Whatever is put, the same record is read back, by `get`, `iter`, `remove` and
    /// `into_iter`, and a record replaced is handed back whole.
    #[test]
    fn every_record_is_read_back_as_it_was_put(
        records in proptest::collection::vec(any_record(), 0..40),
    ) {
        let mut set = KeyRecords::new();
        let mut plain: BTreeMap<Digest, KeyRecord> = BTreeMap::new();
        for (d, o) in &records {
            prop_assert_eq!(set.insert(*d, o.clone()), plain.insert(*d, o.clone()));
        }
        prop_assert_eq!(set.len(), plain.len());
        for (d, o) in &plain {
            prop_assert_eq!(set.record(d), Some(o.clone()));
        }
        let read: Vec<(Digest, KeyRecord)> =
            set.iter().map(|(d, o)| (*d, o.into_owned())).collect();
        let want: Vec<(Digest, KeyRecord)> =
            plain.iter().map(|(d, o)| (*d, o.clone())).collect();
        prop_assert_eq!(&read, &want);
        prop_assert_eq!(
            set.issued_count(),
            plain.values().filter(|o| o.issued.is_some()).count()
        );
        let names: Vec<(String, u32)> =
            set.issued().map(|v| (v.name.to_string(), v.plan_id)).collect();
        let want_names: Vec<(String, u32)> = plain
            .values()
            .filter_map(|o| Some((o.key.clone(), o.issued.as_ref()?.plan_id)))
            .collect();
        prop_assert_eq!(names, want_names);
        let whole: Vec<(Digest, KeyRecord)> =
            set.whole().map(|(d, o)| (*d, o.clone())).collect();
        let beyond: Vec<(Digest, KeyRecord)> = plain
            .iter()
            .filter(|(_, o)| Part::ALL.into_iter().any(|p| p != Part::Issued && o.has(p)))
            .map(|(d, o)| (*d, o.clone()))
            .collect();
        prop_assert!(whole.iter().all(|w| want.contains(w)));
        prop_assert!(beyond.iter().all(|b| whole.contains(b)));
        prop_assert_eq!(KeyRecords::from_iter(records.clone()), set.clone());
        // Made compact first (a start's gather), the same set; and a record merged into a
        // compact one is the merge of the records.
        let compact = records.iter().map(|(d, o)| (*d, Compact::of(d, o.clone())));
        prop_assert_eq!(KeyRecords::from_iter(compact), set.clone());
        if let [(d, first), (_, second), ..] = &records[..] {
            let mut c = Compact::of(d, first.clone());
            c.merge(d, second.clone());
            let mut merged = first.clone();
            merged.merge(second.clone());
            prop_assert_eq!(c.record(d).into_owned(), merged);
        }
        prop_assert_eq!(set.clone().into_iter().collect::<Vec<_>>(), want);
        // Every digest a record holds is held (its own, an issued key's in force and each it
        // had), by the set built one record at a time and by the one built in one go.
        let built = KeyRecords::from_iter(records.clone());
        for (d, o) in &plain {
            let all = o.issued.as_ref().map(|i| i.digests()).unwrap_or_default();
            for x in std::iter::once(*d).chain(all) {
                prop_assert!(set.holds(&x) && built.holds(&x));
            }
        }
        for (d, o) in &plain {
            prop_assert_eq!(set.remove(d), Some(o.clone()));
        }
        prop_assert!(set.is_empty());
        prop_assert!(set.others.is_empty(), "nothing held once every record is out");
    }
}

/// The plain shape is held slim (in the node with no expiry, limit or quota of its own, in a
/// box of its words with one), and each way out of it is held whole.
#[test]
fn a_plain_issued_key_is_held_slim_and_any_other_whole() {
    let d = Digest::of(b"k");
    let mut set = KeyRecords::from_iter([(d, issued(d))]);
    assert!(matches!(set.map[&d], Held::Plain(_)));
    // An expiry, a limit or a quota of its own: its words boxed.
    for own in 0..3 {
        let mut o = issued(d);
        let i = o.issued.as_deref_mut().unwrap();
        match own {
            0 => i.expires_ms = Some(1_000),
            1 => i.requests_per_window = Some(7),
            _ => {
                i.quota = Some(QuotaSpec {
                    requests: 10,
                    per: crate::config::Period::Day,
                })
            }
        }
        set.insert(d, o.clone());
        assert!(matches!(set.map[&d], Held::Slim(_)), "{own}");
        assert_eq!(set.record(&d), Some(o));
    }
    let mut o = issued(d);
    o.issued.as_deref_mut().unwrap().change.by = "partner:acme".into();
    set.insert(d, o);
    assert!(matches!(set.map[&d], Held::Whole(_)));
    let mut o = issued(d);
    o.issued.as_deref_mut().unwrap().expires_ms = Some(0);
    set.insert(d, o);
    assert!(matches!(set.map[&d], Held::Whole(_)));
    // The largest instant and plan id the words hold, and one past each.
    let last = (1 << INSTANT_BITS) - 1;
    for (since_ms, plan_id, slim) in [
        (last, SMALL_MAX as u32, true),
        (last + 1, 2, false),
        (5, SMALL_MAX as u32 + 1, false),
    ] {
        let o = KeyRecord {
            issued: Some(Box::new(IssuedKey::plain(d, plan_id, since_ms))),
            ..KeyRecord::named("acct-1")
        };
        set.insert(d, o.clone());
        assert_eq!(matches!(set.map[&d], Held::Plain(_)), slim);
        assert_eq!(set.record(&d), Some(o));
    }
    // A quota the slim form's word holds, and one it could not hold as it is.
    for (requests, slim) in [
        (crate::config::MAX_QUOTA_REQUESTS, true),
        (crate::config::MAX_QUOTA_REQUESTS + 1, false),
    ] {
        let mut o = issued(d);
        o.issued.as_deref_mut().unwrap().quota = Some(QuotaSpec {
            requests,
            per: crate::config::Period::Day,
        });
        set.insert(d, o.clone());
        assert_eq!(matches!(set.map[&d], Held::Slim(_)), slim);
        assert_eq!(set.record(&d), Some(o));
    }
}

proptest! {
    /// A walk of the set in steps of any size gives each record held slim once, in order,
    /// as [`KeyRecords::slim`] gives it, and none other; and ends.
    #[test]
    fn a_walk_in_steps_gives_each_slim_record_once(
        records in proptest::collection::vec(any_record(), 0..40),
        step in 1usize..7,
    ) {
        let set: KeyRecords = records.into_iter().collect();
        let want: Vec<(Digest, KeyRecord)> = set
            .keys()
            .filter_map(|d| Some((*d, set.slim(d)?)))
            .collect();
        let held_slim = set.map.values().filter(|h| !matches!(h, Held::Whole(_))).count();
        prop_assert_eq!(want.len(), held_slim);
        let mut got = Vec::new();
        let mut after = None;
        for _ in 0..=set.len() {
            let (slim, last) = set.slim_after(after.as_ref(), step);
            got.extend(slim);
            match last {
                Some(last) => after = Some(last),
                None => break,
            }
        }
        prop_assert_eq!(got, want);
    }
}
