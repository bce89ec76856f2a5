//! One exchange with the store: the heartbeat, every pending key's budget call, and settling
//! the answers into the views.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;

use super::script::{pack_calls, unpack_answers};
use super::BudgetSync;
use crate::limit::shared::{store_key, Batch, Call, Reply, Settled};
use crate::redis::{within, Client, StoreError};

/// A budget call's answer: the script's `{granted, ahead}`, or why there is none.
type Answer = Result<Reply, StoreError>;

/// Keys per budget script call to a single Redis (Redis runs a script alone: a batch of 128
/// keeps each well under a millisecond).
const BATCH: usize = 128;

/// Keys per pipeline (or, on a Redis Cluster, calls in flight at once) in one exchange.
const CHUNK: usize = 1024;

impl BudgetSync {
    /// One heartbeat (at a tick: `N`) and every pending key, within `timeout`: one round
    /// trip, the heartbeat (or, in an urgent round, what requests wait for that rides) in
    /// flight beside the budget calls on the same connection. The budget calls do not need
    /// the heartbeat's answer (it is the next exchange's `N`), and an answer that came is
    /// settled even when the other half failed: its grant is the store's.
    pub(super) async fn exchange(
        &self,
        client: &Client,
        calls: &[Call],
        tick: bool,
        timeout: std::time::Duration,
    ) -> (Result<Option<u32>, StoreError>, Vec<Option<Reply>>) {
        let deadline = tokio::time::Instant::now() + timeout;
        let first = async {
            // The rider keeps one exchange's commands in flight at a time: a tick waits for an
            // urgent round's to be answered; an urgent round whose rider is busy sends none
            // (its request waits for the round in flight, and asks again).
            if tick {
                let _riding = self.riding.lock().await;
                return self.beat(client, deadline).await.map(Some);
            }
            let Ok(_riding) = self.riding.try_lock() else {
                return Ok(None);
            };
            let waited = self
                .rider
                .get()
                .map(|r| r.commands(false))
                .unwrap_or_default();
            if waited.is_empty() {
                Ok(None)
            } else {
                self.ride(client, None, waited, deadline)
                    .await
                    .map(|_| None)
            }
        };
        // The budget calls are sent first: a `WAIT` at the end of what rides (behind Sentinel
        // or on a Redis Cluster) blocks the connection's later commands until a replica has
        // the writes.
        let ((replies, failure), fleet) =
            tokio::join!(self.budget_calls(client, calls, deadline), first);
        (failure.map_or(fleet, Err), replies)
    }

    /// Every pending key's budget call, in chunks; the answers in order (`None` for a key
    /// whose call failed or was not sent), and the first failure.
    async fn budget_calls(
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

    /// The heartbeat: this replica is alive; how many are. The rider's commands, if any, go
    /// in the same pipeline (on a Redis Cluster, where a pipeline goes to one node, in a
    /// pipeline of their own to their slot's node, at the same time).
    async fn beat(
        &self,
        client: &Client,
        deadline: tokio::time::Instant,
    ) -> Result<u32, StoreError> {
        let horizon = self.timing.fleet_horizon().as_millis() as u64;
        self.metrics.calls.inc();
        let mut beat = self.heartbeat.evalsha(&[&self.fleet_key]);
        beat.arg(&self.replica).arg(horizon);
        let url = &self.cfg.redis_url;
        let riding = self
            .rider
            .get()
            .map(|r| r.commands(true))
            .unwrap_or_default();
        let first = if riding.is_empty() {
            within(deadline, url, client.query::<u32>(&beat)).await
        } else if matches!(client, Client::Cluster(_)) {
            let alone = within(deadline, url, client.query::<u32>(&beat));
            let (first, ridden) = tokio::join!(alone, self.ride(client, None, riding, deadline));
            // A failed round trip to the meters' node fails the exchange too: the connection
            // is then rebuilt, with the nodes as they are now (a failover there).
            first.and_then(|n| ridden.map(|_| n))
        } else {
            let heartbeat = self.ride(client, Some(&beat), riding, deadline).await;
            heartbeat.and_then(|v| {
                redis::from_redis_value::<u32>(v)
                    .map_err(|_| StoreError::Malformed("a heartbeat that is not a count"))
            })
        };
        match first {
            Err(StoreError::NoScript) => {
                let reload = async {
                    client.load(&self.heartbeat).await?;
                    client.query::<u32>(&beat).await
                };
                within(deadline, url, reload).await
            }
            r => r,
        }
    }

    /// Send the rider's commands, after `beat` when given (whose answer is returned), and tell
    /// the rider what came back. Where a failover promotes a replica (Sentinel, a Redis
    /// Cluster), the counts are taken as written only once a replica holds them (`WAIT`,
    /// `ROLE` at the end of the pipeline, on the same connection); else they are sent again,
    /// and a failover loses none.
    async fn ride(
        &self,
        client: &Client,
        beat: Option<&redis::Cmd>,
        riding: Vec<redis::Cmd>,
        deadline: tokio::time::Instant,
    ) -> Result<redis::Value, StoreError> {
        let rider = self.rider.get().expect("commands came from it");
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        if let Some(b) = beat {
            pipe.add_command(b.clone());
        }
        // Plain commands in the heartbeat's round trip: no script call is counted.
        for c in riding {
            pipe.add_command(c);
        }
        let hold = client.replicated();
        if hold {
            for c in self.hold.commands(self.cfg.timeout / 2) {
                pipe.add_command(c);
            }
        }
        let answers = within(
            deadline,
            &self.cfg.redis_url,
            client.pipeline::<Vec<redis::RedisResult<redis::Value>>>(&pipe),
        )
        .await;
        let extra = usize::from(beat.is_some()) + if hold { 2 } else { 0 };
        match answers {
            Ok(mut a) if a.len() > extra => {
                let heartbeat = beat.map(|_| a.remove(0));
                let held = !hold || {
                    let role = a.pop().and_then(Result::ok);
                    let wait = a.pop().and_then(Result::ok);
                    matches!((wait, role), (Some(w), Some(r)) if self.hold.read(&w, &r))
                };
                if held {
                    rider.answered(Ok(a));
                } else {
                    rider.answered(Err(StoreError::NotReplicated));
                }
                match heartbeat {
                    Some(Ok(v)) => Ok(v),
                    Some(Err(e)) => Err(StoreError::of(&e, &self.cfg.redis_url)),
                    None => Ok(redis::Value::Nil),
                }
            }
            Ok(_) => {
                rider.answered(Err(StoreError::Malformed("an empty pipeline answer")));
                Err(StoreError::Malformed("an empty pipeline answer"))
            }
            Err(e) => {
                rider.answered(Err(e.clone()));
                Err(e)
            }
        }
    }

    /// The budget names of `chunk`'s keys, from the cache or computed.
    fn names(&self, chunk: &[Call]) -> Vec<Arc<str>> {
        // Only this service's one task locks it, and never across an await.
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
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
    /// a channel message and a timer per key (docs/benchmarks.md, "Part two, everything on",
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

    /// Settle an exchange: views, `N`, up or down, metrics, and a log line on a change.
    pub(super) fn settle(
        &self,
        batch: Batch,
        outcome: Result<Option<u32>, StoreError>,
        replies: &[Option<Reply>],
        started: Instant,
    ) -> bool {
        let keys = batch.calls.len();
        let mut syncer = self.syncer();
        let settled: Settled = syncer.finish(batch, replies, self.clock.now());
        self.metrics
            .sync_seconds
            .observe(started.elapsed().as_secs_f64());
        self.metrics.sync_keys.observe(keys as f64);
        let ok = outcome.is_ok() && settled.failed == 0;
        if let Some(rider) = self.rider.get() {
            rider.store_up(ok);
        }
        if let Ok(Some(n)) = outcome {
            self.store.set_fleet(n);
            self.metrics.replicas.set(i64::from(n));
        }
        match (syncer.set_up(ok), outcome) {
            (Some(true), _) => tracing::info!(
                target: "tollgate::cluster",
                store = %self.cfg.redacted_url(),
                replicas = self.store.fleet(),
                "cluster store reachable: budgets are shared again"
            ),
            (Some(false), Err(why)) => tracing::warn!(
                target: "tollgate::cluster",
                store = %self.cfg.redacted_url(),
                error = %why,
                replicas = self.store.fleet(),
                "cluster store unreachable: each replica enforces limit / N on its own"
            ),
            (Some(false), Ok(_)) => tracing::warn!(
                target: "tollgate::cluster",
                store = %self.cfg.redacted_url(),
                failed = settled.failed,
                "cluster store did not answer for every key: each replica enforces limit / N on its own"
            ),
            (None, _) => {}
        }
        self.metrics.up.set(i64::from(ok));
        if !ok {
            self.metrics.errors.inc();
        }
        ok
    }
}
