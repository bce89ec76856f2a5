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
    let mut set = Overrides::new();
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
