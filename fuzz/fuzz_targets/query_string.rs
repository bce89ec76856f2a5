//! The query string of a checked operation: `check_query` on any query a client can send.
//!
//! Input: the query (the text after `?`). Seeds: `fuzz/seeds/query_string/`; reproducers of
//! the outside attack run's finding (`?url=http://169.254.169.254/` on the webhook, `?apiKey=`
//! on an upgrade): `fuzz/regressions/query_string/`.
//!
//! Invariants checked, besides "never panics":
//! - whenever a lenient framework would read a body member from the query (Rails, PHP and
//!   Express merge `name`, `name[]`, `outer[inner]`; Spring binds `outer.inner`; names are
//!   percent- and `+`-decoded, compared case-insensitively, Unicode letters folded as Java's
//!   `equalsIgnoreCase` and Python's `casefold` fold them), `check_query` refuses the query;
//! - a refusal is `400 invalid_body` with a parameter named for each error.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::config::routes::BodyRule;
use tollgate_core::policy::body::check_query;
use tollgate_core::policy::Code;
use tollgate_fuzz::{unicode_fold, RULES};

/// The members a rule's body has (the oracle's own list, at any depth), and the customer key's
/// field name of the routes that carry one.
fn members(rule: BodyRule) -> &'static [&'static str] {
    match rule {
        BodyRule::GroupEvent => &[
            "name",
            "groupid",
            "type",
            "starttime",
            "eventoptions",
            "calltype",
            "description",
        ],
        BodyRule::WebhookSet => &["url", "signing", "webhookkey"],
        BodyRule::ServiceUpgrade => &["apikey", "planid"],
        BodyRule::ServiceKey => &["apikey"],
    }
}

/// `%XX` and `+` decoded, as a framework decodes a parameter's name.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a lenient framework would read a member of `rule` from `query`.
fn lenient_reads_a_member(rule: BodyRule, query: &str, key_field: &str) -> bool {
    let key = key_field.to_ascii_lowercase();
    query.split(['&', ';']).any(|param| {
        let name = decode(param.split('=').next().unwrap_or_default());
        name.split(['[', ']', '.']).any(|part| {
            let part = unicode_fold(part.trim());
            !part.is_empty() && (part == key || members(rule).contains(&part.as_str()))
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    for rule in RULES {
        let key_field = "apiKey";
        let got = check_query(rule, Some(query), key_field);
        if lenient_reads_a_member(rule, query, key_field) {
            assert!(
                got.is_err(),
                "{rule:?} {query:?}: a framework reads a member, forwarded"
            );
        }
        if let Err(r) = got {
            assert_eq!(r.code, Code::InvalidBody, "{rule:?} {query:?}");
            assert!(
                !r.errors.is_empty(),
                "{rule:?} {query:?}: no parameter named"
            );
        }
    }
});
