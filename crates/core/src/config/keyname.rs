//! Key and partner names, as the config holds them: the operator's label for a key in logs,
//! metrics and the admin API (never the key itself), and the bound on how many a table holds.

use std::fmt;
use std::ops::Deref;

/// The most keys and partners one table holds: positions are `u32`.
pub const MAX_KEYS: usize = u32::MAX as usize;

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

    /// `name` as a key name, inline when it fits in [`KeyName::INLINE`] bytes.
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

    /// The name as a string.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
