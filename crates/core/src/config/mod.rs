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
mod locate;
pub mod published;
pub mod routes;

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use cluster::{redact, scrub, Cluster};
pub use edge::{AuthFailures, Server, WebhookGuard, MAX_HEADERS, MAX_HEADER_BYTES};
use file::{FileAllow, FileCatalogue, FileConfig, KeyFields};
use locate::LineIndex;

use crate::digest::is_token68;
use crate::digest::Digest;
use keyname::{KeyName, MAX_KEYS};
use routes::{Catalogue, Family, RouteIdx};

/// The largest limit a plan may set; the limiter's arithmetic is exact up to here.
pub const MAX_REQUESTS_PER_WINDOW: u32 = 1_000_000;
/// The largest body the gateway can hold back and check: Pingora replays a checked body to the
/// upstream from its retry buffer, which is fixed at 64 KiB.
pub const MAX_VALIDATED_BODY_BYTES: u64 = 64 * 1024;
/// The longest window the limiter accepts (one day).
pub const MAX_WINDOW_SECONDS: u32 = 86_400;
/// The longest any one shutdown phase may be (one hour).
pub const MAX_SHUTDOWN_SECONDS: u64 = 3_600;

/// A config the gateway refused, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line, when the problem sits at a place in the file.
    pub line: Option<usize>,
    /// Field path such as `keys[2].sha256`; empty for the file as a whole.
    pub field: String,
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
    pub field: String,
    pub message: String,
}

impl Invalid {
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
    pub line: Option<usize>,
    pub field: String,
    pub message: String,
}

#[derive(Debug, Clone)]
pub struct Config {
    /// The file this config was read from.
    pub source: PathBuf,
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub tls: Option<Tls>,
    pub upstream: Upstream,
    pub limits: Limits,
    /// Where the catalogue came from: a file, or `None` for the built-in one.
    pub routes_file: Option<PathBuf>,
    pub catalogue: Catalogue,
    pub plans: Vec<Plan>,
    pub partner_limit: NonZeroU32,
    /// The customer keys, in file order. [`Policy::new`](crate::policy::Policy::new) moves
    /// them into its key table, so in a compiled policy this list is empty: the keys are held
    /// once, in `Policy::keys`.
    pub keys: Vec<KeySpec>,
    pub partners: Vec<PartnerSpec>,
    pub log_format: LogFormat,
    pub shutdown: Shutdown,
    /// The edge: deadlines, caps, trusted proxies.
    pub server: Server,
    /// Blocking of addresses that fail authentication; `None` when the block is absent.
    pub auth_failures: Option<AuthFailures>,
    pub webhook_guard: WebhookGuard,
    /// Budgets shared across replicas; `None` when the block is absent.
    pub cluster: Option<Cluster>,
    /// The embedded store partner upgrades are kept in (`state.path`, resolved against the
    /// config's directory); `None` when the block is absent.
    pub state_path: Option<PathBuf>,
    /// The digest of the admin listener's bearer token, when one is required.
    pub admin_token: Option<Digest>,
    /// Host names (lower case) the admin listener answers to besides IP literals and
    /// `localhost`: a browser led there by another name (DNS rebinding) is refused.
    pub admin_hosts: Vec<String>,
    /// The entries (`keys[3]`, `partners[0]`) whose key is a published demo key
    /// ([`published`]); each also has a warning.
    pub published_keys: Vec<String>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shutdown {
    pub drain_seconds: u64,
    pub grace_seconds: u64,
    pub timeout_seconds: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub listen: SocketAddr,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub scheme: Scheme,
    /// Host name or IP literal (without brackets), used for the connection and for SNI.
    pub host: String,
    pub port: u16,
    /// The `Host` header value to send (host, plus the port when it is not the default).
    pub authority: String,
    /// Path of the base URL without a trailing slash (`""` for none); prefixed to every route.
    pub base_path: String,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub ca_file: Option<PathBuf>,
    /// Client-claim header fields forwarded anyway (lower case): the operator's exceptions to
    /// the rule that drops them.
    pub pass_headers: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub window: NonZeroU32,
    pub max_body_bytes: NonZeroU64,
    pub max_validated_body_bytes: NonZeroU64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub name: String,
    pub plan_id: u32,
    pub limit: NonZeroU32,
    pub allow: Allow,
    /// Shadow mode: what the allow-list or the limit would refuse is forwarded and recorded
    /// (`shadow_forbidden`, `shadow_rate_limited`).
    pub shadow: bool,
}

/// A plan's endpoint allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allow {
    /// The full customer API, including paths the catalogue does not know.
    All,
    /// Only these catalogued routes (default deny).
    Only(Vec<RouteIdx>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    pub name: KeyName,
    pub digest: Digest,
    /// Index into [`Config::plans`].
    pub plan: usize,
    /// Index into [`Config::partners`].
    pub partner: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartnerSpec {
    pub name: String,
    pub digest: Digest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Where `key_env` values come from; the process environment outside tests.
pub trait Env {
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
                let mut raw: FileConfig =
                    serde_yaml::from_str(text).map_err(|e| yaml_error(path, &e))?;
                let keys = std::mem::take(&mut raw.keys);
                Self::validate(raw, &KeyList::File(&keys), text, path, env)
            }
        }
    }

    /// [`Config::parse`] without the fast path: everything through serde_yaml.
    #[cfg(test)]
    fn parse_slow(text: &str, path: &Path, env: &dyn Env) -> Result<Config, ConfigError> {
        let mut raw: FileConfig = serde_yaml::from_str(text).map_err(|e| yaml_error(path, &e))?;
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
        serde_yaml::from_str(&text).map_err(|e| CatalogueError::There(yaml_error(&path, &e)))?;
    let lines = LineIndex::new(&text);
    let catalogue =
        Catalogue::compile(raw).map_err(|inv| CatalogueError::There(inv.at(&path, &lines)))?;
    Ok((Some(path), catalogue))
}

/// Turn a serde_yaml error (`keys[0]: unknown field `x`, expected … at line 6 column 5`) into
/// a [`ConfigError`] with the field path split out.
fn yaml_error(path: &Path, e: &serde_yaml::Error) -> ConfigError {
    let mut text = e.to_string();
    if let Some(cut) = text.rfind(" at line ") {
        text.truncate(cut);
    }
    let (mut field, mut message) = match text.split_once(": ") {
        Some((f, m)) if !f.contains(' ') => (f.to_string(), m.to_string()),
        _ => (String::new(), text.clone()),
    };
    for marker in ["unknown field `", "missing field `"] {
        if let Some(rest) = message.strip_prefix(marker) {
            if let Some(name) = rest.split('`').next() {
                field = if field.is_empty() {
                    name.to_string()
                } else {
                    format!("{field}.{name}")
                };
            }
        }
    }
    if message.starts_with("data did not match any variant of untagged enum FileAllow") {
        message = "must be `all` or a list of route ids".into();
    }
    ConfigError {
        file: path.to_path_buf(),
        line: e.location().map(|l| l.line()),
        field,
        message,
    }
}

/// Names used as metric labels and log fields: short, printable, no quoting needed.
fn check_name(name: &str, field: impl FnOnce() -> String) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Invalid::new(
            field(),
            format!("`{name}` is not a valid name (1–64 of A–Z a–z 0–9 _ - .)"),
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

fn build(
    raw: FileConfig,
    file_keys: &KeyList<'_>,
    routes_file: Option<PathBuf>,
    catalogue: Catalogue,
    base_dir: &Path,
    env: &dyn Env,
) -> Result<Config, Invalid> {
    let mut warnings = Vec::new();
    let listen = socket_addr(&raw.listen, "listen")?;
    let admin_listen = socket_addr(&raw.admin_listen, "admin_listen")?;
    let tls = match raw.tls {
        None => None,
        Some(t) => Some(Tls {
            listen: socket_addr(&t.listen, "tls.listen")?,
            cert_file: existing_file(base_dir, &t.cert_file, "tls.cert_file")?,
            key_file: existing_file(base_dir, &t.key_file, "tls.key_file")?,
        }),
    };
    let upstream = upstream(&raw.upstream, base_dir)?;
    let limits = Limits {
        window: nonzero_u32(
            raw.limits.window_seconds,
            "limits.window_seconds",
            MAX_WINDOW_SECONDS,
        )?,
        max_body_bytes: nonzero_u64(raw.limits.max_body_bytes, "limits.max_body_bytes")?,
        max_validated_body_bytes: nonzero_u64(
            raw.limits.max_validated_body_bytes,
            "limits.max_validated_body_bytes",
        )?,
    };
    if limits.max_validated_body_bytes.get() > MAX_VALIDATED_BODY_BYTES {
        return Err(Invalid::new(
            "limits.max_validated_body_bytes",
            format!("must be at most {MAX_VALIDATED_BODY_BYTES} (checked bodies are held in a 64 KiB buffer)"),
        ));
    }
    if limits.max_validated_body_bytes > limits.max_body_bytes {
        return Err(Invalid::new(
            "limits.max_validated_body_bytes",
            "must not be above limits.max_body_bytes",
        ));
    }

    if raw.plans.is_empty() {
        return Err(Invalid::new("plans", "at least one plan is needed"));
    }
    let mut plans = Vec::with_capacity(raw.plans.len());
    let mut plan_ids: HashMap<u32, String> = HashMap::new();
    for (name, fp) in raw.plans {
        let at = format!("plans.{name}");
        check_name(&name, || at.clone())?;
        if matches!(name.as_str(), "partner" | "none") {
            // `partner` names the partner keys' policy and `none` an unknown caller, in
            // RateLimit headers, logs and metric labels.
            return Err(Invalid::new(at, format!("`{name}` is a reserved name")));
        }
        if let Some(other) = plan_ids.insert(fp.plan_id, name.clone()) {
            return Err(Invalid::new(
                format!("{at}.plan_id"),
                format!("plan_id {} is also used by plan `{other}`", fp.plan_id),
            ));
        }
        let limit = nonzero_u32(
            fp.requests_per_window,
            &format!("{at}.requests_per_window"),
            MAX_REQUESTS_PER_WINDOW,
        )?;
        let allow = match fp.allow {
            FileAllow::Keyword(k) if k == "all" => Allow::All,
            FileAllow::Keyword(k) => {
                return Err(Invalid::new(
                    format!("{at}.allow"),
                    format!("`{k}` is not `all`; give `all` or a list of route ids"),
                ))
            }
            FileAllow::List(ids) => {
                let mut idx = Vec::with_capacity(ids.len());
                for (i, id) in ids.iter().enumerate() {
                    let field = format!("{at}.allow[{i}]");
                    let Some(r) = catalogue.find(id) else {
                        return Err(Invalid::new(field, format!("unknown route id `{id}`")));
                    };
                    if catalogue.get(r).family == Family::Partner {
                        return Err(Invalid::new(
                            field,
                            format!("`{id}` is a partner operation; plans govern customer keys"),
                        ));
                    }
                    if idx.contains(&r) {
                        return Err(Invalid::new(field, format!("`{id}` is listed twice")));
                    }
                    idx.push(r);
                }
                Allow::Only(idx)
            }
        };
        plans.push(Plan {
            name,
            plan_id: fp.plan_id,
            limit,
            allow,
            shadow: fp.shadow,
        });
    }
    let partner_limit = nonzero_u32(
        raw.partner_requests_per_window,
        "partner_requests_per_window",
        MAX_REQUESTS_PER_WINDOW,
    )?;

    // Digests are unique across customer and partner keys: one bearer token, one identity.
    let n_partners = raw.partners.len();
    let total = n_partners.saturating_add(file_keys.len());
    if total > MAX_KEYS {
        return Err(Invalid::new(
            "keys",
            format!("{total} keys and partners are more than the {MAX_KEYS} the gateway can hold"),
        ));
    }
    let hasher = foldhash::fast::RandomState::default();

    let mut partners: Vec<PartnerSpec> = Vec::with_capacity(n_partners);
    let mut partner_names: HashMap<String, usize> = HashMap::new();
    let mut partner_digests: HashMap<Digest, usize> = HashMap::with_capacity(n_partners);
    for (i, fp) in raw.partners.iter().enumerate() {
        let at = format!("partners[{i}]");
        check_name(&fp.name, || format!("{at}.name"))?;
        if partner_names.insert(fp.name.clone(), i).is_some() {
            return Err(Invalid::new(
                format!("{at}.name"),
                format!("duplicate partner name `{}`", fp.name),
            ));
        }
        let (digest, field) = key_digest(
            "partners",
            i,
            fp.sha256.as_deref(),
            fp.key.as_deref(),
            fp.key_env.as_deref(),
            env,
            &mut warnings,
        )?;
        if let Some(j) = partner_digests.insert(digest, i) {
            let other = format!("partners[{j}] ({})", partners[j].name);
            return Err(Invalid::new(
                format!("{at}.{field}"),
                format!("is the same key as {other}"),
            ));
        }
        partners.push(PartnerSpec {
            name: fp.name.clone(),
            digest,
        });
    }

    // A million keys are checked for duplicates by sorting (sequential memory), not entry by
    // entry in a hash index (a cache miss per entry). Only when something is wrong are they
    // checked again entry by entry, in file order, so that the error is the first one there is.
    let ctx = KeyCheck {
        plans: &plans,
        partners: &partners,
        partner_names: &partner_names,
        env,
        hasher: &hasher,
    };
    let partner_warnings = warnings.len();
    let keys = match ctx.keys(file_keys, false, &mut warnings) {
        Ok(keys) if !ctx.any_duplicate(&keys) => keys,
        _ => {
            warnings.truncate(partner_warnings);
            ctx.keys(file_keys, true, &mut warnings)?
        }
    };

    // A published demo key is open to anyone: loud in `check`, refused by `run`.
    let mut published_keys = Vec::new();
    let entries = partners
        .iter()
        .enumerate()
        .map(|(i, p)| ("partners", i, &p.digest))
        .chain(keys.iter().enumerate().map(|(i, k)| ("keys", i, &k.digest)));
    for (list, i, digest) in entries {
        if let Some(key) = published::published(digest) {
            let field = format!("{list}[{i}]");
            warnings.push(Warning {
                line: None,
                field: field.clone(),
                message: format!(
                    "PUBLISHED DEMO KEY: this is `{key}`, printed in Tollgate's README and demo, so anyone can use it; `tollgate run` refuses it (replace it: `tollgate hash-key`)"
                ),
            });
            published_keys.push(field);
        }
    }

    let log_format = match raw.log.format.as_deref() {
        None | Some("text") => LogFormat::Text,
        Some("json") => LogFormat::Json,
        Some(other) => {
            return Err(Invalid::new(
                "log.format",
                format!("`{other}` is not `text` or `json`"),
            ))
        }
    };

    let seconds = |v: u64, field: &str| {
        if v > MAX_SHUTDOWN_SECONDS {
            Err(Invalid::new(
                field,
                format!("{v} is above the maximum of {MAX_SHUTDOWN_SECONDS}"),
            ))
        } else {
            Ok(v)
        }
    };
    let shutdown = Shutdown {
        drain_seconds: seconds(raw.shutdown.drain_seconds, "shutdown.drain_seconds")?,
        grace_seconds: seconds(raw.shutdown.grace_seconds, "shutdown.grace_seconds")?,
        timeout_seconds: seconds(raw.shutdown.timeout_seconds, "shutdown.timeout_seconds")?,
    };

    let server = edge::server(&raw.server)?;
    let auth_failures = raw
        .auth_failures
        .as_ref()
        .map(edge::auth_failures)
        .transpose()?;
    let webhook_guard = edge::webhook_guard(&raw.webhook_guard)?;
    let state_path = match &raw.state {
        None => None,
        Some(st) if st.path.trim().is_empty() => {
            return Err(Invalid::new("state.path", "must name a file"))
        }
        // Opened (and created) when the gateway starts, which refuses a path it cannot use.
        Some(st) => Some(base_dir.join(&st.path)),
    };
    let admin_token = match &raw.admin_token_sha256 {
        None => None,
        Some(h) => Some(Digest::from_hex(h).ok_or_else(|| {
            Invalid::new(
                "admin_token_sha256",
                "must be 64 hex characters: the SHA-256 of the token (`tollgate hash-key`)",
            )
        })?),
    };
    let cluster = raw
        .cluster
        .as_ref()
        .map(|c| cluster::cluster(c, env))
        .transpose()?;
    let admin_hosts = edge::admin_hosts(&raw.admin_hosts)?;

    Ok(Config {
        source: PathBuf::new(),
        listen,
        admin_listen,
        tls,
        upstream,
        limits,
        routes_file,
        catalogue,
        plans,
        partner_limit,
        keys,
        partners,
        log_format,
        shutdown,
        server,
        auth_failures,
        webhook_guard,
        cluster,
        state_path,
        admin_token,
        admin_hosts,
        published_keys,
        warnings,
    })
}

/// The customer keys of a file, wherever they were read.
enum KeyList<'a> {
    File(&'a [file::FileKey]),
    Fast(&'a fast::KeysSection<'a>),
}

impl<'a> KeyList<'a> {
    fn iter(&self) -> Box<dyn ExactSizeIterator<Item = KeyFields<'a>> + '_> {
        match self {
            KeyList::File(keys) => Box::new(keys.iter().map(file::FileKey::fields)),
            KeyList::Fast(section) => Box::new(section.iter()),
        }
    }

    fn len(&self) -> usize {
        match self {
            KeyList::File(keys) => keys.len(),
            KeyList::Fast(section) => section.iter().len(),
        }
    }
}

/// What checking the customer keys needs of the rest of the config.
struct KeyCheck<'c> {
    plans: &'c [Plan],
    partners: &'c [PartnerSpec],
    partner_names: &'c HashMap<String, usize>,
    env: &'c dyn Env,
    hasher: &'c foldhash::fast::RandomState,
}

impl KeyCheck<'_> {
    /// Check every key in file order, each completely before the next. With `exact`, duplicate
    /// names and digests are caught where they occur, so the error is the first in the file;
    /// without, they are not looked for (see [`KeyCheck::any_duplicate`]), and an error is only
    /// a sign that there is one.
    fn keys(
        &self,
        list: &KeyList<'_>,
        exact: bool,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<KeySpec>, Invalid> {
        let n = list.len();
        let n_partners = self.partners.len();
        // Only in the exact pass (a config with a mistake in it): where each name and digest
        // was first seen, partners first.
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut digests: HashMap<Digest, usize> = HashMap::new();
        if exact {
            names.reserve(n);
            digests.reserve(n_partners + n);
            // Distinct: the partners were checked already.
            digests.extend(self.partners.iter().enumerate().map(|(j, p)| (p.digest, j)));
        }
        let mut keys: Vec<KeySpec> = Vec::with_capacity(n);
        for (i, fk) in list.iter().enumerate() {
            check_name(fk.name, || format!("keys[{i}].name"))?;
            if exact && names.insert(fk.name, i).is_some() {
                return Err(Invalid::new(
                    format!("keys[{i}].name"),
                    format!("duplicate key name `{}`", fk.name),
                ));
            }
            let plan = self
                .plans
                .iter()
                .position(|p| p.name == fk.plan)
                .ok_or_else(|| {
                    Invalid::new(
                        format!("keys[{i}].plan"),
                        format!("no plan named `{}`", fk.plan),
                    )
                })?;
            let partner = match fk.partner {
                None => None,
                Some(p) => Some(*self.partner_names.get(p).ok_or_else(|| {
                    Invalid::new(
                        format!("keys[{i}].partner"),
                        format!("no partner named `{p}`"),
                    )
                })?),
            };
            let (digest, field) =
                key_digest("keys", i, fk.sha256, fk.key, fk.key_env, self.env, warnings)?;
            if exact {
                if let Some(j) = digests.insert(digest, n_partners + i) {
                    let other = match j.checked_sub(n_partners) {
                        None => format!("partners[{j}] ({})", self.partners[j].name),
                        Some(k) => format!("keys[{k}] ({})", keys[k].name),
                    };
                    return Err(Invalid::new(
                        format!("keys[{i}].{field}"),
                        format!("is the same key as {other}"),
                    ));
                }
            }
            keys.push(KeySpec {
                name: KeyName::new(fk.name),
                digest,
                plan,
                partner,
            });
        }
        Ok(keys)
    }

    /// Whether two keys share a name, or two keys or a key and a partner share a digest.
    fn any_duplicate(&self, keys: &[KeySpec]) -> bool {
        let np = self.partners.len();
        let digest = |i: usize| match i.checked_sub(np) {
            None => &self.partners[i].digest,
            Some(k) => &keys[k].digest,
        };
        any_equal(
            keys.len(),
            |i| self.hasher.hash_one(&*keys[i].name),
            |a, b| keys[a].name == keys[b].name,
        ) || any_equal(
            np + keys.len(),
            |i| self.hasher.hash_one(digest(i).folded()),
            |a, b| digest(a) == digest(b),
        )
    }
}

/// Whether two of `n` items are equal (`eq`), given a `hash` of each: sorts the hashes and
/// compares items only where hashes are equal.
fn any_equal(n: usize, hash: impl Fn(usize) -> u64, eq: impl Fn(usize, usize) -> bool) -> bool {
    let mut by_hash: Vec<(u64, u32)> = (0..n).map(|i| (hash(i), i as u32)).collect();
    by_hash.sort_unstable();
    by_hash.chunk_by(|a, b| a.0 == b.0).any(|run| {
        run.iter()
            .enumerate()
            .any(|(x, a)| run[x + 1..].iter().any(|b| eq(a.1 as usize, b.1 as usize)))
    })
}

/// The digest of entry `i` of `list` (`keys` or `partners`), given as exactly one of `sha256`,
/// `key` or `key_env`, and the field that gave it. A plain `key` adds a warning (its line is
/// looked up once validation is done).
fn key_digest(
    list: &str,
    i: usize,
    sha256: Option<&str>,
    key: Option<&str>,
    key_env: Option<&str>,
    env: &dyn Env,
    warnings: &mut Vec<Warning>,
) -> Result<(Digest, &'static str), Invalid> {
    let field = |name: &str| format!("{list}[{i}].{name}");
    match (sha256, key, key_env) {
        (Some(hex), None, None) => {
            let d = Digest::from_hex(hex).ok_or_else(|| {
                Invalid::new(
                    field("sha256"),
                    "must be 64 hexadecimal characters (the SHA-256 of the key)",
                )
            })?;
            Ok((d, "sha256"))
        }
        (None, Some(plain), None) => {
            if !is_token68(plain.as_bytes()) {
                return Err(Invalid::new(
                    field("key"),
                    "is not a usable bearer token (token68 characters)",
                ));
            }
            warnings.push(Warning {
                line: None,
                field: field("key"),
                message: "a plain key sits in the config file; prefer `sha256` (tollgate hash-key) or `key_env`".into(),
            });
            Ok((Digest::of(plain.as_bytes()), "key"))
        }
        (None, None, Some(var)) => {
            let value = env.var(var).ok_or_else(|| {
                Invalid::new(
                    field("key_env"),
                    format!("environment variable `{var}` is not set"),
                )
            })?;
            if !is_token68(value.as_bytes()) {
                return Err(Invalid::new(
                    field("key_env"),
                    format!("environment variable `{var}` is not a usable bearer token (token68 characters)"),
                ));
            }
            Ok((Digest::of(value.as_bytes()), "key_env"))
        }
        (None, None, None) => Err(Invalid::new(
            format!("{list}[{i}]"),
            "give one of `sha256`, `key` or `key_env`",
        )),
        _ => Err(Invalid::new(
            format!("{list}[{i}]"),
            "give only one of `sha256`, `key` and `key_env`",
        )),
    }
}

fn upstream(u: &file::FileUpstream, base_dir: &Path) -> Result<Upstream, Invalid> {
    let field = "upstream.base_url";
    let bad = |why: &str| Invalid::new(field, format!("`{}` {why}", u.base_url));
    let uri: http::Uri = u
        .base_url
        .parse()
        .map_err(|_| bad("is not an http:// or https:// URL"))?;
    let scheme = match uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => return Err(bad("must be an http:// or https:// URL")),
    };
    let authority = uri.authority().ok_or_else(|| bad("has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("must not carry credentials"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(bad("has no host"));
    }
    if uri.query().is_some() {
        return Err(bad("must not have a query"));
    }
    let port = authority.port_u16().unwrap_or(match scheme {
        Scheme::Http => 80,
        Scheme::Https => 443,
    });
    let base_path = uri.path().trim_end_matches('/').to_string();
    let connect_timeout = Duration::from_millis(
        nonzero_u64(u.connect_timeout_ms, "upstream.connect_timeout_ms")?.get(),
    );
    let read_timeout =
        Duration::from_millis(nonzero_u64(u.read_timeout_ms, "upstream.read_timeout_ms")?.get());
    let ca_file = match &u.ca_file {
        None => None,
        Some(f) => {
            if scheme == Scheme::Http {
                return Err(Invalid::new(
                    "upstream.ca_file",
                    "applies only to an https base_url",
                ));
            }
            Some(existing_file(base_dir, f, "upstream.ca_file")?)
        }
    };
    let mut pass_headers = Vec::with_capacity(u.pass_headers.len());
    for (i, name) in u.pass_headers.iter().enumerate() {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(Invalid::new(
                format!("upstream.pass_headers[{i}]"),
                format!("`{name}` is not a header field name"),
            ));
        }
        pass_headers.push(name.to_ascii_lowercase());
    }
    Ok(Upstream {
        pass_headers,
        scheme,
        host: host.to_string(),
        port,
        authority: authority.as_str().to_string(),
        base_path,
        connect_timeout,
        read_timeout,
        ca_file,
    })
}
