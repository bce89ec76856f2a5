//! The `state.path` file, and what happens when its disk fails.
//!
//! One embedded [redb] database holds what this process keeps on local disk: the overrides
//! ([`disk`]) and the quota and ledger counts ([`crate::ledger`]). Every
//! write goes through [`StateFile::write`] and every read through [`StateFile::read`], which
//! handle the disk's faults:
//!
//! - at start, the file must open and take a write (an empty transaction): a file that cannot
//!   is a setup error naming the path;
//! - a write that fails (a full disk, a read-only filesystem, an I/O error) fails alone: the
//!   caller keeps what it was writing (an operator's change is refused with 503, counts wait
//!   for the next pass), `/readyz` says `degraded`, and one line is logged;
//! - redb latches an I/O error (every later call fails with "Previous I/O error occurred"), so
//!   the file is opened again after each failure; the keeper probes it each second while it
//!   fails ([`StateFile::probe`]), and once a write succeeds everything resumes, without a
//!   restart, and one line says so;
//! - a read that fails fails alone (the caller answers its error) and opens the file again,
//!   but says nothing about writes: only a write marks the disk failing.
//!
//! The file is never left half-written: redb commits copy-on-write with a checksummed header,
//! so a write cut by a full disk or a `SIGKILL` leaves the last commit in force.
//!
//! **A file that is not a usable database** at start (damaged by something else: a disk
//! fault, a copy cut short, another program) does not stop the gateway, nor lose the
//! operator's changes: it is moved aside (`<name>.corrupt-<unix seconds>`, kept for
//! inspection), one `error` line says so, and a new file takes the overrides (and, with
//! `cluster`, the copy of the fleet's) from the backup kept beside it: each change appended to
//! its log (`<name>.backup.log`, [`StateFile::write_kept`]: a change costs what it wrote, not
//! what the file holds), and the log folded into the backup written whole
//! (`<name>.backup.json`) on a thread of its own when it outgrows it
//! ([`backup::rewrite_backup`]: no change waits for that). Quota and ledger counts are not in the
//! backup: with `cluster` they come back from Redis; without, the period's counts start again
//! (the customer's gain). docs/operations.md, "Faults", says what to do.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) mod backup;
mod beside;
pub(crate) mod disk;

pub(crate) use beside::read_beside;

use disk::DiskError;

use crate::sync::Locked;

/// The `state.path` file: the database open on it now, and whether its disk is failing.
pub(crate) struct StateFile {
    path: PathBuf,
    db: Mutex<Arc<redb::Database>>,
    failing: AtomicBool,
    /// Held from a change's commit to its line in the backup's log: the log's lines are in
    /// the order of the commits (two changes to one record replay as they were made).
    logging: Mutex<()>,
    /// The thread rewriting the backup whole, while one runs ([`StateFile::write_kept`]).
    rewrite: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Whether the last rewrite of the backup failed (said once, until one succeeds).
    rewrite_failed: Arc<AtomicBool>,
}

impl StateFile {
    /// Open (or create) the file at `path`, and check that it takes a write. A file that is
    /// not a usable database is moved aside and a new one made from the backup (see the
    /// module's docs).
    pub(crate) fn open(path: &Path) -> Result<Arc<Self>, DiskError> {
        let db = match disk::open(path) {
            Err(DiskError::Open { source, .. }) if disk::unusable(&source) => {
                let aside = disk::set_aside(path).map_err(|e| DiskError::Unwritable {
                    path: path.display().to_string(),
                    message: format!(
                        "not a usable database ({source}), and it could not be moved aside: {e}"
                    ),
                })?;
                let db = disk::open(path)?;
                let restored = backup::restore_backup(&db, path);
                tracing::error!(
                    target: "tollgate::state",
                    path = %path.display(),
                    aside = %aside.display(),
                    error = %source,
                    restored = %restored,
                    "state.path is not a usable database: moved aside, and a new one made from its backup; quota and ledger counts come back from Redis with cluster, else start again"
                );
                db
            }
            r => r?,
        };
        let file = Self {
            path: path.to_path_buf(),
            db: Mutex::new(Arc::new(db)),
            failing: AtomicBool::new(false),
            logging: Mutex::new(()),
            rewrite: Mutex::new(None),
            rewrite_failed: Arc::new(AtomicBool::new(false)),
        };
        file.write(probe).map_err(|e| DiskError::Unwritable {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Arc::new(file))
    }

    /// Whether the last write failed (and none has succeeded since): `/readyz` says
    /// `degraded`.
    pub(crate) fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    fn db(&self) -> Arc<redb::Database> {
        Arc::clone(&self.db.locked())
    }

    /// Read with `f` (blocking: from a blocking thread or the keeper's). When it fails, the
    /// file is opened again for the next call (redb may have latched an I/O error); whether
    /// the disk takes writes is left to the writes to say.
    pub(crate) fn read<T, E>(
        &self,
        f: impl FnOnce(&redb::Database) -> Result<T, E>,
    ) -> Result<T, E> {
        let db = self.db();
        let result = f(&db);
        if result.is_err() {
            drop(db);
            self.reopen();
        }
        result
    }

    /// Write with `f` (blocking: from a blocking thread or the keeper's). When it fails, the
    /// disk is marked failing and the file opened again for the next call; when it succeeds
    /// after failures, writes have resumed.
    pub(crate) fn write<T, E: std::fmt::Display>(
        &self,
        f: impl FnOnce(&redb::Database) -> Result<T, E>,
    ) -> Result<T, E> {
        let db = self.db();
        match f(&db) {
            Ok(v) => {
                if self.failing.swap(false, Ordering::AcqRel) {
                    tracing::info!(target: "tollgate::state", path = %self.path.display(), "state.path takes writes again");
                }
                Ok(v)
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::AcqRel) {
                    tracing::error!(target: "tollgate::state", path = %self.path.display(), error = %e, "state.path cannot be written: admin changes answer 503, counts wait in memory, /readyz says degraded");
                }
                drop(db);
                self.reopen();
                Err(e)
            }
        }
    }

    /// [`StateFile::write`] of an operator's change (the overrides, or the copy of the
    /// fleet's), then the backup beside the file brought up to date with what it wrote
    /// (`delta`, appended to the backup's log: [`backup::log_backup`]): what a start finding the
    /// file unusable makes a new one from. A backup that cannot be written is logged; the
    /// change is kept all the same (the file holds it).
    ///
    /// When the log has outgrown the backup, the backup is written whole again on a thread of
    /// its own ([`backup::rewrite_backup`]), one at a time: the change does not wait for it (at a
    /// million keys it is a few hundred MB), and the changes meanwhile go to a new log.
    pub(crate) fn write_kept<T, E: std::fmt::Display>(
        &self,
        f: impl FnOnce(&redb::Database) -> Result<T, E>,
        delta: backup::Delta<'_>,
    ) -> Result<T, E> {
        let whole = matches!(delta, backup::Delta::Whole);
        let logging = self.logging.locked();
        let v = self.write(f)?;
        if whole {
            // Written whole, the backup is what its snapshot holds: no order to keep, and the
            // changes meanwhile do not wait for it.
            drop(logging);
        }
        match backup::log_backup(&self.db(), &self.path, delta) {
            Ok(backup::Logged::Appended) => {}
            Ok(backup::Logged::Outgrown) => self.rewrite_backup(),
            Err(e) => {
                tracing::warn!(target: "tollgate::state", path = %self.path.display(), error = %e, "the backup of state.path's changes was not written");
            }
        }
        Ok(v)
    }

    /// Rewrite the backup whole on a thread of its own, unless one does already.
    fn rewrite_backup(&self) {
        let mut running = self.rewrite.locked();
        if running.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let (db, path) = (self.db(), self.path.clone());
        let failed = Arc::clone(&self.rewrite_failed);
        let spawned = std::thread::Builder::new()
            .name("tollgate-backup".into())
            .spawn(move || {
                let started = std::time::Instant::now();
                match backup::rewrite_backup(&db, &path, backup::Wait::No) {
                    Ok(true) => {
                        failed.store(false, Ordering::Release);
                        tracing::info!(target: "tollgate::state", path = %path.display(), ms = started.elapsed().as_millis() as u64, "the backup of state.path written whole");
                    }
                    Ok(false) => {}
                    Err(e) if !failed.swap(true, Ordering::AcqRel) => {
                        tracing::warn!(target: "tollgate::state", path = %path.display(), error = %e, "the backup of state.path could not be written whole: its log keeps every change meanwhile, and each change tries again");
                    }
                    Err(e) => {
                        tracing::debug!(target: "tollgate::state", error = %e, "the backup of state.path could not be written whole, again");
                    }
                }
            });
        match spawned {
            Ok(t) => *running = Some(t),
            Err(e) => {
                tracing::warn!(target: "tollgate::state", error = %e, "no thread to write the backup of state.path whole");
            }
        }
    }

    /// Wait for the backup's rewrite under way, if one is.
    #[cfg(test)]
    pub(crate) fn settle_backup(&self) {
        if let Some(t) = self.rewrite.locked().take() {
            t.join().expect("the backup's rewrite does not panic");
        }
    }

    /// A write of nothing, while the disk fails: whether it takes writes again.
    pub(crate) fn probe(&self) {
        if self.is_failing() {
            let _ = self.write(probe);
        }
    }

    /// redb refuses every call after an I/O error: open the file anew (several handles may
    /// be open at once: the old one closes when its last user drops it).
    fn reopen(&self) {
        match disk::open(&self.path) {
            Ok(db) => *self.db.locked() = Arc::new(db),
            Err(e) => {
                tracing::debug!(target: "tollgate::state", error = %e, "state.path could not be opened again yet");
            }
        }
    }
}

/// An empty write transaction, committed (redb writes its header: the disk takes writes).
fn probe(db: &redb::Database) -> Result<(), redb::Error> {
    let txn = db.begin_write()?;
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Digest;
    use crate::policy::overrides::KeyRecord;

    #[test]
    fn a_file_that_is_not_a_database_is_set_aside_and_the_changes_come_back_from_the_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let revoked = KeyRecord {
            revoked: Some(Box::new(crate::policy::overrides::Change {
                since_ms: 7,
                by: "admin".into(),
                reason: None,
            })),
            ..KeyRecord::named("basic-1")
        };
        let file = StateFile::open(&path).unwrap();
        let records = [(Digest([1; 32]), Some(revoked.clone()))];
        file.write_kept(
            |db| disk::write_all(db, &records),
            backup::Delta::KeyRecords(&records),
        )
        .unwrap();
        drop(file);
        // Damaged from outside: garbage of a database's size, then a file cut short.
        for damage in [
            vec![0xAB; 73_728],
            std::fs::read(&path).unwrap()[..4096].to_vec(),
        ] {
            std::fs::write(&path, &damage).unwrap();
            let file = StateFile::open(&path).unwrap();
            let set = file.read(disk::read_all).unwrap();
            assert_eq!(set.record(&Digest([1; 32])), Some(revoked.clone()));
            let aside: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.starts_with("state.db.corrupt-"))
                .collect();
            assert_eq!(aside.len(), 1, "{aside:?}");
            for a in aside {
                let kept = std::fs::read(dir.path().join(&a)).unwrap();
                assert_eq!(kept, damage, "set aside as it was");
                std::fs::remove_file(dir.path().join(a)).unwrap();
            }
        }
    }

    #[test]
    fn a_file_another_process_holds_is_not_set_aside() {
        // Only a damaged file is moved: an error of the disk or a lock is the setup error.
        let e = redb::DatabaseError::DatabaseAlreadyOpen;
        assert!(!disk::unusable(&e));
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no");
        assert!(!disk::unusable(&redb::DatabaseError::Storage(
            redb::StorageError::Io(io)
        )));
    }

    #[test]
    fn the_backup_keeps_each_change_in_its_log_and_a_restore_replays_them_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let record = |name: &str| KeyRecord {
            revoked: Some(Box::new(crate::policy::overrides::Change {
                since_ms: 7,
                by: "admin".into(),
                reason: None,
            })),
            ..KeyRecord::named(name)
        };
        let (a, b, c) = (Digest([1; 32]), Digest([2; 32]), Digest([3; 32]));
        let file = StateFile::open(&path).unwrap();
        let write = |records: Vec<(Digest, Option<KeyRecord>)>| {
            file.write_kept(
                |db| disk::write_all(db, &records),
                backup::Delta::KeyRecords(&records),
            )
            .unwrap();
        };
        write(vec![(a, Some(record("a")))]);
        write(vec![(b, Some(record("b")))]);
        write(vec![(a, None), (c, Some(record("c")))]);
        drop(file);
        // One line a change, and no whole backup yet: a change costs what it wrote.
        let log = std::fs::read_to_string(backup::backup_log_path(&path)).unwrap();
        assert_eq!(log.lines().count(), 3);
        assert!(!backup::backup_path(&path).exists());
        // A crash cut the last line short: it is left out.
        let mut torn = log.clone();
        torn.push_str("{\"overrides\":{\"01");
        std::fs::write(backup::backup_log_path(&path), torn).unwrap();
        std::fs::write(&path, vec![0xAB; 73_728]).unwrap();
        let file = StateFile::open(&path).unwrap();
        let set = file.read(disk::read_all).unwrap();
        assert_eq!(set.len(), 2);
        assert_eq!(set.record(&b), Some(record("b")));
        assert_eq!(set.record(&c), Some(record("c")));
        // The next change after the cut line is kept whole in the log.
        let d = Digest([4; 32]);
        let records = [(d, Some(record("d")))];
        file.write_kept(
            |db| disk::write_all(db, &records),
            backup::Delta::KeyRecords(&records),
        )
        .unwrap();
        drop(file);
        std::fs::write(&path, vec![0xAB; 73_728]).unwrap();
        let file = StateFile::open(&path).unwrap();
        let set = file.read(disk::read_all).unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.record(&d), Some(record("d")));
        // Written whole (the fleet's copy replaced): the log starts again.
        file.write_kept(|_| Ok::<(), DiskError>(()), backup::Delta::Whole)
            .unwrap();
        assert!(backup::backup_path(&path).exists());
        assert!(!backup::backup_log_path(&path).exists());
        assert!(!backup::old_log_path(&path).exists());
    }

    /// A revoked record whose reason is `len` bytes long.
    fn revoked(name: &str, len: usize) -> KeyRecord {
        KeyRecord {
            revoked: Some(Box::new(crate::policy::overrides::Change {
                since_ms: 7,
                by: "admin".into(),
                reason: Some("r".repeat(len)),
            })),
            ..KeyRecord::named(name)
        }
    }

    #[test]
    fn a_change_never_waits_for_the_backup_to_be_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db");
        let file = StateFile::open(&path).unwrap();
        let keep = |d: Digest, o: KeyRecord| {
            let records = [(d, Some(o))];
            file.write_kept(
                |db| disk::write_all(db, &records),
                backup::Delta::KeyRecords(&records),
            )
            .unwrap();
        };
        // Another process (an upgrade's) is writing the backup whole: it holds the lock.
        let other = std::fs::File::create(dir.path().join("state.db.backup.lock")).unwrap();
        other.lock().unwrap();
        // A change whose line alone outgrows the backup: it is logged, and returns; the
        // rewrite it asks for is the other's to do.
        keep(Digest([1; 32]), revoked("big", 1 << 20));
        file.settle_backup();
        assert!(!backup::backup_path(&path).exists());
        assert!(!backup::old_log_path(&path).exists());
        let log = std::fs::read_to_string(backup::backup_log_path(&path)).unwrap();
        assert_eq!(log.lines().count(), 1);
        // Once it lets go, the next change has the backup written whole, away from it: the
        // log taken over, then removed; changes after the rewrite go to a new log.
        drop(other);
        keep(Digest([2; 32]), revoked("small", 8));
        file.settle_backup();
        assert!(backup::backup_path(&path).exists());
        assert!(!backup::old_log_path(&path).exists());
        assert!(!backup::backup_log_path(&path).exists());
        keep(Digest([3; 32]), revoked("after", 8));
        file.settle_backup();
        assert!(backup::backup_log_path(&path).exists());
        let want = file.read(disk::read_all).unwrap();
        drop(file);
        std::fs::write(&path, vec![0xAB; 73_728]).unwrap();
        let file = StateFile::open(&path).unwrap();
        assert_eq!(file.read(disk::read_all).unwrap(), want);
        assert_eq!(want.len(), 3);
    }

    /// A step of what happens to `state.path` and its backup.
    #[derive(Debug, Clone)]
    enum Step {
        /// A change: a record written (or taken out), then its line logged.
        Change(u8, Option<usize>),
        /// The rewrite's next step: rotate, write, remove the old log.
        Rewrite,
        /// A crash in the middle of a rewrite: the next starts from its first step.
        Crash,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u8..5, proptest::option::of(1usize..40)).prop_map(|(d, o)| Step::Change(d, o)),
            3 => Just(Step::Rewrite),
            2 => Just(Step::Crash),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Wherever a rewrite of the backup stops, and whatever changes come between its
        /// steps, a start that finds the file unusable gets back every change kept.
        #[test]
        fn a_backup_cut_short_anywhere_in_its_rewrite_restores_every_change(
            steps in proptest::collection::vec(step(), 1..24),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("state.db");
            let db = disk::open(&path).unwrap();
            let mut next = 0;
            for s in &steps {
                match s {
                    Step::Change(d, o) => {
                        let records = [(Digest([*d; 32]), o.map(|len| revoked("k", len)))];
                        disk::write_all(&db, &records).unwrap();
                        backup::log_backup(&db, &path, backup::Delta::KeyRecords(&records)).unwrap();
                    }
                    Step::Rewrite => {
                        match next {
                            0 => backup::rotate_log(&path).unwrap(),
                            1 => backup::write_backup(&db, &path).unwrap(),
                            _ => backup::remove_old_log(&path).unwrap(),
                        }
                        next = (next + 1) % 3;
                    }
                    Step::Crash => next = 0,
                }
            }
            let want = disk::read_all(&db).unwrap();
            drop(db);
            std::fs::write(&path, vec![0xAB; 73_728]).unwrap();
            let file = StateFile::open(&path).unwrap();
            proptest::prop_assert_eq!(file.read(disk::read_all).unwrap(), want);
        }
    }
}
