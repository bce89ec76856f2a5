//! With `cluster`: the overrides as the fleet keeps them. Redis is where the replicas meet;
//! each replica also holds a copy of every change it has read or made ([`Fleet`]'s copy,
//! field by field as Redis names them, in memory and, with `state.path`, on disk), and puts
//! that copy back whenever it finds the set in Redis emptied or replaced ([`super::sync`]).
//!
//! The copy at `state.path` says which set it is of (the set's epoch and version, written with
//! it), as long as every write of it held: a restart whose Redis still holds that epoch reads
//! what changed since it, and neither puts the whole copy back (a million fields merged into
//! Redis) nor reads the whole set.
//!
//! Every change is written with a version from the process's clock ([`Hlc`]), and a part
//! taken out is written as a tombstone, so copies merge by the changes' own order
//! ([`crate::policy::versions`]): a later resume beats an earlier suspension, a revocation is
//! never undone, whichever copy reaches the store first.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::gather::{self, Gathered};
use super::redis_set::{part_field, NewPart, RedisSet};
use crate::config::Cluster;
use crate::digest::Digest;
use crate::fleet_store::StoreError;
use crate::policy::overrides::{KeyRecord, Part};
use crate::policy::versions::{part_of_field, Fields, Hlc, Kept};
use crate::runtime::live::unix_ms;
use crate::state::backup;
use crate::state::disk::{self, DiskError};
use crate::state::StateFile;
use crate::sync::Locked;

/// The overrides in Redis, and this replica's copy of them.
pub(super) struct Fleet {
    pub(super) set: RedisSet,
    /// The `state.path` file, where the copy is kept too.
    pub(super) disk: Option<Arc<StateFile>>,
    copy: Mutex<Copy>,
    /// Whether the copy at `state.path` holds every field of this copy as of its version:
    /// when it was read with its position, and after each whole write of it; not after a
    /// write of it failed (its position is then taken out at the next write).
    disk_whole: AtomicBool,
    hlc: Hlc,
}

/// What this replica holds of the set.
#[derive(Default)]
struct Copy {
    /// Every field, as last read or written; shared with whoever reads it whole (a start, a
    /// put-back, the copy to disk) instead of copied: a million issued keys are a million
    /// fields. A change while one holds it copies it ([`Arc::make_mut`]).
    fields: Arc<Fields>,
    /// The set's version the copy is of (empty: read the whole set next time).
    version: String,
    /// The set's epoch as last read (empty: none read yet).
    epoch: String,
}

impl Fleet {
    /// The set in Redis, and the copy kept at `state.path` (if any) as this replica's own,
    /// with the records that copy holds, gathered to be put in force ([`Opened`]). The copy's
    /// epoch and version come with it when it says which set it is of.
    pub(super) fn open(
        cfg: &Cluster,
        disk: Option<Arc<StateFile>>,
    ) -> Result<(Self, Option<Opened>), DiskError> {
        let started = std::time::Instant::now();
        let (gathered, at) = match &disk {
            Some(file) => file.read(|db| {
                let (gathered, at) = read_copy(db)?;
                if !gathered.fields.is_empty() {
                    return Ok((gathered, at));
                }
                // A copy written before versions: the same records, at version 0.
                let legacy: Vec<(String, String)> = disk::read_all(db)?
                    .iter()
                    .flat_map(|(d, o)| legacy_fields(d, &o))
                    .collect();
                let n = legacy.len();
                Ok((gather::gather([legacy], n), None))
            })?,
            None => (gather::gather([], 0), None),
        };
        let Gathered { fields, parts } = gathered;
        let hlc = Hlc::default();
        fields.values().for_each(|k| hlc.observe(k.version));
        let opened = (!fields.is_empty()).then(|| Opened {
            parts,
            fields: fields.len(),
            read: started.elapsed(),
        });
        let disk_whole = AtomicBool::new(at.is_some());
        let (epoch, version) = at.unwrap_or_default();
        let fleet = Self {
            set: RedisSet::new(cfg),
            disk,
            copy: Mutex::new(Copy {
                fields: Arc::new(fields),
                version,
                epoch,
            }),
            disk_whole,
            hlc,
        };
        Ok((fleet, opened))
    }

    /// Which set the copy at `state.path` is of, to write with it: the epoch and version this
    /// copy is of, when both are known and the copy on disk holds every field of it.
    fn position(&self) -> Option<disk::Position> {
        let c = self.copy();
        (self.disk_whole.load(Ordering::Acquire) && !c.epoch.is_empty() && !c.version.is_empty())
            .then(|| (c.epoch.clone(), c.version.clone()))
    }

    fn copy(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.copy.locked()
    }

    /// The fields held.
    pub(super) fn fields(&self) -> Arc<Fields> {
        Arc::clone(&self.copy().fields)
    }

    /// The set's version and epoch this copy is of.
    pub(super) fn known(&self) -> (String, String) {
        let c = self.copy();
        (c.version.clone(), c.epoch.clone())
    }

    /// Read the whole set at the next poll (a reload dropped records: apply the set again).
    pub(super) fn forget_version(&self) {
        self.copy().version.clear();
    }

    /// The set's epoch is now `epoch`; read it whole next time.
    pub(super) fn marked(&self, epoch: String) {
        let mut c = self.copy();
        c.epoch = epoch;
        c.version.clear();
    }

    /// Take the set read from Redis (same epoch: Redis has every change) as the copy, at
    /// `version`: the fields that name a part, parsed.
    pub(super) fn adopt(&self, version: String, fields: Fields) {
        fields.values().for_each(|k| self.hlc.observe(k.version));
        let mut c = self.copy();
        c.fields = Arc::new(fields);
        c.version = version;
    }

    /// Take the fields a poll found changed since the version this copy is of (the same
    /// epoch: Redis has every change) into the copy, now of `version`. The fields that name a
    /// part, parsed.
    pub(super) fn adopt_delta(
        &self,
        version: String,
        raw: Vec<(String, String)>,
    ) -> Vec<(String, Kept)> {
        let changed: Vec<(String, Kept)> = raw
            .into_iter()
            .filter(|(f, _)| part_of_field(f).is_some())
            .filter_map(|(f, v)| Some((f, Kept::parse(&v)?)))
            .collect();
        changed
            .iter()
            .for_each(|(_, k)| self.hlc.observe(k.version));
        let mut c = self.copy();
        let fields = Arc::make_mut(&mut c.fields);
        for (f, k) in &changed {
            fields.insert(f.clone(), k.clone());
        }
        c.version = version;
        changed
    }

    /// Each part this copy holds of the digest whose hash is `hash`, as kept.
    pub(super) fn parts_of(&self, hash: &str) -> Vec<Kept> {
        let c = self.copy();
        Part::ALL
            .into_iter()
            .filter_map(|p| c.fields.get(&format!("{hash}{}", p.suffix())).cloned())
            .collect()
    }

    /// Keep `fields` (as Redis has them now) in the copy at `state.path` too.
    pub(super) async fn copy_fields_to_disk(&self, fields: Vec<(String, Kept)>) {
        if !self.write_fields_to_disk(fields).await {
            tracing::warn!(target: "tollgate::overrides", "changes read from the cluster store were not copied to state.path (they are, at the next whole read of the set)");
        }
    }

    /// Write `fields` to the copy at `state.path`, if there is one: whether that held.
    async fn write_fields_to_disk(&self, fields: Vec<(String, Kept)>) -> bool {
        let Some(file) = &self.disk else {
            return true;
        };
        let file = Arc::clone(file);
        let at = self.position();
        let kept = tokio::task::spawn_blocking(move || {
            file.write_kept(
                |db| disk::write_fields(db, &fields, at.as_ref()),
                backup::Delta::Fields(&fields),
            )
        })
        .await;
        let held = matches!(kept, Ok(Ok(())));
        if !held {
            // Fields the copy on disk may lack: it says which set it is of no more.
            self.disk_whole.store(false, Ordering::Release);
        }
        held
    }

    /// Keep the parts `changes` name (each digest's record after the change, the part changed
    /// named; a part the record no longer holds is written as a tombstone), at a version
    /// later than any this replica has seen; held here once Redis has them.
    pub(super) async fn keep(
        &self,
        changes: &[(Digest, Part, KeyRecord)],
    ) -> Result<(), StoreError> {
        let parts: Vec<NewPart> = changes
            .iter()
            .map(|(d, part, o)| {
                let record = o.only(*part).unwrap_or_else(|| KeyRecord::named(&o.key));
                NewPart {
                    field: part_field(d, *part),
                    version: self.hlc.next(unix_ms()),
                    json: serde_json::to_string(&record).expect("a record serializes"),
                }
            })
            .collect();
        let kept = self.set.write(&parts).await?;
        let written: Vec<(String, Kept)> = parts.into_iter().map(|p| p.field).zip(kept).collect();
        {
            let mut c = self.copy();
            let fields = Arc::make_mut(&mut c.fields);
            for (f, k) in &written {
                self.hlc.observe(k.version);
                fields.insert(f.clone(), k.clone());
            }
        }
        if !self.write_fields_to_disk(written).await {
            tracing::warn!(target: "tollgate::overrides", "a change kept in the cluster store was not copied to state.path (it is, at the next read of the set)");
        }
        Ok(())
    }

    /// Keep the copy at `state.path` as `fields` (what the set holds now).
    pub(super) async fn copy_to_disk(&self, fields: Arc<Fields>) {
        let Some(file) = &self.disk else {
            return;
        };
        let file = Arc::clone(file);
        // Written whole: what the copy in memory is of, the copy on disk is of too.
        self.disk_whole.store(true, Ordering::Release);
        let at = self.position();
        let kept = tokio::task::spawn_blocking(move || {
            file.write_kept(
                |db| disk::replace_fields(db, &fields, at.as_ref()),
                backup::Delta::Whole,
            )
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(e) = kept {
            self.disk_whole.store(false, Ordering::Release);
            tracing::warn!(target: "tollgate::overrides", error = %e, "the copy of the cluster's overrides at state.path was not written");
        }
    }
}

/// The copy at `state.path`, gathered, and which set it is of (one snapshot of the file): its
/// pages read on a thread of their own (which packs each field's text) and each field's
/// record parsed here as they come, so that the two threads share the work about evenly.
fn read_copy(db: &redb::Database) -> Result<(Gathered, Option<disk::Position>), DiskError> {
    let about = disk::field_rows(db)?;
    let (gathered, at) = crate::state::read_beside(
        |hand| disk::read_copy_pages(db, |page| hand(gather::packed(page))),
        |pages| gather::gather_packed(pages, about),
    );
    at.map(|at| (gathered, at))
}

/// The records of the copy kept at `state.path`, as a start read them, to put in force
/// ([`super::KeyChanges::new`]).
pub(super) struct Opened {
    pub(super) parts: gather::Parts,
    /// How many fields the copy holds.
    pub(super) fields: usize,
    /// How long they took to read and gather.
    pub(super) read: std::time::Duration,
}

/// The fields of a record kept before versions (each part at version 0, as plain JSON, which
/// is how Redis held it then), as text.
fn legacy_fields(d: &Digest, o: &KeyRecord) -> Vec<(String, String)> {
    Part::ALL
        .into_iter()
        .filter_map(|part| {
            let only = o.only(part)?;
            let json = serde_json::to_string(&only).ok()?;
            Some((part_field(d, part), json))
        })
        .collect()
}
