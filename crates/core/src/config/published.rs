//! Keys published in this repository: the demo's. They are written out in the README, the demo
//! policy and `tollgate demo`'s own output, so anyone can send them; a config that lets one in
//! lets everyone in. `check` warns about each, and `run` refuses such a config (and a reload
//! to one) unless told `--allow-demo-keys`; `tollgate demo` serves them on loopback only.

use std::sync::OnceLock;

use crate::digest::Digest;

/// The published keys, in plain text (they are public: that is the point).
pub const PUBLISHED_KEYS: [&str; 5] = [
    "demo-basic-key",
    "demo-standard-key",
    "demo-pro-key",
    "demo-burst-key",
    "demo-partner-key",
];

/// The published key whose digest is `d`, if it is one.
pub fn published(d: &Digest) -> Option<&'static str> {
    static DIGESTS: OnceLock<[Digest; 5]> = OnceLock::new();
    let digests = DIGESTS.get_or_init(|| PUBLISHED_KEYS.map(|k| Digest::of(k.as_bytes())));
    digests
        .iter()
        .position(|p| p == d)
        .map(|i| PUBLISHED_KEYS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_published_key_is_found_by_its_digest_and_nothing_else_is() {
        for k in PUBLISHED_KEYS {
            assert_eq!(published(&Digest::of(k.as_bytes())), Some(k));
        }
        assert_eq!(published(&Digest::of(b"demo-basic-key ")), None);
        assert_eq!(published(&Digest::of(b"basic-key-1")), None);
    }
}
