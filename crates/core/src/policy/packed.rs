//! A kept text held in fewer bytes ([`Packed`]), given back byte for byte: a replica's copy
//! of the set holds a field for each of a million issued keys, and an issued key's part is
//! mostly hex (its `id` and `digest`, 64 characters each, the same two until it is
//! rotated) after a version the `Kept` holds as a number already.
//!
//! The bytes: a head (whether the text starts with the version's 16 digits and `|`, which
//! are left out), then the text with each run of 64 lowercase hex digits as [`DIGEST`] and
//! its 32 bytes, or as [`AGAIN`] when it is the run just before, and each of the [`WORDS`]
//! an issued key's part is made of as one byte. A text is UTF-8, in which none of these
//! bytes ever occurs (0xF5 to 0xFF), so the rest is the text's own bytes. Packing is a
//! function of the text alone (the first word that fits wins, in the table's order): two
//! texts are equal when their packed bytes are.

/// Digits of a version as kept, zero-padded (the crate's `VERSION_DIGITS`).
pub(crate) const VERSION_DIGITS: usize = 16;

/// 64 hex digits follow, as 32 bytes.
const DIGEST: u8 = 0xFF;
/// The 64 hex digits of the last [`DIGEST`] again.
const AGAIN: u8 = 0xFE;
/// What a record's JSON is made of, each held as one byte (0xF5 for the first, and so on):
/// an issued key's part is these, its name, its digest twice and a few numbers.
const WORDS: [&[u8]; 9] = [
    br#"{"key":""#,
    br#"","at_ms":0,"issued":{"id":""#,
    br#"","digest":""#,
    br#"","plan_id":"#,
    br#","since_ms":"#,
    br#","by":"admin"}}"#,
    br#","at_ms":"#,
    br#","by":""#,
    br#","expires_ms":"#,
];
/// The byte of [`WORDS`]'s first.
const FIRST_WORD: u8 = 0xF5;
const _: () = assert!(FIRST_WORD as usize + WORDS.len() == AGAIN as usize);

/// The head's mark of a text that starts with its version.
const VERSIONED: u8 = 1;

/// A kept text, packed (see the module's docs).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Packed(Box<[u8]>);

impl Packed {
    /// `raw`, whose version (read from it) is `version`.
    pub(crate) fn pack(raw: &str, version: u64) -> Self {
        match raw.as_bytes().strip_prefix(&prefix(version)) {
            Some(body) => Self::of_body(VERSIONED, body),
            None => Self::of_body(0, raw.as_bytes()),
        }
    }

    /// `{version}|{json}` for the version it is given back with: the same as [`Packed::pack`]
    /// of that text, without the text made first.
    pub(crate) fn versioned(json: &str) -> Self {
        Self::of_body(VERSIONED, json.as_bytes())
    }

    /// The text's `bytes` after its `head`.
    fn of_body(head: u8, bytes: &[u8]) -> Self {
        let mut out = Vec::with_capacity(bytes.len() / 2 + 8);
        out.push(head);
        let mut last: Option<&[u8]> = None;
        let mut i = 0;
        while i < bytes.len() {
            if matches!(bytes[i], b'{' | b'"' | b',') {
                let rest = &bytes[i..];
                if let Some(w) = WORDS.iter().position(|w| rest.starts_with(w)) {
                    out.push(FIRST_WORD + w as u8);
                    i += WORDS[w].len();
                    continue;
                }
            }
            let run = bytes[i..]
                .iter()
                .take_while(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
                .count();
            let mut j = i;
            while j + 64 <= i + run {
                let hex = &bytes[j..j + 64];
                if last == Some(hex) {
                    out.push(AGAIN);
                } else {
                    out.push(DIGEST);
                    out.extend(hex.chunks(2).map(|p| (nibble(p[0]) << 4) | nibble(p[1])));
                    last = Some(hex);
                }
                j += 64;
            }
            let end = (i + run).max(i + 1).min(bytes.len());
            out.extend_from_slice(&bytes[j..end]);
            i = end;
        }
        Packed(out.into_boxed_slice())
    }

    /// How many bytes it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The text again, as it was packed, of `version`.
    pub(crate) fn text(&self, version: u64) -> String {
        let (head, body) = self.0.split_first().unwrap_or((&0, &[]));
        let mut out = Vec::with_capacity(body.len() * 2 + VERSION_DIGITS + 1);
        if *head == VERSIONED {
            out.extend_from_slice(&prefix(version));
        }
        let mut last: &[u8] = &[];
        let mut i = 0;
        while i < body.len() {
            match body[i] {
                DIGEST => {
                    last = body.get(i + 1..i + 33).unwrap_or_default();
                    push_hex(&mut out, last);
                    i += 33;
                }
                AGAIN => {
                    push_hex(&mut out, last);
                    i += 1;
                }
                b if b >= FIRST_WORD => {
                    out.extend_from_slice(WORDS[usize::from(b - FIRST_WORD)]);
                    i += 1;
                }
                b => {
                    out.push(b);
                    i += 1;
                }
            }
        }
        // Only the bytes of a `&str` and hex were put in: UTF-8.
        String::from_utf8(out).unwrap_or_default()
    }
}

/// `version` as a text starts with it: its last 16 digits, zero-padded, and `|` (with no
/// allocation: a start packs a million texts). A version read from a text has 16 digits at
/// most, so this is its prefix exactly.
fn prefix(version: u64) -> [u8; VERSION_DIGITS + 1] {
    let mut p = [b'0'; VERSION_DIGITS + 1];
    p[VERSION_DIGITS] = b'|';
    let mut v = version;
    for d in p[..VERSION_DIGITS].iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
    p
}

fn nibble(h: u8) -> u8 {
    match h {
        b'0'..=b'9' => h - b'0',
        _ => h - b'a' + 10,
    }
}

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(HEX[usize::from(b >> 4)]);
        out.push(HEX[usize::from(b & 15)]);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Texts made of what kept texts are made of: versions, hex of every length (64 and
    /// around it, repeated), JSON punctuation, other characters.
    fn any_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            "[0-9a-f]{60,70}",
            Just("ab".repeat(32)),
            "[0-9a-fA-F]{0,140}",
            Just("0001796083200000|".to_string()),
            r#"[{}":,a-z_|0-9]{0,20}"#,
            proptest::sample::select(WORDS.to_vec())
                .prop_map(|w| String::from_utf8(w.to_vec()).unwrap()),
            "\\PC{0,8}",
        ];
        proptest::collection::vec(piece, 0..8).prop_map(|p| p.concat())
    }

    proptest! {
        /// Whatever the text and version, it is given back byte for byte, and two texts
        /// pack alike only when they are the same.
        #[test]
        fn a_text_packed_is_given_back_byte_for_byte(
            a in any_text(),
            b in any_text(),
            version in prop_oneof![Just(1_796_083_200_000u64), 0u64..10_000_000_000_000_000],
        ) {
            for t in [&a, &b] {
                prop_assert_eq!(&Packed::pack(t, version).text(version), t);
                let versioned = format!("{version:016}|{t}");
                prop_assert_eq!(Packed::pack(&versioned, version).text(version), versioned.clone());
                prop_assert!(Packed::versioned(t) == Packed::pack(&versioned, version));
            }
            prop_assert_eq!(Packed::pack(&a, version) == Packed::pack(&b, version), a == b);
        }
    }
}
