//! The operator's changes to keys made in batches ([`KeyChanges::make`]): the changes that
//! wait while one is kept are kept together, in one write (one disk commit, one Redis script),
//! so that a store whose write is slow (`state.path`: an fsync) takes as many changes a second
//! as come, not one a write.
//!
//! Whoever takes the change lock first makes every change waiting (its own and others'), in
//! order, each against the records in force plus the batch's earlier ones (put in the set for
//! the time of the computation alone, and taken out before its lock is let go: no reader sees
//! a change not kept). The batch is kept, then applied in order, then each waiter is answered.
//! A batch that cannot be kept is refused whole, and applied nowhere. A change whose turn came
//! in an earlier batch is answered by it, whoever holds the lock then.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::keep::Records;
use super::{ChangeError, KeepError, KeyChanges};
use crate::fleet_store::StoreError;
use crate::policy::overrides::{ChangeKind, ChangeRefused, KeyRecords, Part};
use crate::policy::Policy;
use crate::sync::Locked;

/// What a change is made of: the policy and the records in force (the batch's earlier ones
/// included) to what to keep.
pub(crate) type Make = Box<dyn FnOnce(&Policy, &KeyRecords) -> Result<Records, ChangeError> + Send>;

/// A change waiting for its batch.
pub(super) struct Job {
    kind: ChangeKind,
    name: String,
    make: Make,
    done: oneshot::Sender<Result<(), ChangeError>>,
}

impl KeyChanges {
    /// An operator's change of `kind` (`create`, `rotate`, `delete`) to the key named `name`:
    /// `make` turns the policy and the records in force into what to keep; it is kept, then
    /// applied here (and, through the store, on every replica), with the changes that came
    /// meanwhile. One that cannot be kept is applied nowhere.
    pub(crate) async fn make(
        self: &Arc<Self>,
        kind: ChangeKind,
        name: &str,
        make: Make,
    ) -> Result<(), ChangeError> {
        let (done, mut answer) = oneshot::channel();
        self.waiting.locked().push(Job {
            kind,
            name: name.to_string(),
            make,
            done,
        });
        // The answer may come from the batch of whoever holds the lock now: waited for beside
        // the lock, not behind it (behind it, it would wait for the next batch's write too).
        let one = tokio::select! {
            biased;
            made = &mut answer => return made.unwrap_or_else(|_| Err(lost())),
            one = Arc::clone(&self.serial).lock_owned() => one,
        };
        if let Ok(made) = answer.try_recv() {
            return made;
        }
        // On a task of its own: a batch is made, kept, applied and answered whole even when
        // this request goes away meanwhile (the others in it wait on it too).
        let jobs = std::mem::take(&mut *self.waiting.locked());
        let this = Arc::clone(self);
        let batch = tokio::spawn(async move {
            this.make_batch(jobs).await;
            drop(one);
        });
        let _ = batch.await;
        answer.await.unwrap_or_else(|_| Err(lost()))
    }

    /// Make, keep and apply `jobs`, in order; answer each.
    async fn make_batch(&self, jobs: Vec<Job>) {
        let live = &self.live;
        let snap = live.load();
        let mut made: Vec<(Job, Records)> = Vec::with_capacity(jobs.len());
        let mut refused: Vec<(Job, ChangeError)> = Vec::new();
        self.with_records_for_a_while(|set| {
            // Each job sees the batch's earlier changes; the set is put back as it was after.
            let mut saved = Vec::new();
            let mut created: HashSet<String> = HashSet::new();
            for mut job in jobs {
                let make = std::mem::replace(&mut job.make, Box::new(|_, _| Ok(Vec::new())));
                match make(&snap.policy, set) {
                    Ok(records) => {
                        let new_names: Vec<&str> = records
                            .iter()
                            .filter(|(d, p, o)| {
                                *p == Part::Issued && o.issued.is_some() && !set.contains_key(d)
                            })
                            .map(|(_, _, o)| o.key.as_str())
                            .collect();
                        if new_names.iter().any(|n| created.contains(*n)) {
                            refused.push((job, ChangeRefused::KeyExists("name").into()));
                            continue;
                        }
                        created.extend(new_names.into_iter().map(String::from));
                        for (d, _, o) in &records {
                            saved.push((*d, set.insert(*d, o.clone())));
                        }
                        made.push((job, records));
                    }
                    Err(e) => refused.push((job, e)),
                }
            }
            for (d, before) in saved.into_iter().rev() {
                match before {
                    Some(o) => set.insert(d, o),
                    None => set.remove(&d),
                };
            }
        });
        for (job, e) in refused {
            let _ = job.done.send(Err(e));
        }
        if made.is_empty() {
            return;
        }
        let all: Records = made.iter().flat_map(|(_, r)| r.iter().cloned()).collect();
        match self.keep(&all).await {
            Ok(()) => {
                self.put_records(&all);
                for (job, _) in made {
                    tracing::info!(target: "tollgate::keys", key = %job.name, action = job.kind.as_str(), by = "admin", "key changed");
                    let _ = job.done.send(Ok(()));
                }
            }
            Err(why) => {
                let replicas = matches!(why, KeepError::Redis(StoreError::NotReplicated));
                let why = why.to_string();
                for (job, _) in made {
                    tracing::error!(target: "tollgate::keys", key = %job.name, action = job.kind.as_str(), by = "admin", error = %why, "key change not kept");
                    let e = if replicas {
                        KeepError::Redis(StoreError::NotReplicated)
                    } else {
                        KeepError::Batch(why.clone())
                    };
                    let _ = job.done.send(Err(ChangeError::NotKept(e)));
                }
            }
        }
    }
}

/// The answer of a change whose batch ended without one (its task panicked).
fn lost() -> ChangeError {
    ChangeError::NotKept(KeepError::Batch(
        "the change's batch ended without an answer: it may or may not be kept; read the key and retry".into(),
    ))
}
