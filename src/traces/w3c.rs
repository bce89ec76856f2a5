//! W3C Trace Context: the `traceparent` a request brings, read strictly, and the one the
//! upstream gets. The rules are the recommendation's and its test suite's (w3c/trace-context
//! `test/test.py`): version `00` is exactly `00-{32 hex}-{16 hex}-{2 hex}`, lower-case, with
//! non-zero ids; `ff` is no version; a later version is read by its first four fields and may
//! go on only after a `-`; two `traceparent` fields are no parent at all. Whatever fails is
//! ignored: the request starts a new trace, and the field is never forwarded.

use http::{HeaderMap, HeaderName, HeaderValue};

/// A trace's id: 16 bytes, never all zero.
pub(crate) type TraceId = [u8; 16];
/// A span's id: 8 bytes, never all zero.
pub(crate) type SpanId = [u8; 8];

/// The field's name, as the gateway writes it.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The field's name, parsed once: a lookup by it hashes, but parses nothing.
pub(crate) static TRACEPARENT_NAME: HeaderName = HeaderName::from_static(TRACEPARENT);
/// The vendors' list that goes with it.
pub(crate) static TRACESTATE_NAME: HeaderName = HeaderName::from_static("tracestate");

/// The caller's span, from a valid `traceparent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parent {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// Bit 0 of the flags: the caller records this trace.
    pub(crate) sampled: bool,
}

/// What a request's `traceparent` fields are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// No field.
    Absent,
    /// A field that is not one valid `traceparent`, or two fields (never forwarded).
    Invalid,
    /// One valid field.
    Valid(Parent),
}

/// The request's `traceparent` (one lookup).
pub(crate) fn incoming(headers: &HeaderMap) -> Incoming {
    let mut fields = headers.get_all(&TRACEPARENT_NAME).iter();
    match (fields.next(), fields.next()) {
        (None, _) => Incoming::Absent,
        (Some(v), None) => parse(v.as_bytes()).map_or(Incoming::Invalid, Incoming::Valid),
        // Two fields: test_traceparent_duplicated.
        (Some(_), Some(_)) => Incoming::Invalid,
    }
}

/// One field's value, strictly; `None` for anything the recommendation says to ignore.
pub(crate) fn parse(value: &[u8]) -> Option<Parent> {
    let v = trim(value);
    if v.len() < 55 {
        return None;
    }
    let version = hex_byte(&v[0..2])?;
    match version {
        0xff => return None,
        // Version 00 has exactly these four fields.
        0x00 if v.len() != 55 => return None,
        // A later version may add fields, after a `-`.
        _ if v.len() > 55 && v[55] != b'-' => return None,
        _ => {}
    }
    if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    hex_into(&v[3..35], &mut trace_id)?;
    let mut span_id = [0u8; 8];
    hex_into(&v[36..52], &mut span_id)?;
    let flags = hex_byte(&v[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id,
        span_id,
        sampled: flags & 1 == 1,
    })
}

/// The `traceparent` the upstream gets: version `00`, this trace, the span it is a child of.
pub(crate) fn header(trace_id: &TraceId, span_id: &SpanId, sampled: bool) -> HeaderValue {
    let mut out = [0u8; 55];
    out[0..3].copy_from_slice(b"00-");
    hex_out(trace_id, &mut out[3..35]);
    out[35] = b'-';
    hex_out(span_id, &mut out[36..52]);
    out[52] = b'-';
    out[53..55].copy_from_slice(if sampled { b"01" } else { b"00" });
    // Lower-case hex digits and dashes only: always a valid header value.
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// `id` as lower-case hex into `out` (twice its length).
pub(crate) fn hex_out(id: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, b) in id.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 15)];
    }
}

/// The value without the optional whitespace HTTP allows around it.
fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|&b| b != b' ' && b != b'\t');
    let end = v.iter().rposition(|&b| b != b' ' && b != b'\t');
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

/// A lower-case hex digit's value.
fn digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    Some((digit(two[0])? << 4) | digit(two[1])?)
}

fn hex_into(text: &[u8], out: &mut [u8]) -> Option<()> {
    for (i, o) in out.iter_mut().enumerate() {
        *o = hex_byte(&text[2 * i..2 * i + 2])?;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "12345678901234567890123456789012";
    const SPAN: &str = "1234567890123456";

    fn tp(s: &str) -> Option<Parent> {
        parse(s.as_bytes())
    }

    fn valid(s: &str) -> bool {
        tp(s).is_some()
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(TRACEPARENT, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    // The cases of w3c/trace-context test/test.py, as a vendor that continues or ignores sees
    // them (the suite checks that an ignored parent's trace id is not continued).

    #[test]
    fn a_plain_version_00_parent_is_continued() {
        let p = tp(&format!("00-{TRACE}-{SPAN}-01")).unwrap();
        assert_eq!(hex::encode(p.trace_id), TRACE);
        assert_eq!(hex::encode(p.span_id), SPAN);
        assert!(p.sampled);
        assert!(!tp(&format!("00-{TRACE}-{SPAN}-00")).unwrap().sampled);
        // Other flag bits do not mean sampled; bit 0 does.
        assert!(!tp(&format!("00-{TRACE}-{SPAN}-02")).unwrap().sampled);
        assert!(tp(&format!("00-{TRACE}-{SPAN}-09")).unwrap().sampled);
    }

    #[test]
    fn two_traceparent_fields_are_ignored() {
        // test_traceparent_duplicated
        let one = format!("00-{TRACE}-{SPAN}-01");
        let other = format!("00-{}-{SPAN}-01", "1".repeat(32));
        assert!(matches!(incoming(&headers(&[&one])), Incoming::Valid(_)));
        assert_eq!(incoming(&headers(&[&one, &other])), Incoming::Invalid);
        assert_eq!(incoming(&headers(&[&one, &one])), Incoming::Invalid);
        assert_eq!(incoming(&HeaderMap::new()), Incoming::Absent);
        assert_eq!(incoming(&headers(&["junk"])), Incoming::Invalid);
    }

    #[test]
    fn version_00_with_anything_after_it_is_ignored() {
        // test_traceparent_version_0x00
        assert!(!valid(&format!("00-{TRACE}-{SPAN}-01.")));
        assert!(!valid(&format!(
            "00-{TRACE}-{SPAN}-01-what-the-future-will-be-like"
        )));
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        // test_traceparent_version_0xcc
        let p = tp(&format!("cc-{TRACE}-{SPAN}-01")).unwrap();
        assert_eq!(hex::encode(p.trace_id), TRACE);
        assert!(valid(&format!(
            "cc-{TRACE}-{SPAN}-01-what-the-future-will-be-like"
        )));
        assert!(!valid(&format!(
            "cc-{TRACE}-{SPAN}-01.what-the-future-will-be-like"
        )));
    }

    #[test]
    fn version_ff_and_malformed_versions_are_ignored() {
        // test_traceparent_version_0xff, test_traceparent_version_illegal_characters,
        // test_traceparent_version_too_long / too_short
        assert!(!valid(&format!("ff-{TRACE}-{SPAN}-01")));
        assert!(!valid(&format!(".0-{TRACE}-{SPAN}-01")));
        assert!(!valid(&format!("0.-{TRACE}-{SPAN}-01")));
        assert!(!valid(&format!("000-{TRACE}-{SPAN}-01")));
        assert!(!valid(&format!("0000-{TRACE}-{SPAN}-01")));
        assert!(!valid(&format!("0-{TRACE}-{SPAN}-01")));
    }

    #[test]
    fn zero_ids_are_ignored() {
        // test_traceparent_trace_id_all_zero, test_traceparent_parent_id_all_zero
        assert!(!valid(&format!("00-{}-{SPAN}-01", "0".repeat(32))));
        assert!(!valid(&format!("00-{TRACE}-{}-01", "0".repeat(16))));
    }

    #[test]
    fn short_and_long_ids_are_ignored_not_padded() {
        // test_traceparent_trace_id_too_short / too_long, parent_id likewise
        assert!(!valid(&format!("00-{}-{SPAN}-01", &TRACE[1..])));
        assert!(!valid(&format!("00-{TRACE}0-{SPAN}-01")));
        assert!(!valid(&format!("00-{TRACE}-{}-01", &SPAN[1..])));
        assert!(!valid(&format!("00-{TRACE}-{SPAN}0-01")));
        assert!(!valid(&format!("00-{TRACE}-{SPAN}-1")));
        assert!(!valid(&format!("00-{TRACE}-{SPAN}-011")));
        assert!(!valid(""));
    }

    #[test]
    fn uppercase_and_other_characters_are_ignored() {
        // test_traceparent_trace_id_illegal_characters, parent_id and trace_flags likewise
        assert!(!valid(&format!("00-{}-{SPAN}-01", TRACE.replace('1', "A"))));
        assert!(!valid(&format!("00-ABCDEF{}-{SPAN}-01", &TRACE[6..])));
        assert!(!valid(&format!("00-.{}-{SPAN}-01", &TRACE[1..])));
        assert!(!valid(&format!("00-{TRACE}-ABCDEF{}-01", &SPAN[6..])));
        assert!(!valid(&format!("00-{TRACE}-.{}-01", &SPAN[1..])));
        assert!(!valid(&format!("00-{TRACE}-{SPAN}-.0")));
        assert!(!valid(&format!("00-{TRACE}-{SPAN}-0.")));
        assert!(!valid(&format!("00-{TRACE}-{SPAN}-0A")));
        assert!(!valid(&format!("00_{TRACE}-{SPAN}-01")));
    }

    #[test]
    fn whitespace_around_the_value_is_allowed() {
        // test_traceparent_ows_handling
        for v in [
            format!(" 00-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-01 "),
            format!("\t00-{TRACE}-{SPAN}-01\t"),
        ] {
            assert!(valid(&v), "{v:?}");
        }
        assert!(!valid(&format!("00-{TRACE} -{SPAN}-01")));
    }

    #[test]
    fn the_header_sent_upstream_reads_back() {
        let (t, s) = ([0xab; 16], [0x01, 2, 3, 4, 5, 6, 7, 0xff]);
        let h = header(&t, &s, true);
        assert_eq!(
            h.to_str().unwrap(),
            format!("00-{}-01020304050607ff-01", "ab".repeat(16))
        );
        assert_eq!(
            parse(h.as_bytes()),
            Some(Parent {
                trace_id: t,
                span_id: s,
                sampled: true
            })
        );
        assert!(header(&t, &s, false).to_str().unwrap().ends_with("-00"));
    }
}
