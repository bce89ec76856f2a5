//! A small config for tests and benchmarks (plain keys; never for serving).
#![doc(hidden)]

use std::path::Path;

use crate::authenticate::{Credential, Digest};
use crate::config::{Config, Env};

/// Basic/standard/pro plans as in the spec, plain keys `<plan>-key-1`, two partners each
/// managing one customer: `acme-partner-key` (customer `acme-customer-key`) and
/// `globex-partner-key` (customer `globex-customer-key`).
pub const CONFIG_YAML: &str = r#"
listen: "127.0.0.1:0"
admin_listen: "127.0.0.1:0"
upstream: { base_url: "http://127.0.0.1:9" }
plans:
  basic:
    plan_id: 1
    requests_per_window: 40
    allow: [send_message, send_group, send_group_event, group_list, client, history_sent_status,
            history_sent_list, history_pendings, settings_get, settings_country_codes]
  standard: { plan_id: 2, requests_per_window: 70, allow: all }
  pro: { plan_id: 3, requests_per_window: 150, allow: all }
partners:
  - { name: acme, key: acme-partner-key }
  - { name: globex, key: globex-partner-key }
keys:
  - { name: basic-1, key: basic-key-1, plan: basic }
  - { name: standard-1, key: standard-key-1, plan: standard }
  - { name: pro-1, key: pro-key-1, plan: pro }
  - { name: acme-customer, key: acme-customer-key, plan: basic, partner: acme }
  - { name: globex-customer, key: globex-customer-key, plan: standard, partner: globex }
"#;

/// An environment with no variables.
pub struct NoEnv;

impl Env for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

pub fn config() -> Config {
    Config::parse(CONFIG_YAML, Path::new("testing.yaml"), &NoEnv).expect("test config is valid")
}

/// The credential of the key or partner named `name`.
pub fn credential(cfg: &Config, name: &str) -> Credential {
    if let Some(k) = cfg.keys.iter().find(|k| k.name == name) {
        return Credential::Customer {
            plan: k.plan,
            partner: k.partner,
        };
    }
    let partner = cfg
        .partners
        .iter()
        .position(|p| p.name == name)
        .expect("known name");
    Credential::Partner { partner }
}

/// The digest of a plain key.
pub fn digest(key: &str) -> Digest {
    Digest::of(key.as_bytes())
}
