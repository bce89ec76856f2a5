//! Keys issued through the admin API: issued, rotated and deleted as records, applied to the
//! table one key at a time, carried over a reload with their budget, and refused as the
//! contract says.

use super::*;
use crate::digest::Digest;
use crate::policy::authenticate::AuthHeader;
use crate::policy::keys::{KeyRefusal, KeyState};
use crate::policy::{Policy, RequestHead};
use crate::testing::TestConfig;

fn new_key(name: &str) -> NewKey {
    NewKey {
        name: name.into(),
        plan: "pro".into(),
        partner: None,
        expires_ms: None,
        requests_per_window: None,
        quota: None,
    }
}

/// What `secret` comes to on `p`: the key's name, or the refusal's code.
fn who(p: &Policy, secret: &str) -> Result<String, String> {
    let header = format!("Bearer {secret}");
    let head = RequestHead {
        method: "GET",
        path: "/v2/client/getStatus",
        authorization: AuthHeader::One(header.as_bytes()),
    };
    let d = p.decide(&head, 0);
    match d.verdict {
        Ok(_) => Ok(p.keys.get(d.key.unwrap()).name.as_str().to_string()),
        Err(r) => Err(r.code.as_str().to_string()),
    }
}

/// Keep and apply `changes` as the runtime does: in the set, then on the policy.
fn put(p: &Policy, set: &mut KeyRecords, changes: Vec<(Digest, Part, KeyRecord)>) {
    for (d, _, o) in changes {
        if o.is_empty() {
            set.remove(&d);
        } else {
            set.insert(d, o.clone());
        }
        p.apply_record(&d, &o);
    }
}

#[test]
fn an_issued_key_authenticates_rotates_with_an_overlap_and_is_deleted_for_good() {
    let p = Policy::new(TestConfig::new().parse(), None);
    let mut set = KeyRecords::new();
    let first = Digest::of(b"first");
    let c = p
        .issue(&new_key("shop-1"), first, "admin", 1_000, &set)
        .unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1, Part::Issued);
    put(&p, &mut set, c);
    assert_eq!(who(&p, "first"), Ok("shop-1".into()));
    let k = p.keys.find_by_name("shop-1").unwrap();
    assert!(p.keys.issued_slot(k).is_some());
    assert_eq!(p.keys.configured(), 7, "the YAML's table is as it was");

    // Refused: a name or a digest a key has.
    let again =
        |name: &str, d: Digest, set: &KeyRecords| p.issue(&new_key(name), d, "admin", 1, set);
    assert_eq!(
        again("shop-1", Digest::of(b"x"), &set),
        Err(ChangeRefused::KeyExists("name"))
    );
    assert_eq!(
        again("basic-1", Digest::of(b"x"), &set),
        Err(ChangeRefused::KeyExists("name"))
    );
    assert_eq!(
        again("shop-2", first, &set),
        Err(ChangeRefused::KeyExists("sha256"))
    );
    assert_eq!(
        again("shop-2", Digest::of(b"acme-partner-key"), &set),
        Err(ChangeRefused::KeyExists("sha256"))
    );
    let yaml = p.keys.find_by_name("basic-1").unwrap();
    assert_eq!(
        p.rotate(yaml, Digest::of(b"y"), 0, 1, &set),
        Err(ChangeRefused::DefinedInConfig)
    );
    assert_eq!(
        p.delete(yaml, "admin", 1, &set),
        Err(ChangeRefused::DefinedInConfig)
    );

    // Rotated: the new digest in force, the first one until its overlap ends, one budget.
    let second = Digest::of(b"second");
    let now = crate::clock::wall_ms();
    let c = p.rotate(k, second, 60_000, now, &set).unwrap();
    assert_eq!(c[0].0, first, "kept under the digest it was issued with");
    put(&p, &mut set, c);
    assert_eq!(who(&p, "second"), Ok("shop-1".into()));
    assert_eq!(who(&p, "first"), Ok("shop-1".into()));
    assert_eq!(p.keys.find_by_name("shop-1"), Some(k), "the same entry");
    let (_, next) = p.keys.expire(now + 59_999);
    assert_eq!(next, Some(now + 60_000));
    p.keys.expire(now + 60_000);
    assert_eq!(
        who(&p, "first"),
        Err("unauthorized".into()),
        "the overlap ended"
    );
    assert_eq!(who(&p, "second"), Ok("shop-1".into()));

    // Suspended like any key, by its record under its first digest.
    let c = p
        .change(k, &Action::Suspend(None), "admin", now, &set)
        .unwrap();
    assert_eq!(c[0].0, first);
    put(&p, &mut set, c);
    assert_eq!(p.keys.get(k).live().state(), KeyState::Suspended);
    assert!(
        set.record(&first).unwrap().issued.is_some(),
        "the key's record keeps the key"
    );
    let c = p.change(k, &Action::Resume, "admin", now, &set).unwrap();
    put(&p, &mut set, c);

    // Deleted: every digest revoked and kept so; the name free again; the digests never
    // issued again.
    let c = p.delete(k, "admin", now, &set).unwrap();
    let revoked: Vec<Digest> = c
        .iter()
        .filter(|x| x.1 == Part::Revoked)
        .map(|x| x.0)
        .collect();
    assert_eq!(revoked, [first, second]);
    put(&p, &mut set, c);
    assert_eq!(who(&p, "second"), Err("unauthorized".into()));
    assert_eq!(p.keys.find_by_name("shop-1"), None);
    assert_eq!(p.keys.get(k).live().refused(), Some(KeyRefusal::Revoked));
    assert_eq!(
        again("shop-9", second, &set),
        Err(ChangeRefused::KeyExists("sha256"))
    );
    assert!(
        again("shop-1", Digest::of(b"third"), &set).is_ok(),
        "the name is free"
    );
}

#[test]
fn a_reload_puts_every_issued_key_back_with_its_budget_and_a_clash_is_refused() {
    let config = TestConfig::new();
    let p = Policy::new(config.parse(), None);
    let mut set = KeyRecords::new();
    for i in 0..3 {
        let name = format!("shop-{i}");
        let c = p
            .issue(
                &new_key(&name),
                Digest::of(name.as_bytes()),
                "admin",
                1,
                &set,
            )
            .unwrap();
        put(&p, &mut set, c);
    }
    let k = p.keys.find_by_name("shop-1").unwrap();
    let rate = std::sync::Arc::clone(&p.keys.get(k).rate);

    // A reload: a new table, the issued keys put back from the records, the same budget.
    let q = Policy::new(config.parse(), Some(&p));
    assert!(
        q.apply_overrides(&set).is_empty(),
        "nothing of it is dropped"
    );
    let k = q.keys.find_by_name("shop-1").unwrap();
    assert!(std::sync::Arc::ptr_eq(&rate, &q.keys.get(k).rate));
    assert_eq!(who(&q, "shop-2"), Ok("shop-2".into()));
    assert_eq!(q.keys.issued().len(), 3);

    // The set without one of them (deleted on another replica): gone here too.
    let mut fewer = set.clone();
    fewer.remove(&Digest::of(b"shop-0"));
    q.apply_overrides(&fewer);
    assert_eq!(who(&q, "shop-0"), Err("unauthorized".into()));
    assert_eq!(q.keys.issued().len(), 2);

    // A YAML that names a key as an issued one, or takes its digest, or drops its plan.
    let clash = |c: TestConfig| check_issued(&c.parse(), &set).unwrap_err().field;
    assert_eq!(
        clash(config.clone().add_key("shop-1", "other", "basic")),
        "keys[5].name"
    );
    assert_eq!(
        clash(config.clone().add_key("other", "shop-1", "basic")),
        "keys[5].sha256"
    );
    assert!(check_issued(&config.parse(), &set).is_ok());
}

#[test]
fn an_issued_key_expires_at_its_instant_and_a_reload_after_it_does_not_bring_it_back() {
    let config = TestConfig::new();
    let p = Policy::new(config.parse(), None);
    let mut set = KeyRecords::new();
    let now = crate::clock::wall_ms();
    let key = NewKey {
        expires_ms: Some(now + 60_000),
        ..new_key("shop-exp")
    };
    let c = p
        .issue(&key, Digest::of(b"exp"), "admin", now, &set)
        .unwrap();
    put(&p, &mut set, c);
    assert_eq!(who(&p, "exp"), Ok("shop-exp".into()));
    let (_, next) = p.keys.expire(now + 59_999);
    assert_eq!(next, Some(now + 60_000));
    p.keys.expire(now + 60_000);
    assert_eq!(who(&p, "exp"), Err("unauthorized".into()));
    // Its record says when it expires: a table built after that instant (a reload, a restart)
    // puts it back expired.
    let mut record = set.record(&Digest::of(b"exp")).unwrap();
    record.issued.as_mut().unwrap().expires_ms = Some(now - 1);
    set.insert(Digest::of(b"exp"), record);
    let q = Policy::new(config.parse(), Some(&p));
    q.apply_overrides(&set);
    assert_eq!(who(&q, "exp"), Err("unauthorized".into()));
}

/// A start or a reload puts a plain issued key back from the parts the set holds, without
/// making its record whole: the table it builds is the one the whole records build, key
/// for key (each plain shape: an expiry past and to come, a limit, a quota, a plan this
/// config does not have; beside records held whole).
#[test]
fn a_plain_issued_key_is_put_back_as_its_whole_record_would_put_it() {
    let config = TestConfig::new();
    let now = crate::clock::wall_ms();
    let quota = crate::config::QuotaSpec {
        requests: 500,
        per: crate::config::Period::Day,
    };
    let mut set = KeyRecords::new();
    for (i, (plan_id, expires_ms, limit, quota)) in [
        (3, None, None, None),
        (1, Some(now - 1), None, None),
        (2, Some(now + 60_000), Some(7), Some(quota)),
        (3, None, None, Some(quota)),
        (99, None, None, None),
    ]
    .into_iter()
    .enumerate()
    {
        let d = Digest::of(format!("plain-{i}").as_bytes());
        let mut i_key = IssuedKey::plain(d, plan_id, 1);
        i_key.expires_ms = expires_ms;
        i_key.requests_per_window = limit;
        i_key.quota = quota;
        let o = KeyRecord {
            issued: Some(Box::new(i_key)),
            ..KeyRecord::named(&format!("plain-{i}"))
        };
        set.insert(d, o);
    }
    // A record held whole beside them: a revoked issued key.
    let revoked = Digest::of(b"whole-0");
    set.insert(
        revoked,
        KeyRecord {
            issued: Some(Box::new(IssuedKey::plain(revoked, 3, 1))),
            revoked: Some(Box::new(Change {
                since_ms: 2,
                by: "admin".into(),
                reason: None,
            })),
            ..KeyRecord::named("whole-0")
        },
    );
    assert!(matches!(
        set.held().find(|(d, _)| **d == revoked),
        Some((_, HeldRecord::Whole(_)))
    ));
    assert_eq!(
        set.held()
            .filter(|(_, h)| matches!(h, HeldRecord::Plain(_)))
            .count(),
        5
    );

    let held = Policy::new(config.parse(), None);
    let whole = Policy::new(config.parse(), None);
    assert_eq!(held.apply_overrides(&set), vec![]);
    let mut applying = whole.applying(0);
    for (d, o) in &set {
        applying.record(d, &o);
    }
    assert_eq!(applying.finish(), vec![]);

    assert_eq!(held.keys.len(), whole.keys.len());
    for (d, _) in &set {
        let (a, b) = (held.keys.resolve(d), whole.keys.resolve(d));
        assert_eq!(a, b);
        let Some(crate::policy::keys::Found::Key(k)) = a else {
            continue;
        };
        let (x, y) = (held.keys.get(k), whole.keys.get(k));
        assert_eq!(x.name, y.name);
        assert_eq!(x.credential(), y.credential());
        assert_eq!(x.live(), y.live());
        assert_eq!(x.own_quota(), y.own_quota());
        assert_eq!(held.keys.extra(k), whole.keys.extra(k));
    }
    let name = |p: &Policy, n: &str| p.keys.find_by_name(n).map(|k| p.keys.get(k).live());
    assert_eq!(
        name(&held, "plain-4"),
        None,
        "its plan is not this config's"
    );
    assert!(
        name(&held, "plain-1").is_some_and(|l| l.refused().is_some()),
        "expired"
    );
    assert!(
        name(&held, "whole-0").is_some_and(|l| l.refused().is_some()),
        "revoked"
    );
}

#[test]
fn a_key_deleted_earlier_in_a_batch_is_gone_to_the_changes_after_it() {
    // A batch makes each change on the set its earlier changes left, with the table as it
    // was: a rotation or deletion after the key's deletion finds an issued slot whose
    // record holds no key. That key is gone (404), not one the YAML defines (409).
    let p = Policy::new(TestConfig::new().parse(), None);
    let mut set = KeyRecords::new();
    let c = p
        .issue(
            &new_key("shop-9"),
            Digest::of(b"nine"),
            "admin",
            1_000,
            &set,
        )
        .unwrap();
    put(&p, &mut set, c);
    let k = p.keys.find_by_name("shop-9").unwrap();
    for (d, _, o) in p.delete(k, "admin", 2_000, &set).unwrap() {
        set.insert(d, o);
    }
    assert_eq!(
        p.rotate(k, Digest::of(b"ten"), 0, 3_000, &set),
        Err(ChangeRefused::Deleted)
    );
    assert_eq!(
        p.delete(k, "admin", 3_000, &set),
        Err(ChangeRefused::Deleted)
    );
}

#[test]
fn a_digest_a_rotation_replaced_is_never_issued_again() {
    // Replaced with no overlap, or past its overlap: it no longer authenticates, and it is
    // still the key's, so no new key (nor another rotation) takes it and lets the old
    // secret in as someone else.
    let p = Policy::new(TestConfig::new().parse(), None);
    let mut set = KeyRecords::new();
    let (first, second, third) = (
        Digest::of(b"first"),
        Digest::of(b"second"),
        Digest::of(b"third"),
    );
    let c = p
        .issue(&new_key("shop-1"), first, "admin", 1_000, &set)
        .unwrap();
    put(&p, &mut set, c);
    let k = p.keys.find_by_name("shop-1").unwrap();
    let c = p.rotate(k, second, 0, 2_000, &set).unwrap();
    put(&p, &mut set, c);
    let c = p.rotate(k, third, 10, 3_000, &set).unwrap();
    put(&p, &mut set, c);
    let later = 3_000 + 11;
    for gone in [first, second] {
        assert_eq!(
            p.issue(&new_key("shop-2"), gone, "admin", later, &set),
            Err(ChangeRefused::KeyExists("sha256"))
        );
        assert_eq!(
            p.rotate(k, gone, 0, later, &set),
            Err(ChangeRefused::KeyExists("sha256"))
        );
    }
    // The record keeps one entry a rotation, the first replaced with no overlap.
    let record = set.record(&first).unwrap();
    let previous = &record.issued.as_ref().unwrap().previous;
    assert_eq!(
        previous
            .iter()
            .map(|p| (p.digest, p.until_ms))
            .collect::<Vec<_>>(),
        [(first, 2_000), (second, 3_010)]
    );
    // Built again from its records (a restart), the set still knows them.
    let again: KeyRecords = set.clone().into_iter().collect();
    assert!(again.holds(&second));
}

/// A whole set read on a replica that holds issued keys already: a key deleted there leaves
/// its name before the key issued with it since comes, whatever their digests' order (were
/// the new key put first, the old one, still here, would keep the name from it); and two
/// live keys of one name (a name issued twice while Redis had forgotten the first) end the
/// same way on a replica that knew either, the smaller id keeping the name, the other told.
#[test]
fn a_whole_set_read_frees_a_deleted_name_first_and_settles_a_name_issued_twice() {
    let config = TestConfig::new();
    // Ids on both sides of the old key's, so that the new key sorts first in one case.
    let old = Digest::of(b"old");
    let after_old = |smaller: bool| {
        (0..)
            .map(|i| Digest::of(format!("new-{i}").as_bytes()))
            .find(|d| (*d < old) == smaller)
            .unwrap()
    };
    for new in [after_old(true), after_old(false)] {
        let p = Policy::new(config.parse(), None);
        let mut set = KeyRecords::new();
        let c = p.issue(&new_key("shop"), old, "admin", 1, &set).unwrap();
        put(&p, &mut set, c);
        // Deleted and issued again elsewhere: the set as read whole here.
        let mut elsewhere = set.clone();
        let k = p.keys.find_by_name("shop").unwrap();
        for (d, _, o) in p.delete(k, "admin", 2, &set).unwrap() {
            elsewhere.insert(d, o);
        }
        let fresh = Policy::new(config.parse(), None);
        for (d, _, o) in fresh
            .issue(&new_key("shop"), new, "admin", 3, &KeyRecords::new())
            .unwrap()
        {
            elsewhere.insert(d, o);
        }
        assert!(p.apply_overrides(&elsewhere).is_empty());
        let k = p.keys.find_by_name("shop").unwrap();
        assert_eq!(p.keys.get(k).digest, new);
        assert_eq!(p.keys.issued().take_lost(), vec![]);
    }

    // Two live keys of one name: whichever a replica knew first, both end on the smaller.
    let (small, big) = (after_old(true), old);
    let issued = |d: Digest| {
        let p = Policy::new(config.parse(), None);
        p.issue(&new_key("shop"), d, "admin", 1, &KeyRecords::new())
            .unwrap()
    };
    let mut both = KeyRecords::new();
    for (d, _, o) in issued(small).into_iter().chain(issued(big)) {
        both.insert(d, o);
    }
    for first in [small, big] {
        let p = Policy::new(config.parse(), None);
        let mut set = KeyRecords::new();
        put(&p, &mut set, issued(first));
        p.apply_overrides(&both);
        let k = p.keys.find_by_name("shop").unwrap();
        assert_eq!(p.keys.get(k).digest, small, "knew {first:?} first");
        assert_eq!(p.keys.issued().len(), 1);
        assert_eq!(p.keys.issued().take_lost(), vec![big]);
        // And a start (the table filled from the set at once).
        let q = Policy::new(config.parse(), None);
        q.apply_overrides(&both);
        let k = q.keys.find_by_name("shop").unwrap();
        assert_eq!(q.keys.get(k).digest, small);
        assert_eq!(q.keys.issued().take_lost(), vec![big]);
    }
}
