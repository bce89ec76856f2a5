//! The request path: `normalize` and `classify` on any text a client can put in a request line.
//!
//! Input: `METHOD /path` (a method, one space, the path) or just the path, which is then
//! classified as both GET and POST. Seeds: `fuzz/seeds/path_normalizer/`.
//!
//! Invariants checked, besides "never panics":
//! - a normalized path is absolute, ASCII, free of every byte and escape `normalize` refuses,
//!   and normalizes to itself (what the gateway forwards, it would accept as is);
//! - one more percent-decoding by the upstream cannot make a dot segment, an empty segment or a
//!   new delimiter out of it;
//! - `normalize` refuses exactly when `classify` says `invalid_path`;
//! - the path `classify` forwards classifies again to the same route (the upstream sees the
//!   route that was authorized, in the catalogue's spelling).

#![no_main]

use std::borrow::Cow;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tollgate_core::path::normalize;
use tollgate_core::policy::classify::classify;
use tollgate_core::config::routes::Catalogue;
use tollgate_core::policy::Code;

fn catalogue() -> &'static Catalogue {
    static CATALOGUE: OnceLock<Catalogue> = OnceLock::new();
    CATALOGUE.get_or_init(Catalogue::builtin)
}

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

/// `%XX` → the byte, once, as an upstream that decodes the path would.
fn decode_once(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() && is_hex(b[i + 1]) && is_hex(b[i + 2]) {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).expect("ASCII");
            out.push(u8::from_str_radix(hex, 16).expect("hex"));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

fn check_normalized(input: &str, norm: Cow<'_, str>) {
    let n = norm.as_ref();
    assert!(n.starts_with('/'), "{input:?} → {n:?}: not absolute");
    let b = n.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        assert!(
            c.is_ascii() && !c.is_ascii_control() && !matches!(c, b'#' | b'\\' | b';'),
            "{input:?} → {n:?}: byte {c:#04x} at {i}"
        );
        if c == b'%' {
            assert!(
                b.len() > i + 2
                    && matches!(b[i + 1], b'0'..=b'9' | b'A'..=b'F')
                    && matches!(b[i + 2], b'0'..=b'9' | b'A'..=b'F'),
                "{input:?} → {n:?}: escape at {i} is not `%` and two upper-case hex digits"
            );
        }
    }
    // Borrowed only when nothing changed (an escape already in canonical form, `%B7`, is
    // copied all the same: that is allowed).
    if let Cow::Borrowed(_) = &norm {
        assert_eq!(n, input);
    }
    // Idempotent: the gateway would accept what it forwards, unchanged.
    match normalize(n) {
        Ok(again) => assert_eq!(again, n, "{input:?} → {n:?} → {again:?}"),
        Err(e) => panic!("{input:?} → {n:?}, which normalize refuses: {e:?}"),
    }
    // One more decoding (by the upstream) makes no dot or empty segment and no delimiter.
    let decoded = decode_once(n);
    let segments: Vec<&[u8]> = decoded[1..].split(|&c| c == b'/').collect();
    assert_eq!(
        segments.len(),
        n[1..].split('/').count(),
        "{input:?} → {n:?}: decoding makes a new `/`"
    );
    // ...and leaves no escape behind for a second decoding (`%252e` → `%2e` → `.`).
    assert!(
        !decoded
            .windows(3)
            .any(|w| w[0] == b'%' && is_hex(w[1]) && is_hex(w[2])),
        "{input:?} → {n:?}: decoded once it is {:?}, which still has an escape",
        String::from_utf8_lossy(&decoded)
    );
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        assert!(
            (!seg.is_empty() || last) && *seg != b"." && *seg != b"..",
            "{input:?} → {n:?}: decoded once, segment {i} is {:?}",
            String::from_utf8_lossy(seg)
        );
    }
}

fn check_classified(method: &str, path: &str) {
    let normalized = normalize(path);
    let classified = classify(catalogue(), method, path);
    match (&normalized, &classified) {
        (Err(_), Err(r)) => assert_eq!(r.code, Code::InvalidPath, "{method} {path:?}"),
        (Err(e), Ok(c)) => {
            panic!("{method} {path:?}: normalize refuses ({e:?}), classify gives {c:?}")
        }
        (Ok(_), Err(r)) => assert_ne!(
            r.code,
            Code::InvalidPath,
            "{method} {path:?}: normalize accepts, classify says invalid_path"
        ),
        (Ok(n), Ok(c)) => {
            // The forwarded path is the normalized one, re-spelled in the catalogue's case.
            assert!(
                c.path.eq_ignore_ascii_case(n)
                    || (c.path.len() == n.len() + 1
                        && c.path.ends_with('/')
                        && c.path[..n.len()].eq_ignore_ascii_case(n))
                    || (n.len() == c.path.len() + 1
                        && n.ends_with('/')
                        && n[..c.path.len()].eq_ignore_ascii_case(&c.path)),
                "{method} {path:?} → {n:?} forwarded as {:?}",
                c.path
            );
            match normalize(&c.path) {
                Ok(again) => assert_eq!(again, c.path, "{method} {path:?}: forwarded path changes"),
                Err(e) => panic!(
                    "{method} {path:?}: forwards {:?}, which normalize refuses: {e:?}",
                    c.path
                ),
            }
            let again = classify(catalogue(), method, &c.path).unwrap_or_else(|r| {
                panic!(
                    "{method} {path:?} → {:?}, forwarded {:?}, refused the second time: {r:?}",
                    catalogue().get(c.route).id,
                    c.path
                )
            });
            assert_eq!(
                again.route,
                c.route,
                "{method} {path:?}: {:?} forwarded as {:?}, which is {:?}",
                catalogue().get(c.route).id,
                c.path,
                catalogue().get(again.route).id
            );
            assert_eq!(
                again.path, c.path,
                "{method} {path:?}: forwarded path is not stable"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `METHOD /path`: a method is a token (no `/`, no space).
    let (method, path) = match text.split_once(' ') {
        Some((m, p)) if !m.is_empty() && !m.contains('/') => (Some(m), p),
        _ => (None, text),
    };
    if let Ok(norm) = normalize(path) {
        check_normalized(path, norm);
    }
    match method {
        Some(m) => check_classified(m, path),
        None => {
            check_classified("GET", path);
            check_classified("POST", path);
        }
    }
});
