//! Test helpers: a standard test config with plain keys, and a typed builder for variations of
//! it. Only with the `testing` feature (tests and benchmarks); never in the release binary.
//!
//! The builder edits the file structs ([`FileConfig`]) and writes them out as YAML, so a test's
//! config goes through the same parser, validation and line numbers as an operator's file.

use std::path::Path;

use crate::config::file::{
    FileAllow, FileAuthFailures, FileCluster, FileConfig, FileKey, FileServer, FileShutdown,
    FileTls, FileWebhookGuard,
};
use crate::config::{Config, ConfigError, Env};
use crate::digest::Digest;
use crate::policy::keys::Credential;

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

/// [`CONFIG_YAML`], validated.
pub fn config() -> Config {
    TestConfig::new().parse()
}

/// The credential of the key or partner named `name`.
pub fn credential(cfg: &Config, name: &str) -> Credential {
    if let Some(k) = cfg.keys.iter().find(|k| k.name == name) {
        return Credential::Customer {
            plan: k.plan,
            partner: k.partner,
            limit: k
                .extra
                .as_ref()
                .and_then(|e| e.limit)
                .map_or(0, |n| n.get()),
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

/// A config file under construction, starting from [`CONFIG_YAML`].
///
/// Every setter takes the value an operator would write, valid or not (a test of a refusal
/// builds the refused file the same way).
#[derive(Debug, Clone)]
pub struct TestConfig {
    /// The file as parsed, for a test to edit directly.
    pub file: FileConfig,
}

impl Default for TestConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl TestConfig {
    /// The standard test config ([`CONFIG_YAML`]).
    pub fn new() -> Self {
        Self {
            file: serde_yaml::from_str(CONFIG_YAML).expect("the test config parses"),
        }
    }

    /// `listen`.
    pub fn listen(mut self, addr: impl ToString) -> Self {
        self.file.listen = addr.to_string();
        self
    }

    /// `admin_listen`.
    pub fn admin_listen(mut self, addr: impl ToString) -> Self {
        self.file.admin_listen = addr.to_string();
        self
    }

    /// `tls` with a listener and the certificate and key files.
    pub fn tls(mut self, listen: impl ToString, cert_file: &str, key_file: &str) -> Self {
        self.file.tls = Some(FileTls {
            listen: listen.to_string(),
            cert_file: cert_file.into(),
            key_file: key_file.into(),
        });
        self
    }

    /// `upstream.base_url`.
    pub fn upstream(mut self, base_url: &str) -> Self {
        self.file.upstream.base_url = base_url.into();
        self
    }

    /// `upstream.read_timeout_ms`.
    pub fn read_timeout_ms(mut self, ms: u64) -> Self {
        self.file.upstream.read_timeout_ms = ms;
        self
    }

    /// `upstream.pass_headers`.
    pub fn pass_headers(mut self, names: &[&str]) -> Self {
        self.file.upstream.pass_headers = names.iter().map(|n| n.to_string()).collect();
        self
    }

    /// `upstream.ca_file`.
    pub fn ca_file(mut self, path: &str) -> Self {
        self.file.upstream.ca_file = Some(path.into());
        self
    }

    /// `limits.max_body_bytes` and `limits.max_validated_body_bytes`.
    pub fn body_limits(mut self, max_body: u64, max_validated: u64) -> Self {
        self.file.limits.max_body_bytes = max_body;
        self.file.limits.max_validated_body_bytes = max_validated;
        self
    }

    /// `plans.<plan>.requests_per_window`.
    ///
    /// # Panics
    /// When there is no such plan.
    pub fn plan_limit(mut self, plan: &str, requests_per_window: u32) -> Self {
        self.file
            .plans
            .get_mut(plan)
            .unwrap_or_else(|| panic!("no plan {plan} in the test config"))
            .requests_per_window = requests_per_window;
        self
    }

    /// `plans.<plan>.shadow`.
    pub fn plan_shadow(mut self, plan: &str, shadow: bool) -> Self {
        self.file
            .plans
            .get_mut(plan)
            .unwrap_or_else(|| panic!("no plan {plan} in the test config"))
            .shadow = shadow;
        self
    }

    /// `plans.<plan>.quota: {requests, per}` (`per`: `day` or `month`).
    pub fn plan_quota(mut self, plan: &str, requests: u64, per: &str) -> Self {
        self.file
            .plans
            .get_mut(plan)
            .unwrap_or_else(|| panic!("no plan {plan} in the test config"))
            .quota = Some(quota(requests, per));
        self
    }

    /// `partner_quota: {requests, per}`.
    pub fn partner_quota(mut self, requests: u64, per: &str) -> Self {
        self.file.partner_quota = Some(quota(requests, per));
        self
    }

    /// `ledger: {retention_days}`.
    pub fn ledger(mut self, retention_days: u32) -> Self {
        self.file.ledger = Some(crate::config::file::FileLedger { retention_days });
        self
    }

    /// `plans.<plan>.allow: all`, or the list given.
    pub fn plan_allow(mut self, plan: &str, allow: Option<&[&str]>) -> Self {
        self.file
            .plans
            .get_mut(plan)
            .unwrap_or_else(|| panic!("no plan {plan} in the test config"))
            .allow = match allow {
            None => FileAllow::Keyword("all".into()),
            Some(ids) => FileAllow::List(ids.iter().map(|s| s.to_string()).collect()),
        };
        self
    }

    /// Every plan and the partners at `requests_per_window`: limits that no test load reaches.
    pub fn all_limits(mut self, requests_per_window: u32) -> Self {
        for plan in self.file.plans.values_mut() {
            plan.requests_per_window = requests_per_window;
        }
        self.file.partner_requests_per_window = requests_per_window;
        self
    }

    fn key_mut(&mut self, name: &str) -> &mut FileKey {
        self.file
            .keys
            .iter_mut()
            .find(|k| k.name == name)
            .unwrap_or_else(|| panic!("no key {name} in the test config"))
    }

    /// `keys[name = <name>].plan`.
    pub fn key_plan(mut self, name: &str, plan: &str) -> Self {
        self.key_mut(name).plan = plan.into();
        self
    }

    /// `keys[name = <name>].key` (a plain key).
    pub fn key_value(mut self, name: &str, key: &str) -> Self {
        self.key_mut(name).key = Some(key.into());
        self
    }

    /// Add a customer key with a plain key.
    pub fn add_key(mut self, name: &str, key: &str, plan: &str) -> Self {
        self.file.keys.push(FileKey {
            name: name.into(),
            sha256: None,
            key: Some(key.into()),
            key_env: None,
            plan: plan.into(),
            partner: None,
            previous: Vec::new(),
            expires_at: None,
            requests_per_window: None,
            quota: None,
        });
        self
    }

    /// Edit the entry of the key named `name` (rotation, expiry, its own limit or quota).
    pub fn key_with(mut self, name: &str, edit: impl FnOnce(&mut FileKey)) -> Self {
        edit(self.key_mut(name));
        self
    }

    /// Remove the key named `name`.
    pub fn without_key(mut self, name: &str) -> Self {
        let before = self.file.keys.len();
        self.file.keys.retain(|k| k.name != name);
        assert!(self.file.keys.len() < before, "no key {name}");
        self
    }

    /// `log.format`.
    pub fn log_format(mut self, format: &str) -> Self {
        self.file.log.format = match format {
            "json" => crate::config::LogFormat::Json,
            _ => crate::config::LogFormat::Text,
        };
        self
    }

    /// The `shutdown` phases.
    pub fn shutdown(mut self, drain: u64, grace: u64, timeout: u64) -> Self {
        self.file.shutdown = FileShutdown {
            drain_seconds: drain,
            grace_seconds: grace,
            timeout_seconds: timeout,
        };
        self
    }

    /// Edit the `server` block (deadlines, caps, trusted proxies).
    pub fn server(mut self, edit: impl FnOnce(&mut FileServer)) -> Self {
        edit(&mut self.file.server);
        self
    }

    /// Turn `auth_failures` on with `max_failures` in `window_seconds`, blocking for
    /// `block_seconds`, then edit the rest.
    pub fn auth_failures(
        mut self,
        max_failures: u32,
        window_seconds: u64,
        block_seconds: u64,
    ) -> Self {
        self.file.auth_failures = Some(FileAuthFailures {
            max_failures,
            window_seconds,
            block_seconds,
            ..FileAuthFailures::default()
        });
        self
    }

    /// Turn `cluster` on: budgets shared through the Redis at `redis_url`, names under
    /// `key_prefix`, reconciled every `sync_interval_ms`.
    pub fn cluster(mut self, redis_url: &str, key_prefix: &str, sync_interval_ms: u64) -> Self {
        self.file.cluster = Some(FileCluster {
            redis_url: Some(redis_url.into()),
            redis_url_env: None,
            key_prefix: key_prefix.into(),
            sync_interval_ms,
            timeout_ms: 100,
        });
        self
    }

    /// Edit the `cluster` block (after [`TestConfig::cluster`]).
    pub fn cluster_with(mut self, edit: impl FnOnce(&mut FileCluster)) -> Self {
        if let Some(c) = self.file.cluster.as_mut() {
            edit(c);
        }
        self
    }

    /// Edit the `runtime` block.
    pub fn runtime(mut self, edit: impl FnOnce(&mut crate::config::runtime::FileRuntime)) -> Self {
        edit(&mut self.file.runtime);
        self
    }

    /// Keep partner upgrades in the embedded store at `path`.
    pub fn state_path(mut self, path: &str) -> Self {
        self.file.state = Some(crate::config::file::FileState { path: path.into() });
        self
    }

    /// A `tracing` block: spans posted to `endpoint` in `protocol`, new traces recorded at
    /// `sample_ratio`.
    pub fn tracing(
        mut self,
        endpoint: &str,
        protocol: crate::config::OtlpProtocol,
        sample_ratio: f64,
    ) -> Self {
        self.file.tracing = Some(crate::config::file::FileTracing {
            otlp_endpoint: endpoint.into(),
            protocol,
            sample_ratio,
            service_name: "tollgate-test".into(),
        });
        self
    }

    /// `admin_hosts`.
    pub fn admin_hosts(mut self, hosts: &[&str]) -> Self {
        self.file.admin_hosts = hosts.iter().map(|h| h.to_string()).collect();
        self
    }

    /// Require `Authorization: Bearer <token>` on the admin listener.
    pub fn admin_token(mut self, token: &str) -> Self {
        self.file.admin_token_sha256 = Some(Digest::of(token.as_bytes()).to_hex());
        self
    }

    /// Edit the `webhook_guard` block.
    pub fn webhook_guard(mut self, edit: impl FnOnce(&mut FileWebhookGuard)) -> Self {
        edit(&mut self.file.webhook_guard);
        self
    }

    /// The file, as YAML.
    pub fn yaml(&self) -> String {
        serde_yaml::to_string(&self.file).expect("the file structs serialize")
    }

    /// The file validated as if read from `test.yaml`, or its refusal.
    pub fn try_parse(&self) -> Result<Config, ConfigError> {
        Config::parse(&self.yaml(), Path::new("test.yaml"), &NoEnv)
    }

    /// The file validated as if read from `test.yaml`.
    ///
    /// # Panics
    /// When it is refused.
    pub fn parse(&self) -> Config {
        self.try_parse()
            .unwrap_or_else(|e| panic!("the test config is refused: {e}"))
    }

    /// Write the file to `path`.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.yaml()).expect("the test config is written");
    }
}

/// A quota of `requests` per `per` (`day` or `month`).
///
/// # Panics
/// When `per` is neither.
pub fn quota(requests: u64, per: &str) -> crate::config::QuotaSpec {
    let per = match per {
        "day" => crate::config::Period::Day,
        "month" => crate::config::Period::Month,
        other => panic!("no period {other}"),
    };
    crate::config::QuotaSpec { requests, per }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_writes_a_file_the_loader_reads_back_as_built() {
        let c = TestConfig::new()
            .listen("127.0.0.1:7001")
            .upstream("http://127.0.0.1:7002/base")
            .read_timeout_ms(300)
            .plan_limit("basic", 80)
            .key_plan("pro-1", "standard")
            .without_key("standard-1")
            .add_key("extra", "extra-key", "pro")
            .shutdown(1, 2, 3)
            .parse();
        assert_eq!(c.process.listen.to_string(), "127.0.0.1:7001");
        assert_eq!(c.upstream.base_path, "/base");
        assert_eq!(c.upstream.read_timeout.as_millis(), 300);
        assert_eq!(c.plan("basic").unwrap().limit.get(), 80);
        let names: Vec<&str> = c.keys.iter().map(|k| &*k.name).collect();
        assert_eq!(
            names,
            [
                "basic-1",
                "pro-1",
                "acme-customer",
                "globex-customer",
                "extra"
            ]
        );
        assert_eq!(c.plans[c.keys[1].plan].name, "standard");
        assert_eq!(c.keys[4].digest, digest("extra-key"));
        assert_eq!(c.process.shutdown.grace_seconds, 2);
        // Plain keys warn, as in any file.
        assert_eq!(c.warnings.len(), 7);
    }

    #[test]
    fn a_refused_value_is_refused_with_its_field() {
        let e = TestConfig::new()
            .key_plan("pro-1", "platinum")
            .try_parse()
            .unwrap_err();
        assert_eq!(e.field, "keys[2].plan");
        assert!(e.line.is_some());
    }
}
