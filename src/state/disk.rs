//! Key records on local disk (`state.path`): an embedded, crash-safe [redb] database, one table
//! from a key's digest to its override as JSON.
//!
//! Why redb and not SQLite: the data is a map from a 32-byte digest to a small record; redb is
//! a pure-Rust embedded key-value store (one crate, no C build), ACID and crash-safe by default
//! (copy-on-write B-trees, a commit is durable when it returns), and lets `tollgate check` read
//! the file while a gateway holds it. SQLite (through rusqlite) would bring a C library and SQL
//! for one table of two columns.

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

use crate::digest::Digest;
use crate::policy::overrides::{KeyRecord, KeyRecords};
use crate::policy::versions::{part_of_field, Kept};

pub(super) const TABLE: TableDefinition<'_, &[u8], &[u8]> = TableDefinition::new("plan_overrides");

/// With `cluster`: this replica's copy of the fleet's overrides (`crate::keys::fleet`), field by
/// field as Redis names and holds them (a hash of the digest and the part; the kept text).
pub(super) const FIELDS: TableDefinition<'_, &str, &str> =
    TableDefinition::new("cluster_overrides");

/// With `cluster`: which of the fleet's sets the copy in [`FIELDS`] is of, when it is known to
/// hold every field of that set as of a version: the set's epoch (`epoch`) and version
/// (`version`). Written in the transaction that writes the copy; taken out by a write that
/// cannot say (`crate::keys::fleet`). A restart whose Redis still has that epoch reads what
/// changed since, instead of putting the whole copy back and reading the whole set.
pub(super) const POSITION: TableDefinition<'_, &str, &str> =
    TableDefinition::new("cluster_position");

/// Why the disk store failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiskError {
    #[error("{path}: {source}")]
    Open {
        path: String,
        source: Box<redb::DatabaseError>,
    },
    /// Opened, but a write fails (a full disk, a read-only filesystem).
    #[error("{path}: cannot be written: {message}")]
    Unwritable { path: String, message: String },
    #[error("{0}")]
    Store(Box<dyn std::error::Error + Send + Sync>),
}

fn store(e: impl std::error::Error + Send + Sync + 'static) -> DiskError {
    DiskError::Store(Box::new(e))
}

/// Open (or create) the file at `path` for writing. Several writers: during a zero-downtime
/// upgrade the old and the new process both have it open.
///
/// A file that does not exist yet is created whole or not at all: built beside it
/// (`<name>.new`), its first commit made and synced, then linked into place (a link never
/// replaces a file another process put there meanwhile). A start that fails while creating it
/// (a full disk: redb's header and first pages are 73,728 bytes) leaves no `state.path` that
/// is not a database, and the next start, once the disk has room, creates it.
pub(crate) fn open(path: &Path) -> Result<redb::Database, DiskError> {
    let fail = |e: redb::DatabaseError| DiskError::Open {
        path: path.display().to_string(),
        source: Box::new(e),
    };
    if !path.exists() {
        create_whole(path).map_err(|e| DiskError::Unwritable {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
    }
    builder().create(path).map_err(fail)
}

/// redb's cache of the file's pages: 8 MiB, not redb's default of 1 GiB.
///
/// Every page read goes into that cache and stays there for the process's life, and the file is
/// read whole at a start (every record put back in force) and at each rewrite of the backup: with a
/// million issued keys the default cache held some 500 MB after a start, each page of it copied and
/// its memory zeroed on first touch (some 40 % of a start's `perf` samples); 32 MiB held 33 bytes
/// a key that nothing read again. Past the start, a change writes a few pages and reads the ones
/// on its way, which the kernel's page cache serves as well. Measured with
/// `benches/load/issue.py` on a file of a million keys (docs/keyscale.md, "A start read beside
/// its apply" and "The issued keys' digests in an index of slot numbers"): creates a second the
/// same with 8 MiB, 32 MiB and 1 GiB, and the start as long with 8 MiB as with 32; the start ready
/// in 2.72 and 2.83 s with 32 MiB against 3.94 and 6.2 s with 1 GiB, and 874 bytes resident a key
/// against 1,393; 358–360 bytes with 8 MiB against 394–397 with 32.
const CACHE_BYTES: usize = 8 << 20;

fn builder() -> redb::Builder {
    let mut b = redb::Builder::new();
    b.set_concurrency_mode(redb::ConcurrencyMode::MultiWriter);
    b.set_cache_size(CACHE_BYTES);
    b
}

/// Create the database at `path` through `<name>.new` (see [`open`]).
fn create_whole(path: &Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut new = path.as_os_str().to_owned();
    new.push(".new");
    let new = std::path::PathBuf::from(new);
    // What a start that failed while creating left behind.
    let _ = std::fs::remove_file(&new);
    let built = (|| {
        let db = builder().create(&new)?;
        let txn = db.begin_write()?;
        txn.commit()?;
        drop(db);
        std::fs::File::open(&new)?.sync_all()?;
        match std::fs::hard_link(&new, path) {
            // Another process created it meanwhile: theirs stands.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            r => r?,
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })();
    let _ = std::fs::remove_file(&new);
    built
}

/// Open the file at `path` to read (`tollgate check`, beside a running gateway).
pub(crate) fn open_read_only(path: &Path) -> Result<redb::ReadOnlyDatabase, DiskError> {
    builder().open_read_only(path).map_err(|e| DiskError::Open {
        path: path.display().to_string(),
        source: Box::new(e),
    })
}

/// The table `def` of `db` to read, or `None` when nothing was ever written to it (the
/// overrides' and the ledger's tables alike).
pub(crate) fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    db: &impl ReadableDatabase,
    def: TableDefinition<'_, K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, redb::Error> {
    Ok(table_in(&db.begin_read()?, def)?)
}

/// The table `def` as the read transaction `txn` sees it (`None`: never written to).
pub(super) fn table_in<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<'_, K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, redb::TableError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every override in the file.
pub(crate) fn read_all(db: &impl ReadableDatabase) -> Result<KeyRecords, DiskError> {
    // Gathered, then built in one go: a tree built from its records in order has its nodes
    // full, where one that grows a record at a time leaves them about half full.
    let mut records = Vec::new();
    read_batches(db, |batch| {
        records.extend(batch);
        true
    })?;
    Ok(KeyRecords::from_iter(records))
}

/// How many records the file holds (a row that is not a record included).
pub(crate) fn rows(db: &impl ReadableDatabase) -> Result<usize, DiskError> {
    rows_of(db, TABLE)
}

/// How many fields the copy of the fleet's overrides holds ([`FIELDS`]).
pub(crate) fn field_rows(db: &impl ReadableDatabase) -> Result<usize, DiskError> {
    rows_of(db, FIELDS)
}

/// How many rows the table `def` holds (none when it was never written to).
fn rows_of<K: redb::Key + 'static, V: redb::Value + 'static>(
    db: &impl ReadableDatabase,
    def: TableDefinition<'_, K, V>,
) -> Result<usize, DiskError> {
    let Some(table) = read_table(db, def).map_err(store)? else {
        return Ok(0);
    };
    Ok(table.len().map_err(store)? as usize)
}

/// Records a batch holds in [`read_batches`] (and fields a page in [`read_copy_pages`]).
pub(crate) const BATCH: usize = 4096;

/// Every override in the file, in the order of their digests, handed to `each` in batches of
/// up to [`BATCH`] while it says go on (`true`). A row that is not a record is passed over.
pub(crate) fn read_batches(
    db: &impl ReadableDatabase,
    mut each: impl FnMut(Vec<(Digest, KeyRecord)>) -> bool,
) -> Result<(), DiskError> {
    let Some(table) = read_table(db, TABLE).map_err(store)? else {
        return Ok(());
    };
    let mut batch = Vec::with_capacity(BATCH);
    for row in table.iter().map_err(store)? {
        let (k, v) = row.map_err(store)?;
        let Ok(d) = <[u8; 32]>::try_from(k.value()) else {
            continue;
        };
        if let Ok(o) = serde_json::from_slice::<KeyRecord>(v.value()) {
            batch.push((Digest(d), o));
        }
        if batch.len() == BATCH && !each(std::mem::replace(&mut batch, Vec::with_capacity(BATCH))) {
            return Ok(());
        }
    }
    if !batch.is_empty() {
        each(batch);
    }
    Ok(())
}

/// Write records (or their removal, `None`) in one transaction; durable when it returns
/// (redb's default durability): all of them are kept, or none.
pub(crate) fn write_all(
    db: &redb::Database,
    records: &[(Digest, Option<KeyRecord>)],
) -> Result<(), DiskError> {
    let txn = db.begin_write().map_err(store)?;
    {
        let mut table = txn.open_table(TABLE).map_err(store)?;
        for (d, record) in records {
            match record {
                Some(o) => {
                    table
                        .insert(
                            &d.0[..],
                            serde_json::to_string(o)
                                .expect("an override serializes")
                                .as_bytes(),
                        )
                        .map_err(store)?;
                }
                None => {
                    table.remove(&d.0[..]).map_err(store)?;
                }
            }
        }
    }
    txn.commit().map_err(store)
}

/// The copy of the fleet's overrides kept here (nothing when none was ever written), in the
/// order of their fields, handed to `each` as text (as Redis answers a page: a field's name
/// and its kept text) in pages of up to [`BATCH`] while it says go on (`true`); and which set
/// it is of ([`POSITION`]: its epoch and version, when known), from the same snapshot, so
/// that the copy read holds every field of the version it says (a write of another process
/// between the two, in an upgrade, would otherwise make it say a later one).
pub(crate) fn read_copy_pages(
    db: &impl ReadableDatabase,
    mut each: impl FnMut(Vec<(String, String)>) -> bool,
) -> Result<Option<Position>, DiskError> {
    let txn = db.begin_read().map_err(store)?;
    let at = position_in(&txn)?;
    let Some(table) = table_in(&txn, FIELDS).map_err(store)? else {
        return Ok(at);
    };
    let mut page = Vec::with_capacity(BATCH);
    for row in table.iter().map_err(store)? {
        let (f, v) = row.map_err(store)?;
        page.push((f.value().to_string(), v.value().to_string()));
        if page.len() == BATCH && !each(std::mem::replace(&mut page, Vec::with_capacity(BATCH))) {
            return Ok(at);
        }
    }
    if !page.is_empty() {
        each(page);
    }
    Ok(at)
}

/// The copy's text of each of `fields` (in their order; `None` where it holds none), from one
/// snapshot.
pub(crate) fn read_fields(
    db: &impl ReadableDatabase,
    fields: &[String],
) -> Result<Vec<Option<String>>, DiskError> {
    let txn = db.begin_read().map_err(store)?;
    let Some(table) = table_in(&txn, FIELDS).map_err(store)? else {
        return Ok(vec![None; fields.len()]);
    };
    fields
        .iter()
        .map(|f| {
            Ok(table
                .get(f.as_str())
                .map_err(store)?
                .map(|v| v.value().to_string()))
        })
        .collect()
}

/// Which set the copy is of ([`POSITION`]) as `txn` sees it.
fn position_in(txn: &redb::ReadTransaction) -> Result<Option<Position>, DiskError> {
    let Some(table) = table_in(txn, POSITION).map_err(store)? else {
        return Ok(None);
    };
    let get = |k: &str| -> Result<Option<String>, DiskError> {
        Ok(table.get(k).map_err(store)?.map(|v| v.value().to_string()))
    };
    Ok(match (get("epoch")?, get("version")?) {
        (Some(e), Some(v)) if !e.is_empty() && !v.is_empty() => Some((e, v)),
        _ => None,
    })
}

/// Which set the copy is of: its epoch and version.
pub(crate) type Position = (String, String);

/// Put `fields` in the copy (each in place of what was under its name, unless that is later
/// in the changes' order: [`Kept::replaces`]), and say which set it is of (`at`; `None`: not
/// known), in one transaction.
pub(crate) fn write_fields(
    db: &redb::Database,
    fields: &[(String, Kept)],
    at: Option<&Position>,
) -> Result<(), DiskError> {
    write_copy(db, fields.iter().map(|(f, k)| (f, k)), false, at)
}

/// Make the copy hold `fields` and nothing else (a field given twice: the later), and say
/// which set it is of (`at`), in one transaction.
pub(crate) fn replace_fields<'a>(
    db: &redb::Database,
    fields: impl IntoIterator<Item = (&'a String, &'a Kept)>,
    at: Option<&Position>,
) -> Result<(), DiskError> {
    write_copy(db, fields.into_iter(), true, at)
}

/// `fields` put in the copy (in place of all it held, when `whole`) and [`POSITION`] set to
/// `at`, in one transaction.
fn write_copy<'a>(
    db: &redb::Database,
    fields: impl Iterator<Item = (&'a String, &'a Kept)>,
    whole: bool,
    at: Option<&Position>,
) -> Result<(), DiskError> {
    let txn = db.begin_write().map_err(store)?;
    {
        let mut table = txn.open_table(FIELDS).map_err(store)?;
        if whole {
            table.retain(|_, _| false).map_err(store)?;
        }
        for (f, k) in fields {
            // Two writes of one field that met out of order (the first one's caller went
            // away while it was written) keep the later change, as the store does.
            if !whole {
                let held = table.get(f.as_str()).map_err(store)?;
                let held = held.and_then(|v| Kept::parse(v.value()));
                if let (Some(part), Some(held)) = (part_of_field(f), held) {
                    if held != *k && !k.replaces(part, &held) {
                        continue;
                    }
                }
            }
            table.insert(f.as_str(), k.raw().as_str()).map_err(store)?;
        }
    }
    put_position(&txn, at)?;
    txn.commit().map_err(store)
}

/// [`POSITION`] set to `at`, or taken out.
fn put_position(txn: &redb::WriteTransaction, at: Option<&Position>) -> Result<(), DiskError> {
    let mut table = txn.open_table(POSITION).map_err(store)?;
    match at {
        Some((epoch, version)) => {
            table.insert("epoch", epoch.as_str()).map_err(store)?;
            table.insert("version", version.as_str()).map_err(store)?;
        }
        None => {
            table.retain(|_, _| false).map_err(store)?;
        }
    }
    Ok(())
}

/// Whether opening failed because the file is not a usable database (damaged, or not redb's),
/// rather than because of the disk or another process: such a file is set aside at start.
pub(crate) fn unusable(e: &redb::DatabaseError) -> bool {
    use redb::StorageError as S;
    match e {
        redb::DatabaseError::Storage(S::Corrupted(_)) => true,
        redb::DatabaseError::Storage(S::Io(io)) => io.kind() == std::io::ErrorKind::InvalidData,
        _ => false,
    }
}

/// Move the file at `path` aside, as `<name>.corrupt-<unix seconds>`; where it went.
pub(crate) fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".corrupt-{secs}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// Write one record (or its removal).
#[cfg(test)]
pub(crate) fn write(
    db: &redb::Database,
    d: &Digest,
    record: Option<&KeyRecord>,
) -> Result<(), DiskError> {
    write_all(db, &[(*d, record.cloned())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_store_keeps_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let db = open(&path).unwrap();
        let o = KeyRecord {
            plan_id: Some(2),
            replaced: Some(1),
            partner: Some("p".into()),
            at_ms: 7,
            ..KeyRecord::named("k")
        };
        let d = Digest([3; 32]);
        write(&db, &d, Some(&o)).unwrap();
        write(&db, &Digest([4; 32]), Some(&o)).unwrap();
        write(&db, &Digest([4; 32]), None).unwrap();
        // A second writer beside the first (an upgrade), then a fresh start.
        let other = open(&path).unwrap();
        assert_eq!(read_all(&other).unwrap().len(), 1);
        drop((db, other));
        let db = open(&path).unwrap();
        let set = read_all(&db).unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set.record(&d).unwrap(), o);
    }

    /// The copy says which set it is of when written with a position, and nothing once a
    /// write takes the position out; fields and position change in one transaction.
    #[test]
    fn the_copy_says_which_set_it_is_of_until_a_write_takes_it_out() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir.path().join("state.db")).unwrap();
        let position = |db: &redb::Database| read_copy_pages(db, |_| true).unwrap();
        assert_eq!(position(&db), None, "never written");
        let kept = |v: u64| {
            let digits = crate::policy::versions::VERSION_DIGITS;
            Kept::parse(&format!("{v:0digits$}|{{\"key\":\"k\"}}")).unwrap()
        };
        let one = vec![("f1:k".to_string(), kept(1))];
        let at = |e: &str, v: &str| (e.to_string(), v.to_string());
        write_fields(&db, &one, Some(&at("e1", "7"))).unwrap();
        assert_eq!(position(&db), Some(at("e1", "7")));
        let two = vec![("f2:k".to_string(), kept(2))];
        write_fields(&db, &two, None).unwrap();
        assert_eq!(position(&db), None);
        let mut read = Vec::new();
        read_copy_pages(&db, |page| {
            read.extend(page);
            true
        })
        .unwrap();
        assert_eq!(read.len(), 2);
        let all: crate::policy::versions::Fields = one.into_iter().chain(two).collect();
        replace_fields(&db, &all, Some(&at("e2", "9"))).unwrap();
        assert_eq!(position(&db), Some(at("e2", "9")));
    }

    /// A field written again keeps the later change (a write that comes back out of order
    /// leaves the copy as it was), and is read back by its name.
    #[test]
    fn a_field_written_again_keeps_the_later_change() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(&dir.path().join("state.db")).unwrap();
        let digits = crate::policy::versions::VERSION_DIGITS;
        let kept = |v: u64| Kept::parse(&format!("{v:0digits$}|{{\"key\":\"k\"}}")).unwrap();
        let f = crate::keys::redis_set::part_field(
            &Digest([9; 32]),
            crate::policy::overrides::Part::Suspended,
        );
        let names = [f.clone(), "not-written".to_string()];
        let read = |db: &redb::Database| read_fields(db, &names).unwrap();
        assert_eq!(read(&db), vec![None, None], "never written");
        write_fields(&db, &[(f.clone(), kept(5))], None).unwrap();
        write_fields(&db, &[(f.clone(), kept(3))], None).unwrap();
        assert_eq!(
            read(&db),
            vec![Some(kept(5).raw()), None],
            "the earlier one left out"
        );
        write_fields(&db, &[(f.clone(), kept(8))], None).unwrap();
        assert_eq!(read(&db)[0], Some(kept(8).raw()));
    }
}
