//! Lookups by the full digest, at scale, and the rate state a reload carries over.

use std::sync::Arc;

use super::*;
use crate::config::keyname::KeyName;

#[test]
fn digests_that_differ_in_one_byte_resolve_by_the_full_digest() {
    let mut cfg = crate::testing::config();
    // Synthetic digests (`000…000`, `000…001`, …) share all but their last byte.
    for (i, k) in cfg.keys.iter_mut().enumerate() {
        k.digest = Digest([0; 32]);
        k.digest.0[31] = i as u8;
    }
    let table = KeyTable::build(&cfg, None);
    for (i, k) in cfg.keys.iter().enumerate() {
        assert_eq!(table.lookup(&k.digest), Some(i as KeyIdx));
    }
    let mut c = Digest([0; 32]);
    c.0[31] = 200;
    assert_eq!(table.lookup(&c), None);
    c.0[31] = 0;
    c.0[0] = 1;
    assert_eq!(table.lookup(&c), None);
}

#[test]
fn many_keys_are_all_found_and_others_are_not() {
    let mut cfg = crate::testing::config();
    let spec = cfg.keys[0].clone();
    cfg.keys = (0..5000)
        .map(|i| crate::config::KeySpec {
            name: KeyName::new(&format!("k{i}")),
            digest: Digest::of(format!("key-{i}").as_bytes()),
            ..spec.clone()
        })
        .collect();
    let table = KeyTable::build(&cfg, None);
    assert_eq!(table.len(), 5000 + cfg.partners.len());
    for i in 0..5000u32 {
        let d = Digest::of(format!("key-{i}").as_bytes());
        assert_eq!(table.lookup(&d), Some(i));
        assert_eq!(table.get(i).name, format!("k{i}").as_str());
        assert!(table
            .lookup(&Digest::of(format!("other-{i}").as_bytes()))
            .is_none());
    }
    let acme = table.lookup(&Digest::of(b"acme-partner-key")).unwrap();
    assert_eq!(
        table.get(acme).credential(),
        Credential::Partner { partner: 0 }
    );
}

#[test]
fn reload_carries_rate_state_by_digest_whatever_moved() {
    let mut cfg = crate::testing::config();
    let spec = cfg.keys[0].clone();
    let key = |i: u32| crate::config::KeySpec {
        name: KeyName::new(&format!("k{i}")),
        digest: Digest::of(format!("key-{i}").as_bytes()),
        ..spec.clone()
    };
    cfg.keys = (0..100).map(key).collect();
    let old = KeyTable::build(&cfg, None);
    // Removed at the front, added in the middle, moved from the middle to the end, and the
    // partners after all of them.
    let mut keys: Vec<_> = (3..100).filter(|&i| i != 50).map(key).collect();
    keys.insert(20, key(1000));
    keys.insert(21, key(1001));
    keys.push(key(50));
    let mut cfg2 = cfg.clone();
    cfg2.keys = keys;
    let new = KeyTable::build(&cfg2, Some(&old));
    assert_eq!(new.len(), cfg2.keys.len() + cfg2.partners.len());
    for i in 0..new.len() as KeyIdx {
        let e = new.get(i);
        match old.lookup(&e.digest) {
            Some(o) => assert!(Arc::ptr_eq(&old.get(o).rate, &e.rate), "{}", e.name),
            None => {
                assert!(e.name == "k1000" || e.name == "k1001", "{}", e.name);
                assert_eq!(Arc::strong_count(&e.rate), 1);
            }
        }
    }
}

#[test]
fn reload_carries_rate_state_for_remaining_keys_only() {
    let cfg = crate::testing::config();
    let old = KeyTable::build(&cfg, None);
    let mut cfg2 = cfg.clone();
    cfg2.keys.remove(0);
    let new = KeyTable::build(&cfg2, Some(&old));
    let kept = &cfg2.keys[0].digest;
    let (o, n) = (old.lookup(kept).unwrap(), new.lookup(kept).unwrap());
    assert!(Arc::ptr_eq(&old.get(o).rate, &new.get(n).rate));
    let gone = &cfg.keys[0].digest;
    assert!(new.lookup(gone).is_none());
}

/// A key put in the segment: new under its name, brought up to date when put again with its
/// id (a rotation); when its name comes with another id, the smaller id keeps it (a key with
/// a smaller one replaces it, the old one deleted; one with a larger one is not put), and
/// the loser's id is told.
#[test]
fn an_issued_name_is_new_then_brought_up_to_date_then_kept_by_the_smaller_id() {
    fn key<'a>(id: Digest, digests: &'a [(Digest, u64)], expires_ms: Option<u64>) -> NewIssued<'a> {
        NewIssued {
            name: "shop",
            id,
            credential: Credential::Customer {
                plan: 0,
                partner: None,
                limit: 0,
            },
            extra: expires_ms.map(|ms| crate::config::KeyExtra {
                expires_ms: Some(ms),
                ..crate::config::KeyExtra::default()
            }),
            digests,
            now_ms: 10,
        }
    }
    let seg = Issued::default();
    let d = |s: &str| Digest::of(s.as_bytes());
    let ds = |digests: &[&str]| -> Vec<(Digest, u64)> {
        digests.iter().map(|s| (d(s), u64::MAX)).collect()
    };
    // Two ids, and a third larger than both.
    let (small, big) = match d("a") < d("b") {
        true => ("a", "b"),
        false => ("b", "a"),
    };
    let larger = (0..)
        .map(|i| format!("c{i}"))
        .find(|c| d(c) > d(big))
        .unwrap();
    let first = seg.put(key(d(big), &ds(&[big]), Some(100))).unwrap();
    assert_eq!(
        (seg.find("shop"), seg.lookup(&d(big)), seg.len()),
        (Some(first), Some(first), 1)
    );
    // Its id again, a new digest in force: the same slot, the old digest gone.
    assert_eq!(seg.put(key(d(big), &ds(&["x2"]), Some(100))), Some(first));
    assert_eq!(
        (seg.lookup(&d(big)), seg.lookup(&d("x2")), seg.len()),
        (None, Some(first), 1)
    );
    assert_eq!(seg.take_lost(), vec![]);
    // The name with a smaller id: a new slot; the old one deleted, none of its digests found.
    let second = seg.put(key(d(small), &ds(&[small]), Some(5))).unwrap();
    assert_ne!(second, first);
    assert!(seg.slot(first).unwrap().is_gone());
    assert_eq!(
        (
            seg.find("shop"),
            seg.lookup(&d("x2")),
            seg.lookup(&d(small))
        ),
        (Some(second), None, Some(second))
    );
    assert_eq!(seg.len(), 1);
    assert_eq!(seg.take_lost(), vec![d(big)]);
    // With a larger id: not put, the name's key left as it is.
    assert_eq!(seg.put(key(d(&larger), &ds(&[&larger]), None)), None);
    assert_eq!(
        (seg.find("shop"), seg.lookup(&d(&larger)), seg.len()),
        (Some(second), None, 1)
    );
    assert_eq!(seg.take_lost(), vec![d(&larger)]);
    // Put past its expiry: expired at once.
    let entry = &seg.slot(second).unwrap().entry;
    assert_eq!(entry.live().state(), KeyState::Expired);
}

/// The same id put again issued otherwise (a caller's digest issued on two replicas, on two
/// plans or under two names, while Redis had forgotten the first; the later issue is the one
/// kept): the key is put anew, as it is kept, and no key lost its name.
#[test]
fn an_id_put_again_issued_otherwise_is_put_anew() {
    let seg = Issued::default();
    let id = Digest::of(b"the caller's");
    let put = |plan: usize| {
        seg.put(NewIssued {
            name: "shop",
            id,
            credential: Credential::Customer {
                plan,
                partner: None,
                limit: 0,
            },
            extra: None,
            digests: &[(id, u64::MAX)],
            now_ms: 0,
        })
        .unwrap()
    };
    let first = put(0);
    assert_eq!(put(0), first, "issued alike: the same slot");
    let second = put(1);
    assert_ne!(second, first);
    assert!(seg.slot(first).unwrap().is_gone());
    let entry = &seg.slot(second).unwrap().entry;
    assert_eq!(entry.configured().plan(), Some(1));
    assert_eq!(
        (seg.find("shop"), seg.lookup(&id), seg.len()),
        (Some(second), Some(second), 1)
    );
    assert_eq!(seg.take_lost(), vec![]);
    // Under another name (the caller's digest issued under two names so): that name leaves.
    let third = seg
        .put(NewIssued {
            name: "till",
            id,
            credential: Credential::Customer {
                plan: 1,
                partner: None,
                limit: 0,
            },
            extra: None,
            digests: &[(id, u64::MAX)],
            now_ms: 0,
        })
        .unwrap();
    assert!(seg.slot(second).unwrap().is_gone());
    assert_eq!(
        (
            seg.find("shop"),
            seg.find("till"),
            seg.lookup(&id),
            seg.len()
        ),
        (None, Some(third), Some(third), 1)
    );
    assert_eq!(seg.names_after(None, 10), vec![third]);
    assert_eq!(seg.take_lost(), vec![]);
}

mod state_counts {
    use proptest::prelude::*;

    use super::*;

    /// One change to a table's keys.
    #[derive(Clone, Debug)]
    enum Op {
        /// A flag of the `n`th key (YAML or issued, modulo their number) set or cleared.
        Flag(usize, u8, bool),
        /// A key issued under name `n`, expiring at `expires` (ms; the table's now is 50).
        Issue(u8, Option<u64>),
        /// The issued key of name `n` deleted.
        Delete(u8),
        /// The clock at `ms`: what has expired marked (and cleared, when it steps back).
        Expire(u64),
        /// The `n`th key put on plan `p` (modulo the plans), or back on its own (`None`).
        Upgrade(usize, Option<usize>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..64usize, 0..3u8, any::<bool>()).prop_map(|(n, f, on)| Op::Flag(n, f, on)),
            (0..8u8, proptest::option::of(0..100u64)).prop_map(|(n, e)| Op::Issue(n, e)),
            (0..8u8).prop_map(Op::Delete),
            (0..100u64).prop_map(Op::Expire),
            (0..64usize, proptest::option::of(0..8usize)).prop_map(|(n, p)| Op::Upgrade(n, p)),
        ]
    }

    proptest! {
        /// Whatever changes the keys' flags and plans, in any order (a key issued, expired at
        /// once, suspended, upgraded, deleted; a YAML key's expiry crossed both ways), the
        /// counts by state and by plan read without a walk are the walk's.
        #[test]
        fn the_states_and_plans_counted_as_keys_change_are_the_ones_walked(
            ops in proptest::collection::vec(op(), 1..60)
        ) {
            let mut cfg = crate::testing::config();
            // Some YAML keys expire, at instants the clock crosses both ways.
            for (i, k) in cfg.keys.iter_mut().enumerate().step_by(3) {
                k.extra = Some(Box::new(crate::config::KeyExtra {
                    expires_ms: Some(10 * i as u64),
                    ..crate::config::KeyExtra::default()
                }));
            }
            let table = KeyTable::build(&cfg, None);
            let flags = [EXPIRED, SUSPENDED, REVOKED];
            for op in ops {
                match op {
                    Op::Flag(n, f, on) => {
                        let keys: Vec<KeyIdx> = table.iter().map(|(k, _)| k).collect();
                        table.set_flag(keys[n % keys.len()], flags[f as usize], on);
                    }
                    Op::Issue(n, expires_ms) => {
                        let name = format!("issued-{n}");
                        let id = Digest::of(format!("{name}-{expires_ms:?}").as_bytes());
                        table.put_issued(NewIssued {
                            name: &name,
                            id,
                            credential: Credential::Customer { plan: 0, partner: None, limit: 0 },
                            extra: expires_ms.map(|ms| crate::config::KeyExtra {
                                expires_ms: Some(ms),
                                ..crate::config::KeyExtra::default()
                            }),
                            digests: &[(id, u64::MAX)],
                            now_ms: 50,
                        });
                    }
                    Op::Delete(n) => {
                        if let Some(s) = table.issued().find(&format!("issued-{n}")) {
                            table.remove_issued(table.configured() as KeyIdx + s);
                        }
                    }
                    Op::Expire(ms) => {
                        table.expire(ms);
                    }
                    Op::Upgrade(n, plan) => {
                        let keys: Vec<KeyIdx> = table.iter().map(|(k, _)| k).collect();
                        let plans = table.keys_on_plans().len();
                        table.set_plan_override(keys[n % keys.len()], plan.map(|p| p % plans));
                    }
                }
                prop_assert_eq!(table.states(), table.states_walked());
                prop_assert_eq!(table.keys_on_plans(), table.keys_on_plans_walked());
            }
        }
    }
}

mod filling {
    use proptest::prelude::*;

    use super::*;

    /// One key put, with an id of its own (a fill puts each record once): a name of 8 (a
    /// name put again stays with the smaller id), maybe a second digest of 4 that other
    /// keys of its name may have too (a rotation's: two keys of one name are two replicas'
    /// issues of it, and may share a digest as they share the name), and whether its name
    /// is looked up right after.
    fn put() -> impl Strategy<Value = (u8, Option<u8>, bool)> {
        (
            0..8u8,
            proptest::option::weighted(0.2, 0..4u8),
            proptest::bool::weighted(0.1),
        )
    }

    /// Each key of `seg` not deleted, by name and id; the id each digest finds; the ids in
    /// name order; how many keys; the ids that lost their names, in order. (By id, not
    /// slot: a key that loses its name at once takes no slot when put alone.)
    type Seen = (
        Vec<(String, Digest)>,
        Vec<Option<Digest>>,
        Vec<Digest>,
        usize,
        Vec<Digest>,
    );

    fn seen(seg: &Issued, ids: usize) -> Seen {
        let id = |s: u32| seg.slot(s).unwrap().entry.digest;
        let mut live: Vec<(String, Digest)> = seg
            .iter()
            .map(|(_, slot)| (slot.entry.name.as_str().to_string(), slot.entry.digest))
            .collect();
        live.sort();
        let digests = (0..ids)
            .map(|i| Digest::of(format!("id-{i}").as_bytes()))
            .chain((0..32u8).map(|r| Digest::of(&[r / 4, r % 4])))
            .map(|d| seg.lookup(&d).map(id))
            .collect();
        let names = seg.names_after(None, 100).into_iter().map(id).collect();
        let mut lost = seg.take_lost();
        lost.sort();
        (live, digests, names, seg.len(), lost)
    }

    proptest! {
        /// A segment filled at once (a start: names sorted in at the end or when read) holds
        /// what one filled a key at a time holds: the same slots, names, digests and counts.
        #[test]
        fn a_segment_filled_at_once_is_the_segment_filled_a_key_at_a_time(
            puts in proptest::collection::vec(put(), 0..40)
        ) {
            let (filled, one_by_one) = (Issued::default(), Issued::default());
            filled.reserve(puts.len());
            for (i, &(n, rotated, read)) in puts.iter().enumerate() {
                let name = format!("key-{n}");
                let id = Digest::of(format!("id-{i}").as_bytes());
                let mut digests = vec![(id, u64::MAX)];
                digests.extend(rotated.map(|r| (Digest::of(&[n, r]), u64::MAX)));
                for seg in [&filled, &one_by_one] {
                    seg.put(NewIssued {
                        name: &name,
                        id,
                        credential: Credential::Customer { plan: 0, partner: None, limit: 0 },
                        extra: None,
                        digests: &digests,
                        now_ms: 0,
                    });
                }
                if read {
                    let id = |seg: &Issued| seg.find(&name).map(|s| seg.slot(s).unwrap().entry.digest);
                    prop_assert_eq!(id(&filled), id(&one_by_one));
                }
            }
            filled.settle();
            one_by_one.settle();
            prop_assert_eq!(seen(&filled, puts.len()), seen(&one_by_one, puts.len()));
            prop_assert_eq!(filled.states(), one_by_one.states());
        }
    }
}

/// A key's owner is packed in its entry and read back as it was put, whichever its kind.
#[test]
fn a_credential_packed_in_an_entry_is_read_back_as_it_was() {
    use super::entry::Owner;
    let each = [
        Credential::Customer {
            plan: 0,
            partner: None,
            limit: 0,
        },
        Credential::Customer {
            plan: 3,
            partner: Some(0),
            limit: 150,
        },
        Credential::Customer {
            plan: 70_000,
            partner: Some(99_999),
            limit: u32::MAX,
        },
        Credential::Partner { partner: 0 },
        Credential::Partner { partner: 12 },
    ];
    for c in each {
        let entry = KeyEntry {
            name: KeyName::new("k"),
            owner: Owner::of(c),
            digest: Digest::of(b"k"),
            rate: Arc::default(),
            live: std::sync::atomic::AtomicU64::new(0),
            quota: std::sync::atomic::AtomicU64::new(0),
            issued: std::sync::atomic::AtomicU32::new(0),
        };
        assert_eq!(entry.configured(), c);
        assert_eq!(entry.credential(), c);
    }
}

/// Past the names' merges (thousands of keys filled in no order, some names twice, names given
/// to new keys, a third deleted, some of their names given again), the pages read in name order hold
/// every key not deleted, once each, and each name finds its key.
#[test]
fn the_issued_names_stay_in_order_past_their_merges() {
    let seg = Issued::default();
    let put = |name: &str, id: Digest| {
        seg.put(NewIssued {
            name,
            id,
            credential: Credential::Customer {
                plan: 0,
                partner: None,
                limit: 0,
            },
            extra: None,
            digests: &[(id, u64::MAX)],
            now_ms: 0,
        })
    };
    // Each name's id and slot: a name put again stays with the smaller id.
    let mut want = std::collections::BTreeMap::new();
    let keep = |want: &mut std::collections::BTreeMap<String, (Digest, u32)>,
                name: &str,
                id: Digest,
                s: Option<u32>| {
        match want.get(name) {
            Some(&(held, _)) if held < id => {}
            _ => {
                want.insert(name.to_string(), (id, s.expect("the smaller id is put")));
            }
        }
    };
    let n = 12_000u32;
    // A start's fill: the names sorted in at the first read (5,000 into none), then at the
    // next (7,000 into those, in one pass).
    seg.reserve(n as usize);
    for i in 0..n {
        if i == 5_000 {
            assert_eq!(seg.find("none"), None);
        }
        // Names in no order (7,919 is prime to 11,000), some long enough to be held on the
        // heap; the last 1,000 are names the first 1,000 had (the smaller id's, as in a fill).
        let j = (i * 7_919) % 11_000;
        let name = match j % 5 {
            0 => format!("a-much-longer-key-name-{j:05}"),
            _ => format!("key-{j:05}"),
        };
        let id = Digest::of(format!("id-{i}").as_bytes());
        keep(&mut want, &name, id, put(&name, id));
    }
    assert_eq!(seg.find("none"), None);
    seg.settle();
    let names: Vec<String> = want.keys().cloned().collect();
    // Live names put again with other ids (the smaller keeps each).
    for name in names.iter().skip(1).step_by(3).take(2_000) {
        let id = Digest::of(format!("new-{name}").as_bytes());
        keep(&mut want, name, id, put(name, id));
    }
    for name in names.iter().step_by(3) {
        seg.remove(seg.find(name).unwrap());
        want.remove(name);
    }
    for name in names.iter().step_by(9).take(700) {
        let id = Digest::of(format!("again-{name}").as_bytes());
        keep(&mut want, name, id, put(name, id));
    }
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = seg.names_after(after.as_deref(), 256);
        let Some(&last) = page.last() else { break };
        after = Some(seg.slot(last).unwrap().entry.name.as_str().to_string());
        pages.extend(page);
    }
    assert_eq!(pages, want.values().map(|w| w.1).collect::<Vec<u32>>());
    for (name, &(_, s)) in &want {
        assert_eq!(seg.find(name), Some(s), "{name}");
    }
    assert_eq!(seg.find("key-99999"), None);
    assert_eq!(seg.len(), want.len());
}
