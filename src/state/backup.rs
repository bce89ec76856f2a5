//! The backup beside the `state.path` file: what a new file takes the operator's changes from
//! when the file is found unusable at start ([`restore_backup`]).
//!
//! The backup is written whole (`<name>.backup.json`, [`write_backup`]) and each change after
//! it is appended to its log (`<name>.backup.log`, [`log_backup`]); when the log outgrows the
//! backup, a thread of its own writes the backup whole again ([`rewrite_backup`]), and no
//! change waits for that. The database itself is [`super::disk`]'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable};

use super::disk::{replace_fields, table_in, write_all, FIELDS, TABLE};
use crate::digest::Digest;
use crate::policy::overrides::KeyRecord;
use crate::policy::versions::{Fields, Kept};

/// Where the backup of the file at `path` is: `<name>.backup.json`.
pub(crate) fn backup_path(path: &Path) -> PathBuf {
    let mut b = path.as_os_str().to_owned();
    b.push(".backup.json");
    PathBuf::from(b)
}

/// The backup: the overrides by digest (hex), and the copy of the fleet's by field.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Backup {
    overrides: BTreeMap<String, KeyRecord>,
    fields: BTreeMap<String, String>,
}

/// Every row of `table`, none when it was never written to.
fn rows<'t, K: redb::Key + 'static, V: redb::Value + 'static>(
    table: Option<&'t redb::ReadOnlyTable<K, V>>,
) -> Result<impl Iterator<Item = redb::Result<Row<'t, K, V>>> + 't, redb::StorageError> {
    Ok(table.map(|t| t.iter()).transpose()?.into_iter().flatten())
}

/// A row of a table as redb lends it.
type Row<'t, K, V> = (redb::AccessGuard<'t, K>, redb::AccessGuard<'t, V>);

/// Write the backup of what `db` keeps of the operator's changes beside `path`: whole, from one
/// read transaction (a snapshot: changes go on meanwhile), record by record (no copy of the
/// set in memory), under a temporary name synced to disk, then renamed over the last one and
/// the directory synced.
pub(crate) fn write_backup(
    db: &redb::Database,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use std::io::Write;
    let to = backup_path(path);
    let mut tmp = to.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    let txn = db.begin_read()?;
    let (overrides, fields) = (table_in(&txn, TABLE)?, table_in(&txn, FIELDS)?);
    let file = std::fs::File::create(&tmp)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    out.write_all(b"{\"overrides\":{")?;
    let mut first = true;
    for row in rows(overrides.as_ref())? {
        let (k, v) = row?;
        let (Ok(d), Ok(o)) = (
            <[u8; 32]>::try_from(k.value()),
            serde_json::from_slice::<KeyRecord>(v.value()),
        ) else {
            continue;
        };
        out.write_all(if first { b"\"" } else { b",\"" })?;
        first = false;
        out.write_all(Digest(d).to_hex().as_bytes())?;
        out.write_all(b"\":")?;
        serde_json::to_writer(&mut out, &o)?;
    }
    out.write_all(b"},\"fields\":{")?;
    let mut first = true;
    for row in rows(fields.as_ref())? {
        let (f, v) = row?;
        if !first {
            out.write_all(b",")?;
        }
        first = false;
        serde_json::to_writer(&mut out, f.value())?;
        out.write_all(b":")?;
        serde_json::to_writer(&mut out, v.value())?;
    }
    out.write_all(b"}}")?;
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, &to)?;
    sync_dir(path)?;
    Ok(())
}

/// Sync the directory of `path` (a rename or a removal in it kept).
fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => std::fs::File::open(".")?.sync_all(),
    }
}

/// Where the changes since the backup was last written whole go: `<name>.backup.log`, one
/// JSON line each (a [`Backup`] of what the change wrote; `null` for a record taken out).
pub(crate) fn backup_log_path(path: &Path) -> PathBuf {
    let mut b = path.as_os_str().to_owned();
    b.push(".backup.log");
    PathBuf::from(b)
}

/// What a change wrote, for the backup's log.
pub(crate) enum Delta<'a> {
    /// Records written (or taken out: `None`).
    KeyRecords(&'a [(Digest, Option<KeyRecord>)]),
    /// Fields of the fleet's copy written.
    Fields(&'a [(String, Kept)]),
    /// The fleet's copy replaced whole: the backup is written whole.
    Whole,
}

/// One line of the backup's log: what a change wrote (`None`: taken out).
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Line {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    overrides: BTreeMap<String, Option<KeyRecord>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    fields: BTreeMap<String, String>,
}

/// Where the log a rewrite of the backup took over is while it runs: `<name>.backup.log.old`
/// (see [`rewrite_backup`]).
pub(crate) fn old_log_path(path: &Path) -> PathBuf {
    let mut b = backup_log_path(path).into_os_string();
    b.push(".old");
    PathBuf::from(b)
}

/// Held (an advisory lock, `flock`) while the backup is rewritten: `<name>.backup.lock`. One
/// rewrite at a time, among this process's threads and the processes of an upgrade alike; a
/// process that dies lets go of it.
fn rewrite_lock_path(path: &Path) -> PathBuf {
    let mut b = path.as_os_str().to_owned();
    b.push(".backup.lock");
    PathBuf::from(b)
}

/// Whether the backup's log has grown past the backup (and at least 1 MiB): time to write the
/// backup whole again ([`rewrite_backup`]), away from the change that says so.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Logged {
    Appended,
    Outgrown,
}

/// Bring the backup beside `path` up to date with `delta`, which `db` holds already: one
/// line appended to its log, synced. A change costs what it wrote, never the whole backup:
/// when the log has outgrown the backup, this says so and the caller has it rewritten in the
/// background ([`rewrite_backup`]); only [`Delta::Whole`] (which a log line cannot say)
/// rewrites it here, waiting for a rewrite under way.
pub(crate) fn log_backup(
    db: &redb::Database,
    path: &Path,
    delta: Delta<'_>,
) -> Result<Logged, Box<dyn std::error::Error + Send + Sync>> {
    let log = backup_log_path(path);
    let line = match delta {
        Delta::Whole => {
            rewrite_backup(db, path, Wait::Yes)?;
            return Ok(Logged::Appended);
        }
        Delta::KeyRecords(records) => Line {
            overrides: records
                .iter()
                .map(|(d, o)| (d.to_hex(), o.clone()))
                .collect(),
            ..Line::default()
        },
        Delta::Fields(fields) => Line {
            fields: fields.iter().map(|(f, k)| (f.clone(), k.raw())).collect(),
            ..Line::default()
        },
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(&log)?;
    // A line a crash cut short ends where this one starts: it is ended first, so that only it
    // is left out of a replay.
    let len = file.metadata()?.len();
    let mut last = [b'\n'];
    if len > 0 {
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut last, len - 1)?;
    }
    let mut text = if last[0] == b'\n' {
        Vec::new()
    } else {
        vec![b'\n']
    };
    serde_json::to_writer(&mut text, &line)?;
    text.push(b'\n');
    std::io::Write::write_all(&mut file, &text)?;
    file.sync_data()?;
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    Ok(
        if len + text.len() as u64 > size(&backup_path(path)).max(1 << 20) {
            Logged::Outgrown
        } else {
            Logged::Appended
        },
    )
}

/// Whether [`rewrite_backup`] waits for a rewrite under way (in this process or another).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    Yes,
    No,
}

/// Write the backup beside `path` whole again, and start its log anew; `false` when another
/// rewrite was under way and `wait` is [`Wait::No`] (that one does the work).
///
/// The steps, and why a crash between any two loses nothing: a start replays the backup, then
/// the old log, then the log ([`restore_backup`]), and a line only ever sets a record to what
/// the change wrote, so a line replayed onto a backup that already holds its change (or a
/// later one) changes nothing that the lines after it do not set again.
/// 1. The log is renamed to the old log (not when an old log is there already: a rewrite cut
///    short left it, and it stays the one taken over). Changes go on, into a new log.
/// 2. The backup is written from a snapshot taken after the rename. Every line of the old log
///    was appended after its change was committed, so the snapshot holds all of them (a line
///    that a change appended to the old log through a file it opened before the rename too).
/// 3. Once the new backup is synced in place, the old log is removed.
pub(crate) fn rewrite_backup(
    db: &redb::Database,
    path: &Path,
    wait: Wait,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(rewrite_lock_path(path))?;
    match wait {
        Wait::Yes => lock.lock()?,
        Wait::No => match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(false),
            Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
        },
    }
    rotate_log(path)?;
    write_backup(db, path)?;
    remove_old_log(path)?;
    // Let go when `lock` closes.
    Ok(true)
}

/// Step 1 of [`rewrite_backup`]: the log becomes the old log, unless an old log is there.
pub(crate) fn rotate_log(path: &Path) -> std::io::Result<()> {
    let old = old_log_path(path);
    if old.exists() {
        return Ok(());
    }
    match std::fs::rename(backup_log_path(path), &old) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r?,
    }
    sync_dir(path)
}

/// Step 3 of [`rewrite_backup`]: the old log removed, the backup holding what it held.
pub(crate) fn remove_old_log(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(old_log_path(path)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r.and_then(|()| sync_dir(path)),
    }
}

/// Put the backup beside `path` into `db` (a new file, after the old one was set aside): the
/// backup written whole, then each change the old log of a rewrite cut short holds, then each
/// change the log holds, in order (a last line a crash cut short is left out); what was
/// restored, in words, for the log line.
pub(crate) fn restore_backup(db: &redb::Database, path: &Path) -> String {
    let from = backup_path(path);
    let mut backup: Backup = match std::fs::read(&from) {
        Ok(text) => match serde_json::from_slice(&text) {
            Ok(b) => b,
            Err(e) => {
                return format!(
                    "nothing: the backup at {} does not read ({e})",
                    from.display()
                )
            }
        },
        Err(_) => Backup::default(),
    };
    let mut replayed = 0;
    let logs = [old_log_path(path), backup_log_path(path)]
        .map(|log| std::fs::read(log).unwrap_or_default());
    let lines = logs
        .iter()
        .flat_map(|log| log.split(|&b| b == b'\n'))
        .filter(|l| !l.is_empty());
    for line in lines {
        let Ok(change) = serde_json::from_slice::<Line>(line) else {
            continue;
        };
        for (d, o) in change.overrides {
            match o {
                Some(o) => backup.overrides.insert(d, o),
                None => backup.overrides.remove(&d),
            };
        }
        backup.fields.extend(change.fields);
        replayed += 1;
    }
    if backup.overrides.is_empty() && backup.fields.is_empty() && replayed == 0 {
        return format!("nothing: no backup at {}", from.display());
    }
    let records: Vec<(Digest, Option<KeyRecord>)> = backup
        .overrides
        .into_iter()
        .filter_map(|(d, o)| Some((Digest::from_hex(&d)?, Some(o))))
        .collect();
    let fields: Fields = backup
        .fields
        .into_iter()
        .filter_map(|(f, raw)| Some((f, Kept::parse(&raw)?)))
        .collect();
    // Which set the copy is of is not in the backup: a restart reads the fleet's whole.
    let written = write_all(db, &records).and_then(|()| replace_fields(db, &fields, None));
    match written {
        Ok(()) => format!(
            "{} overrides and {} fields of the fleet's copy from {}",
            records.len(),
            fields.len(),
            from.display()
        ),
        Err(e) => format!(
            "nothing: the backup at {} could not be written ({e})",
            from.display()
        ),
    }
}
