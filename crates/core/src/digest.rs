//! The SHA-256 digest of a key: what the gateway stores and compares instead of the key.

use std::fmt;

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

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

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Digest(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
