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
