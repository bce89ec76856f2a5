//! The YAML file format, exactly as an operator writes it.
//!
//! These structs are deserialized (every one refuses unknown fields) and converted into the
//! validated [`Config`](super::Config) by the section builders; nothing outside `config` reads
//! them. Each block is `#[serde(default)]` with one `impl Default` holding its documented
//! defaults, and words with a fixed set of values (a route's method, family and body rule, the
//! log format) are enums, so a misspelling is refused by the parser with the values it takes.
//! They serialize too, so the tests' typed config builder writes real config files through
//! them.

use indexmap::IndexMap;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::routes::{BodyRule, Family};

/// The whole file. Every block is optional but `upstream.base_url` and `plans` (their absence
/// is refused with their field).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    pub listen: String,
    pub admin_listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<FileTls>,
    pub upstream: FileUpstream,
    pub limits: FileLimits,
    /// Optional route catalogue file, relative to this file. Absent: the built-in catalogue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes: Option<String>,
    pub plans: IndexMap<String, FilePlan>,
    pub partner_requests_per_window: u32,
    pub keys: Vec<FileKey>,
    pub partners: Vec<FilePartner>,
    pub log: FileLog,
    pub shutdown: FileShutdown,
    pub server: FileServer,
    /// Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_failures: Option<FileAuthFailures>,
    pub webhook_guard: FileWebhookGuard,
    /// Off when absent: budgets in this process only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<FileCluster>,
    /// Where partner upgrades are kept on a single process; off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<FileState>,
    /// SHA-256 (64 hex) of the admin listener's bearer token; absent: no token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token_sha256: Option<String>,
    /// Host names the admin listener answers to, besides IP literals and `localhost`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub admin_hosts: Vec<String>,
}

impl Default for FileConfig {
    fn default() -> Self {
        Self {
            listen: "0.0.0.0:8080".into(),
            admin_listen: "127.0.0.1:9091".into(),
            tls: None,
            upstream: FileUpstream::default(),
            limits: FileLimits::default(),
            routes: None,
            plans: IndexMap::new(),
            partner_requests_per_window: 150,
            keys: Vec::new(),
            partners: Vec::new(),
            log: FileLog::default(),
            shutdown: FileShutdown::default(),
            server: FileServer::default(),
            auth_failures: None,
            webhook_guard: FileWebhookGuard::default(),
            cluster: None,
            state: None,
            admin_token_sha256: None,
            admin_hosts: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileState {
    pub path: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileCluster {
    /// `redis://` or `rediss://`; or `redis_url_env`, the name of a variable holding it (for a
    /// URL with a password that should not sit in the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url_env: Option<String>,
    pub key_prefix: String,
    pub sync_interval_ms: u64,
    pub timeout_ms: u64,
}

impl Default for FileCluster {
    fn default() -> Self {
        Self {
            redis_url: None,
            redis_url_env: None,
            key_prefix: "tollgate".into(),
            sync_interval_ms: 100,
            timeout_ms: 100,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileTls {
    pub listen: String,
    pub cert_file: String,
    pub key_file: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileUpstream {
    /// Required: the provider's base URL.
    pub base_url: String,
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Header fields the gateway would drop as client claims (address, host, scheme, URL,
    /// method) that this upstream should get anyway.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pass_headers: Vec<String>,
}

impl Default for FileUpstream {
    fn default() -> Self {
        Self {
            base_url: String::new(),
            connect_timeout_ms: 2000,
            read_timeout_ms: 30_000,
            ca_file: None,
            pass_headers: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileLimits {
    pub window_seconds: u32,
    pub max_body_bytes: u64,
    pub max_validated_body_bytes: u64,
}

impl Default for FileLimits {
    fn default() -> Self {
        Self {
            window_seconds: 10,
            max_body_bytes: 16 * 1024 * 1024,
            max_validated_body_bytes: 64 * 1024,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FilePlan {
    pub plan_id: u32,
    pub requests_per_window: u32,
    pub allow: FileAllow,
    /// Forward what this plan's allow-list or limit would refuse, and record it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
}

/// `allow: all` or `allow: [route_id, …]` (any other word is refused by validation, naming it).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum FileAllow {
    Keyword(String),
    List(Vec<String>),
}

impl<'de> Deserialize<'de> for FileAllow {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FileAllow;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`all` or a list of route ids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FileAllow, E> {
                Ok(FileAllow::Keyword(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<FileAllow, A::Error> {
                let mut ids = Vec::new();
                while let Some(id) = seq.next_element::<String>()? {
                    ids.push(id);
                }
                Ok(FileAllow::List(ids))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileKey {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    pub plan: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partner: Option<String>,
}

impl FileKey {
    pub fn fields(&self) -> KeyFields<'_> {
        KeyFields {
            name: &self.name,
            sha256: self.sha256.as_deref(),
            key: self.key.as_deref(),
            key_env: self.key_env.as_deref(),
            plan: &self.plan,
            partner: self.partner.as_deref(),
        }
    }
}

/// One entry of `keys`, borrowed: from a [`FileKey`], or straight from the text of the file when
/// the key list is read by the fast reader (`config/fast.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyFields<'a> {
    pub name: &'a str,
    pub sha256: Option<&'a str>,
    pub key: Option<&'a str>,
    pub key_env: Option<&'a str>,
    pub plan: &'a str,
    pub partner: Option<&'a str>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FilePartner {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
}

/// The access log's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileLog {
    pub format: LogFormat,
}

/// How SIGTERM drains (see [`Shutdown`](super::Shutdown)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileShutdown {
    pub drain_seconds: u64,
    pub grace_seconds: u64,
    pub timeout_seconds: u64,
}

impl Default for FileShutdown {
    fn default() -> Self {
        Self {
            drain_seconds: 0,
            grace_seconds: 10,
            timeout_seconds: 5,
        }
    }
}

/// The route catalogue file (`policies/routes.yaml`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileCatalogue {
    /// Path prefixes that belong to the Partner API: an unknown path under one is `unknown_route`.
    pub partner_prefixes: Vec<String>,
    pub routes: Vec<FileRoute>,
}

/// A route's method: one HTTP method, or `any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum FileMethod {
    #[serde(rename = "any", alias = "ANY", alias = "Any")]
    Any,
    #[serde(rename = "GET")]
    Get,
    #[serde(rename = "HEAD")]
    Head,
    #[serde(rename = "POST")]
    Post,
    #[serde(rename = "PUT")]
    Put,
    #[serde(rename = "PATCH")]
    Patch,
    #[serde(rename = "DELETE")]
    Delete,
    #[serde(rename = "OPTIONS")]
    Options,
}

impl FileMethod {
    /// The method's token, or `None` for `any`.
    pub fn token(self) -> Option<&'static str> {
        match self {
            FileMethod::Any => None,
            FileMethod::Get => Some("GET"),
            FileMethod::Head => Some("HEAD"),
            FileMethod::Post => Some("POST"),
            FileMethod::Put => Some("PUT"),
            FileMethod::Patch => Some("PATCH"),
            FileMethod::Delete => Some("DELETE"),
            FileMethod::Options => Some("OPTIONS"),
        }
    }
}

/// A route's body rule as written: one of the rules, or `none`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FileBody {
    #[default]
    None,
    GroupEvent,
    WebhookSet,
    ServiceUpgrade,
}

impl FileBody {
    pub fn rule(self) -> Option<BodyRule> {
        match self {
            FileBody::None => None,
            FileBody::GroupEvent => Some(BodyRule::GroupEvent),
            FileBody::WebhookSet => Some(BodyRule::WebhookSet),
            FileBody::ServiceUpgrade => Some(BodyRule::ServiceUpgrade),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileRoute {
    pub id: String,
    pub method: FileMethod,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    pub family: Family,
    #[serde(default)]
    pub body: FileBody,
    #[serde(default)]
    pub assumed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
}

/// The edge: deadlines, caps and trusted proxies (see [`Server`](super::Server)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileServer {
    pub header_timeout_seconds: u64,
    pub idle_timeout_seconds: u64,
    pub body_timeout_seconds: u64,
    pub send_timeout_seconds: u64,
    pub tls_handshake_timeout_seconds: u64,
    pub max_requests_per_connection: u32,
    pub max_header_bytes: u64,
    pub max_headers: u64,
    pub max_connections: u32,
    pub max_connections_per_ip: u32,
    pub trusted_proxies: Vec<String>,
    pub admin_max_connections: u32,
}

impl Default for FileServer {
    fn default() -> Self {
        Self {
            header_timeout_seconds: 10,
            idle_timeout_seconds: 60,
            body_timeout_seconds: 30,
            send_timeout_seconds: 30,
            tls_handshake_timeout_seconds: 10,
            max_requests_per_connection: 1000,
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            max_connections: 10_000,
            max_connections_per_ip: 256,
            trusted_proxies: Vec::new(),
            admin_max_connections: 64,
        }
    }
}

/// Blocking of addresses that fail authentication (see [`AuthFailures`](super::AuthFailures)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileAuthFailures {
    pub max_failures: u32,
    pub window_seconds: u64,
    pub block_seconds: u64,
    pub max_tracked_ips: u64,
}

impl Default for FileAuthFailures {
    fn default() -> Self {
        Self {
            max_failures: 20,
            window_seconds: 60,
            block_seconds: 300,
            max_tracked_ips: 100_000,
        }
    }
}

/// The `webhook_set` URL guard (see [`WebhookGuard`](super::WebhookGuard)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileWebhookGuard {
    pub enabled: bool,
    pub allow_http: bool,
    pub allow_hosts: Vec<String>,
}

impl Default for FileWebhookGuard {
    fn default() -> Self {
        Self {
            enabled: true,
            allow_http: true,
            allow_hosts: Vec::new(),
        }
    }
}
