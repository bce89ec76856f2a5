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

use super::operation::{BodyRule, Effect, Family};

/// The whole file. Every block is optional but `upstream.base_url` and `plans` (their absence
/// is refused with their field).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// Address and port of the gateway's plain HTTP listener; default `0.0.0.0:8080`.
    pub listen: String,
    /// Address and port of the admin listener (`/metrics`, `/healthz`, `/readyz`, `/reload`);
    /// default `127.0.0.1:9091`.
    pub admin_listen: String,
    /// The TLS listener; absent: no TLS listener.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<FileTls>,
    /// The provider the gateway forwards to; `upstream.base_url` is required.
    pub upstream: FileUpstream,
    /// The rate-limit window and the request body caps.
    pub limits: FileLimits,
    /// Optional route catalogue file, relative to this file. Absent: the built-in catalogue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routes: Option<String>,
    /// The plans, by name; at least one is required (`partner` and `none` are reserved names).
    pub plans: IndexMap<String, FilePlan>,
    /// Requests each partner key may make per window (`limits.window_seconds`); default 150.
    pub partner_requests_per_window: u32,
    /// Requests each partner key may make per calendar period (UTC); absent: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partner_quota: Option<FileQuota>,
    /// The usage ledger: every request counted per key and UTC day; off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<FileLedger>,
    /// The customer keys.
    pub keys: Vec<FileKey>,
    /// The partner keys.
    pub partners: Vec<FilePartner>,
    /// The log's format.
    pub log: FileLog,
    /// How SIGTERM drains; absent: the defaults of each phase.
    pub shutdown: FileShutdown,
    /// How the gateway's threads run (Pingora's runtime); absent: the defaults of each field.
    pub runtime: super::runtime::FileRuntime,
    /// The edge: deadlines, caps and trusted proxies; absent: the defaults of each field.
    pub server: FileServer,
    /// Off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_failures: Option<FileAuthFailures>,
    /// The `webhook_set` URL guard; absent: on, with its defaults.
    pub webhook_guard: FileWebhookGuard,
    /// Off when absent: budgets in this process only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster: Option<FileCluster>,
    /// Where partner upgrades are kept on a single process; off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<FileState>,
    /// OpenTelemetry traces, exported over OTLP/HTTP; off when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<FileTracing>,
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
            partner_quota: None,
            ledger: None,
            keys: Vec::new(),
            partners: Vec::new(),
            log: FileLog::default(),
            shutdown: FileShutdown::default(),
            runtime: super::runtime::FileRuntime::default(),
            server: FileServer::default(),
            auth_failures: None,
            webhook_guard: FileWebhookGuard::default(),
            cluster: None,
            state: None,
            tracing: None,
            admin_token_sha256: None,
            admin_hosts: Vec::new(),
        }
    }
}

/// The `state` block: the embedded store on local disk that keeps partner upgrades on a single
/// process.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileState {
    /// The store's file, relative to this file; opened (and created) at start. Required.
    pub path: String,
}

/// The `ledger` block: the usage ledger.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileLedger {
    /// How many days of daily counts are kept (1–3660); default 400.
    pub retention_days: u32,
}

impl Default for FileLedger {
    fn default() -> Self {
        Self {
            retention_days: 400,
        }
    }
}

/// The `cluster` block: budgets shared across replicas through Redis (or Valkey).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileCluster {
    /// `redis://` or `rediss://`; or `redis_url_env`, the name of a variable holding it (for a
    /// URL with a password that should not sit in the file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// Name of the environment variable holding the Redis URL; give exactly one of this and
    /// `redis_url`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url_env: Option<String>,
    /// What every name this fleet writes in Redis starts with (1–64 of A–Z a–z 0–9 `_ - . :`);
    /// default `tollgate`. Replicas with the same Redis and prefix share budgets.
    pub key_prefix: String,
    /// How often each replica exchanges with Redis, in milliseconds (10–60000); default 100.
    pub sync_interval_ms: u64,
    /// The longest one exchange with Redis may take, in milliseconds (1–60000); default 100.
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

/// The `tracing` block: a span for every sampled request, posted to an OpenTelemetry
/// collector over OTLP/HTTP.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileTracing {
    /// The collector's OTLP/HTTP base URL (`http://`); spans are posted to
    /// `{otlp_endpoint}/v1/traces`. Default `http://127.0.0.1:4318`.
    pub otlp_endpoint: String,
    /// `http/protobuf` (the default) or `http/json`.
    pub protocol: OtlpProtocol,
    /// The share of requests without a sampled parent that start a recorded trace, 0 to 1;
    /// default 1. A valid `traceparent`'s own sampled flag decides for its request.
    pub sample_ratio: f64,
    /// The resource attribute `service.name`; default `tollgate`.
    pub service_name: String,
}

impl Default for FileTracing {
    fn default() -> Self {
        Self {
            otlp_endpoint: "http://127.0.0.1:4318".into(),
            protocol: OtlpProtocol::Protobuf,
            sample_ratio: 1.0,
            service_name: "tollgate".into(),
        }
    }
}

/// How spans are encoded for the collector: `tracing.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
pub enum OtlpProtocol {
    /// `http/protobuf`: the binary protobuf encoding (the default).
    #[default]
    #[serde(rename = "http/protobuf")]
    Protobuf,
    /// `http/json`: OTLP's JSON encoding.
    #[serde(rename = "http/json")]
    Json,
}

impl OtlpProtocol {
    /// `http/protobuf` or `http/json`, as the file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Protobuf => "http/protobuf",
            OtlpProtocol::Json => "http/json",
        }
    }
}

/// The `tls` block: a TLS listener beside the plain one.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileTls {
    /// Address and port of the TLS listener, such as `0.0.0.0:8443`.
    pub listen: String,
    /// The certificate file (PEM), relative to this file; it must exist.
    pub cert_file: String,
    /// The private key file (PEM), relative to this file; it must exist.
    pub key_file: String,
}

/// The `upstream` block: the provider the gateway forwards to.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileUpstream {
    /// Required: the provider's base URL.
    pub base_url: String,
    /// How long connecting to the upstream may take, in milliseconds; default 2000.
    pub connect_timeout_ms: u64,
    /// How long one read from (or write to) the upstream may wait, in milliseconds; over it the
    /// answer is `504 upstream_timeout`. Default 30000.
    pub read_timeout_ms: u64,
    /// A private CA file (PEM) for an `https` base URL, relative to this file; absent: no
    /// private CA.
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

/// The `limits` block: the rate-limit window and the request body caps.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileLimits {
    /// The length of the rate-limit window, in seconds (at most 86400); default 10.
    pub window_seconds: u32,
    /// The largest request body, in bytes; over it: `413 body_too_large`. Default 16 MiB.
    pub max_body_bytes: u64,
    /// The largest body the gateway parses and checks, in bytes (at most 65536 and at most
    /// `max_body_bytes`); default 64 KiB.
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

/// One entry of `plans`, under the plan's name.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FilePlan {
    /// The plan's number, unique among plans: the `planID` a partner upgrade names.
    pub plan_id: u32,
    /// Requests each key on this plan may make per window (1–1000000).
    pub requests_per_window: u32,
    /// The customer operations this plan's keys may call.
    pub allow: FileAllow,
    /// Forward what this plan's allow-list or limit would refuse, and record it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    /// Requests each key on this plan may make per calendar period (UTC); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<FileQuota>,
}

/// `allow: all` or `allow: [route_id, …]` (any other word is refused by validation, naming it).
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum FileAllow {
    /// A single word: `all` (the full customer API, including uncatalogued paths).
    Keyword(String),
    /// The ids of the customer routes allowed, each once; every other operation is refused.
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

/// One entry of `keys`: a customer key. The key is given by exactly one of `sha256`, `key`
/// and `key_env`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileKey {
    /// The key's label in logs and metrics, unique among keys; the key itself is never logged.
    pub name: String,
    /// The SHA-256 of the key, 64 hex characters (`tollgate hash-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The key itself, in plain text (`check` warns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The name of the environment variable holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    /// The name of the key's plan.
    pub plan: String,
    /// The name of the partner that manages this key; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partner: Option<String>,
    /// Rotation: earlier digests that authenticate as this key until their `until`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previous: Vec<FilePrevious>,
    /// From this instant (RFC 3339, UTC) the key is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The key's own window limit (its plan's allow-list still applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_window: Option<u32>,
    /// The key's own quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<super::QuotaSpec>,
}

/// A quota: `{ requests: N, per: day|month }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuota {
    /// Requests per period (at least 1).
    pub requests: u64,
    /// The calendar period, in UTC.
    pub per: super::Period,
}

/// One earlier digest of a key (`keys[i].previous[j]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FilePrevious {
    /// The earlier key's SHA-256, 64 hex characters.
    pub sha256: String,
    /// Until this instant (RFC 3339, UTC) it still authenticates.
    pub until: String,
}

impl FileKey {
    /// Whether the entry uses a field the fast reader does not read (`previous`, `quota`).
    pub fn has_extras(&self) -> bool {
        !self.previous.is_empty() || self.quota.is_some()
    }

    /// This entry's fields, borrowed.
    pub fn fields(&self) -> KeyFields<'_> {
        KeyFields {
            name: &self.name,
            sha256: self.sha256.as_deref(),
            key: self.key.as_deref(),
            key_env: self.key_env.as_deref(),
            plan: &self.plan,
            partner: self.partner.as_deref(),
            expires_at: self.expires_at.as_deref(),
            requests_per_window: self.requests_per_window,
            file: self.has_extras().then_some(self),
        }
    }
}

/// One entry of `keys`, borrowed: from a [`FileKey`], or straight from the text of the file when
/// the key list is read by the fast reader (`config/fast.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyFields<'a> {
    /// `name`: the key's label.
    pub name: &'a str,
    /// `sha256`: the key's digest in hex, when given.
    pub sha256: Option<&'a str>,
    /// `key`: the plain key, when given.
    pub key: Option<&'a str>,
    /// `key_env`: the variable holding the key, when given.
    pub key_env: Option<&'a str>,
    /// `plan`: the plan's name.
    pub plan: &'a str,
    /// `partner`: the managing partner's name, when given.
    pub partner: Option<&'a str>,
    /// `expires_at`, when given.
    pub expires_at: Option<&'a str>,
    /// `requests_per_window`, when given.
    pub requests_per_window: Option<u32>,
    /// The whole entry, when it has fields the fast reader does not read (`previous`,
    /// `quota`: only serde_yaml reads those).
    pub file: Option<&'a FileKey>,
}

/// One entry of `partners`: a partner key. The key is given by exactly one of `sha256`, `key`
/// and `key_env`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FilePartner {
    /// The partner's name, unique among partners: what a key's `partner` names.
    pub name: String,
    /// The SHA-256 of the key, 64 hex characters (`tollgate hash-key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The key itself, in plain text (`check` warns).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The name of the environment variable holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
}

/// The format of everything the process logs (access lines and the rest): `log:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `text`: human-readable lines (the default).
    #[default]
    Text,
    /// `json`: one JSON object per line.
    Json,
}

/// The `log` block.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileLog {
    /// `text` or `json`; default `text`.
    pub format: LogFormat,
}

/// How SIGTERM drains (see [`Shutdown`](super::Shutdown)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileShutdown {
    /// Seconds the gateway still serves while `/readyz` answers 503 and HTTP/1.1 answers carry
    /// `Connection: close` (at most 3600); default 0.
    pub drain_seconds: u64,
    /// Seconds requests in flight have to finish once the listeners close (at most 3600);
    /// default 10.
    pub grace_seconds: u64,
    /// Seconds the runtimes have to stop before the process exits (at most 3600); default 5.
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
    /// The routes, each with a unique id.
    pub routes: Vec<FileRoute>,
}

/// A route's method: one HTTP method, or `any`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum FileMethod {
    /// `any` (also `ANY`, `Any`): every method.
    #[serde(rename = "any", alias = "ANY", alias = "Any")]
    Any,
    /// `GET`.
    #[serde(rename = "GET")]
    Get,
    /// `HEAD`.
    #[serde(rename = "HEAD")]
    Head,
    /// `POST`.
    #[serde(rename = "POST")]
    Post,
    /// `PUT`.
    #[serde(rename = "PUT")]
    Put,
    /// `PATCH`.
    #[serde(rename = "PATCH")]
    Patch,
    /// `DELETE`.
    #[serde(rename = "DELETE")]
    Delete,
    /// `OPTIONS`.
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
    /// `none`: the body is not checked (the default).
    #[default]
    None,
    /// `group_event`: the group event body (spec 2.1).
    GroupEvent,
    /// `webhook_set`: the webhook settings body (spec 2.2), with the webhook URL guard.
    WebhookSet,
    /// `service_upgrade`: the partner's service upgrade body (spec 2.3).
    ServiceUpgrade,
    /// `service_key`: a partner's lifecycle operation on one customer key (`apiKey`).
    ServiceKey,
}

impl FileBody {
    /// The rule the body is checked against, or `None` for `none`.
    pub fn rule(self) -> Option<BodyRule> {
        match self {
            FileBody::None => None,
            FileBody::GroupEvent => Some(BodyRule::GroupEvent),
            FileBody::WebhookSet => Some(BodyRule::WebhookSet),
            FileBody::ServiceUpgrade => Some(BodyRule::ServiceUpgrade),
            FileBody::ServiceKey => Some(BodyRule::ServiceKey),
        }
    }
}

/// One entry of the catalogue's `routes`: an operation, matched by method and by exactly one of
/// `path` and `prefix`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileRoute {
    /// The route id used in `allow` lists, logs and metric labels: lower-case letters, digits
    /// and `_`; `unknown` is reserved.
    pub id: String,
    /// An HTTP method in capitals, or `any`.
    pub method: FileMethod,
    /// The exact path matched, under `/v2/` and normalized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A prefix ending in `/`: the route matches every path under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// `customer` or `partner`: which key the route takes; a partner route lies under one of
    /// `partner_prefixes`, a customer route under none.
    pub family: Family,
    /// The rule the request body is checked against; default `none`.
    #[serde(default)]
    pub body: FileBody,
    /// The spec names the operation but does not show its path, so the path is a guess;
    /// default `false`. Marked in `tollgate check`'s summary.
    #[serde(default)]
    pub assumed: bool,
    /// What a 2xx from the upstream does at the edge: `upgrade`, `suspend`, `resume` or
    /// `delete` (partner routes with a `service_upgrade` or `service_key` body). A route with
    /// a `service_upgrade` body and no `effect` upgrades, as in part two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
    /// The body field naming the customer key; default `apiKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_field: Option<String>,
    /// The spec sections the route comes from: a note for readers, not used by the gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<String>,
}

/// The edge: deadlines, caps and trusted proxies (see [`Server`](super::Server)).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileServer {
    /// Seconds a request head has to be complete, from the connection's opening (first
    /// request) or its first byte (later requests); default 10.
    pub header_timeout_seconds: u64,
    /// Seconds a keep-alive connection with no request in progress stays open; default 60.
    pub idle_timeout_seconds: u64,
    /// Seconds a request body has to finish arriving after its head; default 30.
    pub body_timeout_seconds: u64,
    /// Seconds a client may take no byte of an answer before it is dropped; default 30.
    pub send_timeout_seconds: u64,
    /// Seconds a TLS handshake on the TLS listener may take; default 10.
    pub tls_handshake_timeout_seconds: u64,
    /// Requests served on one connection; the last is answered with `Connection: close`.
    /// Default 1000.
    pub max_requests_per_connection: u32,
    /// The largest request line and headers, in bytes (1024–1048575); over: 431. Default 32768.
    pub max_header_bytes: u64,
    /// The most header fields in a request (1–256); over: 431. Default 100.
    pub max_headers: u64,
    /// Open downstream connections, all listeners together; over: closed at once. Default 10000.
    pub max_connections: u32,
    /// Open connections per client address (an IPv6 client by its /64); 0: no cap. Default 256.
    pub max_connections_per_ip: u32,
    /// Addresses or CIDRs of proxies whose `X-Forwarded-For` names the client; default none.
    pub trusted_proxies: Vec<String>,
    /// Open connections to the admin listener, counted apart from the gateway's; default 64.
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
    /// Failed authentications within `window_seconds` that block the address; default 20.
    pub max_failures: u32,
    /// The window failures are counted over, in seconds; default 60.
    pub window_seconds: u64,
    /// How long a blocked address gets `429 too_many_auth_failures`, in seconds; default 300.
    pub block_seconds: u64,
    /// Addresses tracked at most; the least recently seen go first. Default 100000.
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
    /// Whether the guard applies; default `true`.
    pub enabled: bool,
    /// Whether `http` URLs pass; `false`: `https` only. Default `true`.
    pub allow_http: bool,
    /// Host names exempt from the guard, such as an operator's own relay; default none.
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
