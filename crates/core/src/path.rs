//! Paths: one normalizer for every request path (and every path the catalogue names), so that
//! a server can never read a path two ways.
//!
//! Anything ambiguous is refused rather than guessed at:
//! - dot segments (`.`, `..`, also when written `%2e`), empty segments (`//`);
//! - percent-encoded `/`, `\`, `;`, NUL or other control bytes, and malformed escapes;
//! - double encodings (`%25` followed by two hex digits, such as `%252e`);
//! - raw `\`, `;` (path parameters), `#` (fragments), control bytes, and any non-ASCII byte.
//!
//! Escapes of unreserved characters (`A–Z a–z 0–9 - . _ ~`) are decoded; other escapes are
//! kept, with upper-case hex. The query string is not part of a path and is not looked at.
//! Used by the catalogue's check of its own paths ([`crate::config::routes`]) and by
//! classification ([`crate::policy::classify`]).

use std::borrow::Cow;

/// Why a path was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathError {
    /// The path does not start with `/`.
    NotAbsolute,
    /// A raw byte outside ASCII.
    NonAscii,
    /// A raw control byte (0x00–0x1F or 0x7F).
    ControlByte,
    /// A raw `#`.
    Fragment,
    /// A raw `\`.
    Backslash,
    /// A raw `;` (path parameters).
    Semicolon,
    /// A `%` not followed by two hex digits.
    BadEscape,
    /// An escape of `/`, `\`, `;`, NUL or another control byte.
    EncodedDelimiter,
    /// `%25` followed by two hex digits, as written or once decoded.
    DoubleEncoded,
    /// A `.` or `..` segment, also when written with escapes.
    DotSegment,
    /// An empty segment (`//`); a trailing `/` is allowed.
    EmptySegment,
}

impl PathError {
    /// The refusal's `detail`, for the client (400 `invalid_path`).
    pub fn detail(self) -> &'static str {
        match self {
            PathError::NotAbsolute => "the path must start with `/`",
            PathError::NonAscii => "the path contains a non-ASCII byte",
            PathError::ControlByte => "the path contains a control character",
            PathError::Fragment => "the path contains a fragment (`#`)",
            PathError::Backslash => "the path contains `\\`",
            PathError::Semicolon => "the path contains `;` (path parameters are ambiguous)",
            PathError::BadEscape => "the path contains a malformed percent-escape",
            PathError::EncodedDelimiter => {
                "the path contains an encoded `/`, `\\`, `;`, NUL or control character"
            }
            PathError::DoubleEncoded => {
                "the path contains a double percent-encoding (`%25` followed by hex digits)"
            }
            PathError::DotSegment => "the path contains a `.` or `..` segment",
            PathError::EmptySegment => "the path contains an empty segment (`//`)",
        }
    }
}

/// The value of a hex digit, either case.
pub(crate) fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Bytes the fast path of [`normalize`] must look at: `/` (a segment ends), `%` (an escape:
/// the full path), and every byte that refuses a path.
const SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] =
            c >= 0x80 || c <= 0x1F || c == 0x7F || matches!(c, b'#' | b'\\' | b';' | b'%' | b'/');
        i += 1;
    }
    t
};

/// Normalize a request path (without its query), or refuse it. Borrows when nothing changes.
///
/// Most paths hold no escape: one pass checks their bytes and segments and borrows them
/// (a sixth of `decide`'s time went into the two passes of the general case); a path with a
/// `%` takes the general case, [`normalize_escaped`]. Both answer alike, errors included
/// (a byte's refusal before a segment's, as the general case finds them); a property test
/// holds them to it.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, PathError> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut segment = 1;
    let mut bad_segment = None;
    for (i, &c) in b.iter().enumerate().skip(1) {
        if !SPECIAL[usize::from(c)] {
            continue;
        }
        match c {
            b'/' => {
                if bad_segment.is_none() {
                    bad_segment = segment_error(&b[segment..i], false);
                }
                segment = i + 1;
            }
            b'%' => return normalize_escaped(path),
            0x80..=0xFF => return Err(PathError::NonAscii),
            b'#' => return Err(PathError::Fragment),
            b'\\' => return Err(PathError::Backslash),
            b';' => return Err(PathError::Semicolon),
            _ => return Err(PathError::ControlByte),
        }
    }
    match bad_segment.or_else(|| segment_error(&b[segment..], true)) {
        Some(e) => Err(e),
        None => Ok(Cow::Borrowed(path)),
    }
}

/// A segment's refusal: empty (but the last, a trailing `/`), `.` or `..`.
fn segment_error(seg: &[u8], last: bool) -> Option<PathError> {
    match seg {
        b"" if !last => Some(PathError::EmptySegment),
        b"." | b".." => Some(PathError::DotSegment),
        _ => None,
    }
}

/// [`normalize`] in general: escapes decoded where they stand for an unreserved byte,
/// upper-cased otherwise, refused where they hide a delimiter or a double encoding.
pub fn normalize_escaped(path: &str) -> Result<Cow<'_, str>, PathError> {
    let b = path.as_bytes();
    if b.first() != Some(&b'/') {
        return Err(PathError::NotAbsolute);
    }
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            0x80..=0xFF => return Err(PathError::NonAscii),
            0x00..=0x1F | 0x7F => return Err(PathError::ControlByte),
            b'#' => return Err(PathError::Fragment),
            b'\\' => return Err(PathError::Backslash),
            b';' => return Err(PathError::Semicolon),
            b'%' => {
                let (h, l) = match (
                    b.get(i + 1).copied().and_then(hex_val),
                    b.get(i + 2).copied().and_then(hex_val),
                ) {
                    (Some(h), Some(l)) => (h, l),
                    _ => return Err(PathError::BadEscape),
                };
                let decoded = h << 4 | l;
                if matches!(decoded, b'/' | b'\\' | b';' | 0x00..=0x1F | 0x7F) {
                    return Err(PathError::EncodedDelimiter);
                }
                // `%252e` is `%2e` to a server that decodes twice: refuse the ambiguity.
                if decoded == b'%'
                    && b.get(i + 3).copied().and_then(hex_val).is_some()
                    && b.get(i + 4).copied().and_then(hex_val).is_some()
                {
                    return Err(PathError::DoubleEncoded);
                }
                let buf = out.get_or_insert_with(|| b[..i].to_vec());
                if is_unreserved(decoded) {
                    buf.push(decoded);
                } else {
                    buf.extend_from_slice(&[
                        b'%',
                        b[i + 1].to_ascii_uppercase(),
                        b[i + 2].to_ascii_uppercase(),
                    ]);
                }
                i += 3;
                continue;
            }
            _ => {}
        }
        if let Some(buf) = out.as_mut() {
            buf.push(c);
        }
        i += 1;
    }
    let norm: &[u8] = out.as_deref().unwrap_or(b);
    // Decoding may have built a double encoding out of escapes (`%25%32e` → `%252e`): the
    // path forwarded must not hold one either.
    if out.is_some()
        && norm
            .windows(5)
            .any(|w| w[..3] == *b"%25" && hex_val(w[3]).is_some() && hex_val(w[4]).is_some())
    {
        return Err(PathError::DoubleEncoded);
    }
    // Segments: skip the leading `/`; a final empty segment (trailing `/`) is allowed.
    let segments = &norm[1..];
    let mut parts = segments.split(|&c| c == b'/').peekable();
    while let Some(seg) = parts.next() {
        let last = parts.peek().is_none();
        match seg {
            b"" if !last => return Err(PathError::EmptySegment),
            b"." | b".." => return Err(PathError::DotSegment),
            _ => {}
        }
    }
    Ok(match out {
        // Only ASCII went in, and every escape kept is ASCII.
        Some(v) => Cow::Owned(String::from_utf8(v).expect("ASCII")),
        None => Cow::Borrowed(path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20_000))]
        /// The fast path answers exactly as the general case, on paths made of the bytes
        /// that matter (slashes, dots, escapes, refused bytes) and a few plain ones.
        #[test]
        fn the_fast_path_answers_as_the_general_case(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "/", "/", "/", ".", "..", "a", "Bc", "%", "%2e", "%2F", "%41", "%25", "%2", "5",
                "#", ";", "\\", "\u{1}", "\u{7f}", "é", "~", "-",
            ]), 0..12),
            rooted in proptest::bool::weighted(0.8),
        ) {
            let path = if rooted { format!("/{}", parts.concat()) } else { parts.concat() };
            proptest::prop_assert_eq!(normalize(&path), normalize_escaped(&path), "{:?}", path);
        }
    }

    #[test]
    fn normalize_accepts_plain_paths_unchanged() {
        for p in [
            "/",
            "/v2/sendMessage/",
            "/v2/client/getChats",
            "/v2/a-b_c~d.e/x",
        ] {
            assert!(
                matches!(normalize(p), Ok(Cow::Borrowed(q)) if q == p),
                "{p}"
            );
        }
    }

    #[test]
    fn normalize_decodes_unreserved_and_uppercases_other_escapes() {
        assert_eq!(normalize("/v2/%73endMessage/").unwrap(), "/v2/sendMessage/");
        assert_eq!(normalize("/v2/a%2db%7Ec").unwrap(), "/v2/a-b~c");
        assert_eq!(normalize("/v2/a%20b%c3%a9").unwrap(), "/v2/a%20b%C3%A9");
    }

    #[test]
    fn normalize_refuses_ambiguous_paths() {
        let cases: &[(&str, PathError)] = &[
            ("v2/x", PathError::NotAbsolute),
            ("", PathError::NotAbsolute),
            ("/v2/../x", PathError::DotSegment),
            ("/v2/./x", PathError::DotSegment),
            ("/v2/x/..", PathError::DotSegment),
            ("/v2/%2e%2e/x", PathError::DotSegment),
            ("/v2/.%2E/x", PathError::DotSegment),
            ("/v2/%2e/x", PathError::DotSegment),
            ("/v2//x", PathError::EmptySegment),
            ("//v2/x", PathError::EmptySegment),
            ("/v2/a%2Fb", PathError::EncodedDelimiter),
            ("/v2/a%2fb", PathError::EncodedDelimiter),
            ("/v2/a%5Cb", PathError::EncodedDelimiter),
            ("/v2/a%00b", PathError::EncodedDelimiter),
            ("/v2/a%3Bb", PathError::EncodedDelimiter),
            ("/v2/a%0ab", PathError::EncodedDelimiter),
            ("/v2/a;b=c", PathError::Semicolon),
            ("/v2/a\\b", PathError::Backslash),
            ("/v2/a#b", PathError::Fragment),
            ("/v2/a\tb", PathError::ControlByte),
            ("/v2/é", PathError::NonAscii),
            ("/v2/client/%252e%252e/chats/", PathError::DoubleEncoded),
            ("/v2/a%252Fb", PathError::DoubleEncoded),
            // Built from escapes (found by fuzzing): `%25` then an escaped digit.
            ("/%25%625", PathError::DoubleEncoded),
            (
                "/v2/client/%25%32e%25%32e/settings/webhook/set",
                PathError::DoubleEncoded,
            ),
            ("/v2/%25%32%46x", PathError::DoubleEncoded),
            ("/v2/a%zz", PathError::BadEscape),
            ("/v2/a%2", PathError::BadEscape),
            ("/v2/a%", PathError::BadEscape),
        ];
        for (p, e) in cases {
            assert_eq!(normalize(p), Err(*e), "{p:?}");
        }
    }
}
