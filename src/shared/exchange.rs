//! One exchange with the store: the heartbeat (and what rides on it) beside every pending
//! key's budget call (`calls.rs`), and settling the answers into the views.

use std::time::Instant;

use super::BudgetSync;
use crate::fleet_store::{within, Client, StoreError};
use crate::limit::shared::{Batch, Call, Reply, Settled};

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
    /// `ROLE` at the end of the pipeline, on the same connection); else they are sent again
    /// (applied once), and a failover loses none.
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
                // Unconfirmed, the answers are the master's word all the same: read, and
                // what added counts is sent again ([`crate::shared::Rider::answered`]).
                rider.answered(Ok(a), held);
                match heartbeat {
                    Some(Ok(v)) => Ok(v),
                    Some(Err(e)) => Err(StoreError::of(&e, &self.cfg.redis_url)),
                    None => Ok(redis::Value::Nil),
                }
            }
            Ok(_) => {
                rider.answered(
                    Err(StoreError::Malformed("an empty pipeline answer")),
                    false,
                );
                Err(StoreError::Malformed("an empty pipeline answer"))
            }
            Err(e) => {
                rider.answered(Err(e.clone()), false);
                Err(e)
            }
        }
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
