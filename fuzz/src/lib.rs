//! What the fuzz targets share: the one call into the body check (so a change of its signature
//! is adapted here, once) and the webhook guards every target judges a URL under.

use tollgate_core::config::routes::BodyRule;
use tollgate_core::config::WebhookGuard;
use tollgate_core::policy::body::{self, Checked};
use tollgate_core::policy::Refusal;

/// The validated-body cap of the shipped configs (`limits.max_validated_body_bytes`).
pub const MAX_BODY: u64 = 64 * 1024;

/// Every rule with a body check.
pub const RULES: [BodyRule; 4] = [
    BodyRule::GroupEvent,
    BodyRule::WebhookSet,
    BodyRule::ServiceUpgrade,
    BodyRule::ServiceKey,
];

/// `check_body` as the gateway calls it, under `guard` (the `webhook_set` rule's URL guard).
pub fn check_body(
    rule: BodyRule,
    body: &[u8],
    max: u64,
    guard: &WebhookGuard,
) -> Result<Checked, Refusal> {
    body::check_body(rule, body, max, guard)
}

/// The guard of a config without a `webhook_guard` block: on, http allowed, no exempt host.
pub fn default_guard() -> WebhookGuard {
    WebhookGuard::default()
}

/// Whether this run skips inputs that reproduce a known, not yet fixed, finding (the
/// `known` checks in the targets; docs/fuzzing.md, "Findings"): set `TOLLGATE_FUZZ_SKIP_KNOWN=1`
/// for a long run, so that it looks for new findings instead of finding the known ones again
/// thousands of times. The smoke (and CI) never sets it: a known finding fails it until fixed,
/// and its reproducer in `fuzz/regressions/` fails it at once. Delete a `known` check with the
/// fix.
pub fn skip_known() -> bool {
    static SKIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SKIP.get_or_init(|| std::env::var_os("TOLLGATE_FUZZ_SKIP_KNOWN").is_some_and(|v| v == "1"))
}

/// Text folded as a Unicode-aware, case-insensitive comparison folds it (Java's
/// `equalsIgnoreCase`, Python's `casefold`, JavaScript's `/iu`): each character upper-cased,
/// then lower-cased (`ſ` → `s`, the Kelvin sign → `k`, `ı` → `i`, `ß` → `ss`), the dotted `İ`
/// as `i`. The targets' own oracle, written apart from the gateway's folding.
pub fn unicode_fold(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            match c {
                'İ' => "i".to_string(),
                c => c.to_uppercase().flat_map(char::to_lowercase).collect(),
            }
            .chars()
            .collect::<Vec<_>>()
        })
        .collect()
}

/// `%XX` decoded once (as UTF-8, lossily), as an upstream that decodes a path reads it.
pub fn percent_decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
