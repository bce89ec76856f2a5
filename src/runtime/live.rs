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
use crate::digest::Digest;
use crate::limit::{LocalStore, Store};
use crate::policy::overrides::{Drop, Override, Overrides, Part};
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
    /// with a later config, is not this config's to drop ([`LivePolicy::replace_overrides`]).
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
    /// The records of the keys' live changes in force (upgrades, suspensions, revocations,
    /// issued keys), put on every snapshot compiled. Where they are kept and how the fleet
    /// shares them is the key room's (`crate::keys::KeyChanges`, which owns this policy and
    /// changes this set through [`LivePolicy::with_overrides`]).
    in_force: Mutex<Overrides>,
    /// Told which overrides a compile dropped, so that where they are kept forgets them too
    /// (set by the key room's owner, which holds this policy: weak, so that neither keeps the
    /// other alive).
    forget: OnceLock<Weak<dyn Forget>>,
    /// Serializes reloads so two cannot interleave their carry-over of rate state.
    reload_lock: Mutex<()>,
    /// Refuse a reload to a config that holds a published demo key (`run`, unless told
    /// `--allow-demo-keys`).
    refuse_published: AtomicBool,
    path: PathBuf,
    metrics: Arc<Metrics>,
}

/// Where the overrides in force are kept: told what a compile dropped (a reload that changed
/// those keys in the YAML), to forget it there too.
pub trait Forget: Send + Sync {
    fn forget(&self, drops: &[Drop]);

    /// The config now has a key (a digest) the one before did not: the changes kept of it
    /// elsewhere (by a replica whose YAML had it first) may not be in force here yet.
    fn learned_keys(&self) {}
}

/// Whether `new` authenticates a digest `old` did not (a key or an alias the reload added).
fn learned_keys(new: &Policy, old: &Policy) -> bool {
    let keys = &new.keys;
    keys.iter()
        .map(|(_, e)| e.digest)
        .chain(keys.aliases().map(|(_, a)| a.digest))
        .any(|d| old.keys.resolve(&d).is_none())
}

impl LivePolicy {
    /// Compile `config` into the first snapshot. Fails when the upstream cannot be resolved
    /// or its CA file cannot be read.
    pub fn new(config: Config, metrics: Arc<Metrics>) -> Result<Self, ConfigError> {
        Self::with_store(config, metrics, Arc::new(LocalStore), std::iter::empty(), 0)
    }

    /// [`LivePolicy::new`], deciding on budgets with `store` (a shared store when `cluster`
    /// is configured; reloads keep it), with the overrides kept from before: `kept`, in
    /// batches in the order of their digests, about `records` of them. Each batch is put in
    /// force as it comes (while the caller reads the next), once the config is compiled.
    pub fn with_store(
        config: Config,
        metrics: Arc<Metrics>,
        store: Arc<dyn Store>,
        kept: impl IntoIterator<Item = Vec<(Digest, Override)>>,
        records: usize,
    ) -> Result<Self, ConfigError> {
        let path = config.source.clone();
        let mut snapshot = compile(config, Err(store), &metrics)?;
        let in_force = Mutex::new(put_kept_in_force(&snapshot.policy, kept, records, &metrics));
        snapshot.generation = 1;
        let usage = Arc::new(Usage::new());
        usage.reset(1);
        usage.rotate(usage.now_ms() / 1000);
        Ok(Self {
            current: ArcSwap::from_pointee(snapshot),
            usage,
            last_reload: Mutex::new(None),
            started_ms: unix_ms(),
            in_force,
            forget: OnceLock::new(),
            reload_lock: Mutex::new(()),
            refuse_published: AtomicBool::new(false),
            path,
            metrics,
        })
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

    /// Tell `keeper` of every override a compile drops from now on.
    pub fn forget_with(&self, keeper: Weak<dyn Forget>) {
        let _ = self.forget.set(keeper);
    }

    /// Read or change the overrides in force. A change applies to the snapshots compiled from
    /// now on; putting it on the policy in force is the caller's. (The gauges that count them
    /// are set when the metrics are read: [`LivePolicy::refresh_gauges`].)
    pub fn with_overrides<R>(&self, f: impl FnOnce(&mut Overrides) -> R) -> R {
        f(&mut self.in_force.locked())
    }

    /// Set the gauges that count what the keys are (`tollgate_keys`,
    /// `tollgate_plan_overrides`): when the metrics are read, not at each change, so that a
    /// change costs the same with a million keys as with ten.
    pub fn refresh_gauges(&self) {
        let snap = self.current.load();
        self.metrics.set_key_states(&snap.policy);
        let upgrades = upgrades(&self.in_force.locked());
        self.metrics.set_plan_overrides(upgrades);
    }

    /// Put records just kept in force: in the set every later snapshot is compiled with, and
    /// on the policy in force now. Serialized with reloads, so that no reload compiled before
    /// the change replaces the policy after it.
    pub fn put_records(&self, changes: &[(Digest, Part, Override)]) {
        let _serial = self.reload_lock.locked();
        let snap = self.current.load();
        self.with_overrides(|set| {
            for (d, _, o) in changes {
                if o.is_empty() {
                    set.remove(d);
                } else {
                    set.insert(*d, o.clone());
                }
                snap.policy.apply_record(d, o);
            }
        });
    }

    /// Put `set` (every record kept, as another replica may have changed any) in force in
    /// place of the set in force, moved, never copied; what the policy in force drops of it
    /// is taken out of `set` and returned (to be logged and forgotten where it is kept).
    ///
    /// Only what was changed before this config was compiled is its to drop (the later
    /// decision wins): a record with a part dropped that another replica changed after it
    /// (during a rolling reload, on a key or plan this replica's YAML does not have yet)
    /// stays in `set` as it came, not applied here, and is not returned, so that nothing
    /// forgets it; the reload that brings this replica's YAML up to date puts it in force.
    /// The records a change sent here puts in force ([`LivePolicy::put_records`]) are kept
    /// in the set the same way.
    pub fn replace_overrides(&self, mut set: Overrides) -> Vec<Drop> {
        let _serial = self.reload_lock.locked();
        let snap = self.current.load();
        let mut drops = snap.policy.apply_overrides(&set);
        drops.retain(|d| {
            let later = d.parts.iter().any(|&p| {
                d.before
                    .changed_ms(p)
                    .is_some_and(|at| at > snap.compiled_ms)
            });
            if !later {
                match &d.after {
                    Some(o) => set.insert(d.digest, o.clone()),
                    None => set.remove(&d.digest),
                };
            }
            !later
        });
        let before = self.with_overrides(|in_force| std::mem::replace(in_force, set));
        // The set replaced is let go outside the overrides' lock.
        drop(before);
        drops
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
            self.with_overrides(|set| crate::policy::overrides::check_issued(&c, set))?;
            let restart_required = config::changed_fields(&old.policy.config.process, &c.process);
            let mut snapshot = compile(c, Ok(&old.policy), &self.metrics)?;
            let dropped = apply_in_force(&snapshot.policy, &self.in_force, &self.metrics);
            if let Some(keeper) = self.forget.get().and_then(Weak::upgrade) {
                if !dropped.is_empty() {
                    keeper.forget(&dropped);
                }
                if learned_keys(&snapshot.policy, &old.policy) {
                    keeper.learned_keys();
                }
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

/// Put the overrides in force on `policy` (and mark what has expired); drop (one log line
/// each) and return what no longer applies to it.
fn apply_in_force(policy: &Policy, in_force: &Mutex<Overrides>, metrics: &Metrics) -> Vec<Drop> {
    let mut set = in_force.locked();
    policy.keys.expire(crate::clock::wall_ms());
    let drops = policy.apply_overrides(&set);
    settle_drops(policy, &mut set, &drops, metrics);
    drops
}

/// [`apply_in_force`] at a start, of the records kept from before as they come, in batches
/// in the order of their digests: the set they make, once every batch is in force.
fn put_kept_in_force(
    policy: &Policy,
    kept: impl IntoIterator<Item = Vec<(Digest, Override)>>,
    records: usize,
    metrics: &Metrics,
) -> Overrides {
    policy.keys.expire(crate::clock::wall_ms());
    let mut kept = kept.into_iter();
    let first = kept.next().unwrap_or_default();
    // In the order of their digests, the records are in no order of their own: the first
    // batch's share of issued keys is the whole set's, near enough to make room for them at
    // once (and none for a set of other changes).
    let issued = first.iter().filter(|(_, o)| o.issued.is_some()).count();
    let issued = records.saturating_mul(issued) / first.len().max(1);
    let mut applying = policy.applying(issued);
    let mut all = Vec::with_capacity(records);
    for batch in std::iter::once(first).chain(kept) {
        for (d, o) in &batch {
            applying.record(d, o);
        }
        all.extend(batch);
    }
    let drops = applying.finish();
    // Built in one go from records in order: the tree's nodes full.
    let mut set = Overrides::from_iter(all);
    settle_drops(policy, &mut set, &drops, metrics);
    set
}

/// What no longer applies to `policy` taken out of `set` (one log line each), and the gauges
/// of what is in force set.
fn settle_drops(policy: &Policy, set: &mut Overrides, drops: &[Drop], metrics: &Metrics) {
    for d in drops {
        match &d.after {
            Some(o) => set.insert(d.digest, o.clone()),
            None => set.remove(&d.digest),
        };
        let parts: Vec<&str> = d.parts.iter().map(|p| p.name()).collect();
        tracing::info!(
            target: "tollgate::overrides",
            key = %d.before.key,
            dropped = %parts.join(","),
            reason = d.why.as_str(),
            "override dropped"
        );
    }
    metrics.set_plan_overrides(upgrades(set));
    metrics.set_key_states(policy);
}

/// The records of `set` that hold an upgrade (`tollgate_plan_overrides`).
fn upgrades(set: &Overrides) -> usize {
    set.values().filter(|o| o.has(Part::Plan)).count()
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
        live.refresh_gauges();
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

    /// A whole read of the fleet's set (`replace_overrides`) drops only what was changed
    /// before this config was compiled: a suspension another replica made later, of a key
    /// this replica's YAML does not have yet (a rolling reload), is neither applied nor
    /// dropped (nothing forgets it), and the reload that brings the key puts it in force.
    #[test]
    fn a_whole_read_drops_only_what_was_changed_before_its_config() {
        use crate::policy::overrides::{Change, Override};
        let dir = tempfile::tempdir().unwrap();
        // The replica that made the suspension has the key, and records its YAML.
        let newer = dir.path().join("newer.yaml");
        TestConfig::new().write(&newer);
        let there = LivePolicy::new(Config::load(&newer).unwrap(), Arc::default()).unwrap();
        let there = &there.load().policy;
        let yaml = there.fingerprint(there.keys.find_by_name("pro-1").unwrap());
        let path = dir.path().join("gw.yaml");
        TestConfig::new().without_key("pro-1").write(&path);
        let live = LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap();
        let compiled = live.load().compiled_ms;
        let suspended = |since_ms| {
            let mut o = Override::named("pro-1");
            o.yaml = Some(yaml.clone());
            o.suspended = Some(Box::new(Change {
                since_ms,
                by: "admin".into(),
                reason: None,
            }));
            o
        };
        let d = Digest::of(b"pro-key-1");
        let pro = |live: &LivePolicy| {
            let head = RequestHead {
                method: "GET",
                path: "/v2/client/getStatus",
                authorization: AuthHeader::One(b"Bearer pro-key-1"),
            };
            live.load()
                .policy
                .decide(&head, 0)
                .verdict
                .map(|_| ())
                .map_err(|r| r.code)
        };

        // Changed before this config: the config's to drop.
        let drops = live.replace_overrides(Overrides::from_iter([(d, suspended(compiled - 1))]));
        assert_eq!(drops.len(), 1);
        assert_eq!(live.with_overrides(|set| set.len()), 0);

        // Changed after it, elsewhere: kept, not applied, not dropped.
        let later = suspended(compiled + 60_000);
        let drops = live.replace_overrides(Overrides::from_iter([(d, later.clone())]));
        assert!(drops.is_empty(), "{drops:?}");
        assert_eq!(live.with_overrides(|set| set.get(&d).cloned()), Some(later));

        // The reload that brings the key puts the suspension in force.
        TestConfig::new().write(&path);
        live.reload().unwrap();
        assert_eq!(pro(&live), Err(Code::Unauthorized));
    }
}
