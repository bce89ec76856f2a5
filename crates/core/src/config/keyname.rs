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

impl KeyName {
    /// The name's bytes (no check that they are UTF-8: they were a `&str` given to `new`).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            NameRepr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            NameRepr::Heap(s) => s.as_bytes(),
        }
    }
}

/// The inline bytes as three big-endian words: compared as numbers, in the order of the bytes.
fn words(bytes: &[u8; KeyName::INLINE]) -> (u64, u64, u64) {
    let mut last = [0u8; 8];
    last[..6].copy_from_slice(&bytes[16..]);
    (
        u64::from_be_bytes(bytes[..8].try_into().unwrap_or_default()),
        u64::from_be_bytes(bytes[8..16].try_into().unwrap_or_default()),
        u64::from_be_bytes(last),
    )
}

/// Names in the order of their bytes (`str`'s order), two inline names compared a word at a
/// time: a book of a million names (the issued keys') compares names at every step of every
/// search. Inline bytes past a name's length are zero, so the words order the names as their
/// bytes do, the shorter first where one is the other's start, but for a name that ends in
/// zero bytes: there the lengths decide.
impl Ord for KeyName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (&self.0, &other.0) {
            (NameRepr::Inline { len: a, bytes: x }, NameRepr::Inline { len: b, bytes: y }) => {
                words(x).cmp(&words(y)).then(a.cmp(b))
            }
            _ => self.as_bytes().cmp(other.as_bytes()),
        }
    }
}

impl PartialOrd for KeyName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
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

    #[test]
    fn key_names_sort_as_their_text_where_the_words_alone_would_not() {
        let x22 = "x".repeat(22);
        let x23 = "x".repeat(23);
        let texts = [
            "", "\0", "a", "a\0", "a\0\0", "a\0b", "ab", "abc", "b", &x22, &x23, "x\u{e9}",
        ];
        let mut names: Vec<KeyName> = texts.iter().rev().map(|t| KeyName::new(t)).collect();
        names.sort();
        let mut sorted = texts.to_vec();
        sorted.sort();
        assert_eq!(names.iter().map(|n| n.as_str()).collect::<Vec<_>>(), sorted);
    }

    proptest::proptest! {
        /// Names order as their text does, inline or not, zero bytes and all.
        #[test]
        fn key_names_order_as_their_text(
            a in "([a-c0\\x00]|\\PC){0,30}",
            b in "([a-c0\\x00]|\\PC){0,30}",
        ) {
            let (x, y) = (KeyName::new(&a), KeyName::new(&b));
            proptest::prop_assert_eq!(x.cmp(&y), a.as_str().cmp(b.as_str()));
            proptest::prop_assert_eq!(x == y, a == b);
            proptest::prop_assert_eq!(x.as_bytes(), a.as_bytes());
        }
    }
}
