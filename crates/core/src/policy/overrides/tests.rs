//! Upgrades applied, carried over a reload, and dropped by a new config.

use super::*;
use crate::policy::authenticate::AuthHeader;
use crate::policy::keys::{Credential, KeyIdx};
use crate::policy::{Policy, RequestHead};
use crate::refusal::Code;
use crate::testing::{digest, TestConfig};

fn policy(c: TestConfig) -> Policy {
    Policy::new(c.parse(), None)
}

fn plan_of(p: &Policy, key: &str) -> String {
    let k = p.keys.lookup(&digest(key)).unwrap();
    match p.keys.get(k).credential() {
        Credential::Customer { plan, .. } => p.config.plans[plan].name.clone(),
        Credential::Partner { .. } => "partner".into(),
    }
}

fn partner(p: &Policy, key: &str) -> KeyIdx {
    p.keys.lookup(&digest(key)).unwrap()
}

#[test]
fn an_unknown_plan_id_is_invalid_body_at_plan_id() {
    let p = policy(TestConfig::new());
    for id in [99, -1, 1 << 40] {
        let r = p.upgrade(digest("basic-key-1"), id).unwrap_err();
        assert_eq!(r.code, Code::InvalidBody);
        assert_eq!(r.errors[0].pointer, "/planID");
    }
    assert!(p.upgrade(digest("basic-key-1"), 2).is_ok());
}

#[test]
fn an_accepted_upgrade_applies_from_the_next_decision_and_back_to_the_yaml_plan_clears_it() {
    let p = policy(TestConfig::new());
    let head = RequestHead {
        method: "POST",
        path: "/v2/settings/webhook/set",
        authorization: AuthHeader::One(b"Bearer acme-customer-key"),
    };
    assert!(
        p.decide(&head, 0).verdict.is_err(),
        "Basic may not set webhooks"
    );
    let by = partner(&p, "acme-partner-key");
    let up = p.upgrade(digest("acme-customer-key"), 2).unwrap();
    let (kept, before) = p.apply_upgrade(&up, by, 1234).unwrap();
    let kept = kept.unwrap();
    assert_eq!((kept.plan_id, kept.replaced), (Some(2), Some(1)));
    assert_eq!(kept.partner.as_deref(), Some("acme"));
    assert_eq!(kept.key, "acme-customer");
    assert_eq!(p.config.plans[before].name, "basic");
    assert_eq!(plan_of(&p, "acme-customer-key"), "standard");
    assert!(p.decide(&head, 0).verdict.is_ok(), "Standard may");
    // Back to Basic, the YAML's plan: nothing to keep.
    let up = p.upgrade(digest("acme-customer-key"), 1).unwrap();
    let (kept, _) = p.apply_upgrade(&up, by, 1235).unwrap();
    assert_eq!(kept, None);
    assert_eq!(plan_of(&p, "acme-customer-key"), "basic");
}

#[test]
fn an_unknown_key_or_a_partner_key_is_forwarded_and_nothing_is_applied() {
    let p = policy(TestConfig::new());
    let by = partner(&p, "acme-partner-key");
    let up = p.upgrade(digest("nobody"), 2).unwrap();
    assert_eq!(up.key, None);
    assert_eq!(p.apply_upgrade(&up, by, 0), None);
    let up = p.upgrade(digest("globex-partner-key"), 2).unwrap();
    assert_eq!(up.key, None);
}

#[test]
fn the_budget_carries_over_as_the_share_of_the_window_used() {
    let p = policy(TestConfig::new());
    let head = RequestHead {
        method: "GET",
        path: "/v2/client/getStatus",
        authorization: AuthHeader::One(b"Bearer basic-key-1"),
    };
    for _ in 0..20 {
        p.decide(&head, 0).verdict.unwrap();
    }
    // Half of Basic's 40: half of Pro's 150 is left after the upgrade.
    let by = partner(&p, "acme-partner-key");
    let up = p.upgrade(digest("basic-key-1"), 3).unwrap();
    p.apply_upgrade(&up, by, 0).unwrap();
    let q = p.decide(&head, 0).budget.unwrap();
    assert_eq!(q.limit, 150);
    assert_eq!(q.remaining, 74);
}

#[test]
fn a_new_config_keeps_an_override_unless_the_yaml_moved_the_key_or_dropped_it() {
    let first = policy(TestConfig::new());
    let by = partner(&first, "acme-partner-key");
    let mut set = KeyRecords::new();
    for (key, plan) in [
        ("basic-key-1", 2),
        ("acme-customer-key", 3),
        ("standard-key-1", 3),
    ] {
        let up = first.upgrade(digest(key), plan).unwrap();
        let (kept, _) = first.apply_upgrade(&up, by, 0).unwrap();
        set.insert(digest(key), kept.unwrap());
    }
    // The YAML moves standard-key-1 to pro itself, and drops acme-customer.
    let next = Policy::new(
        TestConfig::new()
            .key_plan("standard-1", "pro")
            .without_key("acme-customer")
            .parse(),
        Some(&first),
    );
    let mut dropped = next.apply_overrides(&set);
    dropped.sort_by_key(|d| d.before.key.clone());
    assert!(dropped.iter().all(|d| d.after.is_none()));
    let why: Vec<(&str, Dropped)> = dropped
        .iter()
        .map(|d| (d.before.key.as_str(), d.why))
        .collect();
    assert_eq!(
        why,
        [
            ("acme-customer", Dropped::KeyGone),
            ("standard-1", Dropped::YamlChanged)
        ]
    );
    assert_eq!(plan_of(&next, "basic-key-1"), "standard");
    assert_eq!(plan_of(&next, "standard-key-1"), "pro");
    assert_eq!(next.overrides_in_force(), 1);
    // The set without basic-1's: it is back on its YAML plan.
    let mut left = set.clone();
    left.remove(&digest("basic-key-1"));
    next.apply_overrides(&left);
    assert_eq!(plan_of(&next, "basic-key-1"), "basic");
    assert_eq!(next.overrides_in_force(), 0);
}

/// What a record holds is kept as JSON (on disk, in the backup, in Redis) and read back by
/// later versions: the spelling of every part is fixed, and it reads back as it was.
#[test]
fn a_record_is_kept_in_the_spelling_it_was_always_kept_in() {
    let change = |since_ms, by: &str, reason: Option<&str>| Change {
        since_ms,
        by: by.into(),
        reason: reason.map(Into::into),
    };
    let record = KeyRecord {
        plan_id: Some(3),
        replaced: Some(1),
        partner: Some("p".into()),
        at_ms: 9,
        suspended: Some(Box::new(change(10, "admin", Some("late")))),
        revoked: Some(Box::new(change(11, "partner:p", None))),
        limit: Some(Box::new(LimitChange {
            requests_per_window: 5,
            change: change(12, "admin", None),
        })),
        quota: Some(Box::new(QuotaChange {
            quota: crate::config::QuotaSpec {
                requests: 7,
                per: crate::config::Period::Day,
            },
            change: change(13, "admin", None),
        })),
        issued: Some(Box::new(IssuedKey {
            id: digest("id"),
            digest: digest("now"),
            previous: vec![PreviousDigest {
                digest: digest("before"),
                until_ms: 14,
            }],
            plan_id: 2,
            partner: Some("p".into()),
            expires_ms: Some(15),
            requests_per_window: Some(6),
            quota: Some(crate::config::QuotaSpec {
                requests: 8,
                per: crate::config::Period::Month,
            }),
            change: change(16, "admin", Some("signup")),
            rotated_ms: Some(17),
        })),
        yaml: Some("f".into()),
        ..KeyRecord::named("k")
    };
    let hex = |s: &str| digest(s).to_hex();
    let kept = format!(
        concat!(
            r#"{{"key":"k","plan_id":3,"replaced":1,"partner":"p","at_ms":9,"#,
            r#""suspended":{{"since_ms":10,"by":"admin","reason":"late"}},"#,
            r#""revoked":{{"since_ms":11,"by":"partner:p"}},"#,
            r#""limit":{{"requests_per_window":5,"since_ms":12,"by":"admin"}},"#,
            r#""quota":{{"requests":7,"per":"day","since_ms":13,"by":"admin"}},"#,
            r#""issued":{{"id":"{}","digest":"{}","previous":[{{"digest":"{}","until_ms":14}}],"#,
            r#""plan_id":2,"partner":"p","expires_ms":15,"requests_per_window":6,"#,
            r#""quota":{{"requests":8,"per":"month"}},"since_ms":16,"by":"admin","#,
            r#""reason":"signup","rotated_ms":17}},"yaml":"f"}}"#
        ),
        hex("id"),
        hex("now"),
        hex("before")
    );
    assert_eq!(serde_json::to_string(&record).unwrap(), kept);
    assert_eq!(serde_json::from_str::<KeyRecord>(&kept).unwrap(), record);
    // What was left out reads as nothing (and an issued key's own fields as theirs).
    let bare = format!(
        r#"{{"key":"k","issued":{{"id":"{}","digest":"{}","plan_id":2,"since_ms":1,"by":"admin"}}}}"#,
        hex("id"),
        hex("id")
    );
    let read: KeyRecord = serde_json::from_str(&bare).unwrap();
    assert_eq!(
        serde_json::to_string(&read)
            .unwrap()
            .replace(",\"at_ms\":0", ""),
        bare
    );
}

/// A digest in a record is read in place, and however the JSON spells it: an escaped
/// character (which the reader cannot lend from the text) reads as the plain one; anything but
/// 64 hex characters, in any field that holds a digest, is refused with what was expected.
#[test]
fn a_kept_digest_is_read_however_spelled_and_refused_unless_hex() {
    let hex = digest("id").to_hex();
    let record = |id: &str, now: &str, before: &str| {
        format!(
            concat!(
                r#"{{"key":"k","issued":{{"id":"{}","digest":"{}","#,
                r#""previous":[{{"digest":"{}","until_ms":1}}],"plan_id":2,"since_ms":1,"by":"a"}}}}"#
            ),
            id, now, before
        )
    };
    let plain: KeyRecord = serde_json::from_str(&record(&hex, &hex, &hex)).unwrap();
    let issued = plain.issued.as_deref().unwrap();
    assert_eq!((issued.id, issued.digest), (digest("id"), digest("id")));
    assert_eq!(issued.previous[0].digest, digest("id"));
    let escaped = format!("\\u00{:x}{}", hex.as_bytes()[0], &hex[1..]);
    let read: KeyRecord = serde_json::from_str(&record(&escaped, &escaped, &escaped)).unwrap();
    assert_eq!(read, plain);
    let short = &hex[..63];
    let not_hex = format!("z{}", &hex[1..]);
    for bad in [short, &not_hex, ""] {
        for spelled in [
            record(bad, &hex, &hex),
            record(&hex, bad, &hex),
            record(&hex, &hex, bad),
        ] {
            let e = serde_json::from_str::<KeyRecord>(&spelled).unwrap_err();
            assert!(e.to_string().contains("not 64 hex characters"), "{e}");
        }
    }
    let e = serde_json::from_str::<KeyRecord>(
        &record(&hex, &hex, &hex).replace(&format!(r#""id":"{hex}""#), r#""id":7"#),
    )
    .unwrap_err();
    assert!(e.to_string().contains("64 hex characters"), "{e}");
}
