//! The YAML file format, exactly as an operator writes it.
//!
//! These structs are deserialized (every one refuses unknown fields) and converted into the
//! validated [`Config`](super::Config); nothing outside `config` reads them. They serialize too,
//! so the tests' typed config builder writes real config files through them.

use indexmap::IndexMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_admin_listen")]
    pub admin_listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<FileTls>,
    pub upstream: FileUpstream,
    #[serde(default)]
    pub limits: FileLimits,
    /// Optional route catalogue file, relative to this file. Absent: the built-in catalogue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes: Option<String>,
    pub plans: IndexMap<String, FilePlan>,
    #[serde(default = "default_partner_rpw")]
    pub partner_requests_per_window: u32,
    #[serde(default)]
    pub keys: Vec<FileKey>,
    #[serde(default)]
    pub partners: Vec<FilePartner>,
    #[serde(default)]
    pub log: FileLog,
    #[serde(default)]
    pub shutdown: FileShutdown,
    #[serde(default)]
    pub server: FileServer,
    /// Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_failures: Option<FileAuthFailures>,
    #[serde(default)]
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
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admin_hosts: Vec<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileState {
    pub path: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileCluster {
    /// `redis://` or `rediss://`; or `redis_url_env`, the name of a variable holding it (for a
    /// URL with a password that should not sit in the file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_url_env: Option<String>,
    #[serde(default = "default_key_prefix")]
    pub key_prefix: String,
    #[serde(default = "default_sync_interval_ms")]
    pub sync_interval_ms: u64,
    #[serde(default = "default_cluster_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_key_prefix() -> String {
    "tollgate".into()
}
fn default_sync_interval_ms() -> u64 {
    100
}
fn default_cluster_timeout_ms() -> u64 {
    100
}

fn default_listen() -> String {
    "0.0.0.0:8080".into()
}
fn default_admin_listen() -> String {
    "127.0.0.1:9091".into()
}
fn default_partner_rpw() -> u32 {
    150
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileTls {
    pub listen: String,
    pub cert_file: String,
    pub key_file: String,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileUpstream {
    pub base_url: String,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout_ms: u64,
    #[serde(default = "default_read_timeout")]
    pub read_timeout_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Header fields the gateway would drop as client claims (address, host, scheme, URL,
    /// method) that this upstream should get anyway.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pass_headers: Vec<String>,
}

fn default_connect_timeout() -> u64 {
    2000
}
fn default_read_timeout() -> u64 {
    30000
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    #[serde(default = "default_window")]
    pub window_seconds: u32,
    #[serde(default = "default_max_body")]
    pub max_body_bytes: u64,
    #[serde(default = "default_max_validated_body")]
    pub max_validated_body_bytes: u64,
}

impl Default for FileLimits {
    fn default() -> Self {
        Self {
            window_seconds: default_window(),
            max_body_bytes: default_max_body(),
            max_validated_body_bytes: default_max_validated_body(),
        }
    }
}

fn default_window() -> u32 {
    10
}
fn default_max_body() -> u64 {
    16 * 1024 * 1024
}
fn default_max_validated_body() -> u64 {
    64 * 1024
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

/// `allow: all` or `allow: [route_id, …]`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
pub enum FileAllow {
    Keyword(String),
    List(Vec<String>),
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileKey {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    pub plan: String,
    #[serde(skip_serializing_if = "Option::is_none")]
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileLog {
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

/// How SIGTERM drains (see [`Shutdown`](super::Shutdown)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileShutdown {
    #[serde(default)]
    pub drain_seconds: u64,
    #[serde(default = "default_grace")]
    pub grace_seconds: u64,
    #[serde(default = "default_shutdown_timeout")]
    pub timeout_seconds: u64,
}

impl Default for FileShutdown {
    fn default() -> Self {
        Self {
            drain_seconds: 0,
            grace_seconds: default_grace(),
            timeout_seconds: default_shutdown_timeout(),
        }
    }
}

fn default_grace() -> u64 {
    10
}
fn default_shutdown_timeout() -> u64 {
    5
}

/// The route catalogue file (`policies/routes.yaml`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileCatalogue {
    /// Path prefixes that belong to the Partner API: an unknown path under one is `unknown_route`.
    pub partner_prefixes: Vec<String>,
    pub routes: Vec<FileRoute>,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileRoute {
    pub id: String,
    pub method: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    pub family: String,
    #[serde(default = "default_body")]
    pub body: String,
    #[serde(default)]
    pub assumed: bool,
    #[serde(default)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
}

fn default_body() -> String {
    "none".into()
}

/// The edge: deadlines, caps and trusted proxies (see [`Server`](super::Server)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileServer {
    #[serde(default = "default_header_timeout")]
    pub header_timeout_seconds: u64,
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_seconds: u64,
    #[serde(default = "default_body_timeout")]
    pub body_timeout_seconds: u64,
    #[serde(default = "default_send_timeout")]
    pub send_timeout_seconds: u64,
    #[serde(default = "default_tls_handshake_timeout")]
    pub tls_handshake_timeout_seconds: u64,
    #[serde(default = "default_max_requests_per_connection")]
    pub max_requests_per_connection: u32,
    #[serde(default = "default_max_header_bytes")]
    pub max_header_bytes: u64,
    #[serde(default = "default_max_headers")]
    pub max_headers: u64,
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    #[serde(default = "default_max_connections_per_ip")]
    pub max_connections_per_ip: u32,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    #[serde(default = "default_admin_max_connections")]
    pub admin_max_connections: u32,
}

impl Default for FileServer {
    fn default() -> Self {
        Self {
            header_timeout_seconds: default_header_timeout(),
            idle_timeout_seconds: default_idle_timeout(),
            body_timeout_seconds: default_body_timeout(),
            send_timeout_seconds: default_send_timeout(),
            tls_handshake_timeout_seconds: default_tls_handshake_timeout(),
            max_requests_per_connection: default_max_requests_per_connection(),
            max_header_bytes: default_max_header_bytes(),
            max_headers: default_max_headers(),
            max_connections: default_max_connections(),
            max_connections_per_ip: default_max_connections_per_ip(),
            trusted_proxies: Vec::new(),
            admin_max_connections: default_admin_max_connections(),
        }
    }
}

fn default_header_timeout() -> u64 {
    10
}
fn default_idle_timeout() -> u64 {
    60
}
fn default_body_timeout() -> u64 {
    30
}
fn default_send_timeout() -> u64 {
    30
}
fn default_tls_handshake_timeout() -> u64 {
    10
}
fn default_max_requests_per_connection() -> u32 {
    1000
}
fn default_max_header_bytes() -> u64 {
    32 * 1024
}
fn default_max_headers() -> u64 {
    100
}
fn default_max_connections() -> u32 {
    10_000
}
fn default_max_connections_per_ip() -> u32 {
    256
}
fn default_admin_max_connections() -> u32 {
    64
}

/// Blocking of addresses that fail authentication (see [`AuthFailures`](super::AuthFailures)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthFailures {
    #[serde(default = "default_max_failures")]
    pub max_failures: u32,
    #[serde(default = "default_failure_window")]
    pub window_seconds: u64,
    #[serde(default = "default_block")]
    pub block_seconds: u64,
    #[serde(default = "default_max_tracked_ips")]
    pub max_tracked_ips: u64,
}

impl Default for FileAuthFailures {
    fn default() -> Self {
        Self {
            max_failures: default_max_failures(),
            window_seconds: default_failure_window(),
            block_seconds: default_block(),
            max_tracked_ips: default_max_tracked_ips(),
        }
    }
}

fn default_max_failures() -> u32 {
    20
}
fn default_failure_window() -> u64 {
    60
}
fn default_block() -> u64 {
    300
}
fn default_max_tracked_ips() -> u64 {
    100_000
}

/// The `webhook_set` URL guard (see [`WebhookGuard`](super::WebhookGuard)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileWebhookGuard {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default = "yes")]
    pub allow_http: bool,
    #[serde(default)]
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

fn yes() -> bool {
    true
}
