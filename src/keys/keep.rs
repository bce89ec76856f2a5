//! Writing where the overrides are kept: a change before it applies ([`KeyChanges::keep`]),
//! and what a reload dropped or added ([`KeyChanges::forget`], [`KeyChanges::learned_keys`]).

use std::sync::Arc;

use super::redis_set::Condition;
use super::{Backend, KeepError, KeyChanges};
use crate::digest::Digest;
use crate::policy::overrides::{Drop, KeyRecord, Part};
use crate::state::{backup, disk};

/// What a change keeps: each digest's record after it, the part changed named.
pub(crate) type Records = Vec<(Digest, Part, KeyRecord)>;

impl KeyChanges {
    /// Keep the records `changes` name (each digest's whole record, the part changed named)
    /// where overrides are kept; returns when they are, all of them or none.
    pub(super) async fn keep(
        &self,
        changes: &[(Digest, Part, KeyRecord)],
    ) -> Result<(), KeepError> {
        self.keep_if(changes, &[]).await
    }

    /// [`KeyChanges::keep`], once `conditions` hold where the fleet meets (with `cluster`;
    /// one process alone decides every change under its lock, and needs none).
    pub(super) async fn keep_if(
        &self,
        changes: &[(Digest, Part, KeyRecord)],
        conditions: &[Condition],
    ) -> Result<(), KeepError> {
        match &self.backend {
            Backend::Memory => Ok(()),
            Backend::Disk(db) => {
                let db = Arc::clone(db);
                let records: Vec<(Digest, Option<KeyRecord>)> = changes
                    .iter()
                    .map(|(d, _, o)| (*d, (!o.is_empty()).then(|| o.clone())))
                    .collect();
                tokio::task::spawn_blocking(move || {
                    db.write_kept(
                        |db| disk::write_all(db, &records),
                        backup::Delta::KeyRecords(&records),
                    )
                })
                .await
                .map_err(|e| KeepError::Task(e.to_string()))?
                .map_err(KeepError::from)
            }
            // Boxed: the write's future is deep, and every admin route awaits this one.
            Backend::Redis(fleet) => Box::pin(fleet.keep(changes, conditions)).await,
        }
    }
}

/// What a reload tells the store (through [`crate::runtime::live::KeyHook`], `in_force.rs`).
impl KeyChanges {
    /// Rewrite what a reload dropped where it is kept: the disk at once; Redis through the
    /// next poll (a reload is not async): forgetting the version makes it read the whole set
    /// again, apply it to this config, and delete what this config drops.
    pub(super) fn forget(&self, drops: &[Drop]) {
        match &self.backend {
            Backend::Memory => {}
            Backend::Disk(db) => {
                let records: Vec<(Digest, Option<KeyRecord>)> =
                    drops.iter().map(|d| (d.digest, d.after.clone())).collect();
                if let Err(e) = db.write_kept(
                    |db| disk::write_all(db, &records),
                    backup::Delta::KeyRecords(&records),
                ) {
                    tracing::error!(target: "tollgate::overrides", error = %e, "could not forget a dropped override on disk");
                }
            }
            Backend::Redis(fleet) => fleet.forget_version(),
        }
    }

    /// With Redis, the fleet's set is read whole again at the next poll: the records of a key
    /// this replica's YAML lacked were read and could not be matched to a digest then (a
    /// rolling reload: another replica had the key first, and changed it).
    pub(super) fn learned_keys(&self) {
        if let Some(fleet) = self.fleet() {
            fleet.forget_version();
        }
    }
}
