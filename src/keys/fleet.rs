//! With `cluster`: the overrides as the fleet keeps them. Redis is where the replicas meet;
//! each replica also keeps a copy of every change it has read or made ([`Fleet`]'s copy,
//! field by field as Redis names them), and puts that copy back whenever it finds the set in
//! Redis emptied or replaced ([`super::sync`]).
//!
//! With `state.path` the copy is kept in that file, and read from it when needed (a change
//! read from the set, a put-back): a million issued keys' fields are not held in memory too.
//! Memory holds only what the file may lack: each field from the moment Redis has it until
//! a write of it to the file holds (a write that fails, on a full disk, leaves it held, and
//! the next write that holds takes every field held). The copy is the file's fields with
//! those over them, each field the later of the two in the changes' order.
//!
//! Without `state.path`, memory holds the copy, but not the text of an issued key's own part
//! (most of a million issued keys' fields) while the set in force makes that text again byte
//! for byte: for such a key the copy holds its digest's first 8 bytes and the part's version
//! ([`Made`]: 16 bytes a key, where the text held was some 220 with its name and its node).
//! A whole read checks each such field as it takes it (the text made from the record put in
//! force at the field's version, compared with the text read: one another build wrote
//! differently stays held); the moment the record under that digest changes in the set (a
//! suspension, a rotation, a delete, a reload that drops it), the text is held first
//! ([`Fleet::before_change`]). The copy is then the fields held, and for each key made, its
//! part made from its record.
//!
//! The copy at `state.path` says which set it is of (the set's epoch and version, written with
//! it by every write, which takes every field held: each commit holds every field of the
//! version it names): a restart whose Redis still holds that epoch reads what changed since
//! it, and neither puts the whole copy back (a million fields merged into Redis) nor reads
//! the whole set.
//!
//! Every change is written with a version from the process's clock ([`Hlc`]), and a part
//! taken out is written as a tombstone, so copies merge by the changes' own order
//! ([`crate::policy::versions`]): a later resume beats an earlier suspension, a revocation is
//! never undone, whichever copy reaches the store first.

use std::sync::{Arc, Mutex};

use super::gather::{self, Gathered};
use super::redis_set::{part_field, Condition, NewPart, RedisSet, Written};
use super::{KeepError, KeyChanges};
use crate::config::Cluster;
use crate::digest::Digest;
use crate::policy::overrides::{KeyRecord, KeyRecords, Part};
use crate::policy::versions::{part_of_field, Fields, Hlc, Kept, Version};
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
    hlc: Hlc,
}

/// What this replica holds of the set.
#[derive(Default)]
struct Copy {
    /// The fields held in memory, as last read or written: every field without `state.path`;
    /// with it, those the file may lack (see the module's docs). Shared with whoever reads
    /// them whole (a put-back, the copy to disk) instead of copied: a million issued keys are
    /// a million fields. A change while one holds it copies it ([`Arc::make_mut`]).
    fields: Arc<Fields>,
    /// Without `state.path`: the issued keys whose own part no field held gives, for the set
    /// in force makes it again (see the module's docs). Shared as `fields` is.
    made: Arc<Made>,
    /// Without `state.path`: the issued parts of the records a reload dropped from the set
    /// in force since the copy was last taken whole ([`Fleet::dropped`]), for a whole read
    /// checked meanwhile to hold as text.
    dropped: Vec<(Digest, KeyRecord)>,
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
                if gathered.count > 0 {
                    return Ok((gathered, at));
                }
                // A copy written before versions: the same records, at version 0, held in
                // memory until the copy is written whole.
                let legacy: Vec<(String, String)> = disk::read_all(db)?
                    .iter()
                    .flat_map(|(d, o)| legacy_fields(d, &o))
                    .collect();
                let n = legacy.len();
                Ok((gather::gather([legacy], n), None))
            })?,
            None => (gather::gather([], 0), None),
        };
        let Gathered {
            fields,
            parts,
            count,
            latest,
            ..
        } = gathered;
        let fields = gather::held(fields);
        let hlc = Hlc::default();
        hlc.observe(latest);
        let opened = (count > 0).then(|| Opened {
            parts,
            fields: count,
            read: started.elapsed(),
        });
        let (epoch, version) = at.unwrap_or_default();
        let fleet = Self {
            set: RedisSet::new(cfg),
            disk,
            copy: Mutex::new(Copy {
                fields: Arc::new(fields),
                made: Arc::default(),
                dropped: Vec::new(),
                version,
                epoch,
            }),
            hlc,
        };
        Ok((fleet, opened))
    }

    /// The fields held in memory, and which set the copy is of (its epoch and version, when
    /// both are known), from one look: the copy at `state.path` is of that set once every
    /// field held is written to it.
    fn held(&self) -> (Arc<Fields>, Option<disk::Position>) {
        let c = self.copy();
        let at = (!c.epoch.is_empty() && !c.version.is_empty())
            .then(|| (c.epoch.clone(), c.version.clone()));
        (Arc::clone(&c.fields), at)
    }

    fn copy(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.copy.locked()
    }

    /// Whether the copy holds no field (in memory, nor at `state.path`; a file that cannot be
    /// read is taken to hold some).
    pub(super) async fn holds_nothing(&self) -> bool {
        {
            let c = self.copy();
            if !c.fields.is_empty() || !c.made.0.is_empty() {
                return false;
            }
        }
        let Some(file) = &self.disk else {
            return true;
        };
        let file = Arc::clone(file);
        let rows = tokio::task::spawn_blocking(move || file.read(disk::field_rows));
        matches!(rows.await, Ok(Ok(0)))
    }

    /// Every field of the copy, with its text as kept, in the order of their names: what a
    /// put-back writes. With `state.path`, read from the file, the fields held in memory over
    /// it; an error when it cannot be read. Without, the fields held and the parts made from
    /// `changes`'s set in force ([`Made`]).
    pub(super) async fn whole(
        &self,
        changes: &Arc<KeyChanges>,
    ) -> Result<Vec<(String, String)>, String> {
        let Some(file) = &self.disk else {
            let made = Arc::clone(&self.copy().made);
            let changes = Arc::clone(changes);
            let rows = tokio::task::spawn_blocking(move || made_rows(&made, &changes))
                .await
                .map_err(|e| e.to_string())?;
            // Looked at after the parts were made: a part held as text meanwhile (a reload
            // dropped its record) is in it.
            let held = Arc::clone(&self.copy().fields);
            let rows = rows
                .into_iter()
                .filter(|(f, _)| !held.contains_key(f))
                .collect();
            return Ok(over(rows, &held));
        };
        let held = Arc::clone(&self.copy().fields);
        let file = Arc::clone(file);
        tokio::task::spawn_blocking(move || {
            let mut rows = Vec::with_capacity(file.read(disk::field_rows)?);
            file.read(|db| {
                disk::read_copy_pages(db, |page| {
                    rows.extend(page);
                    true
                })
            })?;
            Ok(over(rows, &held))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e: DiskError| e.to_string())
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
    /// `version` (the latest version among its fields: `latest`): `fields`, those that name a
    /// part, in the order read (`issued`: which of them are issued keys' own parts, and their
    /// digests). With `state.path`, written there whole, and held in memory only when that
    /// write fails; without, held in memory but for the parts `changes`'s set in force,
    /// already this read's, makes again ([`Made`]). Made on a blocking thread: the sort of a
    /// million names, and the check of a million parts, are a second's work or so.
    pub(super) async fn adopt(
        &self,
        version: String,
        fields: Vec<(String, Kept)>,
        issued: Vec<(usize, Digest)>,
        latest: Version,
        changes: &Arc<KeyChanges>,
    ) {
        self.hlc.observe(latest);
        self.copy().version = version;
        let fields = match self.copy_to_disk(fields).await {
            Ok(()) => {
                let mut c = self.copy();
                c.fields = Arc::default();
                c.made = Arc::default();
                c.dropped.clear();
                return;
            }
            Err(fields) => fields,
        };
        let changes = Arc::clone(changes);
        let made = self.disk.is_none();
        let copy = tokio::task::spawn_blocking(move || {
            if made {
                split_made(fields, &issued, &changes)
            } else {
                (gather::held(fields), Made::default())
            }
        });
        let (mut fields, made) = copy.await.expect("building the copy's tree does not panic");
        let mut c = self.copy();
        // A record a reload dropped while the read was checked may have been found in the
        // set, and its part made: held as text instead (the set no longer makes it).
        for (d, o) in std::mem::take(&mut c.dropped) {
            let f = part_field(&d, Part::Issued);
            if let Some(v) = made.version(&d).filter(|_| !fields.contains_key(&f)) {
                fields.insert(f, Kept::new(v, &o));
            }
        }
        c.fields = Arc::new(fields);
        c.made = Arc::new(made);
    }

    /// A reload drops the record `before` under `d` from `set`, the set in force: its
    /// issued part held as text first when the copy made it ([`Fleet::before_change`]), and
    /// kept aside until the next whole read is taken, which may have checked it against the
    /// set before the drop.
    pub(super) fn dropped(&self, d: &Digest, before: &KeyRecord, set: &KeyRecords) {
        self.before_change(d, set);
        if self.disk.is_none() {
            if let Some(o) = before.only(Part::Issued) {
                self.copy().dropped.push((*d, o));
            }
        }
    }

    /// The record under `d` in `changes`'s set in force is about to change: when the copy
    /// holds no text of its issued part, for the record made it ([`Made`]), that text is
    /// held first, as the record makes it now.
    pub(super) fn before_change(&self, d: &Digest, set: &KeyRecords) {
        let mut c = self.copy();
        let Some(version) = c.made.version(d) else {
            return;
        };
        let f = part_field(d, Part::Issued);
        if c.fields.contains_key(&f) {
            return;
        }
        if let Some(record) = set.slim(d) {
            Arc::make_mut(&mut c.fields).insert(f, Kept::new(version, &record));
        }
    }

    /// The issued part under `d` as the copy has it when it holds no text of it (the set in
    /// force makes it: [`Made`]); `None` when the copy made none under `d`, or the record is
    /// no longer slim (its text is held then: [`Fleet::before_change`]). Asked only when no
    /// text of it is held.
    pub(super) fn made_part(&self, d: &Digest, changes: &KeyChanges) -> Option<KeyRecord> {
        self.copy().made.version(d)?;
        changes.with_records(|set| set.slim(d))
    }

    /// Take the fields a poll found changed since the version this copy is of (the same
    /// epoch: Redis has every change) into the copy, now of `version`, and into the copy at
    /// `state.path` first when there is one: a change in force here holds through a restart
    /// while Redis is down, however soon after the restart comes. The fields that name a
    /// part, parsed.
    pub(super) async fn adopt_delta(
        &self,
        version: String,
        raw: Vec<(String, String)>,
    ) -> Vec<(String, Kept)> {
        let changed = self.parsed(raw);
        self.hold(&changed);
        self.copy().version = version;
        self.write_changed(changed).await
    }

    /// Take fields read from the set (a key's parts, read when a change met another
    /// replica's) into the copy, as [`Fleet::adopt_delta`] does, the version this copy is of
    /// left as it is (the next poll reads them again). The fields that name a part, parsed.
    pub(super) async fn take_fields(&self, raw: Vec<(String, String)>) -> Vec<(String, Kept)> {
        let changed = self.parsed(raw);
        self.hold(&changed);
        self.write_changed(changed).await
    }

    /// The fields of `raw` that name a part, parsed, their versions observed.
    fn parsed(&self, raw: Vec<(String, String)>) -> Vec<(String, Kept)> {
        let changed: Vec<(String, Kept)> = raw
            .into_iter()
            .filter(|(f, _)| part_of_field(f).is_some())
            .filter_map(|(f, v)| Some((f, Kept::parse(&v)?)))
            .collect();
        changed
            .iter()
            .for_each(|(_, k)| self.hlc.observe(k.version));
        changed
    }

    /// `changed`, once what is held is written to `state.path` (or its write failed).
    async fn write_changed(&self, changed: Vec<(String, Kept)>) -> Vec<(String, Kept)> {
        if !self.write_held().await {
            tracing::warn!(target: "tollgate::overrides", "changes read from the cluster store were not copied to state.path (they are held in memory, and written by the next write that holds)");
        }
        changed
    }

    /// Each part this copy holds of each digest whose hash is one of `hashes` (in their
    /// order), as kept, named; `None` when the copy at `state.path` could not be read. An
    /// issued part the set in force makes ([`Made`]) is not among them: [`Fleet::made_part`].
    pub(super) async fn parts_of(&self, hashes: &[&str]) -> Option<Vec<Vec<(Part, Kept)>>> {
        let names: Vec<String> = hashes
            .iter()
            .flat_map(|h| Part::ALL.map(|p| format!("{h}{}", p.suffix())))
            .collect();
        let on_disk = match &self.disk {
            None => vec![None; names.len()],
            Some(file) => {
                let (file, names) = (Arc::clone(file), names.clone());
                tokio::task::spawn_blocking(move || file.read(|db| disk::read_fields(db, &names)))
                    .await
                    .ok()?
                    .ok()?
            }
        };
        let c = self.copy();
        let mut kept = names.iter().zip(on_disk).map(|(f, text)| {
            let on_disk = text.as_deref().and_then(Kept::parse);
            later(f, c.fields.get(f), on_disk.as_ref()).cloned()
        });
        let parts = hashes
            .iter()
            .map(|_| {
                Part::ALL
                    .into_iter()
                    .zip(kept.by_ref().take(Part::ALL.len()))
                    .filter_map(|(p, k)| Some((p, k?)))
                    .collect()
            })
            .collect();
        Some(parts)
    }

    /// Hold `fields` in memory (until they are written to `state.path`: [`Fleet::write_held`]).
    fn hold(&self, fields: &[(String, Kept)]) {
        if fields.is_empty() {
            return;
        }
        let mut c = self.copy();
        let held = Arc::make_mut(&mut c.fields);
        for (f, k) in fields {
            held.insert(f.clone(), k.clone());
        }
    }

    /// `fields` were written to `state.path`: held in memory no more, unless changed since.
    fn let_go(&self, fields: &[(String, Kept)]) {
        let mut c = self.copy();
        if self.disk.is_none() || c.fields.is_empty() {
            return;
        }
        let held = Arc::make_mut(&mut c.fields);
        for (f, k) in fields {
            if held.get(f) == Some(k) {
                held.remove(f);
            }
        }
    }

    /// Write every field held in memory to the copy at `state.path`, if there is one, with
    /// which set the copy is then of, and hold them no more once that holds: whether it held
    /// (or there is no file). Held are the fields just read or kept, and those of writes that
    /// failed before: the first write that holds after a full disk makes the file the whole
    /// copy again.
    ///
    /// Not tried while the file's disk fails (a write of everything held, a million fields
    /// after a whole read, would fail each time, and each change would wait for it): the
    /// keeper's probe says when it takes writes again ([`StateFile::probe`]), and the next
    /// write then takes what was held meanwhile.
    async fn write_held(&self) -> bool {
        let Some(file) = &self.disk else {
            return true;
        };
        if file.is_failing() {
            return false;
        }
        let file = Arc::clone(file);
        let (held, at) = self.held();
        let written: Vec<(String, Kept)> =
            held.iter().map(|(f, k)| (f.clone(), k.clone())).collect();
        drop(held);
        let kept = tokio::task::spawn_blocking(move || {
            let kept = file.write_kept(
                |db| disk::write_fields(db, &written, at.as_ref()),
                backup::Delta::Fields(&written),
            );
            kept.map(|()| written)
        })
        .await;
        match kept {
            Ok(Ok(written)) => {
                self.let_go(&written);
                true
            }
            _ => false,
        }
    }

    /// Keep the parts `changes` name (each digest's record after the change, the part changed
    /// named; a part the record no longer holds is written as a tombstone), at a version
    /// later than any this replica has seen, once `conditions` hold in Redis (else nothing is
    /// written: [`KeepError::Clash`]); held here once Redis has them.
    pub(super) async fn keep(
        &self,
        changes: &[(Digest, Part, KeyRecord)],
        conditions: &[Condition],
    ) -> Result<(), KeepError> {
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
        let kept = match self.set.write(&parts, conditions).await? {
            Written::Kept(kept) => kept,
            Written::Clash { condition, clash } => {
                return Err(KeepError::Clash { condition, clash })
            }
        };
        let written: Vec<(String, Kept)> = parts.into_iter().map(|p| p.field).zip(kept).collect();
        written
            .iter()
            .for_each(|(_, k)| self.hlc.observe(k.version));
        self.hold(&written);
        if !self.write_held().await {
            tracing::warn!(target: "tollgate::overrides", "a change kept in the cluster store was not copied to state.path (it is held in memory, and written by the next write that holds)");
        }
        Ok(())
    }

    /// Keep the copy at `state.path` as `fields` (what the set holds now, in the order
    /// read); `fields` back when they were not written (no file, a disk that fails).
    async fn copy_to_disk(&self, fields: Vec<(String, Kept)>) -> Result<(), Vec<(String, Kept)>> {
        let Some(file) = &self.disk else {
            return Err(fields);
        };
        if file.is_failing() {
            // Held in memory, as after a write that fails ([`Fleet::write_held`]).
            return Err(fields);
        }
        let file = Arc::clone(file);
        // Written whole: what the copy in memory is of, the copy on disk is of too.
        let (_, at) = self.held();
        // In the order of the file's table (its B-tree filled from one end, not all over): a
        // stable sort, so that a field read twice is written the later last.
        let sorted = tokio::task::spawn_blocking(move || {
            let mut fields = fields;
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            fields
        });
        let fields = Arc::new(sorted.await.expect("a sort does not panic"));
        let written = Arc::clone(&fields);
        let kept = tokio::task::spawn_blocking(move || {
            file.write_kept(
                |db| disk::replace_fields(db, written.iter().map(|(f, k)| (f, k)), at.as_ref()),
                backup::Delta::Whole,
            )
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        match kept {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(target: "tollgate::overrides", error = %e, "the copy of the cluster's overrides at state.path was not written (it is held in memory)");
                Err(Arc::try_unwrap(fields).unwrap_or_else(|shared| (*shared).clone()))
            }
        }
    }
}

/// Of the field `f` as held in memory and as read from `state.path`, the later in the
/// changes' order ([`Kept::replaces`]; the one in memory when they are equal).
fn later<'a>(f: &str, held: Option<&'a Kept>, on_disk: Option<&'a Kept>) -> Option<&'a Kept> {
    match (held, on_disk, part_of_field(f)) {
        (Some(h), Some(d), Some(part)) if d.replaces(part, h) => Some(d),
        (Some(h), _, _) => Some(h),
        (None, d, _) => d,
    }
}

/// The copy whole: `rows` (each field's name and text as read from `state.path`) with the
/// fields `held` in memory over them ([`later`]), in the order of their names (the file's
/// order: its table's keys are compared as strings, as a [`Fields`]'s are).
fn over(mut rows: Vec<(String, String)>, held: &Fields) -> Vec<(String, String)> {
    if held.is_empty() {
        return rows;
    }
    rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::with_capacity(rows.len() + held.len());
    let mut mem = held.iter().peekable();
    for (f, text) in rows {
        while let Some((hf, hk)) = mem.next_if(|(hf, _)| hf.as_str() < f.as_str()) {
            out.push((hf.clone(), hk.raw()));
        }
        let text = match mem.next_if(|(hf, _)| **hf == f) {
            Some((_, h)) => {
                let on_disk = Kept::parse(&text);
                match later(&f, Some(h), on_disk.as_ref()) {
                    Some(k) if std::ptr::eq(k, h) => h.raw(),
                    _ => text,
                }
            }
            None => text,
        };
        out.push((f, text));
    }
    out.extend(mem.map(|(f, k)| (f.clone(), k.raw())));
    out
}

/// Steps of a walk of the set in force: its lock is taken for each, not for the walk.
const STEP: usize = 4096;

/// Without `state.path`: the issued keys whose own part the copy holds no text of, because
/// the set in force makes that text again byte for byte (see the module's docs): each by
/// its digest's first 8 bytes, with the part's version, in order. Two digests that share
/// their first 8 bytes are both held as text instead.
#[derive(Default)]
pub(super) struct Made(Vec<(u64, Version)>);

impl Made {
    /// The version of the part made under `d` (or under another digest with its first 8
    /// bytes: never one the set holds, whose parts the copy holds as text).
    fn version(&self, d: &Digest) -> Option<Version> {
        let p = prefix(d);
        let i = self.0.binary_search_by_key(&p, |(q, _)| *q).ok()?;
        Some(self.0[i].1)
    }
}

/// A digest's first 8 bytes, as a number.
fn prefix(d: &Digest) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&d.0[..8]);
    u64::from_le_bytes(first)
}

/// `fields` (read whole, `issued` naming the issued keys' own parts among them, which may be
/// held unnamed) split into the fields the copy holds and the parts `changes`'s set in force
/// makes again: a part is made when the record under its digest, held slim, makes at its
/// version the very text read.
fn split_made(
    mut fields: Vec<(String, Kept)>,
    issued: &[(usize, Digest)],
    changes: &KeyChanges,
) -> (Fields, Made) {
    let mut made: Vec<(u64, Version, usize)> = Vec::with_capacity(issued.len());
    for step in issued.chunks(STEP) {
        let records: Vec<Option<KeyRecord>> =
            changes.with_records(|set| step.iter().map(|(_, d)| set.slim(d)).collect());
        for (&(i, d), record) in step.iter().zip(records) {
            let kept = &fields[i].1;
            if record.is_some_and(|r| Kept::new(kept.version, &r) == *kept) {
                made.push((prefix(&d), kept.version, i));
            }
        }
    }
    made.sort_unstable_by_key(|m| m.0);
    let mut is_made = vec![false; fields.len()];
    let mut only = Vec::with_capacity(made.len());
    for same in made.chunk_by(|a, b| a.0 == b.0) {
        if let [(p, v, i)] = same {
            is_made[*i] = true;
            only.push((*p, *v));
        }
    }
    drop(made);
    // The parts held, gathered unnamed (`gather::Gathered::issued`), named from their digests.
    for &(i, d) in issued {
        if !is_made[i] && fields[i].0.is_empty() {
            fields[i].0 = part_field(&d, Part::Issued);
        }
    }
    let held = fields
        .into_iter()
        .zip(is_made)
        .filter_map(|(f, made)| (!made).then_some(f));
    (gather::held(held.collect()), Made(only))
}

/// The parts `made` names, made from `changes`'s set in force, as kept, in the order of
/// their fields' names.
fn made_rows(made: &Made, changes: &KeyChanges) -> Vec<(String, String)> {
    let mut rows = Vec::with_capacity(made.0.len());
    let mut after = None;
    while !made.0.is_empty() {
        let (slim, last) = changes.with_records(|set| set.slim_after(after.as_ref(), STEP));
        for (d, record) in slim {
            if let Some(v) = made.version(&d) {
                rows.push((part_field(&d, Part::Issued), Kept::raw_of(v, &record)));
            }
        }
        match last {
            Some(last) => after = Some(last),
            None => break,
        }
    }
    rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    rows
}

/// The copy at `state.path`, gathered (its fields left in the file), and which set it is of
/// (one snapshot of the file): its pages read on a thread of their own and each field's
/// record parsed here as they come.
fn read_copy(db: &redb::Database) -> Result<(Gathered, Option<disk::Position>), DiskError> {
    let about = disk::field_rows(db)?;
    let (gathered, at) = crate::state::read_beside(
        |hand| disk::read_copy_pages(db, hand),
        |pages| gather::gather_unheld(pages, about),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::redis_set::part_field;
    use crate::keys::Keeping;
    use crate::policy::overrides::{Change, IssuedKey};
    use crate::runtime::live::LivePolicy;

    fn change() -> Option<Box<Change>> {
        Some(Box::new(Change {
            since_ms: 1,
            by: "admin".into(),
            reason: None,
        }))
    }

    fn suspended(name: &str) -> KeyRecord {
        KeyRecord {
            suspended: change(),
            ..KeyRecord::named(name)
        }
    }

    fn revoked(name: &str) -> KeyRecord {
        KeyRecord {
            revoked: change(),
            ..KeyRecord::named(name)
        }
    }

    /// A replica with `cluster` and no `state.path` (its Redis never reached), the set in
    /// force empty.
    fn without_state_path() -> Arc<KeyChanges> {
        let cluster = Cluster {
            redis_url: "redis://127.0.0.1:1".into(),
            key_prefix: "made".into(),
            sync_interval: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(1),
        };
        let (keeping, _) = Keeping::open(Some(&cluster), None).unwrap();
        let live =
            Arc::new(LivePolicy::new(tollgate_core::testing::config(), Arc::default()).unwrap());
        KeyChanges::new(keeping, live, KeyRecords::new())
    }

    fn fleet_of(changes: &KeyChanges) -> &Fleet {
        changes
            .fleet()
            .expect("a cluster's changes are kept in Redis")
    }

    /// The digest and plain record of the issued key `name`.
    fn plain(name: &str) -> (Digest, KeyRecord) {
        let d = Digest::of(name.as_bytes());
        let record = KeyRecord {
            issued: Some(Box::new(IssuedKey::plain(d, 1, 1_700_000_000_000))),
            ..KeyRecord::named(name)
        };
        (d, record)
    }

    /// The set as Redis holds it: the issued keys `a`, `b`, `c` and `w` (`w`'s text spelt
    /// otherwise, by another build) and a tombstone of `a`'s suspension; in the order of
    /// their names.
    fn read() -> Vec<(String, String)> {
        let mut rows: Vec<(String, String)> = ["a", "b", "c", "w"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let (d, record) = plain(name);
                let raw = Kept::new(1_700_000_000_000_000 + i as u64, &record).raw();
                (part_field(&d, Part::Issued), raw)
            })
            .collect();
        rows[3].1 = rows[3].1.replacen(r#"{"key":"w","#, r#"{ "key":"w","#, 1);
        let tomb = Kept::new(5, &KeyRecord::named("a")).raw();
        rows.push((part_field(&plain("a").0, Part::Suspended), tomb));
        rows.sort_unstable();
        rows
    }

    /// `rows` read whole, as a round takes them: in force, then into the copy, `between`
    /// done before the copy takes them (as a reload may while the read is checked).
    async fn read_whole(
        changes: &Arc<KeyChanges>,
        rows: &[(String, String)],
        between: impl FnOnce(),
    ) {
        let gathered = gather::gather([rows.to_vec()], rows.len());
        let set = gathered.parts.into_set(&changes.live.load().policy);
        assert!(changes.replace_records(set).is_empty());
        between();
        fleet_of(changes)
            .adopt("1".into(), gathered.fields, gathered.issued, 9, changes)
            .await;
    }

    /// Without `state.path`, an issued key's own part whose text the set in force makes again
    /// is not held as text, and the copy whole (what a put-back writes) still gives it byte
    /// for byte; a part whose text another build wrote differently stays held; and a change
    /// to the record (a suspension, the record taken out) holds the text first, as it was
    /// read, so that the copy keeps what Redis has.
    #[tokio::test]
    async fn a_part_the_set_makes_again_is_held_as_a_version_and_put_back_byte_for_byte() {
        let changes = without_state_path();
        let fleet = fleet_of(&changes);
        let rows = read();
        read_whole(&changes, &rows, || {}).await;
        let held: Vec<String> = fleet.copy().fields.keys().cloned().collect();
        let (da, db, dc) = (plain("a").0, plain("b").0, plain("c").0);
        let mut want = vec![
            part_field(&plain("w").0, Part::Issued),
            part_field(&da, Part::Suspended),
        ];
        want.sort_unstable();
        assert_eq!(held, want, "only what the set cannot make again is held");
        assert_eq!(fleet.copy().made.0.len(), 3);
        assert_eq!(fleet.whole(&changes).await.unwrap(), rows, "byte for byte");
        assert!(!fleet.holds_nothing().await);

        // A suspension of `a` put in force, and `b` taken out (as a delete is): their parts
        // as read are held first, and the copy whole is as it was.
        let mut suspended = plain("a").1;
        suspended.suspended = change();
        changes.put_records(&[
            (da, Part::Suspended, suspended),
            (db, Part::Issued, KeyRecord::named("b")),
        ]);
        assert_eq!(fleet.copy().fields.len(), 4, "a's and b's parts held now");
        assert_eq!(fleet.whole(&changes).await.unwrap(), rows, "byte for byte");
        // `c` is still made from the set, as a delta that names it finds it.
        assert_eq!(fleet.made_part(&dc, &changes), Some(plain("c").1));
        assert_eq!(fleet.made_part(&da, &changes), None, "not slim: not made");
    }

    /// A reload that drops a record while a whole read is checked against the set (found
    /// there, its part made) leaves the part held as text once the read is taken: the set
    /// no longer makes it, and the copy keeps what Redis has until the drop is written.
    #[tokio::test]
    async fn a_record_a_reload_drops_while_a_read_is_checked_stays_in_the_copy() {
        let changes = without_state_path();
        let fleet = fleet_of(&changes);
        let rows = read();
        let (dc, c) = plain("c");
        read_whole(&changes, &rows, || {
            // The reload's drop, as `compiled` makes it: told first, the set changed after
            // the read was checked (the check happens in `adopt`: the set still has `c`).
            changes.with_records(|set| fleet.dropped(&dc, &c, set));
        })
        .await;
        changes.with_records_for_a_while(|set| set.remove(&dc));
        assert_eq!(fleet.whole(&changes).await.unwrap(), rows, "c's part kept");
    }

    /// The copy whole is the file's fields with those held in memory over them: each field
    /// once, in the order of names, the later of its two copies (a revocation kept whatever
    /// the versions), the fields of either alone as they are.
    #[test]
    fn the_copy_whole_is_the_files_fields_with_the_held_ones_over_them() {
        let d = |s: &[u8]| Digest::of(s);
        let f = |s: &[u8], p| part_field(&d(s), p);
        let tomb = |name: &str| KeyRecord::named(name);
        let rows: Vec<(String, String)> = [
            // Older on disk than in memory: memory's.
            (f(b"a", Part::Suspended), Kept::new(10, &suspended("a"))),
            // Later on disk than in memory (a write that came back out of order): the file's.
            (f(b"b", Part::Suspended), Kept::new(30, &suspended("b"))),
            // A revocation on disk, a later tombstone in memory: the revocation.
            (f(b"c", Part::Revoked), Kept::new(5, &revoked("c"))),
            // On disk alone.
            (f(b"d", Part::Suspended), Kept::new(7, &suspended("d"))),
        ]
        .into_iter()
        .map(|(f, k)| (f, k.raw()))
        .collect();
        let held: Fields = [
            (f(b"a", Part::Suspended), Kept::new(20, &tomb("a"))),
            (f(b"b", Part::Suspended), Kept::new(25, &tomb("b"))),
            (f(b"c", Part::Revoked), Kept::new(9, &tomb("c"))),
            // In memory alone.
            (f(b"e", Part::Suspended), Kept::new(8, &suspended("e"))),
        ]
        .into_iter()
        .collect();
        let mut shuffled = rows.clone();
        shuffled.reverse();
        let whole = over(shuffled, &held);
        let names: Vec<&str> = whole.iter().map(|(f, _)| f.as_str()).collect();
        let mut want: Vec<&str> = rows
            .iter()
            .map(|(f, _)| f.as_str())
            .chain(held.keys().map(String::as_str))
            .collect();
        want.sort_unstable();
        want.dedup();
        assert_eq!(names, want, "each field once, in order");
        let text = |name: &str| &whole.iter().find(|(f, _)| f == name).unwrap().1;
        let version = |name: &str| Kept::parse(text(name)).unwrap().version;
        assert_eq!(version(&f(b"a", Part::Suspended)), 20);
        assert_eq!(version(&f(b"b", Part::Suspended)), 30);
        assert_eq!(
            version(&f(b"c", Part::Revoked)),
            5,
            "a revocation is never undone"
        );
        assert_eq!(version(&f(b"d", Part::Suspended)), 7);
        assert_eq!(version(&f(b"e", Part::Suspended)), 8);
        // Nothing held: the file's rows as they are.
        assert_eq!(over(rows.clone(), &Fields::new()), rows);
    }
}
