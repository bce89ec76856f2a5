//! Partner upgrades kept: where plan overrides live, and how every replica learns of them.
//!
//! The decision is the core's (`tollgate_core::policy::overrides`); this module keeps the
//! overrides so that they outlive the process, and spreads them:
//!
//! | config | where | a change reaches |
//! |---|---|---|
//! | `cluster:` | Redis: one hash `{<prefix>:ov}:set` (field: a hash of the key's digest; value: the override as JSON, with the key's *name*) and a version counter `{<prefix>:ov}:v`; both expire 30 days after the last replica touched them | every replica within one `sync_interval` (each polls the version) |
//! | `state.path` | an embedded, crash-safe database on local disk ([redb]: pure Rust, ACID, every commit synced before it returns) | this process |
//! | neither | memory | this process, until it stops (`check` warns) |
//!
//! An upgrade the upstream accepted is written before its answer goes back to the partner: an
//! acknowledged upgrade is a kept one. A write that fails is logged; the override still applies
//! in this process.
//!
//! Why redb and not SQLite: the data is a map from a 32-byte digest to a small record; redb is a
//! pure-Rust embedded key-value store (one crate, no C build), ACID and crash-safe by default
//! (copy-on-write B-trees, a commit is durable when it returns), and lets `tollgate check` read
//! the file while a gateway holds it. SQLite (through rusqlite) would bring a C library and SQL
//! for one table of two columns.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::IntGauge;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use redis::Script;

use crate::cluster::{connect, Conn, Failure};
use crate::config::{Cluster as ClusterConfig, Plan};
use crate::digest::Digest;
use crate::limit::shared::hashed;
use crate::policy::keys::KeyIdx;
use crate::policy::overrides::{Override, Overrides, Upgrade};
use crate::policy::Policy;
use crate::runtime::live::LivePolicy;
use crate::runtime::metrics::Metrics;

const TABLE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("plan_overrides");
/// How long the overrides stay in Redis after the last replica touched them.
const REDIS_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// Write one override (`put` with its JSON, or `del`) and bump the version.
const WRITE_LUA: &str = r"
if ARGV[1] == 'put' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
else
  redis.call('HDEL', KEYS[1], ARGV[2])
end
local v = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return v
";

/// The version, and the whole set when it is not the one the replica has (`ARGV[1]`); keeps
/// both alive.
const POLL_LUA: &str = r"
local v = redis.call('GET', KEYS[2]) or '0'
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if v == ARGV[1] then
  return {v}
end
return {v, redis.call('HGETALL', KEYS[1])}
";

/// Where the overrides are kept.
enum Backend {
    Memory,
    Disk(Arc<redb::Database>),
    Redis(Box<RedisBackend>),
}

struct RedisBackend {
    cfg: ClusterConfig,
    set_key: String,
    version_key: String,
    write: Script,
    poll: Script,
    conn: tokio::sync::Mutex<Option<Conn>>,
}

impl RedisBackend {
    async fn conn(&self) -> Result<Conn, Failure> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = tokio::time::timeout(self.cfg.timeout, connect(&self.cfg))
            .await
            .map_err(|_| Failure("no connection within timeout_ms".into()))??;
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn write(&self, digest: &Digest, record: Option<&Override>) -> Result<(), Failure> {
        let conn = self.conn().await?;
        let mut inv = self.write.key(&self.set_key);
        inv.key(&self.version_key);
        match record {
            Some(o) => inv.arg("put").arg(field(digest)).arg(json(o)),
            None => inv.arg("del").arg(field(digest)).arg(""),
        };
        inv.arg(REDIS_TTL.as_millis() as u64);
        let r = tokio::time::timeout(self.cfg.timeout, conn.invoke::<i64>(&inv)).await;
        match r {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                self.conn.lock().await.take();
                Err(Failure::of(&e, &self.cfg.redis_url))
            }
            Err(_) => Err(Failure("no answer within timeout_ms".into())),
        }
    }
}

/// The name of a key's override in Redis: a hash of its digest under a label of its own.
fn field(d: &Digest) -> String {
    hashed(b"tollgate-cluster-override:", d)
}

fn json(o: &Override) -> String {
    serde_json::to_string(o).expect("an override serializes")
}

/// The overrides in force, where they are kept, and the gauge that counts them.
pub struct PlanOverrides {
    set: Mutex<Overrides>,
    backend: Backend,
    gauge: IntGauge,
    /// The Redis version this process last applied.
    version: Mutex<String>,
}

/// What `check` and the admin API show of one override.
#[derive(Clone, Debug)]
pub struct Shown {
    pub key: String,
    pub plan: String,
    pub plan_id: u32,
    pub replaced: String,
    pub replaced_plan_id: u32,
    pub partner: Option<String>,
    pub at_ms: u64,
}

impl Shown {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "key": self.key,
            "plan": self.plan,
            "plan_id": self.plan_id,
            "replaced": self.replaced,
            "replaced_plan_id": self.replaced_plan_id,
            "partner": self.partner,
            "at_ms": self.at_ms,
        })
    }
}

impl PlanOverrides {
    /// Overrides kept in memory only (no `state`, no `cluster`; and the tests).
    pub fn memory(metrics: &Metrics) -> Self {
        Self::with(Backend::Memory, Overrides::new(), metrics)
    }

    /// Open the store the config names, with what it holds: Redis with `cluster` (filled by
    /// [`OverrideSync`]), else the file at `state.path`, else memory.
    pub fn open(
        cluster: Option<&ClusterConfig>,
        state_path: Option<&Path>,
        metrics: &Metrics,
    ) -> Result<Self, String> {
        if let Some(c) = cluster {
            let prefix = &c.key_prefix;
            let backend = Backend::Redis(Box::new(RedisBackend {
                cfg: c.clone(),
                set_key: format!("{{{prefix}:ov}}:set"),
                version_key: format!("{{{prefix}:ov}}:v"),
                write: Script::new(WRITE_LUA),
                poll: Script::new(POLL_LUA),
                conn: tokio::sync::Mutex::new(None),
            }));
            return Ok(Self::with(backend, Overrides::new(), metrics));
        }
        let Some(path) = state_path else {
            return Ok(Self::memory(metrics));
        };
        // Several writers: during a zero-downtime upgrade the old and the new process both
        // have it open.
        let db = redb::Builder::new()
            .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
            .create(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let set = read_all(&db).map_err(|e| format!("state.path {}: {e}", path.display()))?;
        Ok(Self::with(Backend::Disk(Arc::new(db)), set, metrics))
    }

    fn with(backend: Backend, set: Overrides, metrics: &Metrics) -> Self {
        let gauge = IntGauge::new(
            "tollgate_plan_overrides",
            "Customer keys on a plan a partner's upgrade gave them (not the YAML's).",
        )
        .expect("valid metric");
        metrics.register(Box::new(gauge.clone()));
        Self {
            set: Mutex::new(set),
            backend,
            gauge,
            version: Mutex::new(String::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Overrides> {
        self.set.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Put the overrides on a policy being compiled (start, reload); drop and forget those that
    /// no longer apply, one log line each.
    pub fn apply_to(&self, policy: &Policy) {
        let mut set = self.lock();
        let dropped = policy.apply_overrides(&set);
        for (digest, o, why) in &dropped {
            set.remove(digest);
            tracing::info!(
                target: "tollgate::overrides",
                key = %o.key,
                plan_id = o.plan_id,
                reason = why.as_str(),
                "plan override dropped"
            );
        }
        self.gauge.set(set.len() as i64);
        drop(set);
        if !dropped.is_empty() {
            self.forget_later(dropped.into_iter().map(|(d, ..)| d).collect());
        }
    }

    /// Remove dropped overrides from where they are kept (the disk at once; Redis from a task,
    /// as a reload is not async).
    fn forget_later(&self, digests: Vec<Digest>) {
        match &self.backend {
            Backend::Memory => {}
            Backend::Disk(db) => {
                for d in &digests {
                    if let Err(e) = write_disk(db, d, None) {
                        tracing::error!(target: "tollgate::overrides", error = %e, "could not forget a dropped override on disk");
                    }
                }
            }
            Backend::Redis(_) => {
                // Deleted from Redis by the next poll (a reload is not async): forgetting the
                // version makes it read the whole set again, apply it to this config, and
                // delete what this config drops.
                self.version
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
            }
        }
    }

    /// The upstream accepted `upgrade` from the key `by`, decided on `decided` (the policy of
    /// the request): apply it on that policy and on the one in force now, keep it, log it.
    /// What changed, for the access line (`from->to` plan names).
    pub async fn upgraded(
        &self,
        live: &LivePolicy,
        decided: &Policy,
        upgrade: &Upgrade,
        by: KeyIdx,
    ) -> Option<String> {
        let now = live.load();
        let (kept, before) = decided.apply_upgrade(upgrade, by, unix_ms())?;
        let from = decided.config.plans[before].name.clone();
        let to = decided.config.plans[upgrade.plan].name.clone();
        {
            let mut set = self.lock();
            match &kept {
                Some(o) => set.insert(upgrade.target, o.clone()),
                None => set.remove(&upgrade.target),
            };
            if !std::ptr::eq(&now.policy, decided) {
                // A reload came in between: the policy in force gets it too.
                let one: Overrides = kept.iter().map(|o| (upgrade.target, o.clone())).collect();
                now.policy.apply_overrides(&one);
                if kept.is_none() {
                    if let Some(k) = now.policy.keys.lookup(&upgrade.target) {
                        now.policy.keys.get(k).set_plan_override(None);
                    }
                }
            }
            self.gauge.set(set.len() as i64);
        }
        let partner = kept.as_ref().and_then(|o| o.partner.clone());
        let key = decided
            .keys
            .get(upgrade.key.unwrap_or_default())
            .name
            .as_str()
            .to_string();
        if let Err(why) = self.keep(&upgrade.target, kept.as_ref()).await {
            tracing::error!(
                target: "tollgate::overrides",
                key = %key,
                error = %why,
                "plan override applied here but not kept: it ends with this process"
            );
        }
        tracing::info!(
            target: "tollgate::overrides",
            key = %key,
            from = %from,
            to = %to,
            partner = %partner.as_deref().unwrap_or("-"),
            "plan override applied"
        );
        Some(format!("{from}->{to}"))
    }

    /// Write one override (or its removal) where overrides are kept; returns when it is.
    async fn keep(&self, digest: &Digest, record: Option<&Override>) -> Result<(), String> {
        match &self.backend {
            Backend::Memory => Ok(()),
            Backend::Disk(db) => {
                let (db, d, r) = (Arc::clone(db), *digest, record.cloned());
                tokio::task::spawn_blocking(move || write_disk(&db, &d, r.as_ref()))
                    .await
                    .map_err(|e| e.to_string())?
            }
            Backend::Redis(r) => r.write(digest, record).await.map_err(|f| f.0),
        }
    }

    /// `DELETE /api/overrides/{name}`: the key back on its YAML plan. Whether it had one.
    pub async fn remove(&self, live: &LivePolicy, name: &str) -> Result<bool, String> {
        let snap = live.load();
        let Some(digest) = snap.policy.clear_override(name) else {
            return Ok(false);
        };
        let had = {
            let mut set = self.lock();
            let had = set.remove(&digest).is_some();
            self.gauge.set(set.len() as i64);
            had
        };
        self.keep(&digest, None).await?;
        tracing::info!(target: "tollgate::overrides", key = %name, "plan override removed by the operator");
        Ok(had)
    }

    /// The overrides in force, for the admin API and the page.
    pub fn shown(&self, policy: &Policy) -> Vec<Shown> {
        let set = self.lock();
        let mut v = show(&set, &policy.config.plans);
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether overrides are shared through Redis (and [`OverrideSync`] must run).
    pub fn shared(&self) -> bool {
        matches!(self.backend, Backend::Redis(_))
    }
}

fn show(set: &Overrides, plans: &[Plan]) -> Vec<Shown> {
    let name = |id: u32| {
        plans
            .iter()
            .find(|p| p.plan_id == id)
            .map_or_else(|| format!("plan_id {id}"), |p| p.name.clone())
    };
    set.values()
        .map(|o| Shown {
            key: o.key.clone(),
            plan: name(o.plan_id),
            plan_id: o.plan_id,
            replaced: name(o.replaced),
            replaced_plan_id: o.replaced,
            partner: o.partner.clone(),
            at_ms: o.at_ms,
        })
        .collect()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn read_all(db: &impl ReadableDatabase) -> Result<Overrides, String> {
    let txn = db.begin_read().map_err(|e| e.to_string())?;
    let table = match txn.open_table(TABLE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Overrides::new()),
        Err(e) => return Err(e.to_string()),
    };
    let mut set = Overrides::new();
    for row in table.iter().map_err(|e| e.to_string())? {
        let (k, v) = row.map_err(|e| e.to_string())?;
        let Ok(d) = <[u8; 32]>::try_from(k.value()) else {
            continue;
        };
        if let Ok(o) = serde_json::from_slice::<Override>(v.value()) {
            set.insert(Digest(d), o);
        }
    }
    Ok(set)
}

fn write_disk(db: &redb::Database, d: &Digest, record: Option<&Override>) -> Result<(), String> {
    let txn = db.begin_write().map_err(|e| e.to_string())?;
    {
        let mut table = txn.open_table(TABLE).map_err(|e| e.to_string())?;
        match record {
            Some(o) => {
                table
                    .insert(&d.0[..], json(o).as_bytes())
                    .map_err(|e| e.to_string())?;
            }
            None => {
                table.remove(&d.0[..]).map_err(|e| e.to_string())?;
            }
        }
    }
    // Durable when it returns (redb's default durability): an acknowledged upgrade is kept.
    txn.commit().map_err(|e| e.to_string())
}

/// What `tollgate check` shows of the overrides kept at `state.path` (read-only: a running
/// gateway may hold the file).
pub fn read_state(path: &Path, plans: &[Plan]) -> Result<Vec<Shown>, String> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let db = redb::Builder::new()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .open_read_only(path)
        .map_err(|e| e.to_string())?;
    let set = read_all(&db)?;
    let mut v = show(&set, plans);
    v.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(v)
}

/// What `tollgate check` shows of the overrides kept in the cluster's Redis.
pub async fn read_redis(cfg: &ClusterConfig, plans: &[Plan]) -> Result<Vec<Shown>, String> {
    let conn = tokio::time::timeout(cfg.timeout.max(Duration::from_secs(1)), connect(cfg))
        .await
        .map_err(|_| "no connection".to_string())?
        .map_err(|f| f.0)?;
    let set_key = format!("{{{}:ov}}:set", cfg.key_prefix);
    let pairs: HashMap<String, String> = match conn {
        Conn::Single(mut c) => {
            redis::cmd("HGETALL")
                .arg(&set_key)
                .query_async(&mut c)
                .await
        }
        Conn::Cluster(mut c) => {
            redis::cmd("HGETALL")
                .arg(&set_key)
                .query_async(&mut c)
                .await
        }
    }
    .map_err(|e| Failure::of(&e, &cfg.redis_url).0)?;
    let set: Overrides = pairs
        .values()
        .filter_map(|v| serde_json::from_str::<Override>(v).ok())
        .enumerate()
        .map(|(i, o)| (Digest([i as u8; 32]), o))
        .collect();
    let mut v = show(&set, plans);
    v.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(v)
}

/// With `cluster`: polls the overrides' version in Redis every `sync_interval` and, when it
/// moved, applies the whole set to the policy in force.
pub struct OverrideSync {
    pub overrides: Arc<PlanOverrides>,
    pub live: Arc<LivePolicy>,
    pub every: Duration,
}

impl OverrideSync {
    async fn round(&self) -> Result<(), Failure> {
        let Backend::Redis(r) = &self.overrides.backend else {
            return Ok(());
        };
        let conn = r.conn().await?;
        let known = self
            .overrides
            .version
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut inv = r.poll.key(&r.set_key);
        inv.key(&r.version_key)
            .arg(&known)
            .arg(REDIS_TTL.as_millis() as u64);
        let reply = tokio::time::timeout(r.cfg.timeout, conn.invoke::<redis::Value>(&inv))
            .await
            .map_err(|_| Failure("no answer within timeout_ms".into()))?;
        let reply = match reply {
            Ok(v) => v,
            Err(e) => {
                r.conn.lock().await.take();
                return Err(Failure::of(&e, &r.cfg.redis_url));
            }
        };
        let redis::Value::Array(items) = reply else {
            return Ok(());
        };
        let version: String = items
            .first()
            .and_then(|v| redis::from_redis_value(v.clone()).ok())
            .unwrap_or_default();
        let Some(pairs) = items.get(1) else {
            return Ok(());
        };
        let pairs: HashMap<String, String> =
            redis::from_redis_value(pairs.clone()).unwrap_or_default();
        let snap = self.live.load();
        let policy = &snap.policy;
        // Fields are hashes of digests; the record names the key: find it, and check that its
        // digest hashes to the field.
        let mut set = Overrides::new();
        for (f, v) in &pairs {
            let Ok(o) = serde_json::from_str::<Override>(v) else {
                continue;
            };
            let found = (0..policy.keys.len() as KeyIdx)
                .map(|k| policy.keys.get(k))
                .find(|e| e.name.as_str() == o.key && field(&e.digest) == *f);
            if let Some(e) = found {
                set.insert(e.digest, o);
            }
        }
        // Keys that lost their override elsewhere go back to their YAML plan here.
        for k in 0..policy.keys.len() as KeyIdx {
            let e = policy.keys.get(k);
            if e.plan_override().is_some() && !set.contains_key(&e.digest) {
                e.set_plan_override(None);
            }
        }
        let dropped = policy.apply_overrides(&set);
        for (d, o, why) in &dropped {
            set.remove(d);
            tracing::info!(target: "tollgate::overrides", key = %o.key, reason = why.as_str(), "plan override dropped");
            let _ = r.write(d, None).await;
        }
        let n = set.len();
        *self.overrides.lock() = set;
        self.overrides.gauge.set(n as i64);
        *self
            .overrides
            .version
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = if dropped.is_empty() {
            version
        } else {
            String::new()
        };
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for OverrideSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if let Err(Failure(why)) = self.round().await {
                tracing::debug!(target: "tollgate::overrides", error = %why, "overrides not read from the cluster store");
            }
        }
    }
}

/// Where `state.path` resolves, for messages.
pub fn describe(path: Option<&PathBuf>) -> String {
    path.map_or_else(|| "memory".into(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redis_field_is_neither_the_key_nor_its_digest() {
        let d = Digest::of(b"a-customer-key");
        let f = field(&d);
        assert_eq!(f.len(), 32);
        assert!(!hex::encode(d.0).contains(&f));
        assert_ne!(f, crate::limit::shared::store_key("x", &d));
    }

    #[test]
    fn the_disk_store_keeps_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let open = || {
            redb::Builder::new()
                .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
                .create(&path)
                .unwrap()
        };
        let db = open();
        let o = Override {
            plan_id: 2,
            replaced: 1,
            key: "k".into(),
            partner: Some("p".into()),
            at_ms: 7,
        };
        let d = Digest([3; 32]);
        write_disk(&db, &d, Some(&o)).unwrap();
        write_disk(&db, &Digest([4; 32]), Some(&o)).unwrap();
        write_disk(&db, &Digest([4; 32]), None).unwrap();
        // A second writer beside the first (an upgrade), then a fresh start.
        let other = open();
        assert_eq!(read_all(&other).unwrap().len(), 1);
        drop((db, other));
        let db = open();
        let set = read_all(&db).unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set[&d], o);
    }
}
