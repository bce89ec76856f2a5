//! The budget calls of an exchange: each key's call built (its budget's name in Redis, its
//! packed arguments), sent in pipelines to a single Redis or one by one to a Redis Cluster's
//! nodes, and their answers read.

use std::sync::Arc;

use futures_util::future::join_all;

use super::script::{pack_calls, unpack_answers};
use super::BudgetSync;
use crate::fleet_store::{within, Client, StoreError};
use crate::limit::shared::{store_key, Call, Reply};
use crate::sync::Locked;

/// A budget call's answer: the script's `{granted, ahead}`, or why there is none.
type Answer = Result<Reply, StoreError>;

/// Keys per budget script call to a single Redis (Redis runs a script alone: a batch of 128
/// keeps each well under a millisecond).
const BATCH: usize = 128;

/// Keys per pipeline (or, on a Redis Cluster, calls in flight at once) in one exchange.
const CHUNK: usize = 1024;

impl BudgetSync {
    /// Every pending key's budget call, in chunks; the answers in order (`None` for a key
    /// whose call failed or was not sent), and the first failure.
    pub(super) async fn budget_calls(
        &self,
        client: &Client,
        calls: &[Call],
        deadline: tokio::time::Instant,
    ) -> (Vec<Option<Reply>>, Option<StoreError>) {
        let mut replies = Vec::with_capacity(calls.len());
        let mut failure = None;
        for chunk in calls.chunks(CHUNK) {
            let answers = match client {
                Client::Single(_) | Client::Sentinel(_) => {
                    self.pipelined(client, chunk, deadline).await
                }
                Client::Cluster(_) => self.one_by_one(client, chunk, deadline).await,
            };
            for a in answers {
                match a {
                    Ok(reply) => replies.push(Some(reply)),
                    Err(e) => {
                        failure.get_or_insert(e);
                        replies.push(None);
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        (replies, failure)
    }

    /// The budget names of `chunk`'s keys, from the cache or computed.
    fn names(&self, chunk: &[Call]) -> Vec<Arc<str>> {
        // Only this service's one task locks it, and never across an await.
        let mut names = self.names.locked();
        if names.len() + chunk.len() > super::NAMES {
            names.clear();
        }
        chunk
            .iter()
            .map(|c| {
                Arc::clone(
                    names
                        .entry(c.id)
                        .or_insert_with(|| store_key(&self.cfg.key_prefix, &c.id).into()),
                )
            })
            .collect()
    }

    /// The budget call for `batch` (one key, or several in one slot or on a single Redis).
    fn budget_call(&self, batch: &[Call], names: &[Arc<str>]) -> redis::Cmd {
        let horizon = self.timing.key_horizon().as_millis() as u64;
        let keys: Vec<&str> = names.iter().map(|n| &**n).collect();
        let mut cmd = self.budget.evalsha(&keys);
        cmd.arg(horizon).arg(pack_calls(batch));
        cmd
    }

    /// A chunk of budget calls to a single Redis: [`BATCH`] keys per script call, every call
    /// of the chunk in one pipeline (one write, one read), instead of a script call, a future,
    /// a channel message and a timer per key (docs/benchmarks/history.md, tuning step 8,
    /// has the measured effect). A Redis that lost the script (a restart) answers `NOSCRIPT`:
    /// the script is loaded and those batches, and only those (the others have applied their
    /// hits), are sent again.
    async fn pipelined(
        &self,
        client: &Client,
        chunk: &[Call],
        deadline: tokio::time::Instant,
    ) -> Vec<Answer> {
        let names = self.names(chunk);
        let batches: Vec<(usize, usize)> = (0..chunk.len())
            .step_by(BATCH)
            .map(|at| (at, (at + BATCH).min(chunk.len())))
            .collect();
        let mut out: Vec<Option<Answer>> = vec![None; chunk.len()];
        let mut todo: Vec<usize> = (0..batches.len()).collect();
        let fail_all = |f: StoreError| vec![Err(f); chunk.len()];
        let url = &self.cfg.redis_url;
        for attempt in 0..2 {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &b in &todo {
                let (from, to) = batches[b];
                pipe.add_command(self.budget_call(&chunk[from..to], &names[from..to]));
            }
            self.metrics.calls.inc_by(todo.len() as u64);
            let answers = within(
                deadline,
                url,
                client.pipeline::<Vec<redis::RedisResult<Vec<u8>>>>(&pipe),
            )
            .await;
            let answers = match answers {
                Ok(a) if a.len() == todo.len() => a,
                Ok(_) => {
                    return fail_all(StoreError::Malformed(
                        "a pipeline answered a different number of replies",
                    ))
                }
                Err(e) => return fail_all(e),
            };
            let mut again = Vec::new();
            for (&b, a) in todo.iter().zip(answers) {
                let (from, to) = batches[b];
                match a.map_err(|e| StoreError::of(&e, url)) {
                    Err(StoreError::NoScript) if attempt == 0 => again.push(b),
                    Err(e) => out[from..to].fill(Some(Err(e))),
                    Ok(v) => match unpack_answers(&v, to - from) {
                        Some(answers) => {
                            for (o, a) in out[from..to].iter_mut().zip(answers) {
                                *o = Some(Ok(a));
                            }
                        }
                        None => out[from..to].fill(Some(Err(StoreError::Malformed(
                            "a budget call answered the wrong number of values",
                        )))),
                    },
                }
            }
            if again.is_empty() {
                break;
            }
            match within(deadline, url, client.load(&self.budget)).await {
                Ok(_) => todo = again,
                Err(e) => {
                    for b in again {
                        let (from, to) = batches[b];
                        out[from..to].fill(Some(Err(e.clone())));
                    }
                    break;
                }
            }
        }
        out.into_iter()
            .map(|a| a.unwrap_or(Err(StoreError::Malformed("no answer"))))
            .collect()
    }

    /// A chunk of budget calls to a Redis Cluster, one key per script call (the keys' slots
    /// differ), all in flight together.
    async fn one_by_one(
        &self,
        client: &Client,
        chunk: &[Call],
        deadline: tokio::time::Instant,
    ) -> Vec<Answer> {
        let names = self.names(chunk);
        self.metrics.calls.inc_by(chunk.len() as u64);
        let url = &self.cfg.redis_url;
        let answers = join_all((0..chunk.len()).map(|i| {
            let cmd = self.budget_call(&chunk[i..=i], &names[i..=i]);
            async move {
                match within(deadline, url, client.query::<Vec<u8>>(&cmd)).await {
                    Err(StoreError::NoScript) => {
                        let reload = async {
                            client.load(&self.budget).await?;
                            client.query::<Vec<u8>>(&cmd).await
                        };
                        within(deadline, url, reload).await
                    }
                    r => r,
                }
            }
        }))
        .await;
        answers
            .into_iter()
            .map(|a| match a {
                Ok(v) => match unpack_answers(&v, 1).as_deref() {
                    Some(&[one]) => Ok(one),
                    _ => Err(StoreError::Malformed(
                        "a budget call answered the wrong number of values",
                    )),
                },
                Err(e) => Err(e),
            })
            .collect()
    }
}
