//! Request bodies: `check_body` for every body rule on any bytes a client can send.
//!
//! Input: the raw body. Every input is checked against all three rules (`group_event`,
//! `webhook_set`, `service_upgrade`) under the shipped cap, and once more under a cap one byte
//! below its length. Seeds: `fuzz/seeds/body_checker/`.
//!
//! Invariants checked, besides "never panics" (and no runaway recursion or allocation, which
//! libFuzzer's limits report):
//! - a body over the cap is `413` and nothing else, whatever it holds;
//! - a refusal is one of the body codes, an `invalid_body` one names at least one field, every
//!   pointer is a JSON Pointer, and every detail is bounded (it is echoed in the answer);
//! - whether a body parses does not depend on the rule: all three rules agree on
//!   `invalid_json`;
//! - a body that passes is one JSON object (serde_json agrees).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::config::WebhookGuard;
use tollgate_core::policy::body::Checked;
use tollgate_core::config::routes::BodyRule;
use tollgate_core::policy::{Code, Refusal};
use tollgate_fuzz::{check_body, default_guard, MAX_BODY, RULES};

/// A detail longer than this would echo the input back at the client.
const MAX_DETAIL: usize = 512;

fn check_refusal(rule: BodyRule, body: &[u8], r: &Refusal) {
    let shown = String::from_utf8_lossy(body);
    assert!(
        matches!(r.code, Code::InvalidJson | Code::InvalidBody),
        "{}: {shown:?}: unexpected code {:?}",
        rule.name(),
        r.code
    );
    assert!(
        r.detail.chars().count() <= MAX_DETAIL,
        "{}: detail of {} characters",
        rule.name(),
        r.detail.chars().count()
    );
    if r.code == Code::InvalidBody {
        assert!(
            !r.errors.is_empty(),
            "{}: {shown:?}: invalid_body without a field",
            rule.name()
        );
    }
    for e in &r.errors {
        assert!(
            e.pointer.is_empty() || e.pointer.starts_with('/'),
            "{}: {shown:?}: pointer {:?}",
            rule.name(),
            e.pointer
        );
        assert!(
            e.detail.chars().count() <= MAX_DETAIL,
            "{}: {shown:?}: {} detail of {} characters",
            rule.name(),
            e.pointer,
            e.detail.chars().count()
        );
    }
}

fn check(body: &[u8], guard: &WebhookGuard) {
    let mut invalid_json = None;
    for rule in RULES {
        // Over the cap: 413, before anything is parsed.
        if !body.is_empty() {
            let small = body.len() as u64 - 1;
            match check_body(rule, body, small, guard) {
                Err(r) => assert_eq!(r.code, Code::BodyTooLarge, "{}", rule.name()),
                Ok(c) => panic!(
                    "{}: {} bytes passed a cap of {small}: {c:?}",
                    rule.name(),
                    body.len()
                ),
            }
        }
        let result = check_body(rule, body, MAX_BODY, guard);
        let is_invalid_json = matches!(&result, Err(r) if r.code == Code::InvalidJson);
        match invalid_json {
            None => invalid_json = Some(is_invalid_json),
            Some(before) => assert_eq!(
                before,
                is_invalid_json,
                "{}: the rules disagree on whether {:?} is JSON",
                rule.name(),
                String::from_utf8_lossy(body)
            ),
        }
        match result {
            Err(r) => check_refusal(rule, body, &r),
            Ok(checked) => {
                let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| {
                    panic!(
                        "{}: passed, but serde_json refuses {:?}: {e}",
                        rule.name(),
                        String::from_utf8_lossy(body)
                    )
                });
                assert!(v.is_object(), "{}: passed a non-object", rule.name());
                let expected = match rule {
                    BodyRule::GroupEvent => matches!(checked, Checked::GroupEvent),
                    BodyRule::WebhookSet => matches!(checked, Checked::WebhookSet),
                    BodyRule::ServiceUpgrade => matches!(checked, Checked::ServiceUpgrade { .. }),
                    BodyRule::ServiceKey => matches!(checked, Checked::ServiceKey { .. }),
                };
                assert!(expected, "{}: checked as {checked:?}", rule.name());
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() as u64 > MAX_BODY {
        return;
    }
    check(data, &default_guard());
});
