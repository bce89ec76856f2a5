//! Authenticate: `Authorization: Bearer <key>` → the caller's entry in the [`KeyTable`].
//!
//! The presented token is hashed (SHA-256) and its digest looked up; the gateway never holds a
//! key (see [`super::keys`]). A missing header, a malformed one, two headers and an unknown key
//! all produce the same refusal, and looking a key up never creates state, so unknown keys
//! cannot grow memory.

use super::keys::{Digest, KeyIdx, KeyTable};
use crate::digest::is_token68;

use super::refusal::Refusal;

/// What the request carried in `Authorization`.
#[derive(Clone, Copy, Debug)]
pub enum AuthHeader<'a> {
    /// No `Authorization` field.
    Missing,
    /// One `Authorization` field, its raw value.
    One(&'a [u8]),
    /// More than one `Authorization` field: ambiguous, refused.
    Many,
}

/// Extract the bearer token from one `Authorization` value: scheme case-insensitive, one or
/// more spaces (RFC 9110 `1*SP`: spaces only, no tab), a token68. Surrounding spaces and tabs
/// are tolerated (RFC 9110 OWS).
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let ows = |c: &u8| *c == b' ' || *c == b'\t';
    let start = value.iter().position(|c| !ows(c)).unwrap_or(value.len());
    let end = value.iter().rposition(|c| !ows(c)).map_or(start, |i| i + 1);
    let v = &value[start..end];
    if v.len() < 7 || !v[..6].eq_ignore_ascii_case(b"bearer") || v[6] != b' ' {
        return None;
    }
    let at = v[7..].iter().position(|&c| c != b' ')? + 7;
    let token = &v[at..];
    is_token68(token).then_some(token)
}

/// The caller's entry, or `401 unauthorized` — the same answer for every way of failing.
pub fn authenticate(table: &KeyTable, header: AuthHeader<'_>) -> Result<KeyIdx, Refusal> {
    let AuthHeader::One(value) = header else {
        return Err(Refusal::unauthorized());
    };
    let token = bearer_token(value).ok_or_else(Refusal::unauthorized)?;
    table
        .lookup(&Digest::of(token))
        .ok_or_else(Refusal::unauthorized)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::refusal::Code;

    #[test]
    fn token68_grammar() {
        assert!(is_token68(b"abc-._~+/XYZ09"));
        assert!(is_token68(b"abc=="));
        assert!(!is_token68(b""));
        assert!(!is_token68(b"=="));
        assert!(!is_token68(b"a=b"));
        assert!(!is_token68(b"a b"));
        assert!(!is_token68(b"a,b"));
        assert!(!is_token68("clé".as_bytes()));
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bEaReR abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Bearer   abc  "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearerabc"), None);
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer a b"), None);
        assert_eq!(bearer_token(b"Bearer\tabc"), None);
        // Between the scheme and the token, spaces only (found by fuzzing).
        assert_eq!(bearer_token(b"Bearer \tabc"), None);
        assert_eq!(bearer_token(b"Bearer  \x0cabc"), None);
        assert_eq!(bearer_token(b"\t Bearer   abc \t"), Some(&b"abc"[..]));
    }

    #[test]
    fn every_failure_is_the_same_401() {
        let cfg = crate::testing::config();
        let table = KeyTable::build(&cfg, None);
        for h in [
            AuthHeader::Missing,
            AuthHeader::Many,
            AuthHeader::One(b"Basic Zm9vOmJhcg=="),
            AuthHeader::One(b"Bearer"),
            AuthHeader::One(b"Bearer not-a-known-key"),
        ] {
            let r = authenticate(&table, h).unwrap_err();
            assert_eq!(r, Refusal::unauthorized());
        }
        let i = authenticate(&table, AuthHeader::One(b"Bearer basic-key-1")).unwrap();
        assert_eq!(table.get(i).name, "basic-1");
        assert_eq!(Refusal::unauthorized().code, Code::Unauthorized);
    }
}
