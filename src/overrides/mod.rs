//! Partner upgrades kept: where plan overrides live, and how every replica learns of them.
//!
//! The decision is the core's (`tollgate_core::policy::overrides`), and the overrides in force
//! are the live snapshot's ([`LivePolicy::with_overrides`]); this room keeps them so that they
//! outlive the process, and spreads them:
//!
//! | config | where | a change reaches |
//! |---|---|---|
//! | `cluster:` | Redis ([`redis_set`]) | every replica within one `sync_interval` ([`sync`]: each polls the version) |
//! | `state.path` | an embedded, crash-safe database on local disk ([`disk`]) | this process |
//! | neither | memory | this process, until it stops (`check` warns) |
//!
//! An upgrade the upstream accepted is written before its answer goes back to the partner: an
//! acknowledged upgrade is a kept one. A write that fails is logged; the override still applies
//! in this process. `tollgate check` reads what is kept through [`check`].

pub mod check;
pub mod disk;
pub mod redis_set;
pub mod sync;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::config::{Cluster, Plan};
use crate::digest::Digest;
use crate::policy::keys::KeyIdx;
use crate::policy::overrides::{Override, Overrides, Upgrade};
use crate::policy::Policy;
use crate::runtime::live::{unix_ms, Forget, LivePolicy};
pub use sync::OverrideSync;

/// Where the overrides are kept.
enum Backend {
    Memory,
    Disk(Arc<redb::Database>),
    Redis(Box<redis_set::RedisSet>),
}

/// Why a change could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    #[error(transparent)]
    Redis(#[from] crate::redis::StoreError),
    #[error("the disk writer stopped: {0}")]
    Task(String),
}

/// Where the overrides are kept, and (with Redis) the version this process last applied.
pub struct PlanOverrides {
    backend: Backend,
    version: Mutex<String>,
}

/// What `check`, the admin API and the page show of one override.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shown {
    pub key: String,
    pub plan: String,
    pub plan_id: u32,
    pub replaced: String,
    pub replaced_plan_id: u32,
    pub partner: Option<String>,
    pub at_ms: u64,
}

impl PlanOverrides {
    /// Overrides kept in memory only (no `state`, no `cluster`; and the tests).
    pub fn memory() -> Self {
        Self::with(Backend::Memory)
    }

    /// Open the store the config names, and what it holds now: Redis with `cluster` (whose
    /// set [`OverrideSync`] reads), else the file at `state.path`, else memory.
    pub fn open(
        cluster: Option<&Cluster>,
        state_path: Option<&Path>,
    ) -> Result<(Self, Overrides), disk::DiskError> {
        if let Some(c) = cluster {
            let backend = Backend::Redis(Box::new(redis_set::RedisSet::new(c)));
            return Ok((Self::with(backend), Overrides::new()));
        }
        let Some(path) = state_path else {
            return Ok((Self::memory(), Overrides::new()));
        };
        let db = disk::open(path)?;
        let set = disk::read_all(&db)?;
        Ok((Self::with(Backend::Disk(Arc::new(db))), set))
    }

    fn with(backend: Backend) -> Self {
        Self {
            backend,
            version: Mutex::new(String::new()),
        }
    }

    fn version(&self) -> String {
        self.version
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_version(&self, v: String) {
        *self.version.lock().unwrap_or_else(|e| e.into_inner()) = v;
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
        live.with_overrides(|set| {
            match &kept {
                Some(o) => set.insert(upgrade.target, o.clone()),
                None => set.remove(&upgrade.target),
            };
        });
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
    async fn keep(&self, digest: &Digest, record: Option<&Override>) -> Result<(), KeepError> {
        match &self.backend {
            Backend::Memory => Ok(()),
            Backend::Disk(db) => {
                let (db, d, r) = (Arc::clone(db), *digest, record.cloned());
                tokio::task::spawn_blocking(move || disk::write(&db, &d, r.as_ref()))
                    .await
                    .map_err(|e| KeepError::Task(e.to_string()))?
                    .map_err(KeepError::from)
            }
            Backend::Redis(r) => Ok(r.write(digest, record).await?),
        }
    }

    /// `DELETE /api/overrides/{name}`: the key back on its YAML plan. Whether it had one.
    pub async fn remove(&self, live: &LivePolicy, name: &str) -> Result<bool, KeepError> {
        let snap = live.load();
        let Some(digest) = snap.policy.clear_override(name) else {
            return Ok(false);
        };
        let had = live.with_overrides(|set| set.remove(&digest).is_some());
        self.keep(&digest, None).await?;
        tracing::info!(target: "tollgate::overrides", key = %name, "plan override removed by the operator");
        Ok(had)
    }

    /// The overrides in force, for the admin API and the page.
    pub fn shown(live: &LivePolicy, policy: &Policy) -> Vec<Shown> {
        live.with_overrides(|set| show(set.values(), &policy.config.plans))
    }

    /// Whether overrides are shared through Redis (and [`OverrideSync`] must run).
    pub fn shared(&self) -> bool {
        matches!(self.backend, Backend::Redis(_))
    }
}

impl Forget for PlanOverrides {
    /// Remove overrides a reload dropped from where they are kept: the disk at once; Redis
    /// through the next poll (a reload is not async): forgetting the version makes it read
    /// the whole set again, apply it to this config, and delete what this config drops.
    fn forget(&self, dropped: Vec<Digest>) {
        match &self.backend {
            Backend::Memory => {}
            Backend::Disk(db) => {
                for d in &dropped {
                    if let Err(e) = disk::write(db, d, None) {
                        tracing::error!(target: "tollgate::overrides", error = %e, "could not forget a dropped override on disk");
                    }
                }
            }
            Backend::Redis(_) => self.set_version(String::new()),
        }
    }
}

/// `records` as shown, sorted by key name; a plan no plan has any more is shown by its id.
fn show<'o>(records: impl Iterator<Item = &'o Override>, plans: &[Plan]) -> Vec<Shown> {
    let name = |id: u32| {
        plans
            .iter()
            .find(|p| p.plan_id == id)
            .map_or_else(|| format!("plan_id {id}"), |p| p.name.clone())
    };
    let mut v: Vec<Shown> = records
        .map(|o| Shown {
            key: o.key.clone(),
            plan: name(o.plan_id),
            plan_id: o.plan_id,
            replaced: name(o.replaced),
            replaced_plan_id: o.replaced,
            partner: o.partner.clone(),
            at_ms: o.at_ms,
        })
        .collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

fn json(o: &Override) -> String {
    serde_json::to_string(o).expect("an override serializes")
}

/// Where `state.path` resolves, for messages.
pub fn describe(path: Option<&PathBuf>) -> String {
    path.map_or_else(|| "memory".into(), |p| p.display().to_string())
}
