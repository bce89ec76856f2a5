//! The config in force, swapped whole on reload.
//!
//! A [`Snapshot`] is everything a request needs that comes from the config: the compiled
//! policy, the resolved upstream, and the metric label handles. Readers take one with a single
//! `ArcSwap` load (no lock) and keep it for the whole request, so a request never sees half of
//! one config and half of another.
//!
//! A reload (SIGHUP or `POST /reload`) reads and validates the file completely, resolves the
//! upstream, and only then swaps; per-key rate state carries over for keys that remain (matched
//! by digest). A refused reload changes nothing: the old snapshot keeps serving, the reason is
//! logged and returned, and `tollgate_config_reloads_total{result="error"}` counts it.
//!
//! Settings bound to sockets or to the process (`listen`, `admin_listen`, `tls`, `log`,
//! `shutdown`, `runtime`, `cluster`, `state`, and the two `server` settings Pingora's HTTP/2
//! layer takes at start) cannot
//! change in a running process: a reload that changes them still applies everything else, and
//! reports those fields as needing a restart or an upgrade. The rest of `server` applies to
//! connections accepted after the reload.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use arc_swap::ArcSwap;

use super::metrics::{Meters, Metrics};
use super::upstream::Target;
use crate::config::{self, Config, ConfigError};
use crate::limit::{LocalStore, Store};
use crate::policy::Policy;
use crate::sync::Locked;
use crate::usage::Usage;

/// Everything a request reads from the config, fixed for that request.
pub struct Snapshot {
    pub policy: Policy,
    pub target: Target,
    pub meters: Meters,
    /// Which config this is (1 for the first; one more per reload): the usage counts are for
    /// one generation.
    pub generation: u64,
    /// When it was compiled (ms since the Unix epoch): a change made after it, by a replica
    /// with a later config, is not this config's to drop (`crate::keys`, `replace_records`).
    pub compiled_ms: u64,
}

/// The last reload, for the operator's view.
#[derive(Clone, Debug)]
pub struct LastReload {
    /// ms since the Unix epoch.
    pub at_ms: u64,
    /// `None` when it took effect; the refusal otherwise.
    pub error: Option<String>,
}

/// A reload that took effect.
#[derive(Clone)]
pub struct Reloaded {
    pub snapshot: Arc<Snapshot>,
    /// Fields that changed in the file but keep their old value until a restart or upgrade.
    pub restart_required: Vec<String>,
}

pub struct LivePolicy {
    current: ArcSwap<Snapshot>,
    /// Per-key counts for the operator's view, for the snapshot in force.
    usage: Arc<Usage>,
    last_reload: Mutex<Option<LastReload>>,
    /// When the process loaded its first config (ms since the Unix epoch).
    started_ms: u64,
    /// The owner of the keys' live changes (`crate::keys::KeyChanges`), told of every
    /// config compiled so that it puts the changes in force on it (weak: the owner holds
    /// this policy, and neither keeps the other alive).
    hook: OnceLock<Weak<dyn KeyHook>>,
    /// Serializes reloads so two cannot interleave their carry-over of rate state.
    reload_lock: Mutex<()>,
    /// Refuse a reload to a config that holds a published demo key (`run`, unless told
    /// `--allow-demo-keys`).
    refuse_published: AtomicBool,
    path: PathBuf,
    metrics: Arc<Metrics>,
}

/// The owner of the keys' live changes, as a reload sees it: the set of changes in force is
/// the owner's, and every config compiled is handed to it, under the reload's lock, before it
/// serves.
pub trait KeyHook: Send + Sync {
    /// Whether `config` can take the changes in force (an issued key's name or digest that
    /// the YAML now has too refuses the reload).
    fn check(&self, config: &Config) -> Result<(), ConfigError>;

    /// `new` was compiled from a reload of `old`: put the changes in force on it.
    fn compiled(&self, new: &Policy, old: &Policy);
}

impl LivePolicy {
    /// Compile `config` into the first snapshot. Fails when the upstream cannot be resolved
    /// or its CA file cannot be read.
    pub fn new(config: Config, metrics: Arc<Metrics>) -> Result<Self, ConfigError> {
        Self::with_store(config, metrics, Arc::new(LocalStore), |_| ()).map(|(live, ())| live)
    }

    /// [`LivePolicy::new`], deciding on budgets with `store` (a shared store when `cluster`
    /// is configured; reloads keep it); `first` puts the changes kept from before on the
    /// policy compiled, before it serves (`crate::keys::put_kept_in_force`), and what it
    /// returns is handed back beside the policy.
    pub fn with_store<T>(
        config: Config,
        metrics: Arc<Metrics>,
        store: Arc<dyn Store>,
        first: impl FnOnce(&Policy) -> T,
    ) -> Result<(Self, T), ConfigError> {
        let path = config.source.clone();
        let mut snapshot = compile(config, Err(store), &metrics)?;
        snapshot.policy.keys.expire(crate::clock::wall_ms());
        let made = first(&snapshot.policy);
        snapshot.generation = 1;
        let usage = Arc::new(Usage::new());
        usage.reset(1);
        usage.rotate(usage.now_ms() / 1000);
        let live = Self {
            current: ArcSwap::from_pointee(snapshot),
            usage,
            last_reload: Mutex::new(None),
            started_ms: unix_ms(),
            hook: OnceLock::new(),
            reload_lock: Mutex::new(()),
            refuse_published: AtomicBool::new(false),
            path,
            metrics,
        };
        Ok((live, made))
    }

    /// The snapshot in force now.
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The per-key counts of the operator's view.
    pub fn usage(&self) -> &Arc<Usage> {
        &self.usage
    }

    /// The last reload (none yet: `None`), and when the first config was loaded.
    pub fn last_reload(&self) -> (Option<LastReload>, u64) {
        let last = self.last_reload.locked().clone();
        (last, self.started_ms)
    }

    /// Set the gauge that counts what the keys are (`tollgate_keys`): when the metrics are
    /// read, not at each change, so that a change costs the same with a million keys as with
    /// ten.
    pub fn refresh_key_states(&self) {
        self.metrics.set_key_states(&self.current.load().policy);
    }

    /// Hand every config compiled from now on to `owner` (once; later calls are ignored).
    pub fn hook(&self, owner: Weak<dyn KeyHook>) {
        let _ = self.hook.set(owner);
    }

    /// Run `f` on the snapshot in force, serialized with reloads: no reload compiled before
    /// `f` replaces the policy after it (a change put on the policy in force here is on
    /// every later one too, through the [`KeyHook`]).
    pub fn serialized<R>(&self, f: impl FnOnce(&Snapshot) -> R) -> R {
        let _serial = self.reload_lock.locked();
        f(&self.current.load())
    }

    /// Mark what has expired at the wall clock's `wall_ms` on the policy in force; the next
    /// instant at which something expires.
    pub fn expire(&self, wall_ms: u64) -> Option<u64> {
        let snap = self.current.load();
        snap.policy.keys.expire(wall_ms).1
    }

    /// From now on, refuse a reload to a config that holds a published demo key.
    pub fn refuse_published_keys(&self) {
        self.refuse_published.store(true, Ordering::Relaxed);
    }

    /// The file the config is (re)loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-read the config file and swap it in; see the module comment.
    pub fn reload(&self) -> Result<Reloaded, ConfigError> {
        self.replace(Config::load(&self.path))
    }

    /// Swap in `config` if it is valid; count, log and return what happened.
    pub fn replace(&self, config: Result<Config, ConfigError>) -> Result<Reloaded, ConfigError> {
        let _serial = self.reload_lock.locked();
        let old = self.current.load_full();
        let refuse = self.refuse_published.load(Ordering::Relaxed);
        let result = config.and_then(|c| {
            if refuse {
                refuse_published_keys(&c)?;
            }
            let hook = self.hook.get().and_then(Weak::upgrade);
            if let Some(h) = &hook {
                h.check(&c)?;
            }
            let restart_required = config::changed_fields(&old.policy.config.process, &c.process);
            let mut snapshot = compile(c, Ok(&old.policy), &self.metrics)?;
            snapshot.policy.keys.expire(crate::clock::wall_ms());
            if let Some(h) = &hook {
                h.compiled(&snapshot.policy, &old.policy);
            }
            snapshot.generation = old.generation + 1;
            let snapshot = Arc::new(snapshot);
            self.usage.reset(snapshot.generation);
            self.usage.rotate(self.usage.now_ms() / 1000);
            self.current.store(Arc::clone(&snapshot));
            Ok(Reloaded {
                snapshot,
                restart_required,
            })
        });
        *self.last_reload.locked() = Some(LastReload {
            at_ms: unix_ms(),
            error: result.as_ref().err().map(|e| e.to_string()),
        });
        match &result {
            Ok(r) => {
                self.metrics.reloaded(true);
                tracing::info!(
                    target: "tollgate::reload",
                    file = %self.path.display(),
                    keys = r.snapshot.policy.keys.len(),
                    "config reloaded"
                );
                for field in &r.restart_required {
                    tracing::warn!(
                        target: "tollgate::reload",
                        field,
                        "changed in the file, but takes effect only after a restart or upgrade"
                    );
                }
            }
            Err(e) => {
                self.metrics.reloaded(false);
                tracing::error!(
                    target: "tollgate::reload",
                    error = %e,
                    "config reload refused; the previous config keeps serving"
                );
            }
        }
        result
    }
}

/// Compile `config` into a snapshot, carrying rate state and the store over from the policy
/// in force (`Ok`), or starting with `store` (`Err`: the first snapshot).
fn compile(
    config: Config,
    previous: Result<&Policy, Arc<dyn Store>>,
    metrics: &Metrics,
) -> Result<Snapshot, ConfigError> {
    let target = resolve_upstream(&config)?;
    let policy = match previous {
        Ok(p) => Policy::new(config, Some(p)),
        Err(store) => Policy::with_store(config, None, store),
    };
    let meters = metrics.meters(&policy);
    Ok(Snapshot {
        policy,
        target,
        meters,
        generation: 0,
        compiled_ms: unix_ms(),
    })
}

/// The upstream of `config`, resolved (and its TLS settings read), or the error that refuses
/// the config: at start, on reload, and in `tollgate check`.
pub fn resolve_upstream(config: &Config) -> Result<Target, ConfigError> {
    Target::new(&config.upstream).map_err(|e| ConfigError {
        file: config.source.clone(),
        line: None,
        field: "upstream".into(),
        message: e.to_string(),
    })
}

/// Refuse `config` if it holds a published demo key ([`crate::config::published`]): the first
/// such entry, with its line.
pub fn refuse_published_keys(config: &Config) -> Result<(), ConfigError> {
    let Some(field) = config.published_keys.first() else {
        return Ok(());
    };
    let line = config
        .warnings
        .iter()
        .find(|w| &w.field == field)
        .and_then(|w| w.line);
    Err(ConfigError {
        file: config.source.clone(),
        line,
        field: field.clone(),
        message: format!(
            "holds a published demo key ({} of the config's entries do): anyone can use it. Replace it, or serve a local trial with `tollgate run --allow-demo-keys`",
            config.published_keys.len()
        ),
    })
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::authenticate::AuthHeader;
    use crate::policy::{Code, RequestHead};
    use tollgate_core::testing::TestConfig;

    fn send(live: &LivePolicy) -> Result<u32, Code> {
        let head = RequestHead {
            method: "POST",
            path: "/v2/sendMessage/",
            authorization: AuthHeader::One(b"Bearer basic-key-1"),
        };
        let d = live.load().policy.decide(&head, 0);
        d.verdict
            .map(|_| d.budget.unwrap().remaining)
            .map_err(|r| r.code)
    }

    fn basic_limit(live: &LivePolicy) -> u32 {
        live.load().policy.config.plan("basic").unwrap().limit.get()
    }

    fn metrics_text(live: &LivePolicy) -> String {
        live.refresh_key_states();
        String::from_utf8(live.metrics().render()).unwrap()
    }

    #[test]
    fn reload_swaps_whole_keeps_budgets_and_refuses_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.yaml");
        TestConfig::new().write(&path);
        let live = LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap();
        for _ in 0..10 {
            send(&live).unwrap();
        }
        assert_eq!(send(&live), Ok(29));

        // A bigger Basic limit takes effect, and what was spent stays spent: 11 requests at
        // 250 ms each used 2.75 s of the window, which is 22 requests at 80 per window; this
        // one makes 23.
        TestConfig::new().plan_limit("basic", 80).write(&path);
        let r = live.reload().unwrap();
        assert!(r.restart_required.is_empty());
        assert_eq!(basic_limit(&live), 80);
        assert_eq!(send(&live), Ok(80 - 23));

        // A broken file is refused with its line; the old policy keeps serving.
        std::fs::write(&path, "plans: [oops\n").unwrap();
        let err = live.reload().err().unwrap();
        assert!(err.line.is_some(), "{err}");
        assert_eq!(basic_limit(&live), 80);
        assert!(send(&live).is_ok());

        let out = metrics_text(&live);
        assert!(
            out.contains(r#"tollgate_config_reloads_total{result="success"} 1"#),
            "{out}"
        );
        assert!(
            out.contains(r#"tollgate_config_reloads_total{result="error"} 1"#),
            "{out}"
        );
    }

    #[test]
    fn a_reload_reports_process_fields_and_keeps_the_key_gauge_on_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.yaml");
        TestConfig::new().write(&path);
        let live = LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap();
        assert!(metrics_text(&live).contains("tollgate_keys{state=\"active\"} 7"));

        // One key fewer, and a new listen address (which cannot move without a restart).
        TestConfig::new()
            .without_key("pro-1")
            .listen("127.0.0.1:1")
            .write(&path);
        let r = live.reload().unwrap();
        assert_eq!(r.restart_required, vec!["listen"]);
        assert!(metrics_text(&live).contains("tollgate_keys{state=\"active\"} 6"));

        // An upstream that cannot be resolved is refused like a syntax error.
        let bad = TestConfig::new().upstream("http://no-such-host.invalid:9");
        let err = live.replace(bad.try_parse()).err().unwrap();
        assert_eq!(err.field, "upstream", "{err}");
        assert!(metrics_text(&live).contains("tollgate_keys{state=\"active\"} 6"));
    }
}
