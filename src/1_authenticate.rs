//! Step 1 — authenticate: `Authorization: Bearer <key>` → the caller's key entry.
//!
//! Keys are secrets, so the gateway never holds one: the config carries SHA-256 digests, the
//! presented token is hashed, and the digest is looked up in an immutable [`KeyTable`] that a
//! reload swaps whole. The table is indexed by a hash of the digest (seeded per table); every
//! comparison of a stored digest with the presented one is of all 32 bytes, in constant time
//! ([`subtle`]). A missing header, a malformed one, two
//! headers, and an unknown key all produce the same refusal, and looking a key up never
//! creates state, so unknown keys cannot grow memory.
//!
//! Each entry owns its rate-limit state (an `Arc`, so a reload can hand the same counter to the
//! new table for a key that remains: a request still deciding on the old table spends from the
//! same budget as one on the new table).
//!
//! The table is built for up to millions of keys: an entry is 88 bytes with its name inline
//! ([`KeyName`]), plus the 24-byte rate-state allocation, and the index holds a tag byte and a
//! `u32` position per slot, at most half full ([`SlotIndex`]): about 130 bytes per key in all.
//! `cargo bench --bench keys` measures it (docs/keyscale.md).

use std::fmt;
use std::hash::BuildHasher;
use std::ops::Deref;
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::limit::RateState;
use crate::refusal::Refusal;
use crate::slots::SlotIndex;

/// SHA-256 of a key. Its `Debug` never prints the bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn of(key: &[u8]) -> Self {
        Digest(Sha256::digest(key).into())
    }

    /// Parse 64 hex characters (either case). Branch-free per character: a config can hold a
    /// million digests.
    pub fn from_hex(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        let mut bad = 0u8;
        for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
            let (hi, lo) = (HEX[usize::from(pair[0])], HEX[usize::from(pair[1])]);
            bad |= hi | lo;
            *o = (hi << 4) | (lo & 0x0f);
        }
        (bad & 0xf0 == 0).then_some(Digest(out))
    }

    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The four 64-bit words XORed: every byte counts, for a cheap hash (`hash_one` of this, not
    /// of the 32 bytes, keeps a lookup of an unknown key within a few ns of a bare probe).
    pub fn folded(&self) -> u64 {
        self.0
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
            .fold(0, |a, w| a ^ w)
    }

    /// Equal, compared in constant time.
    pub fn ct_eq(&self, other: &Digest) -> bool {
        bool::from(self.0.ct_eq(&other.0))
    }
}

/// Hex digit values; `0xff` for a byte that is not one.
static HEX: [u8; 256] = {
    let mut t = [0xff; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        t[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

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

/// A key's or partner's name: at most 64 characters (the config checks them), kept inline up to
/// [`KeyName::INLINE`] bytes so that a million names cost no allocation.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct KeyName(NameRepr);

#[derive(Clone, PartialEq, Eq, Hash)]
enum NameRepr {
    Inline {
        len: u8,
        bytes: [u8; KeyName::INLINE],
    },
    Heap(Box<str>),
}

const _: () = assert!(std::mem::size_of::<KeyName>() == 24);

impl KeyName {
    /// The longest name kept without an allocation.
    pub const INLINE: usize = 22;

    pub fn new(name: &str) -> Self {
        if name.len() <= Self::INLINE {
            let mut bytes = [0u8; Self::INLINE];
            bytes[..name.len()].copy_from_slice(name.as_bytes());
            KeyName(NameRepr::Inline {
                len: name.len() as u8,
                bytes,
            })
        } else {
            KeyName(NameRepr::Heap(name.into()))
        }
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            // Always the whole of a `&str` given to `new`, so always UTF-8.
            NameRepr::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            NameRepr::Heap(s) => s,
        }
    }
}

impl Deref for KeyName {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for KeyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for KeyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq<str> for KeyName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for KeyName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[derive(Debug)]
pub struct KeyEntry {
    /// The operator's label for logs and metrics; never the key.
    pub name: KeyName,
    pub credential: Credential,
    pub digest: Digest,
    pub rate: Arc<RateState>,
}

/// Index of an entry in its [`KeyTable`].
pub type KeyIdx = u32;

/// Immutable digest → key table, built per config: customer keys in config order, then
/// partner keys.
#[derive(Debug, Default)]
pub struct KeyTable {
    entries: Box<[KeyEntry]>,
    /// Entry positions by a hash of the whole digest ([`Digest::folded`]). (Not of its first
    /// bytes alone: digests written by hand or by a test generator, such as `000…001`,
    /// `000…002`, share those.)
    index: SlotIndex,
    /// Seeded per table.
    hasher: foldhash::fast::RandomState,
}

impl KeyTable {
    /// Build the table for `config`. Rate state is taken over from `previous` for every digest
    /// that is in both, so a reload does not reset anyone's budget.
    pub fn build(config: &Config, previous: Option<&KeyTable>) -> Self {
        let mut carry = Carry { previous, shift: 0 };
        let mut entries = Vec::with_capacity(config.keys.len() + config.partners.len());
        for (i, k) in config.keys.iter().enumerate() {
            entries.push(KeyEntry {
                name: k.name.clone(),
                credential: Credential::Customer {
                    plan: k.plan,
                    partner: k.partner,
                },
                digest: k.digest,
                rate: carry.rate(i, &k.digest),
            });
        }
        for (i, p) in config.partners.iter().enumerate() {
            let at = entries.len();
            entries.push(KeyEntry {
                name: KeyName::new(&p.name),
                credential: Credential::Partner { partner: i },
                digest: p.digest,
                rate: carry.rate(at, &p.digest),
            });
        }
        let entries = entries.into_boxed_slice();
        let hasher = foldhash::fast::RandomState::default();
        let mut index = SlotIndex::with_capacity(entries.len());
        for (i, e) in entries.iter().enumerate() {
            // The config refuses a digest given twice; should one slip through, the first wins.
            let _ = index.insert(hasher.hash_one(e.digest.folded()), i as KeyIdx, |j| {
                entries[j as usize].digest == e.digest
            });
        }
        Self {
            entries,
            index,
            hasher,
        }
    }

    /// The entry with this digest; every digest comparison is constant-time.
    pub fn lookup(&self, d: &Digest) -> Option<KeyIdx> {
        self.index.find(self.hasher.hash_one(d.folded()), |i| {
            self.entries[i as usize].digest.ct_eq(d)
        })
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

/// Hands each key's rate state from the previous table to the new one.
///
/// Between two reloads most keys stay where they were, or move by the keys added or removed
/// before them: the entry at the new position plus the last offset seen is tried first (one
/// sequential read; the digest decides), and only when it is another key is the digest looked
/// up (a random read, the cost of a reload with a million keys). Either way the state handed
/// over is that of the entry with the same digest, so the result is the same as looking every
/// key up.
struct Carry<'p> {
    previous: Option<&'p KeyTable>,
    /// Position in the previous table minus position in the new one, at the last key found.
    shift: isize,
}

impl Carry<'_> {
    fn rate(&mut self, at: usize, d: &Digest) -> Arc<RateState> {
        let Some(prev) = self.previous else {
            return Arc::default();
        };
        let guess = at
            .checked_add_signed(self.shift)
            .and_then(|g| prev.entries.get(g));
        if let Some(e) = guess.filter(|e| e.digest.ct_eq(d)) {
            return Arc::clone(&e.rate);
        }
        match prev.lookup(d) {
            Some(j) => {
                self.shift = j as isize - at as isize;
                Arc::clone(&prev.get(j).rate)
            }
            None => Arc::default(),
        }
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
        assert_eq!(Digest::from_hex(&"a".repeat(66)), None);
        // Every byte in every position of a pair: exactly what the `hex` crate accepts.
        let base = d.to_hex();
        for at in [0, 1, 62, 63] {
            for c in 0..=255u8 {
                let mut s = base.clone().into_bytes();
                s[at] = c;
                let Ok(s) = String::from_utf8(s) else {
                    continue;
                };
                let mut want = [0u8; 32];
                let want = hex::decode_to_slice(&s, &mut want)
                    .ok()
                    .map(|()| Digest(want));
                assert_eq!(Digest::from_hex(&s), want, "{c}");
            }
        }
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
    fn digests_that_differ_in_one_byte_resolve_by_the_full_digest() {
        let mut cfg = crate::testing::config();
        // Synthetic digests (`000…000`, `000…001`, …) share all but their last byte.
        for (i, k) in cfg.keys.iter_mut().enumerate() {
            k.digest = Digest([0; 32]);
            k.digest.0[31] = i as u8;
        }
        let table = KeyTable::build(&cfg, None);
        for (i, k) in cfg.keys.iter().enumerate() {
            assert_eq!(table.lookup(&k.digest), Some(i as KeyIdx));
        }
        let mut c = Digest([0; 32]);
        c.0[31] = 200;
        assert_eq!(table.lookup(&c), None);
        c.0[31] = 0;
        c.0[0] = 1;
        assert_eq!(table.lookup(&c), None);
    }

    #[test]
    fn many_keys_are_all_found_and_others_are_not() {
        let mut cfg = crate::testing::config();
        let spec = cfg.keys[0].clone();
        cfg.keys = (0..5000)
            .map(|i| crate::config::KeySpec {
                name: KeyName::new(&format!("k{i}")),
                digest: Digest::of(format!("key-{i}").as_bytes()),
                ..spec.clone()
            })
            .collect();
        let table = KeyTable::build(&cfg, None);
        assert_eq!(table.len(), 5000 + cfg.partners.len());
        for i in 0..5000u32 {
            let d = Digest::of(format!("key-{i}").as_bytes());
            assert_eq!(table.lookup(&d), Some(i));
            assert_eq!(table.get(i).name, format!("k{i}").as_str());
            assert!(table
                .lookup(&Digest::of(format!("other-{i}").as_bytes()))
                .is_none());
        }
        let acme = table.lookup(&Digest::of(b"acme-partner-key")).unwrap();
        assert_eq!(
            table.get(acme).credential,
            Credential::Partner { partner: 0 }
        );
    }

    #[test]
    fn key_names_are_inline_up_to_22_bytes_and_read_back_whole() {
        for name in [
            "",
            "a",
            "shop-0000001",
            &"x".repeat(22),
            &"y".repeat(23),
            &"z".repeat(64),
        ] {
            let n = KeyName::new(name);
            assert_eq!(&*n, name);
            assert_eq!(n.to_string(), name);
            assert_eq!(format!("{n:?}"), format!("{name:?}"));
            assert!(n == name);
            assert_eq!(matches!(n.0, NameRepr::Inline { .. }), name.len() <= 22);
        }
        assert_ne!(KeyName::new("ab"), KeyName::new("abc"));
    }

    #[test]
    fn reload_carries_rate_state_by_digest_whatever_moved() {
        let mut cfg = crate::testing::config();
        let spec = cfg.keys[0].clone();
        let key = |i: u32| crate::config::KeySpec {
            name: KeyName::new(&format!("k{i}")),
            digest: Digest::of(format!("key-{i}").as_bytes()),
            ..spec.clone()
        };
        cfg.keys = (0..100).map(key).collect();
        let old = KeyTable::build(&cfg, None);
        // Removed at the front, added in the middle, moved from the middle to the end, and the
        // partners after all of them.
        let mut keys: Vec<_> = (3..100).filter(|&i| i != 50).map(key).collect();
        keys.insert(20, key(1000));
        keys.insert(21, key(1001));
        keys.push(key(50));
        let mut cfg2 = cfg.clone();
        cfg2.keys = keys;
        let new = KeyTable::build(&cfg2, Some(&old));
        assert_eq!(new.len(), cfg2.keys.len() + cfg2.partners.len());
        for i in 0..new.len() as KeyIdx {
            let e = new.get(i);
            match old.lookup(&e.digest) {
                Some(o) => assert!(Arc::ptr_eq(&old.get(o).rate, &e.rate), "{}", e.name),
                None => {
                    assert!(e.name == "k1000" || e.name == "k1001", "{}", e.name);
                    assert_eq!(Arc::strong_count(&e.rate), 1);
                }
            }
        }
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
