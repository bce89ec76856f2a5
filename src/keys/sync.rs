//! With `cluster`: every replica polls the overrides' set in Redis each `sync_interval` and,
//! when it moved, puts what changed in force here and takes it into its copy: the fields the
//! log names, or, when the log cannot say, the whole set, read in pages.
//!
//! A set whose epoch is not the one this replica read last (`poll.lua` says so) was emptied
//! or replaced: a Redis restarted without persistence, a failover to a replica that lost it,
//! eviction. It is never read as "no changes": the replica first puts back every field it
//! holds (`fleet.rs`, merged by the changes' own order in `restore.lua`), and only then
//! reads the set, which now holds what every replica that found it so put back. A replica's
//! first poll does the same, so that a restart with a copy at `state.path` puts back what the
//! store may have lost meanwhile.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::fleet::Fleet;
use super::gather::{gather_beside, gather_chunks, gather_page, Gathered};
use super::redis_set::{field, new_epoch, split_field, Condition, Polled};
use super::KeyChanges;
use crate::digest::Digest;
use crate::fleet_store::StoreError;
use crate::policy::overrides::{Dropped, KeyRecord, Part};
use crate::policy::versions::Kept;
use crate::runtime::lifecycle::Health;

/// The sync of the changes kept in Redis (a background service, with `cluster` only): every
/// `every`, this replica's owner of the changes reads what the fleet changed.
pub(crate) struct KeySync {
    pub changes: Arc<KeyChanges>,
    pub every: Duration,
    /// Told when the first read is in force, when the process waits for it to be ready (a
    /// replica that keeps no copy of its own: [`Health::awaiting_first_read`]).
    pub first_read: Option<Arc<Health>>,
    /// The compact copy of the set this replica writes now and then.
    pub copying: Copying,
}

impl KeySync {
    /// One poll: whether the set as Redis holds it is in force here after it (not when the
    /// set was emptied or replaced during the round: the next one reads it).
    async fn round(&self) -> Result<bool, StoreError> {
        let Some(fleet) = self.changes.fleet() else {
            return Ok(true);
        };
        // Serialized with the changes made here: a change is kept and held before a poll
        // reads the set, or after the poll's set is in force.
        let one = Arc::clone(&self.changes.serial).lock_owned().await;
        let live = &self.changes.live;
        let (known, epoch) = fleet.known();
        let (version, about) = match fleet.set.poll(&known, &epoch).await? {
            Polled::Same => {
                self.copy_now_and_then();
                return Ok(true);
            }
            Polled::Delta { version, fields } => {
                take_delta(fleet, &self.changes, version, fields).await;
                self.copy_now_and_then();
                return Ok(true);
            }
            Polled::Whole { version, fields } => (version, fields),
            Polled::Unknown {
                epoch: found,
                fields,
            } => {
                if fields == 0 && fleet.holds_nothing().await {
                    // No set, and nothing to put back: nothing to mark either (a fleet that
                    // never changed a key leaves nothing in Redis).
                    fleet.marked(String::new());
                    return Ok(true);
                }
                if !put_back(fleet, &self.changes, &epoch, &found, fields).await? {
                    return Ok(false);
                }
                let (_, epoch) = fleet.known();
                match fleet.set.poll("", &epoch).await? {
                    Polled::Whole { version, fields } => (version, fields),
                    // Emptied again meanwhile: the next round puts back again.
                    Polled::Same | Polled::Delta { .. } | Polled::Unknown { .. } => {
                        return Ok(false)
                    }
                }
            }
        };
        let (_, epoch) = fleet.known();
        let started = std::time::Instant::now();
        let (from, version, gathered) = match read_compact(fleet, &epoch).await {
            Some((version, gathered)) => ("compact copy", version, gathered),
            None => {
                // The pages parsed on a blocking thread as they come, while the next one is
                // read.
                let fields_about = usize::try_from(about).unwrap_or(0);
                let (pages, gathering) = gather_beside(fields_about, fleet.disk.is_none());
                let held = fleet.set.read_whole(&epoch, about, &pages).await;
                drop(pages);
                if !held? {
                    // Emptied or replaced while it was read: the next round finds it so.
                    return Ok(false);
                }
                let gathered = gathering
                    .await
                    .map_err(|_| StoreError::Malformed("the overrides' parse stopped"))?;
                ("set", version, gathered)
            }
        };
        let Gathered {
            fields,
            issued,
            parts,
            count,
            latest,
        } = gathered;
        let read = started.elapsed();
        // With `state.path`, on disk first, as a delta is: what is in force here holds
        // through a restart while Redis is down, however soon after the read it comes.
        // Without, the copy is made in memory after the set is in force (below).
        let mut in_memory = None;
        if fleet.disk.is_some() {
            fleet
                .adopt(version, fields, issued, latest, &self.changes)
                .await;
        } else {
            in_memory = Some((version, fields, issued));
        }
        let set = parts.into_set(&live.load().policy);
        let matched = started.elapsed();
        let dropped = self.changes.replace_records(set);
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        tracing::info!(
            target: "tollgate::overrides",
            fields = count,
            from,
            read_ms = ms(read),
            match_ms = ms(matched - read),
            apply_ms = ms(started.elapsed() - matched),
            "the cluster store's overrides read whole"
        );
        dropped.iter().for_each(super::in_force::log_drop);
        if let Some((version, fields, issued)) = in_memory {
            if dropped.is_empty() {
                // Made on a task of its own, the lock held until it is (no change or poll
                // reads or writes the copy before): a start that waits for this read is
                // ready meanwhile, not after the sort of a million fields.
                let changes = Arc::clone(&self.changes);
                tokio::spawn(async move {
                    if let Some(fleet) = changes.fleet() {
                        fleet.adopt(version, fields, issued, latest, &changes).await;
                    }
                    drop(one);
                });
                return Ok(true);
            }
            fleet
                .adopt(version, fields, issued, latest, &self.changes)
                .await;
        }
        if !dropped.is_empty() {
            // Each part dropped, kept as taken out (a tombstone), and any part the drop put
            // (a key deleted for a name it lost is revoked): every replica drops it too.
            let gone: Vec<_> = dropped
                .iter()
                .flat_map(|d| {
                    let after = d
                        .after
                        .clone()
                        .unwrap_or_else(|| KeyRecord::named(&d.before.key));
                    let put = Part::ALL
                        .into_iter()
                        .filter(|&p| after.has(p) && !d.before.has(p));
                    d.parts
                        .iter()
                        .copied()
                        .chain(put)
                        .map(|p| (d.digest, p, after.clone()))
                        .collect::<Vec<_>>()
                })
                .collect();
            let _ = fleet.keep(&gone, &[]).await;
            // A name a key lost is claimed again for the key that keeps it (the claim named
            // the loser, or nothing once Redis forgot): a replica that has not polled finds
            // the name taken, and the key through it (docs/cluster.md, "Two replicas at once").
            let keys = &live.load().policy.keys;
            let claims: Vec<Condition> = dropped
                .iter()
                .filter(|d| d.why == Dropped::NameTaken)
                .filter_map(|d| {
                    let k = keys.find_by_name(&d.before.key)?;
                    Some(Condition::Name {
                        name: d.before.key.clone(),
                        id: keys.get(k).digest,
                    })
                })
                .collect();
            if !claims.is_empty() {
                let _ = fleet.keep(&[], &claims).await;
            }
            // Read everything again next time.
            fleet.forget_version();
        }
        Ok(true)
    }
}

/// The set read from its compact copy (`redis_set::compact`) and the fields the log names
/// since the copy's version, read first (their texts now), then each chunk, gathered on two
/// threads, the fields read again left out of the chunks: the set as a whole read now would
/// find it, and the version it is at. `None` when the copy cannot be used (none, of another
/// epoch or format, older than the log covers, a chunk gone or not one, the set's epoch moved,
/// Redis not answering): the set is then read in pages.
async fn read_compact(fleet: &Fleet, epoch: &str) -> Option<(String, Gathered)> {
    let status = fleet.set.compact_status().await.ok()?;
    let h = status.usable(epoch)?;
    let (version, delta) = match fleet.set.poll(&h.version.to_string(), epoch).await.ok()? {
        Polled::Same => (h.version.to_string(), Vec::new()),
        Polled::Delta { version, fields } => (version, fields),
        Polled::Whole { .. } | Polled::Unknown { .. } => return None,
    };
    let issued = fleet.disk.is_none();
    let skip: Arc<HashSet<String>> = Arc::new(delta.iter().map(|(f, _)| f.clone()).collect());
    // No more than the set holds (`usable`): what a header says is not what is made ready for.
    let about = usize::try_from(h.fields).unwrap_or(0) + delta.len();
    let (chunks, gathering) = gather_chunks(about, issued, skip, h.fields, &h.generation);
    // A chunk gone or damaged, or other entries than the header says: the copy is taken out
    // (another is written at the next look). A chunk not read in time is not that.
    let (mut missing, mut timed_out) = (false, false);
    for i in 0..h.chunks {
        match fleet.set.compact_chunk(&h, i).await {
            Ok(Some(chunk)) => {
                if chunks.send((i, chunk)).await.is_err() {
                    // Both threads stopped: a chunk was not one.
                    break;
                }
            }
            Ok(None) => missing = true,
            Err(_) => timed_out = true,
        }
        if missing || timed_out {
            break;
        }
    }
    drop(chunks);
    // Every field the set held when its status was read (but its epoch's) was in it at the
    // copy's version, or was written since and is read again: a copy of fewer (one chunk's
    // bytes under another's name, an older copy's header made to name a later version) is
    // not the set's.
    let whole = |entries: u64, again: u64| {
        (entries + delta.len() as u64).saturating_sub(again) + 1 >= status.fields
    };
    let gathered = gathering
        .await
        .ok()
        .flatten()
        .filter(|(_, entries, again)| {
            !missing && !timed_out && *entries == h.fields && whole(*entries, *again)
        });
    let Some((gathered, _, _)) = gathered else {
        if timed_out {
            tracing::debug!(target: "tollgate::overrides", "the compact copy of the cluster store's overrides not read in time: the set is read in pages");
        } else {
            tracing::warn!(target: "tollgate::overrides", generation = %h.generation, "the compact copy of the cluster store's overrides is damaged (a chunk gone or not one, other fields than its header says, or fewer than the set holds): taken out, the set read in pages");
            let _ = fleet.set.drop_compact(&h).await;
        }
        return None;
    };
    if !fleet.set.has_epoch(epoch).await.ok()? {
        return None;
    }
    let read_again = gather_page(delta, issued);
    Some((version, gathered.merge(read_again)))
}

/// Write the set's compact copy when it wants one (`compact::Status::wants_copy`) and no replica
/// has in the last minute: on a task of its own, off the change lock (the copy reads the set
/// in pages, as a whole read does).
async fn write_copy(fleet: &Fleet) {
    let status = match fleet.set.compact_status().await {
        Ok(s) if s.wants_copy() => s,
        Ok(_) => return,
        Err(why) => {
            tracing::debug!(target: "tollgate::overrides", error = %why, "the compact copy's status not read");
            return;
        }
    };
    if !matches!(fleet.set.claim_compact().await, Ok(true)) {
        return;
    }
    let started = std::time::Instant::now();
    match fleet.set.write_compact(&status).await {
        Ok(Some(h)) => tracing::info!(
            target: "tollgate::overrides",
            fields = h.fields,
            chunks = h.chunks,
            version = %h.version,
            write_ms = started.elapsed().as_millis() as u64,
            "the compact copy of the cluster store's overrides written"
        ),
        Ok(None) => {
            tracing::info!(target: "tollgate::overrides", "the compact copy of the cluster store's overrides not written: the set moved meanwhile (tried again within a minute)")
        }
        Err(why) => {
            tracing::warn!(target: "tollgate::overrides", error = %why, "the compact copy of the cluster store's overrides not written (tried again within a minute)")
        }
    }
}

/// The polls between two looks at whether the compact copy wants writing.
const COPY_EVERY: u32 = 50;

/// Whether this replica is writing the compact copy, and the polls since it last looked.
#[derive(Default)]
pub(crate) struct Copying {
    polls: std::sync::atomic::AtomicU32,
    writing: Arc<std::sync::atomic::AtomicBool>,
}

impl KeySync {
    /// Every [`COPY_EVERY`] polls that found the set in force (the first included), look
    /// whether the compact copy wants writing, and write it ([`write_copy`]), one at a time.
    fn copy_now_and_then(&self) {
        use std::sync::atomic::Ordering;
        if !self
            .copying
            .polls
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(COPY_EVERY)
            || self.copying.writing.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let changes = Arc::clone(&self.changes);
        let writing = Arc::clone(&self.copying.writing);
        tokio::spawn(async move {
            if let Some(fleet) = changes.fleet() {
                write_copy(fleet).await;
            }
            writing.store(false, Ordering::Release);
        });
    }
}

/// With the change lock held (a batch of changes, one of which met a change another replica
/// made meanwhile to the key issued as `id`): read that key's parts from Redis, take them into
/// the copy and put them in force, as a poll would have (the poll that follows reads them
/// again, logged as they are after the version it has). Whether it did: not when Redis does
/// not answer.
pub(super) async fn catch_up(changes: &KeyChanges, id: &Digest) -> bool {
    let Some(fleet) = changes.fleet() else {
        return false;
    };
    read_key(fleet, changes, &field(id)).await
}

/// With the change lock held: the key named `name`, issued by another replica within the
/// last minute and not polled here yet, read from Redis through its name's claim (its parts,
/// one `HMGET`) and put in force, as a poll would. Whether this replica has a key of that
/// name after it. (A change asked of this replica moments after another issued the key finds
/// it, instead of answering 404 until the next poll.)
pub(super) async fn look_up(changes: &KeyChanges, name: &str) -> bool {
    let Some(fleet) = changes.fleet() else {
        return false;
    };
    let Ok(Some(owner)) = fleet.set.claimed_by(name).await else {
        return false;
    };
    let Some((hash, _)) = split_field(&owner) else {
        return false;
    };
    read_key(fleet, changes, hash).await
        && changes.live.load().policy.keys.find_by_name(name).is_some()
}

/// Read every part of the key whose digest hashes to `hash` from Redis (one `HMGET`), take
/// them into the copy and put them in force, as a poll would (the poll that follows reads
/// them again). Whether Redis answered.
async fn read_key(fleet: &Fleet, changes: &KeyChanges, hash: &str) -> bool {
    let names: Vec<String> = Part::ALL
        .iter()
        .map(|p| format!("{hash}{}", p.suffix()))
        .collect();
    let Ok(texts) = fleet.set.read_fields(&names).await else {
        return false;
    };
    let raw = names
        .into_iter()
        .zip(texts)
        .filter_map(|(f, t)| Some((f, t?)))
        .collect();
    let changed = fleet.take_fields(raw).await;
    apply_delta(fleet, changes, &changed).await;
    true
}

/// Take the fields a poll found changed since `version` into the copy (on disk first, with
/// `state.path`), then put them in force.
async fn take_delta(
    fleet: &Fleet,
    changes: &KeyChanges,
    version: String,
    fields: Vec<(String, String)>,
) {
    let changed = fleet.adopt_delta(version, fields).await;
    apply_delta(fleet, changes, &changed).await;
}

/// The set was found with another epoch than `known` (`found`, empty for none, holding
/// `fields` fields): put back what this replica holds, and take the epoch the set has then.
/// Logged once, at `warn`, when the set was emptied or replaced under this replica, or found
/// empty while this replica holds changes. Whether it was put back: not when the copy at
/// `state.path` cannot be read (the epoch is left as it was, and the next poll tries again:
/// a set marked without this replica's copy would undo its changes).
async fn put_back(
    fleet: &Fleet,
    changes: &Arc<KeyChanges>,
    known: &str,
    found: &str,
    fields: u64,
) -> Result<bool, StoreError> {
    let copy = match fleet.whole(changes).await {
        Ok(copy) => copy,
        Err(why) => {
            tracing::warn!(target: "tollgate::overrides", error = %why, "the copy of the cluster's overrides at state.path could not be read: not put back yet (tried again at the next poll)");
            return Ok(false);
        }
    };
    let (epoch, changed) = fleet.set.restore(&copy, &new_epoch()).await?;
    let held = copy.len();
    // Emptied or replaced under this replica (it had read another epoch), or found empty
    // while this replica holds changes (a restart with a copy at `state.path`).
    let lost = !known.is_empty() || (found.is_empty() && fields == 0);
    if lost && held > 0 {
        tracing::warn!(
            target: "tollgate::overrides",
            held,
            put_back = changed,
            "the cluster store's overrides were found emptied or replaced; restored from this replica's copy"
        );
    } else if found.is_empty() && fields > 0 {
        tracing::info!(target: "tollgate::overrides", fields, "the cluster store's overrides had no epoch (an earlier version wrote them); marked");
    } else if changed > 0 {
        tracing::info!(target: "tollgate::overrides", put_back = changed, "changes the cluster store did not have put back from this replica's copy");
    }
    fleet.marked(epoch);
    Ok(true)
}

/// Put in force what a delta changed: for each digest whose parts changed, its record as the
/// copy holds it now (all its parts merged; empty when every part was taken out), under the
/// digest it names. A digest is found from its record: an issued key's record names it; any
/// other names its key, whose digests (in force and `previous`) are hashed to match. The work
/// is the delta's, whatever the number of keys; a record whose digest no key has any more (a
/// revocation of a renamed key's digest) waits for the next whole read of the set, as does
/// the whole delta when the copy at `state.path` cannot be read.
async fn apply_delta(fleet: &Fleet, changes: &KeyChanges, changed: &[(String, Kept)]) {
    let mut hashes: Vec<&str> = changed
        .iter()
        .filter_map(|(f, _)| split_field(f).map(|(h, _)| h))
        .collect();
    hashes.sort_unstable();
    hashes.dedup();
    let Some(each) = fleet.parts_of(&hashes).await else {
        tracing::warn!(target: "tollgate::overrides", "the copy of the cluster's overrides at state.path could not be read: what changed is put in force at the next whole read of the set");
        fleet.forget_version();
        return;
    };
    let snap = changes.live.load();
    let keys = &snap.policy.keys;
    let mut records = Vec::new();
    for (hash, parts) in hashes.into_iter().zip(each) {
        let mut record = KeyRecord::default();
        for o in parts.iter().filter_map(|(_, k)| k.record()) {
            if record.key.is_empty() {
                record.key.clone_from(&o.key);
            }
            if !o.is_empty() {
                record.merge(o);
            }
        }
        let by_name = keys.find_by_name(&record.key).into_iter().flat_map(|k| {
            std::iter::once(keys.get(k).digest).chain(keys.aliases_of(k).map(|a| a.digest))
        });
        let digest = record
            .issued
            .as_ref()
            .map(|i| i.id)
            .into_iter()
            .chain(by_name)
            .find(|d| field(d) == hash);
        if let Some(d) = digest {
            // An issued key's own part the set in force makes (no text held of it): from
            // there, as the copy has it.
            if !parts.iter().any(|(p, _)| *p == Part::Issued) {
                if let Some(o) = fleet.made_part(&d, changes) {
                    record.merge(o);
                }
            }
            let part = changed
                .iter()
                .find_map(|(f, _)| split_field(f).filter(|(h, _)| *h == hash).map(|(_, p)| p))
                .unwrap_or(Part::Plan);
            records.push((d, part, record));
        }
    }
    changes.put_records(&records);
}

#[async_trait]
impl BackgroundService for KeySync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut awaiting = self.first_read.clone();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            let round = self.round().await;
            if let Err(why) = &round {
                tracing::debug!(target: "tollgate::overrides", error = %why, "overrides not read from the cluster store");
            }
            let Some(health) = awaiting.take_if(|_| !matches!(round, Ok(false))) else {
                continue;
            };
            match round {
                Ok(_) => {
                    tracing::info!(target: "tollgate::overrides", "the fleet's key changes are in force: ready once the listener accepts")
                }
                // As when Redis goes down later: serving (degraded), on the YAML alone until
                // the store answers.
                Err(why) => {
                    tracing::warn!(target: "tollgate::overrides", error = %why, "the fleet's key changes could not be read at the start: serving with the YAML's keys alone until the cluster store answers")
                }
            }
            // After the line: whoever sees the replica ready finds it in the log.
            health.first_read_done();
        }
    }
}
