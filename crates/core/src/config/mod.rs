//! The validated configuration.
//!
//! The YAML file ([`mod@file`]) is read once, checked completely, and converted into [`Config`]; the
//! rest of the program only ever sees this typed form. Every refusal is a [`ConfigError`] naming
//! the file, the line and the field, so `tollgate check` and a refused reload can say exactly
//! what is wrong.
//!
//! Relative paths in a config (`routes`, `tls.*_file`, `upstream.ca_file`) are resolved against
//! the directory of the config file, not the working directory.

mod cluster;
mod edge;
mod fast;
pub mod file;
pub mod keyname;
mod keys;
mod locate;
pub mod operation;
mod plans;
pub mod process;
pub mod published;
pub mod routes;
pub mod runtime;
pub mod traces;
mod upstream;

use std::fmt;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use cluster::{at_address, redact, scrub, Cluster, SentinelUrl};
pub use edge::{AuthFailures, Server, WebhookGuard, MAX_HEADERS, MAX_HEADER_BYTES};
pub use file::LogFormat;
use file::{FileCatalogue, FileConfig};
use keyname::KeyName;
use keys::KeyList;
use locate::LineIndex;
pub use process::{changed_fields, Process, MAX_SHUTDOWN_SECONDS};
pub use runtime::Runtime;
pub use traces::{OtlpProtocol, SampleRatio, Tracing};

use crate::digest::Digest;
use routes::{Catalogue, RouteIdx};

/// The largest limit a plan may set; the limiter's arithmetic is exact up to here.
pub const MAX_REQUESTS_PER_WINDOW: u32 = 1_000_000;
/// The largest body the gateway can hold back and check: Pingora replays a checked body to the
/// upstream from its retry buffer, which is fixed at 64 KiB.
pub const MAX_VALIDATED_BODY_BYTES: u64 = 64 * 1024;
/// The longest window the limiter accepts (one day).
pub const MAX_WINDOW_SECONDS: u32 = 86_400;

/// A config the gateway refused, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the problem is in: the config, or the route catalogue it names.
    pub file: PathBuf,
    /// 1-based line, when the problem sits at a place in the file.
    pub line: Option<usize>,
    /// Field path such as `keys[2].sha256`; empty for the file as a whole.
    pub field: String,
    /// What is wrong, without the file, line and field given apart.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if self.field.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": field `{}`: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// A problem found by validation, before it is placed in a file and on a line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Field path such as `keys[2].sha256`, by which the problem is placed on a line.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl Invalid {
    /// A problem with `field` (a field path such as `keys[2].sha256`), saying `message`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    fn at(self, file: &Path, lines: &LineIndex<'_>) -> ConfigError {
        ConfigError {
            file: file.to_path_buf(),
            line: lines.line_of(&self.field),
            field: self.field,
            message: self.message,
        }
    }
}

/// Something `check` should point out that does not stop the config from loading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// 1-based line of `field`; `None` when it cannot be placed in the file.
    pub line: Option<usize>,
    /// Field path such as `keys[2].key`.
    pub field: String,
    /// What `check` says about it.
    pub message: String,
}

/// A validated config, its settings grouped by lifetime: [`Process`] (bound to the process:
/// a reload keeps them until a restart), [`Server`] (the edge: a connection keeps those it was
/// accepted under), and the rest (each request takes them from the snapshot in force).
#[derive(Debug, Clone)]
pub struct Config {
    /// The file this config was read from.
    pub source: PathBuf,
    /// Settings bound to the process.
    pub process: Process,
    /// The edge: deadlines, caps, trusted proxies. Shared: an HTTP/1.1 connection keeps the
    /// one it was accepted under for its life.
    pub server: Arc<Server>,
    /// The provider requests are forwarded to (`upstream`).
    pub upstream: Upstream,
    /// The rate-limit window and the body size caps (`limits`).
    pub limits: Limits,
    /// Where the catalogue came from: a file, or `None` for the built-in one.
    pub routes_file: Option<PathBuf>,
    /// The route catalogue in force: the `routes` file's, or the built-in one.
    pub catalogue: Catalogue,
    /// The plans, in file order; [`KeySpec::plan`] indexes into them.
    pub plans: Vec<Plan>,
    /// Requests per window allowed to each partner key (`partner_requests_per_window`).
    pub partner_limit: NonZeroU32,
    /// Requests each partner key may make per calendar period (`partner_quota`).
    pub partner_quota: Option<QuotaSpec>,
    /// The usage ledger (`ledger`); off when `None`.
    pub ledger: Option<Ledger>,
    /// The customer keys, in file order. [`Policy::new`](crate::policy::Policy::new) moves
    /// them into its key table, so in a compiled policy this list is empty: the keys are held
    /// once, in `Policy::keys`.
    pub keys: Vec<KeySpec>,
    /// The partner keys, in file order; [`KeySpec::partner`] indexes into them.
    pub partners: Vec<PartnerSpec>,
    /// Blocking of addresses that fail authentication; `None` when the block is absent.
    pub auth_failures: Option<AuthFailures>,
    /// The `webhook_set` rule's guard against URLs into private networks (`webhook_guard`).
    pub webhook_guard: WebhookGuard,
    /// The digest of the admin listener's bearer token, when one is required.
    pub admin_token: Option<Digest>,
    /// Host names (lower case) the admin listener answers to besides IP literals and
    /// `localhost`: a browser led there by another name (DNS rebinding) is refused.
    pub admin_hosts: Vec<String>,
    /// The entries (`keys[3]`, `partners[0]`) whose key is a published demo key
    /// ([`published`]); each also has a warning.
    pub published_keys: Vec<String>,
    /// What `check` should point out; none of it stops the config from loading.
    pub warnings: Vec<Warning>,
}

/// What SIGTERM does, phase by phase (the `shutdown` block).
///
/// 1. **drain** (`drain_seconds`, default 0): the gateway still accepts and serves, but
///    `/readyz` answers 503 and every HTTP/1.1 answer carries `Connection: close`, so load
///    balancers and clients move away without a failed request;
/// 2. **grace** (`grace_seconds`, default 10): the listeners close, idle connections are
///    closed, and requests in flight have this long to finish (Pingora's
///    `grace_period_seconds`; it always waits the whole period);
/// 3. **timeout** (`timeout_seconds`, default 5): the runtimes get this long to stop before
///    the process exits (Pingora's `graceful_shutdown_timeout_seconds`).
///
/// These values override the same two settings of a Pingora `--conf` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Shutdown {
    /// Phase 1, in seconds: serving on while `/readyz` answers 503 (`shutdown.drain_seconds`).
    pub drain_seconds: u64,
    /// Phase 2, in seconds: what requests in flight have to finish (`shutdown.grace_seconds`).
    pub grace_seconds: u64,
    /// Phase 3, in seconds: what the runtimes have to stop (`shutdown.timeout_seconds`).
    pub timeout_seconds: u64,
}

/// The TLS listener (the `tls` block).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tls {
    /// The address it listens on (`tls.listen`).
    pub listen: SocketAddr,
    /// The certificate (chain) file, PEM, resolved against the config's directory.
    pub cert_file: PathBuf,
    /// The private key file, PEM, resolved against the config's directory.
    pub key_file: PathBuf,
}

/// The scheme of `upstream.base_url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `http://`: plain HTTP to the upstream.
    Http,
    /// `https://`: TLS to the upstream, its certificate and host name checked.
    Https,
}

/// The provider the gateway forwards to (the `upstream` block), its `base_url` taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `http` or `https`, from the base URL.
    pub scheme: Scheme,
    /// Host name or IP literal (without brackets), used for the connection and for SNI.
    pub host: String,
    /// The base URL's port, or the scheme's default (80, 443).
    pub port: u16,
    /// The `Host` header value to send (host, plus the port when it is not the default).
    pub authority: String,
    /// Path of the base URL without a trailing slash (`""` for none); prefixed to every route.
    pub base_path: String,
    /// How long connecting to the upstream may take, TLS handshake included
    /// (`upstream.connect_timeout_ms`).
    pub connect_timeout: Duration,
    /// How long one read from (or write to) the upstream may wait; no answer within it is
    /// `504 upstream_timeout` (`upstream.read_timeout_ms`).
    pub read_timeout: Duration,
    /// A private CA (PEM) for an https upstream (`upstream.ca_file`, resolved against the
    /// config's directory); `None` when the field is absent.
    pub ca_file: Option<PathBuf>,
    /// Client-claim header fields forwarded anyway (lower case): the operator's exceptions to
    /// the rule that drops them.
    pub pass_headers: Vec<String>,
}

/// The `limits` block: the rate-limit window and the body size caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The rate-limit window, in seconds (`limits.window_seconds`).
    pub window: NonZeroU32,
    /// The largest request body, in bytes (`limits.max_body_bytes`); over: `413 body_too_large`.
    pub max_body_bytes: NonZeroU64,
    /// The largest body, in bytes, that the gateway reads whole and checks (routes with a body
    /// rule; `limits.max_validated_body_bytes`); over: `413 body_too_large`.
    pub max_validated_body_bytes: NonZeroU64,
}

/// A plan (one entry of `plans`): the limit and allow-list of the customer keys on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The plan's name (its key under `plans`), as used in headers, logs and metric labels.
    pub name: String,
    /// The plan's number (`plan_id`): a partner upgrade's `planID` names the plan by it.
    pub plan_id: u32,
    /// Requests per window allowed to each key on this plan (`requests_per_window`).
    pub limit: NonZeroU32,
    /// The endpoint allow-list (`allow`).
    pub allow: Allow,
    /// Shadow mode: what the allow-list or the limit would refuse is forwarded and recorded
    /// (`shadow_forbidden`, `shadow_rate_limited`).
    pub shadow: bool,
    /// Requests each key on this plan may make per calendar period (`quota`).
    pub quota: Option<QuotaSpec>,
}

/// A plan's endpoint allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allow {
    /// The full customer API, including paths the catalogue does not know.
    All,
    /// Only these catalogued routes (default deny).
    Only(Vec<RouteIdx>),
}

/// A customer key (one entry of `keys`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    /// The key's name (`name`): its label in logs, metrics and the admin API.
    pub name: KeyName,
    /// SHA-256 of the key, from `sha256`, `key` or `key_env`.
    pub digest: Digest,
    /// Index into [`Config::plans`].
    pub plan: usize,
    /// Index into [`Config::partners`].
    pub partner: Option<usize>,
    /// Rotation, expiry, the key's own limit and quota; `None` for the usual key (a million
    /// keys without them cost nothing more).
    pub extra: Option<Box<KeyExtra>>,
}

/// What a key may have beyond a digest, a plan and a partner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyExtra {
    /// Earlier digests that still authenticate as this key, each until an instant (ms since
    /// the Unix epoch).
    pub previous: Vec<(Digest, u64)>,
    /// From this instant (ms since the Unix epoch) the key is refused.
    pub expires_ms: Option<u64>,
    /// The key's own window limit.
    pub limit: Option<NonZeroU32>,
    /// The key's own quota.
    pub quota: Option<QuotaSpec>,
}

/// A calendar period in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Period {
    /// From 00:00 UTC to the next.
    Day,
    /// From 00:00 UTC on the first day of a month to the next.
    Month,
}

impl Period {
    /// `day` or `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    /// The first instant (ms since the Unix epoch) after the UTC calendar period that holds
    /// `now_ms`: the next midnight, or the first of the next month.
    pub fn end_after(self, now_ms: u64) -> u64 {
        let secs = i64::try_from(now_ms / 1000).unwrap_or(0);
        let Ok(now) = time::OffsetDateTime::from_unix_timestamp(secs) else {
            return now_ms;
        };
        let day = now.date();
        let next = match self {
            Period::Day => day.next_day(),
            Period::Month => {
                let (y, m) = match day.month() {
                    time::Month::December => (day.year() + 1, time::Month::January),
                    m => (day.year(), m.next()),
                };
                time::Date::from_calendar_date(y, m, 1).ok()
            }
        };
        next.map_or(now_ms, |d| {
            u64::try_from(d.midnight().assume_utc().unix_timestamp()).unwrap_or(0) * 1000
        })
    }
}

#[cfg(test)]
mod period_tests {
    use super::Period;
    use crate::clock::rfc3339;

    #[test]
    fn periods_end_at_the_next_utc_midnight_or_first_of_the_month() {
        let now = 1_795_635_600_000; // 2026-11-25T19:40:00Z
        assert_eq!(rfc3339(Period::Day.end_after(now)), "2026-11-26T00:00:00Z");
        assert_eq!(
            rfc3339(Period::Month.end_after(now)),
            "2026-12-01T00:00:00Z"
        );
        let dec = 1_798_675_200_000; // 2026-12-31T00:00:00Z
        assert_eq!(
            rfc3339(Period::Month.end_after(dec)),
            "2027-01-01T00:00:00Z"
        );
        assert_eq!(rfc3339(Period::Day.end_after(dec)), "2027-01-01T00:00:00Z");
    }
}

/// A quota: so many requests per calendar period (as the file writes it: `{requests, per}`).
pub use file::FileQuota as QuotaSpec;

/// The most requests a quota may allow in one period (the count is kept in 40 bits).
pub const MAX_QUOTA_REQUESTS: u64 = 1_000_000_000_000;

/// The usage ledger's settings (`ledger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ledger {
    /// Days of daily counts kept (`retention_days`).
    pub retention_days: u32,
}

/// The most days the ledger keeps, and answers in one query.
pub const MAX_LEDGER_DAYS: u32 = 3660;

/// A quota as the file gives it, checked: 1 to [`MAX_QUOTA_REQUESTS`] requests.
fn quota(q: Option<QuotaSpec>, field: &str) -> Result<Option<QuotaSpec>, Invalid> {
    match q {
        Some(q) if q.requests == 0 => Err(Invalid::new(
            format!("{field}.requests"),
            "must be at least 1",
        )),
        Some(q) if q.requests > MAX_QUOTA_REQUESTS => Err(Invalid::new(
            format!("{field}.requests"),
            format!(
                "{} is above the maximum of {MAX_QUOTA_REQUESTS}",
                q.requests
            ),
        )),
        q => Ok(q),
    }
}

/// A partner key (one entry of `partners`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartnerSpec {
    /// The partner's name (`name`), which customer keys give as their `partner`.
    pub name: String,
    /// SHA-256 of the partner's key, from `sha256`, `key` or `key_env`.
    pub digest: Digest,
}

/// Where `key_env` values come from; the process environment outside tests.
pub trait Env {
    /// The value of the variable `name`; `None` when it is not set.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Config {
    /// Read and validate the config at `path`, taking `key_env` values from the process.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with_env(path, &ProcessEnv)
    }

    /// [`Config::load`], taking environment variables (`key_env`, `cluster.redis_url_env`)
    /// from `env`.
    pub fn load_with_env(path: &Path, env: &dyn Env) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: None,
            field: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(&text, path, env)
    }

    /// Validate `text` as if read from `path` (used for errors and relative paths).
    ///
    /// A long key list in the usual plain form is read by a fast reader (`config/fast.rs`)
    /// instead of serde_yaml (same result, a fraction of the time); anything else, and every
    /// error, goes through serde_yaml.
    /// Lines for errors and warnings are looked up only when there is one to report.
    pub fn parse(text: &str, path: &Path, env: &dyn Env) -> Result<Config, ConfigError> {
        let fast = fast::split(text).and_then(|split| {
            let mut raw: FileConfig = serde_yaml::from_str(&split.rest).ok()?;
            split.is_marker(&raw.keys).then(|| {
                raw.keys.clear();
                (raw, split.keys)
            })
        });
        match fast {
            Some((raw, section)) => Self::validate(raw, &KeyList::Fast(&section), text, path, env),
            None => {
                let mut raw: FileConfig = from_yaml(text).map_err(|e| yaml_error(path, text, e))?;
                let keys = std::mem::take(&mut raw.keys);
                Self::validate(raw, &KeyList::File(&keys), text, path, env)
            }
        }
    }

    /// [`Config::parse`] without the fast path: everything through serde_yaml.
    #[cfg(test)]
    fn parse_slow(text: &str, path: &Path, env: &dyn Env) -> Result<Config, ConfigError> {
        let mut raw: FileConfig = from_yaml(text).map_err(|e| yaml_error(path, text, e))?;
        let keys = std::mem::take(&mut raw.keys);
        Self::validate(raw, &KeyList::File(&keys), text, path, env)
    }

    fn validate(
        raw: FileConfig,
        keys: &KeyList<'_>,
        text: &str,
        path: &Path,
        env: &dyn Env,
    ) -> Result<Config, ConfigError> {
        let lines = LineIndex::new(text);
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let (routes_file, catalogue) =
            load_catalogue(raw.routes.as_deref(), &base_dir).map_err(|e| match e {
                CatalogueError::Here(inv) => inv.at(path, &lines),
                CatalogueError::There(err) => err,
            })?;
        let mut config = build(raw, keys, routes_file, catalogue, &base_dir, env)
            .map_err(|inv| inv.at(path, &lines))?;
        config.source = path.to_path_buf();
        if !config.warnings.is_empty() {
            let fields: Vec<&str> = config.warnings.iter().map(|w| w.field.as_str()).collect();
            let found = lines.lines_of(&fields);
            for (w, line) in config.warnings.iter_mut().zip(found) {
                w.line = line;
            }
        }
        Ok(config)
    }

    /// The plan named `name`, if there is one.
    pub fn plan(&self, name: &str) -> Option<&Plan> {
        self.plans.iter().find(|p| p.name == name)
    }
}

enum CatalogueError {
    /// The config's `routes` field itself is wrong.
    Here(Invalid),
    /// The catalogue file is wrong; the error names that file.
    There(ConfigError),
}

fn load_catalogue(
    field: Option<&str>,
    base_dir: &Path,
) -> Result<(Option<PathBuf>, Catalogue), CatalogueError> {
    let Some(rel) = field else {
        return Ok((None, Catalogue::builtin()));
    };
    let path = base_dir.join(rel);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        CatalogueError::Here(Invalid::new(
            "routes",
            format!("cannot read `{}`: {e}", path.display()),
        ))
    })?;
    let raw: FileCatalogue =
        from_yaml(&text).map_err(|e| CatalogueError::There(yaml_error(&path, &text, e)))?;
    let lines = LineIndex::new(&text);
    let catalogue =
        Catalogue::compile(raw).map_err(|inv| CatalogueError::There(inv.at(&path, &lines)))?;
    Ok((Some(path), catalogue))
}

/// Deserialize `text`, keeping the path of the field an error is about.
fn from_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
) -> Result<T, serde_path_to_error::Error<serde_yaml::Error>> {
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
}

/// A parse error as a [`ConfigError`]: the field path as serde_path_to_error tracked it
/// (`server.idle_timeout` for an unknown field, `keys[0]` for a missing one), the line as
/// serde_yaml located it, and serde's own message without the two things already given apart
/// (serde_yaml writes its path in front and the location after it). A field given twice is
/// named whole (`ledger`, `server.idle_timeout_seconds`), at its second line where `text`
/// shows it (serde_yaml locates the map that holds it).
fn yaml_error(
    path: &Path,
    text: &str,
    e: serde_path_to_error::Error<serde_yaml::Error>,
) -> ConfigError {
    let mut field = match e.path().to_string() {
        root if root == "." => String::new(),
        field => field,
    };
    let inner = e.into_inner();
    let location = inner.location();
    let mut message = inner.to_string();
    if let Some(l) = &location {
        let at = format!(" at line {} column {}", l.line(), l.column());
        message = message.replacen(&at, "", 1);
    }
    if let Some((prefix, rest)) = message.split_once(": ") {
        if !prefix.contains(' ') && field.starts_with(prefix) {
            message = rest.to_string();
        }
    }
    let mut line = location.map(|l| l.line());
    let twice = message
        .strip_prefix("duplicate field `")
        .and_then(|r| r.split_once('`'))
        .map(|(name, _)| name.to_string());
    if let Some(name) = twice {
        field = if field.is_empty() {
            name
        } else {
            format!("{field}.{name}")
        };
        line = second_line_of(text, &field).or(line);
    }
    ConfigError {
        file: path.to_path_buf(),
        line,
        field,
        message,
    }
}

/// The line (1-based) where `field` (`ledger`, `server.idle_timeout_seconds`: maps only) is
/// given a second time in `text`, in block style: the lines of its parent's block whose
/// indentation is the block's and whose key is the field's last name.
fn second_line_of(text: &str, field: &str) -> Option<usize> {
    let mut parts = field.split('.');
    let last = parts.next_back()?;
    let mut indent = 0;
    let mut lines = text.lines().enumerate();
    for parent in parts {
        lines.find(|(_, l)| key_at(l, indent) == Some(parent))?;
        indent = lines
            .clone()
            .map(|(_, l)| l)
            .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .map(|l| l.len() - l.trim_start().len())
            .filter(|&i| i > indent)?;
    }
    lines
        .take_while(|(_, l)| {
            l.trim().is_empty()
                || l.trim_start().starts_with('#')
                || l.len() - l.trim_start().len() >= indent
        })
        .filter(|(_, l)| key_at(l, indent) == Some(last))
        .nth(1)
        .map(|(i, _)| i + 1)
}

/// The key of a block mapping's line at exactly `indent` spaces (`name: …` or `"name": …`).
fn key_at(line: &str, indent: usize) -> Option<&str> {
    let rest = line.strip_prefix(&" ".repeat(indent))?;
    if rest.starts_with(' ') {
        return None;
    }
    let (key, _) = rest.split_once(':')?;
    Some(key.trim().trim_matches(['"', '\'']))
}

/// The line (1-based) of the field `field` (`keys[3].name`) in the YAML file `file`, read
/// now; `None` when the file cannot be read or has no such field.
pub fn line_in(file: &Path, field: &str) -> Option<usize> {
    let text = std::fs::read_to_string(file).ok()?;
    LineIndex::new(&text).line_of(field)
}

/// Whether `name` can name a key, a plan or a partner: 1 to 64 of `A–Z a–z 0–9 _ - .`
/// (names are metric labels and log fields: short, printable, no quoting needed), but not
/// `.` or `..`: names are segments of the admin API's paths (`/api/keys/{name}`), where
/// those two are dot segments that a client, a proxy or a browser removes before sending
/// (RFC 3986 §5.2.4), so that the key could not be shown, rotated or revoked by its path.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// [`is_valid_name`]'s rule in words.
pub const NAME_RULE: &str = "1 to 64 of A–Z a–z 0–9 _ - ., not `.` or `..`";

fn check_name(name: &str, field: impl FnOnce() -> String) -> Result<(), Invalid> {
    if is_valid_name(name) {
        Ok(())
    } else {
        Err(Invalid::new(
            field(),
            format!("`{name}` is not a valid name ({NAME_RULE})"),
        ))
    }
}

fn nonzero_u32(v: u32, field: &str, max: u32) -> Result<NonZeroU32, Invalid> {
    if v > max {
        return Err(Invalid::new(
            field,
            format!("{v} is above the maximum of {max}"),
        ));
    }
    NonZeroU32::new(v).ok_or_else(|| Invalid::new(field, "must be greater than 0"))
}

fn nonzero_u64(v: u64, field: &str) -> Result<NonZeroU64, Invalid> {
    NonZeroU64::new(v).ok_or_else(|| Invalid::new(field, "must be greater than 0"))
}

fn socket_addr(v: &str, field: &str) -> Result<SocketAddr, Invalid> {
    v.parse().map_err(|_| {
        Invalid::new(
            field,
            format!("`{v}` is not an address such as 0.0.0.0:8080"),
        )
    })
}

fn existing_file(base_dir: &Path, v: &str, field: &str) -> Result<PathBuf, Invalid> {
    let p = base_dir.join(v);
    if p.is_file() {
        Ok(p)
    } else {
        Err(Invalid::new(
            field,
            format!("no such file `{}`", p.display()),
        ))
    }
}

/// The sections, each checked by its own builder, in the order an operator reads the file.
fn build(
    raw: FileConfig,
    file_keys: &KeyList<'_>,
    routes_file: Option<PathBuf>,
    catalogue: Catalogue,
    base_dir: &Path,
    env: &dyn Env,
) -> Result<Config, Invalid> {
    let mut warnings = Vec::new();
    let server = edge::server(&raw.server)?;
    let process = process::process(&raw, &server, base_dir, env)?;
    let upstream = upstream::upstream(&raw.upstream, base_dir)?;
    let limits = plans::limits(&raw.limits)?;
    let partner_limit = plans::partner_limit(raw.partner_requests_per_window)?;
    let partner_quota = quota(raw.partner_quota, "partner_quota")?;
    let ledger = raw
        .ledger
        .as_ref()
        .map(|l| {
            if l.retention_days == 0 || l.retention_days > MAX_LEDGER_DAYS {
                return Err(Invalid::new(
                    "ledger.retention_days",
                    format!("must be 1 to {MAX_LEDGER_DAYS}"),
                ));
            }
            Ok(Ledger {
                retention_days: l.retention_days,
            })
        })
        .transpose()?;
    let (partners, partner_names) = keys::partners(&raw.partners, env, &mut warnings)?;
    let auth_failures = raw
        .auth_failures
        .as_ref()
        .map(edge::auth_failures)
        .transpose()?;
    let webhook_guard = edge::webhook_guard(&raw.webhook_guard)?;
    let (admin_token, admin_hosts) = edge::admin(&raw)?;
    let plans = plans::plans(raw.plans, &catalogue)?;
    let keys = keys::keys(
        file_keys,
        &plans,
        &partners,
        &partner_names,
        env,
        &mut warnings,
    )?;
    let published_keys = keys::published_keys(&partners, &keys, &mut warnings);
    if process.cluster.is_none() && process.state_path.is_none() {
        // The first quota in the file, to name it.
        let quota_field = plans
            .iter()
            .find(|p| p.quota.is_some())
            .map(|p| format!("plans.{}.quota", p.name))
            .or_else(|| partner_quota.map(|_| "partner_quota".to_string()))
            .or_else(|| {
                keys.iter()
                    .position(|k| k.extra.as_ref().is_some_and(|x| x.quota.is_some()))
                    .map(|i| format!("keys[{i}].quota"))
            });
        let forgotten = [
            (quota_field, "quotas restart"),
            (ledger.map(|_| "ledger".to_string()), "the ledger restarts"),
        ];
        for (field, what) in forgotten {
            if let Some(field) = field {
                warnings.push(Warning {
                    line: None,
                    field,
                    message: format!(
                        "without `state.path` or `cluster`, {what} with the process (counts are kept in memory only)"
                    ),
                });
            }
        }
    }
    if process.cluster.is_some() && process.state_path.is_none() {
        warnings.push(Warning {
            line: None,
            field: "cluster".to_string(),
            message: "cluster without state.path: each replica holds the fleet's key changes and \
                      quota counts in memory only, and puts them back when Redis loses them; if \
                      every replica and a Redis without persistence restart together, only the \
                      YAML remains (set state.path)"
                .to_string(),
        });
    }
    Ok(Config {
        source: PathBuf::new(),
        process,
        server: Arc::new(server),
        upstream,
        limits,
        routes_file,
        catalogue,
        plans,
        partner_limit,
        partner_quota,
        ledger,
        keys,
        partners,
        auth_failures,
        webhook_guard,
        admin_token,
        admin_hosts,
        published_keys,
        warnings,
    })
}
