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
