//! The `state.path` file, and what happens when its disk fails.
//!
//! One embedded [redb] database holds what this process keeps on local disk: the overrides
//! ([`crate::overrides::disk`]) and the quota and ledger counts ([`crate::ledger`]). Every
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

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::overrides::disk::{self, DiskError};

/// The `state.path` file: the database open on it now, and whether its disk is failing.
pub struct StateFile {
    path: PathBuf,
    db: Mutex<Arc<redb::Database>>,
    failing: AtomicBool,
}

impl StateFile {
    /// Open (or create) the file at `path`, and check that it takes a write.
    pub fn open(path: &Path) -> Result<Arc<Self>, DiskError> {
        let db = disk::open(path)?;
        let file = Self {
            path: path.to_path_buf(),
            db: Mutex::new(Arc::new(db)),
            failing: AtomicBool::new(false),
        };
        file.write(probe).map_err(|e| DiskError::Unwritable {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Arc::new(file))
    }

    /// Whether the last write failed (and none has succeeded since): `/readyz` says
    /// `degraded`.
    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    fn db(&self) -> Arc<redb::Database> {
        Arc::clone(&self.db.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Read with `f` (blocking: from a blocking thread or the keeper's). When it fails, the
    /// file is opened again for the next call (redb may have latched an I/O error); whether
    /// the disk takes writes is left to the writes to say.
    pub fn read<T, E>(&self, f: impl FnOnce(&redb::Database) -> Result<T, E>) -> Result<T, E> {
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
    pub fn write<T, E: std::fmt::Display>(
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

    /// A write of nothing, while the disk fails: whether it takes writes again.
    pub fn probe(&self) {
        if self.is_failing() {
            let _ = self.write(probe);
        }
    }

    /// redb refuses every call after an I/O error: open the file anew (several handles may
    /// be open at once: the old one closes when its last user drops it).
    fn reopen(&self) {
        match disk::open(&self.path) {
            Ok(db) => *self.db.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(db),
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
