//! The JSON reader's duplicate rule: two member names that some reader would take for one
//! member are refused, wherever they stand.
//!
//! Input: two member names separated by a NUL byte (`url\0URL`), as UTF-8. They are put in a
//! body three ways: side by side at the top, inside a nested object, and after twenty other
//! members (where the reader switches from a scan to a set), and checked by the `group_event`
//! rule (any other problem of those bodies is `invalid_body`, so `invalid_json` is the
//! duplicate rule's alone). Seeds:
//! `fuzz/seeds/json_members/`; reproducers of the outside attack run's findings (`url`/`URL`,
//! `apiKey`/`APIKEY`, the Kelvin sign, the long s, the dotless i):
//! `fuzz/regressions/json_members/`.
//!
//! Invariants checked, besides "never panics":
//! - names equal under any common reading of case (Unicode lower-casing, upper-casing, or
//!   character-by-character simple mappings, as Go's `encoding/json`, Jackson and
//!   System.Text.Json bind members) are refused as `invalid_json`, in all three places;
//! - names that no reading of case confuses are never refused for it;
//! - the answer does not depend on where the pair stands.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_core::policy::Code;
use tollgate_fuzz::{check_body, default_guard, MAX_BODY};
use tollgate_core::config::routes::BodyRule;

/// Every single-character case mapping of `c` (itself included).
fn mappings(c: char) -> Vec<char> {
    let mut out = vec![c];
    let mut one = |it: &mut dyn Iterator<Item = char>| {
        let v: Vec<char> = it.collect();
        if v.len() == 1 {
            out.push(v[0]);
        }
    };
    one(&mut c.to_lowercase());
    one(&mut c.to_uppercase());
    out
}

/// Whether some reader of case would take `a` and `b` for one name.
fn same_to_some_reader(a: &str, b: &str) -> bool {
    if a.to_lowercase() == b.to_lowercase() || a.to_uppercase() == b.to_uppercase() {
        return true;
    }
    let (x, y): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    x.len() == y.len()
        && x.iter().zip(&y).all(|(&p, &q)| {
            let (mp, mq) = (mappings(p), mappings(q));
            mp.iter().any(|m| mq.contains(m))
        })
}

/// Whether any reading of case could confuse `a` and `b` (broadly: full folding both ways,
/// twice, and the dotted and dotless i).
fn confusable(a: &str, b: &str) -> bool {
    let fold = |s: &str| -> String {
        let once: String = s
            .chars()
            .map(|c| if matches!(c, '\u{130}' | '\u{131}') { 'i' } else { c })
            .flat_map(|c| c.to_uppercase().flat_map(char::to_lowercase))
            .collect();
        once.chars()
            .flat_map(|c| c.to_uppercase().flat_map(char::to_lowercase))
            .collect()
    };
    same_to_some_reader(a, b) || fold(a) == fold(b)
}

/// The body check's answer: refused for a duplicate member (`invalid_json`), or not. The
/// `group_event` rule: any other problem of these bodies is `invalid_body` (missing fields).
fn refused_as_duplicate(body: &str) -> bool {
    match check_body(BodyRule::GroupEvent, body.as_bytes(), MAX_BODY, &default_guard()) {
        Err(r) => r.code == Code::InvalidJson && r.detail.contains("duplicate key"),
        Ok(_) => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((a, b)) = text.split_once('\0') else {
        return;
    };
    let (ja, jb) = (serde_json::to_string(a).unwrap(), serde_json::to_string(b).unwrap());
    let top = format!("{{{ja}:1,{jb}:2}}");
    let nested = format!("{{\"o\":{{{ja}:1,{jb}:2}}}}");
    let fillers: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
    let members: Vec<String> = fillers.iter().map(|f| format!("\"{f}\":0")).collect();
    let large = format!("{{{},{ja}:1,{jb}:2}}", members.join(","));
    let answers = [
        refused_as_duplicate(&top),
        refused_as_duplicate(&nested),
        refused_as_duplicate(&large),
    ];
    let clashes = |n: &str| fillers.iter().any(|f| confusable(n, f));
    assert_eq!(answers[0], answers[1], "{a:?} / {b:?}: top level and nested differ");
    if !clashes(a) && !clashes(b) {
        assert_eq!(answers[0], answers[2], "{a:?} / {b:?}: a large object differs");
    }
    if same_to_some_reader(a, b) {
        assert!(answers[0], "{a:?} / {b:?} are one member to some reader, and passed");
    }
    if !confusable(a, b) {
        assert!(!answers[0], "{a:?} / {b:?} refused as duplicates");
    }
});
