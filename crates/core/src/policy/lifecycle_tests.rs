//! Keys that change live, in the core: rotation, expiry (an injected wall clock), suspension,
//! revocation, a key's own limit, what a reload keeps of them, and partners' lifecycle
//! operations.

use super::authenticate::AuthHeader;
use super::keys::KeyRefusal;
use super::overrides::{Action, ChangeRefused, Dropped, KeyRecords, Part, Pending};
use super::*;
use crate::config::file::FilePrevious;
use crate::config::routes::Effect;
use crate::testing::{digest, TestConfig};

const SEC: u64 = 1000;
/// 2026-12-01T00:00:00Z.
const DEC_1: u64 = 1_796_083_200_000;

fn send<'a>(p: &Policy, auth: &'a str) -> Decision<'a> {
    p.decide(
        &RequestHead {
            method: "POST",
            path: "/v2/sendMessage/",
            authorization: AuthHeader::One(auth.as_bytes()),
        },
        0,
    )
}

/// Why `auth` is refused (`None`: admitted); every refusal is the one 401.
fn refused(p: &Policy, auth: &str) -> Option<KeyRefusal> {
    let d = send(p, auth);
    match d.verdict {
        Ok(_) => None,
        Err(r) => {
            assert_eq!(r, Refusal::unauthorized(), "{auth}");
            assert_eq!(
                (d.key, d.budget, d.credential),
                (None, None, None),
                "no oracle"
            );
            Some(d.not_authenticated.unwrap().reason)
        }
    }
}

fn rotated() -> TestConfig {
    TestConfig::new().key_with("basic-1", |k| {
        k.previous.push(FilePrevious {
            sha256: digest("old-basic-key").to_hex(),
            until: "2026-12-01T00:00:00Z".into(),
        });
        k.expires_at = Some("2027-01-01T00:00:00Z".into());
    })
}

#[test]
fn a_previous_digest_is_the_same_key_until_its_until() {
    let p = Policy::new(rotated().parse(), None);
    assert_eq!(p.keys.expire(DEC_1 - 1), (false, Some(DEC_1)));
    let old = send(&p, "Bearer old-basic-key");
    let new = send(&p, "Bearer basic-key-1");
    assert_eq!(old.key, new.key, "one name");
    assert_eq!(new.budget.unwrap().remaining, 38, "one budget");
    // From `until` on, the earlier key is refused; the key in force is not.
    assert_eq!(
        p.keys.expire(DEC_1),
        (true, Some(DEC_1 + 31 * 86_400 * SEC))
    );
    assert_eq!(
        refused(&p, "Bearer old-basic-key"),
        Some(KeyRefusal::Expired)
    );
    assert_eq!(refused(&p, "Bearer basic-key-1"), None);
    // A wall clock stepped back: what has not expired yet serves again.
    p.keys.expire(DEC_1 - SEC);
    assert_eq!(refused(&p, "Bearer old-basic-key"), None);
}

#[test]
fn a_key_is_refused_from_its_expires_at() {
    let p = Policy::new(rotated().parse(), None);
    let jan_1 = DEC_1 + 31 * 86_400 * SEC;
    p.keys.expire(jan_1 - 1);
    assert_eq!(refused(&p, "Bearer basic-key-1"), None);
    assert_eq!(p.keys.expire(jan_1), (true, None), "nothing left to expire");
    assert_eq!(p.keys.expire(jan_1 + 1), (false, None));
    assert_eq!(refused(&p, "Bearer basic-key-1"), Some(KeyRefusal::Expired));
    assert_eq!(
        refused(&p, "Bearer old-basic-key"),
        Some(KeyRefusal::Expired)
    );
    assert_eq!(p.keys.states(), [6, 1, 0, 0]);
    assert_eq!(refused(&p, "Bearer nobody"), Some(KeyRefusal::Unknown));
}

fn act(p: &Policy, set: &mut KeyRecords, name: &str, action: Action) -> Result<(), ChangeRefused> {
    let k = p.keys.find_by_name(name).unwrap();
    for (d, _, o) in p.change(k, &action, "admin", 7, set)? {
        assert_eq!(p.apply_record(&d, &o), None);
        if o.is_empty() {
            set.remove(&d);
        } else {
            set.insert(d, o);
        }
    }
    Ok(())
}

#[test]
fn suspended_keys_are_refused_until_resumed_and_count_as_failed_authentications() {
    let p = Policy::new(TestConfig::new().auth_failures(3, 60, 120).parse(), None);
    let mut set = KeyRecords::new();
    act(
        &p,
        &mut set,
        "basic-1",
        Action::Suspend(Some("unpaid".into())),
    )
    .unwrap();
    assert_eq!(
        set.record(&digest("basic-key-1"))
            .unwrap()
            .suspended
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("unpaid")
    );
    assert_eq!(
        refused(&p, "Bearer basic-key-1"),
        Some(KeyRefusal::Suspended)
    );
    let client = "192.0.2.9".parse().unwrap();
    let head = RequestHead {
        method: "GET",
        path: "/v2/client/x",
        authorization: AuthHeader::One(b"Bearer basic-key-1"),
    };
    let blocks: Vec<bool> = (0..3)
        .map(|_| p.decide_for(&head, Some(client), 0).block_started.is_some())
        .collect();
    assert_eq!(blocks, [false, false, true]);
    act(&p, &mut set, "basic-1", Action::Resume).unwrap();
    assert!(set.is_empty(), "nothing left to keep");
    assert_eq!(refused(&p, "Bearer basic-key-1"), None);
}

#[test]
fn a_revocation_holds_for_every_digest_in_force_whatever_the_yaml_says() {
    let cfg = rotated();
    let p = Policy::new(cfg.parse(), None);
    p.keys.expire(DEC_1 - 1);
    let mut set = KeyRecords::new();
    act(&p, &mut set, "basic-1", Action::Revoke).unwrap();
    assert_eq!(set.len(), 2, "the key's digest and its previous one");
    assert_eq!(refused(&p, "Bearer basic-key-1"), Some(KeyRefusal::Revoked));
    assert_eq!(
        refused(&p, "Bearer old-basic-key"),
        Some(KeyRefusal::Revoked)
    );
    assert_eq!(
        act(&p, &mut set, "basic-1", Action::Resume),
        Err(ChangeRefused::Revoked)
    );
    assert_eq!(p.keys.states()[3], 1);
    // A reload that moves the key to another plan: still revoked.
    let next = Policy::new(cfg.clone().key_plan("basic-1", "pro").parse(), Some(&p));
    assert_eq!(next.apply_overrides(&set), vec![]);
    assert_eq!(
        refused(&next, "Bearer basic-key-1"),
        Some(KeyRefusal::Revoked)
    );
    // The key taken out of the YAML and put back: still revoked.
    let gone = Policy::new(cfg.clone().without_key("basic-1").parse(), Some(&next));
    assert_eq!(
        gone.apply_overrides(&set),
        vec![],
        "a revocation outlives its key"
    );
    let back = Policy::new(cfg.parse(), Some(&gone));
    back.apply_overrides(&set);
    assert_eq!(
        refused(&back, "Bearer basic-key-1"),
        Some(KeyRefusal::Revoked)
    );
    // A new sha256 serves; the revoked digest, now a previous one, does not.
    let renewed = TestConfig::new().key_with("basic-1", |k| {
        k.key = Some("new-basic-key".into());
        k.previous.push(FilePrevious {
            sha256: digest("basic-key-1").to_hex(),
            until: "2026-12-01T00:00:00Z".into(),
        });
    });
    let renewed = Policy::new(renewed.parse(), Some(&back));
    renewed.keys.expire(DEC_1 - 1);
    assert_eq!(renewed.apply_overrides(&set), vec![]);
    assert_eq!(refused(&renewed, "Bearer new-basic-key"), None);
    assert_eq!(
        refused(&renewed, "Bearer basic-key-1"),
        Some(KeyRefusal::Revoked)
    );
}

#[test]
fn a_key_of_its_own_limit_has_a_policy_of_its_own() {
    let cfg = TestConfig::new().key_with("pro-1", |k| k.requests_per_window = Some(500));
    let p = Policy::new(cfg.parse(), None);
    let d = send(&p, "Bearer pro-key-1");
    assert_eq!(d.budget.unwrap().limit, 500);
    let (policy, state) = p.rate_limit_headers(
        d.key.unwrap(),
        d.credential.unwrap(),
        &d.budget.unwrap(),
        None,
    );
    assert_eq!(policy, "\"pro-1\";q=500;w=10");
    assert_eq!(state, "\"pro-1\";r=499;t=1");
    // Live, then back to the YAML's.
    let mut set = KeyRecords::new();
    act(&p, &mut set, "basic-1", Action::Limit(Some(3))).unwrap();
    let codes: Vec<bool> = (0..4)
        .map(|_| send(&p, "Bearer basic-key-1").verdict.is_ok())
        .collect();
    assert_eq!(codes, [true, true, true, false]);
    act(&p, &mut set, "basic-1", Action::Limit(None)).unwrap();
    assert_eq!(send(&p, "Bearer basic-key-1").budget.unwrap().limit, 40);
    // A partner key has none.
    assert_eq!(
        act(&p, &mut set, "acme", Action::Limit(Some(3))),
        Err(ChangeRefused::NotACustomerKey)
    );
}

#[test]
fn a_reload_that_changes_the_key_drops_its_suspension_limit_and_quota_only() {
    let cfg = TestConfig::new();
    let p = Policy::new(cfg.parse(), None);
    let mut set = KeyRecords::new();
    act(&p, &mut set, "basic-1", Action::Suspend(None)).unwrap();
    act(&p, &mut set, "basic-1", Action::Limit(Some(5))).unwrap();
    act(&p, &mut set, "standard-1", Action::Suspend(None)).unwrap();
    // Unchanged YAML: both kept.
    let same = Policy::new(cfg.parse(), Some(&p));
    assert_eq!(same.apply_overrides(&set), vec![]);
    assert_eq!(
        refused(&same, "Bearer basic-key-1"),
        Some(KeyRefusal::Suspended)
    );
    // basic-1 gets an expiry in the YAML: its changes go; standard-1's stay.
    let changed = cfg.key_with("basic-1", |k| {
        k.expires_at = Some("2099-01-01T00:00:00Z".into())
    });
    let next = Policy::new(changed.parse(), Some(&same));
    let drops = next.apply_overrides(&set);
    assert_eq!(drops.len(), 1);
    assert_eq!(drops[0].why, Dropped::YamlChanged);
    assert_eq!(drops[0].parts, [Part::Suspended, Part::Limit]);
    assert_eq!(drops[0].after, None);
    assert_eq!(refused(&next, "Bearer basic-key-1"), None);
    assert_eq!(send(&next, "Bearer basic-key-1").budget.unwrap().limit, 40);
    assert_eq!(
        refused(&next, "Bearer standard-key-1"),
        Some(KeyRefusal::Suspended)
    );
    // Another replica resumed standard-1: the whole set read again takes it off here.
    set.remove(&digest("standard-key-1"));
    set.remove(&digest("basic-key-1"));
    next.apply_overrides(&set);
    assert_eq!(refused(&next, "Bearer standard-key-1"), None);
}

#[test]
fn partners_suspend_resume_and_delete_their_own_customers_only() {
    let p = Policy::new(TestConfig::new().parse(), None);
    let acme = p.keys.lookup(&digest("acme-partner-key")).unwrap();
    for (route, effect) in [
        ("service_suspend", Effect::Suspend),
        ("service_resume", Effect::Resume),
        ("service_delete", Effect::Delete),
    ] {
        let r = p.config.catalogue.find(route).unwrap();
        let check =
            |k: &str| p.check_request_body(acme, r, format!(r#"{{"apiKey":"{k}"}}"#).as_bytes());
        assert_eq!(
            check("acme-customer-key").unwrap(),
            Some(Pending::Lifecycle {
                effect,
                target: digest("acme-customer-key"),
                key: p.keys.lookup(&digest("acme-customer-key")),
            })
        );
        for other in ["globex-customer-key", "unknown-key", "ACME-CUSTOMER-KEY"] {
            assert_eq!(
                check(other).unwrap_err().code,
                Code::NotYourCustomer,
                "{other}"
            );
        }
        let bad = p
            .check_request_body(acme, r, br#"{"apiKey":""}"#)
            .unwrap_err();
        assert_eq!(
            (bad.code, bad.errors[0].pointer.as_str()),
            (Code::InvalidBody, "/apiKey")
        );
    }
}

#[test]
fn check_refuses_a_shared_previous_digest_and_instants_not_in_utc() {
    let shared = TestConfig::new().key_with("basic-1", |k| {
        k.previous.push(FilePrevious {
            sha256: digest("pro-key-1").to_hex(),
            until: "2026-12-01T00:00:00Z".into(),
        });
    });
    let e = shared.try_parse().unwrap_err();
    assert_eq!(e.field, "keys[0].previous[0].sha256");
    assert!(e.message.contains("keys[2] (pro-1)"), "{}", e.message);
    assert!(e.line.is_some());
    for (edit, field) in [
        (
            Box::new(|k: &mut crate::config::file::FileKey| {
                k.expires_at = Some("2027-01-01T00:00:00+01:00".into())
            }) as Box<dyn Fn(&mut _)>,
            "keys[0].expires_at",
        ),
        (
            Box::new(|k: &mut crate::config::file::FileKey| {
                k.previous.push(FilePrevious {
                    sha256: digest("x").to_hex(),
                    until: "tomorrow".into(),
                })
            }),
            "keys[0].previous[0].until",
        ),
        (
            Box::new(|k: &mut crate::config::file::FileKey| k.requests_per_window = Some(0)),
            "keys[0].requests_per_window",
        ),
        (
            Box::new(|k: &mut crate::config::file::FileKey| {
                k.requests_per_window = Some(1_000_001)
            }),
            "keys[0].requests_per_window",
        ),
    ] {
        let e = TestConfig::new()
            .key_with("basic-1", edit)
            .try_parse()
            .unwrap_err();
        assert_eq!(e.field, field);
    }
    let past = TestConfig::new()
        .key_with("basic-1", |k| {
            k.expires_at = Some("2020-01-01T00:00:00Z".into())
        })
        .parse();
    assert!(past
        .warnings
        .iter()
        .any(|w| w.field == "keys[0].expires_at"));
}
