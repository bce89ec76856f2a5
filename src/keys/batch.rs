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
//!
//! With `cluster`, the write asks Redis for conditions on the issued keys it changes (another
//! replica may have changed them since this one polled: docs/cluster.md, "Two replicas at
//! once"); a change that meets another replica's is taken out of the batch, refused (a name
//! or digest taken: 409) or made again once this replica has read the key (a rotation or
//! deletion), and the rest of the batch is made again without it.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::keep::Records;
use super::redis_set::{Clash, Condition};
use super::{sync, ChangeError, KeepError, KeyChanges};
use crate::digest::Digest;
use crate::fleet_store::StoreError;
use crate::policy::overrides::{ChangeKind, ChangeRefused, KeyRecord, KeyRecords, Part};
use crate::policy::Policy;
use crate::sync::Locked;

/// What a change is made of: the policy and the records in force (the batch's earlier ones
/// included) to what to keep. Made again when a batch is (another replica's change met).
pub(crate) type Make = Box<dyn Fn(&Policy, &KeyRecords) -> Result<Records, ChangeError> + Send>;

/// How many times a batch catches up with what other replicas changed meanwhile (then makes
/// its changes again) before a change that still meets another's answers 503.
const CATCH_UPS: usize = 2;

/// A batch's jobs made: each with what it keeps, and the conditions its write asks of Redis,
/// each with the index of its job.
struct Made {
    jobs: Vec<(Job, Records)>,
    conditions: Vec<(usize, Condition)>,
}

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

    /// Make, keep and apply `jobs`, in order; answer each. With `cluster`, a job whose write
    /// Redis refuses (a name or digest another replica claimed meanwhile: 409; a key another
    /// replica changed meanwhile: made again after this replica catches up, at most
    /// [`CATCH_UPS`] times) is taken out, and the others are made again without it.
    async fn make_batch(&self, jobs: Vec<Job>) {
        let mut jobs = jobs;
        let mut catch_ups = 0;
        loop {
            let Made {
                jobs: made,
                conditions,
            } = self.make_jobs(jobs);
            if made.is_empty() {
                return;
            }
            let all: Records = made.iter().flat_map(|(_, r)| r.iter().cloned()).collect();
            let asked: Vec<Condition> = conditions.iter().map(|(_, c)| c.clone()).collect();
            let why = match self.keep_if(&all, &asked).await {
                Ok(()) => {
                    self.put_records(&all);
                    for (job, _) in made {
                        tracing::info!(target: "tollgate::keys", key = %job.name, action = job.kind.as_str(), by = "admin", "key changed");
                        let _ = job.done.send(Ok(()));
                    }
                    return;
                }
                Err(KeepError::Clash { condition, clash }) => {
                    let (at, ref met) = conditions[condition];
                    let mut rest: Vec<Job> = made.into_iter().map(|(job, _)| job).collect();
                    let job = rest.remove(at);
                    tracing::info!(target: "tollgate::keys", key = %job.name, action = job.kind.as_str(), by = "admin", clash = ?clash, "key change met another replica's");
                    let refused: ChangeError = match clash {
                        Clash::Name => ChangeRefused::KeyExists("name").into(),
                        Clash::Sha256 => ChangeRefused::KeyExists("sha256").into(),
                        Clash::Changed
                            if catch_ups < CATCH_UPS && sync::catch_up(self, met.id()).await =>
                        {
                            catch_ups += 1;
                            rest.insert(at, job);
                            jobs = rest;
                            continue;
                        }
                        Clash::Changed => ChangeError::NotKept(KeepError::Batch(
                            "the key was changed on another replica meanwhile, and this one \
                             could not catch up: read it and retry"
                                .into(),
                        )),
                    };
                    let _ = job.done.send(Err(refused));
                    jobs = rest;
                    continue;
                }
                Err(why) => why,
            };
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
            return;
        }
    }

    /// Make `jobs`, in order, each against the records in force and the earlier ones' (the
    /// set put back as it was after), answering those refused: the others with what each
    /// keeps, and the conditions the batch's write asks of Redis, each with the index of its
    /// job among them (a key's issued part as this replica has it, taken from the set before
    /// the first job of the batch that changes it).
    fn make_jobs(&self, jobs: Vec<Job>) -> Made {
        let snap = self.live.load();
        let mut made: Vec<(Job, Records)> = Vec::with_capacity(jobs.len());
        let mut conditions = Vec::new();
        let mut refused: Vec<(Job, ChangeError)> = Vec::new();
        self.with_records_for_a_while(|set| {
            // Each job sees the batch's earlier changes; the set is put back as it was after.
            let mut saved = Vec::new();
            let mut created: HashSet<String> = HashSet::new();
            let mut touched: HashSet<Digest> = HashSet::new();
            for job in jobs {
                match (job.make)(&snap.policy, set) {
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
                        for (d, p, o) in &records {
                            if *p == Part::Issued && touched.insert(*d) {
                                let was =
                                    set.get(d).and_then(|r| r.issued.as_ref().map(|i| i.digest));
                                let at = made.len();
                                conditions
                                    .extend(conditions_of(*d, was, o).into_iter().map(|c| (at, c)));
                            }
                        }
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
        Made {
            jobs: made,
            conditions,
        }
    }
}

/// What Redis must hold for the issued part `after` of the key issued as `id` to be written,
/// this replica having it with the digest in force `was` (`None`: no key): a new key's name
/// and digest unclaimed by another and its part absent; a rotated or deleted key's part as
/// this replica has it, the rotated key not revoked and the rotation's digest unclaimed by
/// another, the deleted key's name let go.
fn conditions_of(id: Digest, was: Option<Digest>, after: &KeyRecord) -> Vec<Condition> {
    let name = || after.key.clone();
    match (was, after.issued.as_deref()) {
        (None, Some(i)) => vec![
            Condition::Name { name: name(), id },
            Condition::Issued { id, was: None },
            Condition::Secret {
                digest: i.digest,
                id,
            },
        ],
        (Some(w), Some(i)) => {
            let mut c = vec![Condition::Issued { id, was: Some(w) }];
            if i.digest != w {
                c.push(Condition::Unrevoked { id });
                c.push(Condition::Secret {
                    digest: i.digest,
                    id,
                });
            }
            c
        }
        (Some(w), None) => vec![
            Condition::Issued { id, was: Some(w) },
            Condition::Free { name: name(), id },
        ],
        (None, None) => Vec::new(),
    }
}

/// The answer of a change whose batch ended without one (its task panicked).
fn lost() -> ChangeError {
    ChangeError::NotKept(KeepError::Batch(
        "the change's batch ended without an answer: it may or may not be kept; read the key and retry".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::overrides::{IssuedKey, PreviousDigest};

    fn issued(name: &str, id: Digest) -> KeyRecord {
        KeyRecord {
            issued: Some(Box::new(IssuedKey::plain(id, 1, 1_700_000_000_000))),
            ..KeyRecord::named(name)
        }
    }

    #[test]
    fn a_new_key_claims_its_name_and_digest_and_a_change_expects_the_key_as_read() {
        let id = Digest::of(b"first");
        let name = "n".to_string();
        // Created: its name and digest claimed, its part absent.
        assert_eq!(
            conditions_of(id, None, &issued("n", id)),
            [
                Condition::Name {
                    name: name.clone(),
                    id
                },
                Condition::Issued { id, was: None },
                Condition::Secret { digest: id, id },
            ]
        );
        // Rotated: the part as read, the key not revoked, and the new digest claimed.
        let new = Digest::of(b"second");
        let mut rotated = issued("n", id);
        let i = rotated.issued.as_mut().unwrap();
        i.previous.push(PreviousDigest {
            digest: id,
            until_ms: 1,
        });
        i.digest = new;
        assert_eq!(
            conditions_of(id, Some(id), &rotated),
            [
                Condition::Issued { id, was: Some(id) },
                Condition::Unrevoked { id },
                Condition::Secret { digest: new, id },
            ]
        );
        // Another change of the part (none today keeps its digest): the part as read alone.
        assert_eq!(
            conditions_of(id, Some(id), &issued("n", id)),
            [Condition::Issued { id, was: Some(id) }]
        );
        // Deleted after a rotation: the part as read (its digest in force), the name let go.
        assert_eq!(
            conditions_of(id, Some(new), &KeyRecord::named("n")),
            [
                Condition::Issued { id, was: Some(new) },
                Condition::Free { name, id },
            ]
        );
        // No issued part before or after (a part of part three): nothing asked.
        assert!(conditions_of(id, None, &KeyRecord::named("n")).is_empty());
    }
}
