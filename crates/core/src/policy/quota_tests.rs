//! Quotas in the decision: charged after the window limit, refused with `quota_exhausted` and
//! `Retry-After` to the period's end, both policies in the rate-limit fields, shadow plans,
//! a key's own quota (from the YAML, and live), a new period, and a reload.

use super::authenticate::AuthHeader;
use super::overrides::{Action, KeyRecords};
use super::*;
use crate::testing::{quota, TestConfig};

/// 2026-11-30T23:59:58Z: two seconds before December.
const NOV_30_LATE: u64 = 1_796_083_198_000;
/// 2026-12-01T00:00:00Z.
const DEC_1: u64 = 1_796_083_200_000;
const SEC: u64 = 1_000_000_000;

fn send<'a>(p: &Policy, auth: &'a str, now: Nanos) -> Decision<'a> {
    p.decide(
        &RequestHead {
            method: "POST",
            path: "/v2/sendMessage/",
            authorization: AuthHeader::One(auth.as_bytes()),
        },
        now,
    )
}

fn at(p: Policy, wall_ms: u64) -> Policy {
    p.metering.calendar.set(wall_ms);
    p
}

fn headers(p: &Policy, d: &Decision<'_>) -> (String, String) {
    let (a, b) = p.rate_limit_headers(
        d.key.unwrap(),
        d.credential.unwrap(),
        &d.budget.unwrap(),
        d.quota_state.as_deref(),
    );
    (
        String::from_utf8(a.to_vec()).unwrap(),
        String::from_utf8(b.to_vec()).unwrap(),
    )
}

#[test]
fn a_monthly_quota_refuses_after_its_last_unit_until_the_month_ends() {
    let cfg = TestConfig::new().plan_quota("basic", 3, "month").parse();
    let p = at(Policy::new(cfg, None), NOV_30_LATE);
    for left in (0..3).rev() {
        let d = send(&p, "Bearer basic-key-1", 0);
        assert!(d.verdict.is_ok());
        assert_eq!(d.quota_state.as_ref().unwrap().remaining, left);
    }
    let d = send(&p, "Bearer basic-key-1", 0);
    let r = d.verdict.as_ref().unwrap_err();
    assert_eq!((r.code, r.retry_after), (Code::QuotaExhausted, Some(2)));
    assert_eq!(
        (r.status(), r.code.outcome()),
        (429, Outcome::QuotaExhausted)
    );
    let (policy, state) = headers(&p, &d);
    assert_eq!(
        policy, "\"basic\";q=40;w=10, \"basic-month\";q=3;w=2592000",
        "November has 30 days"
    );
    assert_eq!(state, "\"basic\";r=36;t=1, \"basic-month\";r=0;t=2");
    // Another key on the plan has its own count; a plan without a quota has none.
    assert!(send(&p, "Bearer acme-customer-key", 0).verdict.is_ok());
    assert_eq!(send(&p, "Bearer pro-key-1", 0).quota_state, None);
    // December: a new period, 31 days long.
    p.metering.calendar.set(DEC_1);
    let d = send(&p, "Bearer basic-key-1", 0);
    assert!(d.verdict.is_ok());
    assert_eq!(
        headers(&p, &d).0,
        "\"basic\";q=40;w=10, \"basic-month\";q=3;w=2678400"
    );
}

#[test]
fn the_window_limit_is_checked_first_and_spends_no_quota() {
    let cfg = TestConfig::new()
        .plan_limit("basic", 2)
        .plan_quota("basic", 100, "day")
        .parse();
    let p = at(Policy::new(cfg, None), DEC_1);
    for _ in 0..2 {
        assert!(send(&p, "Bearer basic-key-1", 0).verdict.is_ok());
    }
    let d = send(&p, "Bearer basic-key-1", 0);
    assert_eq!(d.verdict.as_ref().unwrap_err().code, Code::RateLimited);
    // Reported, not charged: both policies in the fields.
    assert_eq!(d.quota_state.as_ref().unwrap().remaining, 98);
    assert_eq!(
        headers(&p, &d).1,
        "\"basic\";r=0;t=5, \"basic-day\";r=98;t=86400"
    );
    // Refused before the limit (an allow-list refusal): reported too.
    let d = p.decide(
        &RequestHead {
            method: "POST",
            path: "/v2/settings/webhook/set",
            authorization: AuthHeader::One(b"Bearer basic-key-1"),
        },
        20 * SEC,
    );
    assert_eq!(d.verdict.unwrap_err().code, Code::PlanRestricted);
    assert_eq!(d.quota_state.as_ref().unwrap().remaining, 98);
}

#[test]
fn a_shadow_plan_forwards_over_its_quota_and_says_so() {
    let cfg = TestConfig::new()
        .plan_shadow("basic", true)
        .plan_quota("basic", 1, "day")
        .parse();
    let p = at(Policy::new(cfg, None), DEC_1);
    assert_eq!(send(&p, "Bearer basic-key-1", 0).shadow, None);
    let d = send(&p, "Bearer basic-key-1", 0);
    assert!(d.verdict.is_ok());
    assert_eq!(d.shadow, Some(Outcome::ShadowQuotaExhausted));
    assert_eq!(d.quota_state.as_ref().unwrap().charged, None);
}

#[test]
fn a_keys_own_quota_is_named_by_the_key_and_a_live_one_counts_what_was_charged() {
    let cfg = TestConfig::new()
        .plan_quota("basic", 10, "month")
        .key_with("acme-customer", |k| k.quota = Some(quota(2, "day")))
        .partner_quota(1, "day")
        .parse();
    let p = at(Policy::new(cfg, None), DEC_1);
    let d = send(&p, "Bearer acme-customer-key", 0);
    assert_eq!(
        headers(&p, &d).0,
        "\"basic\";q=40;w=10, \"acme-customer-day\";q=2;w=86400"
    );
    // basic-1 spends 4 of its plan's 10; a live quota of 5 a month leaves it 1.
    for _ in 0..4 {
        assert!(send(&p, "Bearer basic-key-1", 0).verdict.is_ok());
    }
    let k = p.keys.find_by_name("basic-1").unwrap();
    let mut set = KeyRecords::new();
    for (d, _, o) in p
        .change(k, &Action::Quota(Some(quota(5, "month"))), "admin", 0, &set)
        .unwrap()
    {
        set.insert(d, o);
    }
    p.apply_overrides(&set);
    let d = send(&p, "Bearer basic-key-1", 0);
    assert_eq!(d.quota_state.as_ref().unwrap().remaining, 0);
    assert!(d.quota_state.as_ref().unwrap().own);
    assert_eq!(
        send(&p, "Bearer basic-key-1", 0).verdict.unwrap_err().code,
        Code::QuotaExhausted
    );
    // Taken off: the plan's again, with the same count.
    p.apply_overrides(&KeyRecords::new());
    assert_eq!(
        send(&p, "Bearer basic-key-1", 0)
            .quota_state
            .unwrap()
            .remaining,
        4
    );
    // Partner keys: `partner_quota`, named `partner-day`.
    let d = p.decide(
        &RequestHead {
            method: "POST",
            path: "/v2/service/upgrade",
            authorization: AuthHeader::One(b"Bearer acme-partner-key"),
        },
        0,
    );
    assert!(headers(&p, &d).0.ends_with(", \"partner-day\";q=1;w=86400"));
}

#[test]
fn a_reload_keeps_the_counts_and_a_give_back_returns_one() {
    let cfg = TestConfig::new().plan_quota("basic", 2, "day");
    let old = at(Policy::new(cfg.parse(), None), DEC_1);
    let d = send(&old, "Bearer basic-key-1", 0);
    let charged = d.quota_state.as_ref().unwrap().charged.unwrap();
    assert!(send(&old, "Bearer basic-key-1", 0).verdict.is_ok());
    let new = Policy::new(cfg.parse(), Some(&old));
    assert_eq!(
        send(&new, "Bearer basic-key-1", 0)
            .verdict
            .unwrap_err()
            .code,
        Code::QuotaExhausted
    );
    let k = new.keys.find_by_name("basic-1").unwrap();
    new.keys.get(k).rate.meter.get().unwrap().give_back(charged);
    assert!(send(&new, "Bearer basic-key-1", 0).verdict.is_ok());
}

#[test]
fn the_config_checks_quotas_and_warns_when_their_counts_would_not_be_kept() {
    let warned = |c: TestConfig| -> Vec<(String, String)> {
        c.parse()
            .warnings
            .into_iter()
            .filter(|w| !w.message.contains("a plain key"))
            .map(|w| (w.field, w.message))
            .collect()
    };
    let w = warned(TestConfig::new().plan_quota("pro", 10, "day").ledger(30));
    assert_eq!(w.len(), 2, "{w:?}");
    assert_eq!(w[0].0, "plans.pro.quota");
    assert!(
        w[0].1.contains("quotas restart with the process"),
        "{}",
        w[0].1
    );
    assert_eq!(w[1].0, "ledger");
    assert!(warned(
        TestConfig::new()
            .plan_quota("pro", 10, "day")
            .state_path("/tmp/state.db")
    )
    .is_empty());
    for (bad, field) in [
        (
            TestConfig::new().plan_quota("pro", 0, "day"),
            "plans.pro.quota.requests",
        ),
        (
            TestConfig::new().partner_quota(1_000_000_000_001, "month"),
            "partner_quota.requests",
        ),
        (TestConfig::new().ledger(0), "ledger.retention_days"),
        (TestConfig::new().ledger(3661), "ledger.retention_days"),
    ] {
        let e = bad.try_parse().unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
}

#[test]
fn after_the_wall_clock_steps_back_a_spent_quota_points_to_the_period_it_was_spent_in() {
    let cfg = TestConfig::new().plan_quota("basic", 2, "day").parse();
    let p = at(Policy::new(cfg, None), DEC_1 + 10_000);
    for _ in 0..2 {
        assert!(send(&p, "Bearer basic-key-1", 0).verdict.is_ok());
    }
    // The clock steps back into November 30: the count of December 1 still refuses (it is
    // of a later day), until December 1 ends, and says so.
    p.metering.calendar.set(NOV_30_LATE);
    let d = send(&p, "Bearer basic-key-1", 0);
    let r = d.verdict.as_ref().unwrap_err();
    assert_eq!(r.code, Code::QuotaExhausted);
    assert_eq!(r.retry_after, Some(2 + 86_400), "to the end of December 1");
    let (_, state) = headers(&p, &d);
    assert!(state.ends_with("\"basic-day\";r=0;t=86402"), "{state}");
}
