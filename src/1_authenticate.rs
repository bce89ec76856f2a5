//! Step 1 — authenticate: `Authorization: Bearer <key>` → the caller's key entry.
//!
//! Keys are secrets, so the gateway never holds one: the config carries SHA-256 digests, the
//! presented token is hashed, and the digest is looked up in an immutable [`KeyTable`] that a
//! reload swaps whole. The table is indexed by the first eight digest bytes only; the full
//! 32-byte comparison is constant-time ([`subtle`]). A missing header, a malformed one, two
//! headers, and an unknown key all produce the same refusal, and looking a key up never
//! creates state, so unknown keys cannot grow memory.
//!
//! Each entry owns its rate-limit state (an `Arc`, so a reload can hand the same counter to the
//! new table for a key that remains).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::limit::RateState;
use crate::refusal::Refusal;

/// SHA-256 of a key. Its `Debug` never prints the bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn of(key: &[u8]) -> Self {
        Digest(Sha256::digest(key).into())
    }

    /// Parse 64 hex characters (either case).
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Digest(out))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn prefix(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Digest(..)")
    }
}

/// RFC 7235 token68: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
pub fn is_token68(b: &[u8]) -> bool {
    let body_end = b.iter().rposition(|&c| c != b'=').map_or(0, |i| i + 1);
    body_end > 0
        && b[..body_end].iter().all(|&c| {
            c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
}

/// What the request carried in `Authorization`.
#[derive(Clone, Copy, Debug)]
pub enum AuthHeader<'a> {
    Missing,
    One(&'a [u8]),
    /// More than one `Authorization` field: ambiguous, refused.
    Many,
}

/// Who a key belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// A customer key on a plan (index into `Config::plans`), maybe managed by a partner.
    Customer { plan: usize, partner: Option<usize> },
    /// A partner key (index into `Config::partners`).
    Partner { partner: usize },
}

#[derive(Debug)]
pub struct KeyEntry {
    /// The operator's label for logs and metrics; never the key.
    pub name: String,
    pub credential: Credential,
    pub digest: Digest,
    pub rate: Arc<RateState>,
    /// Next entry whose digest shares the first eight bytes (practically never).
    next: Option<u32>,
}

/// Index of an entry in its [`KeyTable`].
pub type KeyIdx = u32;

/// The digest prefix is already uniformly distributed: hash it as itself.
#[derive(Default)]
struct PrefixHasher(u64);

impl Hasher for PrefixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Immutable digest → key table, built per config.
#[derive(Debug, Default)]
pub struct KeyTable {
    entries: Vec<KeyEntry>,
    by_prefix: HashMap<u64, KeyIdx, BuildHasherDefault<PrefixHasher>>,
}

impl KeyTable {
    /// Build the table for `config`. Rate state is taken over from `previous` for every digest
    /// that is in both, so a reload does not reset anyone's budget.
    pub fn build(config: &Config, previous: Option<&KeyTable>) -> Self {
        let carried = |d: &Digest| {
            previous
                .and_then(|t| t.lookup(d).map(|i| Arc::clone(&t.get(i).rate)))
                .unwrap_or_default()
        };
        let mut entries = Vec::with_capacity(config.keys.len() + config.partners.len());
        for k in &config.keys {
            entries.push(KeyEntry {
                name: k.name.clone(),
                credential: Credential::Customer {
                    plan: k.plan,
                    partner: k.partner,
                },
                digest: k.digest,
                rate: carried(&k.digest),
                next: None,
            });
        }
        for (i, p) in config.partners.iter().enumerate() {
            entries.push(KeyEntry {
                name: p.name.clone(),
                credential: Credential::Partner { partner: i },
                digest: p.digest,
                rate: carried(&p.digest),
                next: None,
            });
        }
        let mut by_prefix: HashMap<u64, KeyIdx, _> = HashMap::default();
        by_prefix.reserve(entries.len());
        for i in 0..entries.len() {
            let idx = i as KeyIdx;
            if let Some(head) = by_prefix.insert(entries[i].digest.prefix(), idx) {
                entries[i].next = Some(head);
            }
        }
        Self { entries, by_prefix }
    }

    /// The entry with this digest, compared in constant time.
    pub fn lookup(&self, d: &Digest) -> Option<KeyIdx> {
        let mut at = self.by_prefix.get(&d.prefix()).copied();
        while let Some(i) = at {
            let e = &self.entries[i as usize];
            if bool::from(e.digest.0.ct_eq(&d.0)) {
                return Some(i);
            }
            at = e.next;
        }
        None
    }

    pub fn get(&self, i: KeyIdx) -> &KeyEntry {
        &self.entries[i as usize]
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Extract the bearer token from one `Authorization` value: scheme case-insensitive, one or
/// more spaces, a token68. Surrounding whitespace is tolerated (RFC 9110 OWS).
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let v = value.trim_ascii();
    if v.len() < 7 || !v[..6].eq_ignore_ascii_case(b"bearer") || v[6] != b' ' {
        return None;
    }
    let token = v[7..].trim_ascii_start();
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
    use crate::refusal::Code;

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
    }

    #[test]
    fn digest_hex_roundtrip_and_debug_hides_bytes() {
        let d = Digest::of(b"secret-key");
        assert_eq!(Digest::from_hex(&d.to_hex()), Some(d));
        assert_eq!(Digest::from_hex(&d.to_hex().to_uppercase()), Some(d));
        assert_eq!(Digest::from_hex("abc"), None);
        assert_eq!(Digest::from_hex(&"g".repeat(64)), None);
        assert!(!format!("{d:?}").contains(&d.to_hex()[..8]));
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
            assert_eq!(r.code, Code::Unauthorized);
        }
        let i = authenticate(&table, AuthHeader::One(b"Bearer basic-key-1")).unwrap();
        assert_eq!(table.get(i).name, "basic-1");
    }

    #[test]
    fn prefix_collisions_still_resolve_by_full_digest() {
        let cfg = crate::testing::config();
        let mut table = KeyTable::build(&cfg, None);
        // Force two entries into one prefix chain, then look both up.
        let a = table.entries[0].digest;
        let mut b = table.entries[1].digest;
        b.0[..8].copy_from_slice(&a.0[..8]);
        table.entries[1].digest = b;
        table.by_prefix.clear();
        table.by_prefix.insert(a.prefix(), 1);
        table.entries[1].next = Some(0);
        table.entries[0].next = None;
        assert_eq!(table.lookup(&a), Some(0));
        assert_eq!(table.lookup(&b), Some(1));
        let mut c = a;
        c.0[31] ^= 1;
        assert_eq!(table.lookup(&c), None);
    }

    #[test]
    fn reload_carries_rate_state_for_remaining_keys_only() {
        let cfg = crate::testing::config();
        let old = KeyTable::build(&cfg, None);
        let mut cfg2 = cfg.clone();
        cfg2.keys.remove(0);
        let new = KeyTable::build(&cfg2, Some(&old));
        let kept = &cfg2.keys[0].digest;
        let (o, n) = (old.lookup(kept).unwrap(), new.lookup(kept).unwrap());
        assert!(Arc::ptr_eq(&old.get(o).rate, &new.get(n).rate));
        let gone = &cfg.keys[0].digest;
        assert!(new.lookup(gone).is_none());
    }
}
