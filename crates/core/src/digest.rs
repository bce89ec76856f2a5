//! The SHA-256 digest of a key: what the gateway stores and compares instead of the key.

use std::fmt;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

/// SHA-256 of a key. Its `Debug` never prints the bytes.
///
/// `==` and the order are for the digests the gateway holds (maps of its own records); a
/// presented key is compared with [`Digest::ct_eq`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// The digest of `key`.
    pub fn of(key: &[u8]) -> Self {
        Digest(Sha256::digest(key).into())
    }

    /// Parse 64 hex characters (either case).
    pub fn from_hex(s: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Digest(out))
    }

    /// The 64 lowercase hex characters, as `from_hex` reads them.
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

    /// Equal, compared in constant time: the four 64-bit words' differences are folded with
    /// XOR and OR (no branch on the data), and only the fold's test goes through `subtle`
    /// (one optimisation barrier instead of one per byte: a tenth of `decide`'s time went
    /// into the per-byte compare, docs/benchmarks/history.md, tuning step 11).
    pub fn ct_eq(&self, other: &Digest) -> bool {
        let word = |d: &[u8; 32], i: usize| {
            u64::from_ne_bytes(d[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
        };
        let diff = (0..4).fold(0u64, |acc, i| acc | (word(&self.0, i) ^ word(&other.0, i)));
        bool::from(diff.ct_eq(&0))
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
    body_end > 0 && b[..body_end].iter().all(|&c| TOKEN68[usize::from(c)])
}

/// The bytes of a token68's body, as a table: one load per byte instead of a chain of range
/// tests.
const TOKEN68: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/');
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The table says of every byte what RFC 7235's token68 grammar says.
    #[test]
    fn the_token68_table_is_the_grammar() {
        for c in 0..=255u8 {
            let rule = c.is_ascii_alphanumeric() || b"-._~+/".contains(&c);
            assert_eq!(TOKEN68[usize::from(c)], rule, "byte {c:#04x}");
            assert_eq!(is_token68(&[c]), rule, "byte {c:#04x}");
        }
    }

    #[test]
    fn ct_eq_sees_a_difference_in_any_byte() {
        let a = Digest::of(b"some key");
        assert!(a.ct_eq(&Digest(a.0)));
        for i in 0..32 {
            for bit in [0x01, 0x80] {
                let mut b = a;
                b.0[i] ^= bit;
                assert!(!a.ct_eq(&b), "byte {i}, bit {bit:#x}");
            }
        }
    }

    #[test]
    fn digest_hex_roundtrip_and_debug_hides_bytes() {
        let d = Digest::of(b"secret-key");
        assert_eq!(Digest::from_hex(&d.to_hex()), Some(d));
        assert_eq!(Digest::from_hex(&d.to_hex().to_uppercase()), Some(d));
        assert_eq!(Digest::from_hex("abc"), None);
        assert_eq!(Digest::from_hex(&"g".repeat(64)), None);
        assert_eq!(Digest::from_hex(&"a".repeat(66)), None);
        assert!(!format!("{d:?}").contains(&d.to_hex()[..8]));
    }
}
