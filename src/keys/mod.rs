//! A key's life while it serves: the keys the gateway issues ([`secret`]), and every change
//! made to a key live (a partner's upgrade, a suspension, a revocation, a live limit or
//! quota, an issue, a rotation, a deletion), kept so that it outlives the process and spread
//! to every replica.
//!
//! [`KeyChanges`] is the room's one owner: it holds where changes are kept, the set of them
//! in force, the lock that makes them one at a time, and the live policy they apply to. A caller names the change
//! ([`KeyChanges::change`], [`KeyChanges::make`], [`KeyChanges::upgraded`]); the owner
//! decides it on the policy in force (the core's `tollgate_core::policy::overrides`), keeps
//! it, then applies it; readers take the live policy's snapshots. The set of records in
//! force is the owner's too (`in_force.rs`): a reload hands it each config it compiles
//! ([`crate::runtime::live::KeyHook`]), and it puts the set on it.
//!
//! | config | where | a change reaches |
//! |---|---|---|
//! | `cluster:` | Redis ([`redis_set`]), and a copy on every replica (`fleet.rs`), put back when Redis is found emptied | every replica within one `sync_interval` ([`sync`]: each polls the version) |
//! | `state.path` | an embedded, crash-safe database on local disk ([`disk`]) | this process |
//! | both | as `cluster:`, and each replica's copy at `state.path` too, put in force at start until Redis answers | as `cluster:` |
//! | neither | memory | this process, until it stops (`check` warns) |
//!
//! An operator's change is kept before it is applied and acknowledged: a store that cannot
//! keep it refuses it, and nothing is applied anywhere. An upgrade or lifecycle operation the
//! upstream accepted is written before its answer goes back to the partner; a write that
//! fails is logged, and the change still applies in this process. `tollgate check` reads what
//! is kept through [`check`].
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`KeyChanges`]: the store opened ([`Keeping`]), a change made (kept, then applied), an upgrade, a partner's lifecycle operation, a removal |
//! | [`secret`] | the secrets of issued keys: their format, and a malformed one told offline |
//! | `in_force.rs` | the set in force: a change put on the policy, a whole read put in its place, each config a reload compiles handed the set ([`crate::runtime::live::KeyHook`]), a start's records |
//! | `keep.rs` | the writes: a change kept before it applies, what a reload dropped forgotten, a key it added read again |
//! | `batch.rs` | the operator's changes made in batches: those that wait while one is kept are kept together ([`KeyChanges::make`]) |
//! | `shown.rs` | what `check`, the admin API and the page show of the upgrades ([`UpgradeRow`]) |
//! | `fleet.rs`, [`redis_set`], `gather.rs`, [`sync`] | with `cluster`: this replica's copy, the set in Redis (and its compact copy), a whole read of it, the poll that spreads it (and writes the compact copy now and then) |
//! | [`check`] | what `tollgate check` reads, read-only |

mod batch;
pub(crate) mod check;
mod fleet;
mod gather;
mod in_force;
mod keep;
pub(crate) mod redis_set;
pub(crate) mod secret;
mod shown;
pub(crate) mod sync;

use std::path::Path;
use std::sync::Arc;

use crate::config::routes::Effect;
use crate::config::Cluster;
use crate::digest::Digest;
use crate::policy::keys::{Found, KeyIdx};
use crate::policy::overrides::{
    Action, ChangeKind, ChangeRefused, KeyRecord, KeyRecords, Part, Upgrade,
};
use crate::policy::Policy;
use crate::runtime::live::{unix_ms, LivePolicy};
use crate::state::disk;
use crate::state::StateFile;
pub(crate) use in_force::put_kept_in_force;
pub(crate) use keep::Records;
use redis_set::Condition;
pub(crate) use shown::UpgradeRow;
pub(crate) use sync::KeySync;

/// Where the changes are kept.
enum Backend {
    Memory,
    Disk(Arc<StateFile>),
    /// Redis, and this replica's copy of what it holds (on disk too with `state.path`, which
    /// a restart puts in force until Redis answers: a revocation holds through a restart while
    /// Redis is down).
    Redis(Box<fleet::Fleet>),
}

/// Why a change could not be kept.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeepError {
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    #[error(transparent)]
    Redis(#[from] crate::fleet_store::StoreError),
    #[error("the disk writer stopped: {0}")]
    Task(String),
    /// The store's error for a batch of changes, told to each of them.
    #[error("{0}")]
    Batch(String),
    /// A condition of the write (its index) did not hold in Redis: nothing was written.
    #[error("refused by the cluster store: {clash}")]
    Clash {
        condition: usize,
        clash: redis_set::Clash,
    },
}

/// Why a change to a key was not made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChangeError {
    /// No key has that name (or that secret).
    #[error("no such key")]
    NotFound,
    /// The change cannot be made to that key.
    #[error(transparent)]
    Refused(#[from] ChangeRefused),
    /// The store could not keep it: nothing was applied.
    #[error("not kept ({0}): nothing was changed")]
    NotKept(#[from] KeepError),
}

/// Which key a change is for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum KeyRef<'a> {
    /// By its name.
    Name(&'a str),
    /// By the digest of its secret (any of its digests in force).
    Digest(&'a Digest),
}

/// The records kept at `state.path` that a start puts in force (none with `cluster`, whose
/// start reads Redis's set, or without `state.path`). Read in batches, so that a start can
/// put each in force while the next is read (`crate::server`).
pub(crate) struct Kept(Option<Arc<StateFile>>);

impl Kept {
    /// How many there are (about: a row that is not a record counts).
    pub(crate) fn rows(&self) -> Result<usize, disk::DiskError> {
        self.0.as_ref().map_or(Ok(0), |f| f.read(disk::rows))
    }

    /// Read them, in the order of their digests, handing `each` a batch at a time while it
    /// says go on (`true`).
    pub(crate) fn read(
        &self,
        each: impl FnMut(Vec<(Digest, KeyRecord)>) -> bool,
    ) -> Result<(), disk::DiskError> {
        self.0
            .as_ref()
            .map_or(Ok(()), |f| f.read(|db| disk::read_batches(db, each)))
    }
}

/// Where a config keeps the changes to keys, opened ([`Keeping::open`]) before the live
/// policy is built, and handed to [`KeyChanges::new`] with it; with `cluster`, what the copy
/// at `state.path` holds, gathered to be put in force then.
pub(crate) struct Keeping(Backend, Option<fleet::Opened>);

impl Keeping {
    /// Changes kept in memory only (no `state`, no `cluster`; and the tests).
    pub(crate) fn memory() -> Self {
        Self(Backend::Memory, None)
    }

    /// Open the store the config names, and what a start puts in force from it: Redis with
    /// `cluster` (whose set [`KeySync`] reads; what this replica's copy holds is put in force
    /// by [`KeyChanges::new`]), else the file at `state.path` (its records, to read:
    /// [`Kept`]), else memory.
    pub(crate) fn open(
        cluster: Option<&Cluster>,
        state_path: Option<&Path>,
    ) -> Result<(Self, Kept), disk::DiskError> {
        let file = state_path.map(StateFile::open).transpose()?;
        if let Some(c) = cluster {
            let (fleet, opened) = fleet::Fleet::open(c, file)?;
            return Ok((Self(Backend::Redis(Box::new(fleet)), opened), Kept(None)));
        }
        match file {
            Some(db) => Ok((Self(Backend::Disk(Arc::clone(&db)), None), Kept(Some(db)))),
            None => Ok((Self::memory(), Kept(None))),
        }
    }
}

/// The one owner of the changes made to keys while they serve: where they are kept, the set
/// in force, the lock that makes them one at a time, and the live policy they apply to.
pub(crate) struct KeyChanges {
    backend: Backend,
    /// The policy in force, to which every change applies (and from which readers take
    /// snapshots).
    live: Arc<LivePolicy>,
    /// The records of the keys' live changes in force (upgrades, suspensions, revocations,
    /// limits, quotas, issued keys), one a digest, put on every config compiled
    /// (`in_force.rs`).
    in_force: std::sync::Mutex<in_force::InForce>,
    /// Changes made here, one at a time (each reads the records in force, keeps the new ones,
    /// then applies them), and (with Redis) the polls of the fleet's set.
    serial: Arc<tokio::sync::Mutex<()>>,
    /// The operator's changes waiting for their batch (`batch.rs`).
    waiting: std::sync::Mutex<Vec<batch::Job>>,
}

impl KeyChanges {
    /// The owner of `live`'s changes, kept by `keeping`, with `in_force` the records already
    /// on it (a start's from `state.path`: [`put_kept_in_force`]). With `cluster`, what this
    /// replica's copy holds (kept at `state.path`) is put in force at once, so that a restart
    /// while Redis is down still refuses what was revoked; what no longer applies to this
    /// config is left to the first read of the set to drop (a whole read, then). Every config
    /// a reload compiles is handed to the owner ([`crate::runtime::live::KeyHook`]), which
    /// puts the set on it.
    pub(crate) fn new(keeping: Keeping, live: Arc<LivePolicy>, in_force: KeyRecords) -> Arc<Self> {
        let this = Arc::new(Self {
            backend: keeping.0,
            live,
            in_force: std::sync::Mutex::new(in_force::InForce::new(in_force)),
            serial: Arc::new(tokio::sync::Mutex::new(())),
            waiting: std::sync::Mutex::new(Vec::new()),
        });
        if let (Backend::Redis(fleet), Some(opened)) = (&this.backend, keeping.1) {
            let started = std::time::Instant::now();
            let set = opened.parts.into_set(&this.live.load().policy);
            let matched = started.elapsed();
            if !this.replace_records(set).is_empty() {
                // What this config drops is dropped by a whole read of the set (every
                // replica drops it then), not by a read of what changed since the copy.
                fleet.forget_version();
            }
            let ms = |d: std::time::Duration| d.as_millis() as u64;
            tracing::info!(
                target: "tollgate::overrides",
                fields = opened.fields,
                read_ms = ms(opened.read),
                match_ms = ms(matched),
                apply_ms = ms(started.elapsed() - matched),
                "the copy of the cluster's overrides kept at state.path put in force"
            );
        }
        this.refresh_gauges();
        let weak: std::sync::Weak<dyn crate::runtime::live::KeyHook> =
            Arc::downgrade(&this) as std::sync::Weak<Self>;
        this.live.hook(weak);
        this
    }

    /// The live policy the changes apply to.
    pub(crate) fn live(&self) -> &Arc<LivePolicy> {
        &self.live
    }

    /// With `cluster`, the fleet's set and this replica's copy of it.
    fn fleet(&self) -> Option<&fleet::Fleet> {
        match &self.backend {
            Backend::Redis(fleet) => Some(fleet),
            Backend::Memory | Backend::Disk(_) => None,
        }
    }

    /// The `state.path` file, when there is one (the quota and ledger counts are kept there
    /// too).
    pub(crate) fn state_file(&self) -> Option<Arc<StateFile>> {
        match &self.backend {
            Backend::Memory => None,
            Backend::Disk(db) => Some(Arc::clone(db)),
            Backend::Redis(fleet) => fleet.disk.clone(),
        }
    }

    /// The upstream accepted `upgrade` from the key `by`, decided on `decided` (the policy of
    /// the request): apply it, keep it, log it. What changed, for the access line (`from->to`
    /// plan names).
    pub(crate) async fn upgraded(
        &self,
        decided: &Policy,
        upgrade: &Upgrade,
        by: KeyIdx,
    ) -> Option<String> {
        let _one = self.serial.lock().await;
        let live = &self.live;
        let (kept, before) = decided.apply_upgrade(upgrade, by, unix_ms())?;
        let from = decided.config.plans[before].name.clone();
        let to = decided.config.plans[upgrade.plan].name.clone();
        let key = decided
            .keys
            .get(upgrade.key.unwrap_or_default())
            .name
            .as_str()
            .to_string();
        let partner = kept.as_ref().and_then(|o| o.partner.clone());
        let mut record = self
            .with_records(|set| set.record(&upgrade.target))
            .unwrap_or_else(|| KeyRecord::named(&key));
        record.clear(Part::Plan);
        if let Some(o) = kept {
            record.merge(o);
        }
        let change = [(upgrade.target, Part::Plan, record)];
        self.put_records(&change);
        let result = self.keep(&change).await;
        live.metrics()
            .admin_change(ChangeKind::Upgrade, result.is_ok());
        if let Err(why) = result {
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

    /// Make `action` on the key `target`, by `by` (`admin`, or `partner:<name>`): keep it
    /// where changes are kept, then apply it here (and, through the store, on every replica).
    /// The key's name.
    ///
    /// An operator's change that cannot be kept is refused and applied nowhere ([`ChangeError::
    /// NotKept`]); a partner's (`apply_unkept`), which the upstream has already accepted, is
    /// applied here all the same, and the failure logged. With `cluster`, a change to an
    /// issued key that another replica rotated or deleted since this one polled is made again
    /// once this replica has read the key (at most twice; a key deleted meanwhile: not found).
    pub(crate) async fn change(
        &self,
        target: KeyRef<'_>,
        action: Action,
        by: &str,
        apply_unkept: bool,
    ) -> Result<String, ChangeError> {
        let _one = self.serial.lock().await;
        let mut catch_ups = 0;
        loop {
            let snap = self.live.load();
            let keys = &snap.policy.keys;
            let k = match target {
                KeyRef::Name(name) => keys.find_by_name(name),
                KeyRef::Digest(d) => match keys.resolve(d) {
                    Some(Found::Key(k)) => Some(k),
                    Some(Found::Alias(a)) => Some(keys.alias(a).key),
                    None => None,
                },
            };
            let Some(k) = k else {
                // Issued by another replica moments ago, and not polled here yet?
                if let (KeyRef::Name(name), 0) = (target, catch_ups) {
                    catch_ups += 1;
                    if sync::look_up(self, name).await {
                        continue;
                    }
                }
                return Err(ChangeError::NotFound);
            };
            let name = keys.get(k).name.as_str().to_string();
            // An issued key's change expects the key as this replica has it (another replica
            // may have rotated, deleted or revoked it since this one polled: docs/cluster.md,
            // "Two replicas at once"); a revocation, whatever revoked it before.
            let (changes, conditions) = self.with_records(|set| {
                let changes = snap.policy.change(k, &action, by, unix_ms(), set)?;
                let revoking = matches!(action, Action::Revoke);
                let conditions: Vec<Condition> = keys
                    .issued_slot(k)
                    .map(|slot| slot.entry.digest)
                    .and_then(|id| {
                        let was = set.get(&id)?.issued.as_ref()?.digest;
                        Some([
                            Some(Condition::Issued { id, was: Some(was) }),
                            (!revoking).then_some(Condition::Unrevoked { id }),
                        ])
                    })
                    .into_iter()
                    .flatten()
                    .flatten()
                    .collect();
                Ok::<_, ChangeError>((changes, conditions))
            })?;
            let kept = self.keep_if(&changes, &conditions).await;
            if let Err(KeepError::Clash { condition, .. }) = &kept {
                let id = *conditions[*condition].id();
                if catch_ups < 2 && sync::catch_up(self, &id).await {
                    catch_ups += 1;
                    continue;
                }
            }
            if let Err(why) = &kept {
                tracing::error!(
                    target: "tollgate::keys",
                    key = %name,
                    action = %action.name(),
                    by = %by,
                    error = %why,
                    "key change not kept"
                );
                if !apply_unkept {
                    return Err(ChangeError::NotKept(kept.unwrap_err()));
                }
            }
            self.put_records(&changes);
            tracing::info!(
                target: "tollgate::keys",
                key = %name,
                action = %action.name(),
                by = %by,
                "key changed"
            );
            return Ok(name);
        }
    }

    /// The upstream accepted a partner's lifecycle operation (`effect`) on the customer key
    /// whose digest is `target`: apply it, keep it (a failure to keep it is logged: the
    /// provider has done it, so the edge does it too), count it. The action, for the access
    /// line; `None` when the key is not one of this config's.
    pub(crate) async fn partner_effect(
        &self,
        effect: Effect,
        target: &Digest,
        by: &str,
    ) -> Option<&'static str> {
        let action = match effect {
            Effect::Suspend => Action::Suspend(None),
            Effect::Resume => Action::Resume,
            Effect::Delete => Action::Revoke,
            Effect::Upgrade => return None,
        };
        let done = self.change(KeyRef::Digest(target), action, by, true).await;
        let kind = ChangeKind::of_effect(effect);
        self.live.metrics().admin_change(kind, done.is_ok());
        match done {
            Ok(_) => Some(kind.as_str()),
            Err(why) => {
                tracing::warn!(target: "tollgate::keys", by = %by, action = %kind.as_str(), error = %why, "partner's change not applied at the edge");
                None
            }
        }
    }

    /// `DELETE /api/overrides/{name}`: the key back on its YAML plan. Whether it had one.
    pub(crate) async fn remove(&self, name: &str) -> Result<bool, KeepError> {
        let _one = self.serial.lock().await;
        let live = &self.live;
        let snap = live.load();
        let Some(k) = snap.policy.keys.find_by_name(name) else {
            return Ok(false);
        };
        let digest = snap.policy.keys.get(k).digest;
        let Some(mut record) = self
            .with_records(|set| set.record(&digest))
            .filter(|o| o.has(Part::Plan))
        else {
            return Ok(false);
        };
        record.clear(Part::Plan);
        let change = [(digest, Part::Plan, record)];
        self.keep(&change).await?;
        self.put_records(&change);
        tracing::info!(target: "tollgate::overrides", key = %name, "plan override removed by the operator");
        Ok(true)
    }

    /// With `cluster`: the key named `name`, if another replica issued it within the last
    /// minute and this one has not polled it yet, read from Redis and put in force (takes the
    /// change lock). Whether this replica has a key of that name after it.
    pub(crate) async fn look_up(&self, name: &str) -> bool {
        if self.fleet().is_none() {
            return false;
        }
        let _one = self.serial.lock().await;
        sync::look_up(self, name).await
    }

    /// Whether overrides are shared through Redis (and [`KeySync`] must run).
    pub(crate) fn shared(&self) -> bool {
        matches!(self.backend, Backend::Redis(..))
    }
}
