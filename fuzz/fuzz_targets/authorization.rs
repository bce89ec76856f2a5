//! The `Authorization` header: `bearer_token` and `authenticate` on any bytes a client can put
//! in the field, against the key table of `tollgate_core::testing::config()`.
//!
//! Input: one field value, raw bytes (a header value need not be UTF-8). Seeds:
//! `fuzz/seeds/authorization/`.
//!
//! Invariants checked, besides "never panics":
//! - a token `bearer_token` returns lies inside the value, is token68, and comes after a
//!   case-insensitive `Bearer` and a space;
//! - `authenticate` finds a key exactly when the token is one of the config's keys (an oracle
//!   kept here: the plain test keys and who they belong to), and finds *that* key;
//! - a missing field and several fields are refused whatever else, with the same reason as
//!   every other failure of a token no key has (`unknown`, and no key).

#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tollgate_core::digest::is_token68;
use tollgate_core::policy::authenticate::{
    authenticate, bearer_token, AuthHeader, NotAuthenticated,
};
use tollgate_core::policy::keys::{KeyRefusal, KeyTable};

/// The plain keys of `testing::CONFIG_YAML`, and the name of the key or partner each is.
const KEYS: [(&str, &str); 7] = [
    ("basic-key-1", "basic-1"),
    ("standard-key-1", "standard-1"),
    ("pro-key-1", "pro-1"),
    ("acme-customer-key", "acme-customer"),
    ("globex-customer-key", "globex-customer"),
    ("acme-partner-key", "acme"),
    ("globex-partner-key", "globex"),
];

struct Fixture {
    table: KeyTable,
    names: HashMap<&'static [u8], &'static str>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let table = KeyTable::build(&tollgate_core::testing::config(), None);
        assert_eq!(
            table.len(),
            KEYS.len(),
            "the test config's keys changed: update KEYS"
        );
        let names = KEYS.iter().map(|&(k, n)| (k.as_bytes(), n)).collect();
        Fixture { table, names }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    // No key is expired, suspended or revoked here: every failure is `unknown`, of no key.
    let unauthorized = NotAuthenticated {
        reason: KeyRefusal::Unknown,
        key: None,
    };

    let token = bearer_token(data);
    if let Some(t) = token {
        let start = t.as_ptr() as usize - data.as_ptr() as usize;
        assert!(
            start + t.len() <= data.len(),
            "the token is not inside the value"
        );
        assert!(is_token68(t), "{:?}: token {:?} is not token68", data, t);
        let before = &data[..start];
        let scheme = before.trim_ascii_start();
        assert!(
            scheme.len() >= 7
                && scheme[..6].eq_ignore_ascii_case(b"bearer")
                && scheme[6] == b' '
                && scheme[7..].iter().all(|&c| c == b' '),
            "{:?}: token {:?} after {:?}",
            String::from_utf8_lossy(data),
            String::from_utf8_lossy(t),
            String::from_utf8_lossy(before)
        );
        let after = &data[start + t.len()..];
        assert!(
            after.iter().all(|c| c.is_ascii_whitespace()),
            "{:?}: {:?} after the token",
            String::from_utf8_lossy(data),
            String::from_utf8_lossy(after)
        );
    }

    let expected = token.and_then(|t| f.names.get(t).copied());
    match (authenticate(&f.table, AuthHeader::One(data)), expected) {
        (Ok((i, _)), Some(name)) => assert_eq!(
            f.table.get(i).name.as_str(),
            name,
            "{:?} authenticated as the wrong key",
            String::from_utf8_lossy(data)
        ),
        (Ok((i, _)), None) => panic!(
            "{:?} authenticated as {:?}, which is no key of the config",
            String::from_utf8_lossy(data),
            f.table.get(i).name.as_str()
        ),
        (Err(r), Some(name)) => panic!(
            "{:?} carries the key of {name} but was refused: {r:?}",
            String::from_utf8_lossy(data)
        ),
        (Err(r), None) => assert_eq!(r, unauthorized, "a failure told apart"),
    }

    // One field or none: the same refusal, whatever the value.
    assert_eq!(
        authenticate(&f.table, AuthHeader::Missing),
        Err(unauthorized)
    );
    assert_eq!(authenticate(&f.table, AuthHeader::Many), Err(unauthorized));
});
