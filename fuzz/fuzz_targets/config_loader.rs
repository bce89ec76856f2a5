//! The config file: `Config::parse` on any UTF-8 text, through the fast key-list reader and
//! serde_yaml, and all of validation. It must never panic; it may refuse.
//!
//! Input: the text of a config file. Seeds: `fuzz/seeds/config_loader/` (the shipped configs
//! and refused examples from `policies/`).
//!
//! **The `routes:` field reads a file.** `Config::parse` resolves `routes` against the config's
//! directory and reads it, so a fuzzed config could name `/dev/zero` (an endless read),
//! `/dev/stdin` (a hang), a FIFO, or any file on the machine. The target never lets it read
//! anything but its own two catalogue files:
//! - the config "lives" in a private temporary directory holding `routes.yaml` (the shipped
//!   catalogue) and `duplicate_id.yaml` (a refused one), so those two names load for real;
//! - an input that may set `routes` is first read for that one field, by serde_yaml with the
//!   same field name and type as the config (`Option<String>`); it is parsed only when
//!   `routes` is absent, null, or one of those two names. Any other value, or a text that
//!   does not even read that far, is skipped.
//!
//! The probe runs only when the text contains `routes` or a backslash: YAML has no other way
//! to spell a key `routes` (a double-quoted key with escapes, `"\x72outes"`, or an escaped
//! line break, needs a backslash; folding always inserts a space or a line break), so every
//! other text cannot set it. The fast key-list reader replaces only self-contained key lines,
//! so it cannot make a `routes` key appear that the whole text does not have.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use tollgate_core::config::Config;
use tollgate_core::policy::Policy;
use tollgate_core::testing::NoEnv;

/// The catalogue files the fuzzed config may name.
const CATALOGUES: [(&str, &str); 2] = [
    ("routes.yaml", include_str!("../../policies/routes.yaml")),
    (
        "duplicate_id.yaml",
        include_str!("../../policies/invalid/catalogue/duplicate_id.yaml"),
    ),
];

/// `fuzz.yaml` in a directory of this process's own, holding [`CATALOGUES`].
fn config_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tollgate-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        for (name, text) in CATALOGUES {
            std::fs::write(dir.join(name), text).expect("a catalogue file");
        }
        dir.join("fuzz.yaml")
    })
}

/// The one field of the config that reads a file, read as the config reads it.
#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    routes: Option<String>,
}

/// Whether parsing `text` reads no file but ours.
fn reads_only_ours(text: &str) -> bool {
    if !text.contains("routes") && !text.contains('\\') {
        return true;
    }
    match serde_yaml::from_str::<Probe>(text) {
        Ok(Probe { routes: None }) => true,
        Ok(Probe { routes: Some(r) }) => CATALOGUES.iter().any(|(name, _)| r == *name),
        Err(_) => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if !reads_only_ours(text) {
        return;
    }
    let path = config_path();
    match Config::parse(text, path, &NoEnv) {
        Ok(config) => {
            // A config that loads compiles into a policy, with every key and partner.
            let keys = config.keys.len() + config.partners.len();
            let policy = Policy::new(config, None);
            assert_eq!(policy.keys.len(), keys);
        }
        Err(e) => {
            // A refusal names the file it is about.
            assert!(
                e.file == *path || e.file.parent() == path.parent(),
                "an error about {:?}",
                e.file
            );
        }
    }
});
