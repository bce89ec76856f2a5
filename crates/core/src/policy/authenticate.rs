//! Authenticate: `Authorization: Bearer <key>` → the caller's entry in the [`KeyTable`].
//!
//! The presented token is hashed (SHA-256) and its digest looked up; the gateway never holds a
//! key (see [`super::keys`]). A missing header, a malformed one, two headers and an unknown key
//! all produce the same refusal, and looking a key up never creates state, so unknown keys
//! cannot grow memory.

use super::keys::{Alias, Digest, Found, KeyFlags, KeyIdx, KeyRefusal, KeyTable};
use crate::digest::is_token68;

/// What the request carried in `Authorization`.
#[derive(Clone, Copy, Debug)]
pub enum AuthHeader<'a> {
    /// No `Authorization` field.
    Missing,
    /// One `Authorization` field, its raw value.
    One(&'a [u8]),
    /// More than one `Authorization` field: ambiguous, refused.
    Many,
    /// The digest of the bearer key this request's first decision hashed: a request decided
    /// again after waiting for the fleet ([`super::Decision::unsettled`]) is not hashed twice.
    Digest(Digest),
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

/// Why authentication failed: the reason (for logs and metrics only) and, for a known key
/// that is refused, which one. The client gets the same 401 whatever it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotAuthenticated {
    /// Why.
    pub reason: KeyRefusal,
    /// The key, when the token is a known key's that is expired, suspended or revoked.
    pub key: Option<KeyIdx>,
}

impl NotAuthenticated {
    const UNKNOWN: Self = Self {
        reason: KeyRefusal::Unknown,
        key: None,
    };
}

/// The caller's entry and what is in force for it ([`KeyFlags`]), or why not — one 401 for
/// every way of failing ([`super::Refusal::unauthorized`]).
///
/// A digest in force costs one table lookup and one branch on the key's [`KeyFlags`] word; only
/// a digest that is no key's is looked for among the `previous` digests.
#[inline]
pub fn authenticate(
    table: &KeyTable,
    header: AuthHeader<'_>,
) -> Result<(KeyIdx, KeyFlags), NotAuthenticated> {
    authenticate_digest(table, &presented(header)?)
}

/// The digest of the bearer key `header` presents (hashed here, unless it is one already).
#[inline]
pub fn presented(header: AuthHeader<'_>) -> Result<Digest, NotAuthenticated> {
    match header {
        AuthHeader::One(value) => {
            let token = bearer_token(value).ok_or(NotAuthenticated::UNKNOWN)?;
            Ok(Digest::of(token))
        }
        AuthHeader::Digest(d) => Ok(d),
        AuthHeader::Missing | AuthHeader::Many => Err(NotAuthenticated::UNKNOWN),
    }
}

/// [`authenticate`] a presented key's digest.
#[inline]
pub fn authenticate_digest(
    table: &KeyTable,
    digest: &Digest,
) -> Result<(KeyIdx, KeyFlags), NotAuthenticated> {
    let (key, alias) = match table.lookup(digest) {
        Some(k) => (k, None),
        None => match table.resolve(digest) {
            Some(Found::Alias(a)) => (table.alias(a).key, Some(table.alias(a))),
            _ => return Err(NotAuthenticated::UNKNOWN),
        },
    };
    let live = table.get(key).live();
    if !live.is_plain() {
        if let Some(reason) = live.refused() {
            // Revoked digests first: a revoked alias stays revoked whatever its key's state.
            let reason = match alias.and_then(Alias::refused) {
                Some(KeyRefusal::Revoked) => KeyRefusal::Revoked,
                _ => reason,
            };
            return Err(NotAuthenticated {
                reason,
                key: Some(key),
            });
        }
    }
    if let Some(reason) = alias.and_then(Alias::refused) {
        return Err(NotAuthenticated {
            reason,
            key: Some(key),
        });
    }
    Ok((key, live))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::{Code, Refusal};

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
            assert_eq!(r, NotAuthenticated::UNKNOWN);
        }
        let (i, _) = authenticate(&table, AuthHeader::One(b"Bearer basic-key-1")).unwrap();
        assert_eq!(table.get(i).name, "basic-1");
        assert_eq!(Refusal::unauthorized().code, Code::Unauthorized);
    }
}
