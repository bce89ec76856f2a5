//! Shared budgets: the background half of [`SharedStore`], keeping every key's leases (the
//! requests Redis granted this replica) in step through Redis (the `cluster` block).
//!
//! The request path decides on a key's lease, or a quiet key on credit
//! (`tollgate_core::limit::shared`); a request it cannot decide so parks: it runs an urgent
//! exchange at once, on its own thread, and waits for it ([`Settling`], at most `timeout_ms`).
//! This room is one Pingora background service, [`BudgetSync`], that every `sync_interval` (a
//! tick) exchanges, and the urgent exchanges the requests run beside it; each exchange:
//!
//! 1. at a tick, sends this replica's heartbeat (`heartbeat.lua` on `<prefix>:fleet`, a sorted
//!    set of replica ids by their last heartbeat), which answers how many replicas are alive:
//!    `N`;
//! 2. sends each key with something to say (requests parked, a lease to top up or give back, a
//!    debt, a floor) to `budget.lua` on `<prefix>:b:{<hash>}` (to a single Redis 128 keys per
//!    call and every call of the exchange in one pipeline; to a Redis Cluster one key per call,
//!    one slot each, all in flight together), which grants what the budget has room for with
//!    Redis's clock and answers the grant and the distance ahead ([`exchange`]);
//! 3. settles the answers (leases grown, views renewed) and wakes the requests parked for it.
//!
//! Every script call touches one slot (on a Redis Cluster one key; the budget names carry a
//! hash tag), reads the time with `TIME` (replicas' clocks never matter), and sets an expiry on
//! what it writes. Redis holds no key and no digest: names are a hash of the digest under a
//! fixed label ([`store_key`](crate::limit::shared::store_key)), values are times and counts.
//!
//! **Failures.** An exchange that fails or passes `timeout` marks the store down: requests go
//! on, each replica enforcing `limit / N` on its own (`tollgate_cluster_store_up 0`, `/readyz`
//! says `degraded`, one log line). A circuit breaker then waits 2, 4, 8 … intervals (at most
//! [`MAX_BACKOFF`]) between attempts, so a dead Redis costs one timeout per backoff, not one per
//! interval. While down, no request parks. The first exchange that succeeds brings sharing
//! back (one log line), sending each pending key's view as a floor so that what was admitted
//! while down is neither lost nor counted twice.
//!
//! | module | what |
//! |---|---|
//! | [`exchange`] | one exchange: heartbeat, the budget calls (pipelined or one by one), settling |
//! | [`script`] | the two `.lua` scripts and their packed arguments and answers |
//! | [`settling`] | a parked request's urgent exchange, run on its own thread, and its wait |
//! | `metrics` | `tollgate_cluster_*` |

mod calls;
pub mod exchange;
mod metrics;
pub mod script;
pub mod settling;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::clock::Clock;
use crate::config::Cluster;
use crate::digest::Digest;
use crate::fleet_store::{Client, Lua, StoreError};
use crate::limit::shared::fleet_key;
use crate::limit::shared::Batch;
use crate::limit::{SharedStore, Syncer, Timing};
use crate::runtime::metrics::Metrics;
use crate::sync::Locked;
use metrics::SharedMetrics;
pub use settling::Settling;

/// The longest the breaker waits between two attempts on a store that is down.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Budget names kept by [`BudgetSync`] (about 150 bytes each: 10 MB at most).
const NAMES: usize = 1 << 16;

/// The shared budgets' background service (see the module docs).
pub struct BudgetSync {
    cfg: Cluster,
    timing: Timing,
    store: Arc<SharedStore>,
    syncer: Mutex<Syncer>,
    clock: Arc<dyn Clock>,
    /// This process's name in the store: random, so two replicas never share one.
    replica: String,
    fleet_key: String,
    budget: Lua,
    heartbeat: Lua,
    metrics: SharedMetrics,
    settling: Arc<Settling>,
    /// Each key's budget name in the store, computed once (a SHA-256 and a hex string per
    /// key per exchange were half of the exchange's CPU). At most [`NAMES`] entries: past
    /// that it starts again, so memory stays bounded whatever the number of keys.
    names: Mutex<HashMap<Digest, Arc<str>, foldhash::fast::RandomState>>,
    /// What rides on the heartbeat's round trip at each tick (the quota and ledger counts).
    rider: std::sync::OnceLock<Arc<dyn Rider>>,
    /// Held while the rider's commands of one exchange are in flight (it keeps one).
    riding: tokio::sync::Mutex<()>,
    /// Whether the master the rider's counts go to has replicas to wait for.
    hold: crate::fleet_store::Hold,
    /// The ticks' connection, for an urgent round on a thread whose own is not open yet.
    published: Mutex<Option<Client>>,
    breaker: Mutex<Breaker>,
}

/// The circuit breaker on a store that fails: after `failures` in a row, no exchange before
/// `next_try` (2, 4, 8 … intervals, at most [`MAX_BACKOFF`]).
#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    next_try: Option<tokio::time::Instant>,
}

/// Commands that ride on each tick's heartbeat, in the same pipeline (one round trip for the
/// heartbeat, the quota counts and the ledger's), and on an urgent round when a request waits
/// for them: [`crate::ledger`]'s fleet half.
pub trait Rider: Send + Sync {
    /// This round's commands (none: nothing rides): at a tick, everything there is to send;
    /// in an urgent round, only what a request waits for. Each names one slot.
    fn commands(&self, tick: bool) -> Vec<redis::Cmd>;
    /// Their answers, in order, or why none came (then nothing of them may be taken as
    /// applied, and nothing is lost: what was sent is sent again, or put back); `replicated`:
    /// a replica holds what they wrote, or none need to (else a failover may lose it, and
    /// what added counts is sent again: each such command must be applied once however
    /// often it is sent).
    fn answered(
        &self,
        answers: Result<Vec<redis::RedisResult<redis::Value>>, StoreError>,
        replicated: bool,
    );
    /// Whether a request waits for what rides: an urgent round is due.
    fn waiting(&self) -> bool;
    /// Whether the round with the store succeeded (a request decides on its own while not).
    fn store_up(&self, up: bool);
}

impl BudgetSync {
    /// The store for the policy, and the service that keeps it in step with the fleet.
    pub fn new(
        cfg: Cluster,
        window: Duration,
        clock: Arc<dyn Clock>,
        metrics: &Metrics,
    ) -> (Arc<SharedStore>, Arc<Self>) {
        let timing = Timing {
            sync_interval: cfg.sync_interval,
            timeout: cfg.timeout,
            window,
        };
        let (store, syncer) = SharedStore::new(timing);
        let shared_metrics = SharedMetrics::new(metrics);
        let settling = Arc::new(Settling::new(
            cfg.timeout,
            shared_metrics.settle_seconds.clone(),
        ));
        let svc = Self {
            fleet_key: fleet_key(&cfg.key_prefix),
            cfg,
            timing,
            store: Arc::clone(&store),
            syncer: Mutex::new(syncer),
            clock,
            replica: replica_id(),
            budget: Lua::new(script::BUDGET_LUA),
            heartbeat: Lua::new(script::HEARTBEAT_LUA),
            metrics: shared_metrics,
            settling,
            names: Mutex::default(),
            rider: std::sync::OnceLock::new(),
            riding: tokio::sync::Mutex::new(()),
            hold: crate::fleet_store::Hold::default(),
            published: Mutex::default(),
            breaker: Mutex::default(),
        };
        let svc = Arc::new(svc);
        svc.settling.serve(Arc::downgrade(&svc));
        (store, svc)
    }

    /// Send `rider`'s commands with every tick's heartbeat.
    pub fn carry(&self, rider: Arc<dyn Rider>) {
        let _ = self.rider.set(rider);
    }

    /// What a request parked on this store waits with.
    pub fn settling(&self) -> Arc<Settling> {
        Arc::clone(&self.settling)
    }

    fn syncer(&self) -> std::sync::MutexGuard<'_, Syncer> {
        // Locked by the ticks and the urgent rounds, never across an await.
        self.syncer.locked()
    }

    /// The next round's number and batch, taken together (rounds run side by side; a request
    /// waits for its own round, or for every earlier one when its own had nothing to send).
    fn begin_round(&self, tick: bool) -> (u64, Batch) {
        let mut syncer = self.syncer();
        let number = self.settling.open();
        (number, syncer.begin(self.clock.now(), tick))
    }

    /// The interval's round: connect if needed, heartbeat and exchange, settle, and wake the
    /// requests whose keys it carried. Whether it succeeded.
    async fn tick(&self, client: &mut Option<Client>) -> bool {
        let started = std::time::Instant::now();
        let (number, batch) = self.begin_round(true);
        self.metrics.parked.inc_by(batch.parked());
        let ok = self.exchange_batch(client, true, batch, started).await;
        self.settling.close(number);
        ok
    }

    fn published(&self) -> Option<Client> {
        self.published.locked().clone()
    }

    fn breaker(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.breaker.locked()
    }

    /// Whether no exchange may be tried now (the store failed lately).
    fn breaker_open(&self) -> bool {
        self.breaker()
            .next_try
            .is_some_and(|t| tokio::time::Instant::now() < t)
    }

    /// How long a tick's exchange may take: `timeout_ms`, and after failures in a row as long
    /// as the backoff before it ([`backoff`]). A store slow for a moment comes back to a
    /// backlog (every key touched meanwhile, each with its debt or floor): held to
    /// `timeout_ms`, that exchange timed out again, and again as the backlog grew with the
    /// backoff, and under load the fleet never shared again (a load run stayed degraded after
    /// one slow answer). An exchange gets as long as the interval whose backlog it carries. No
    /// request waits on a tick: a parked request runs its own exchange, within `timeout_ms`.
    fn tick_timeout(&self) -> Duration {
        match self.breaker().failures {
            0 => self.cfg.timeout,
            n => self.cfg.timeout.max(backoff(self.cfg.sync_interval, n)),
        }
    }

    /// Count an exchange's outcome: a failure opens the breaker for twice as long as the
    /// last, a success closes it.
    fn record(&self, ok: bool) {
        let mut b = self.breaker();
        if ok {
            *b = Breaker::default();
            return;
        }
        self.settling.forget_connections();
        b.failures = b.failures.saturating_add(1);
        b.next_try =
            Some(tokio::time::Instant::now() + backoff(self.cfg.sync_interval, b.failures));
    }

    async fn exchange_batch(
        &self,
        client: &mut Option<Client>,
        tick: bool,
        batch: Batch,
        started: std::time::Instant,
    ) -> bool {
        if client.is_none() {
            match crate::fleet_store::connect(&self.cfg).await {
                Ok(c) => {
                    // The budget script loaded at once, so that the first request to wait for
                    // Redis waits one round trip (a `NOSCRIPT` answer costs two more); a
                    // failure here is the exchange's to find.
                    let _ = tokio::time::timeout(self.cfg.timeout, c.load(&self.budget)).await;
                    *client = Some(c);
                }
                Err(e) => return self.settle(batch, Err(e), &[], started),
            }
        }
        let Some(c) = client.as_ref() else {
            return false;
        };
        let timeout = if tick {
            self.tick_timeout()
        } else {
            self.cfg.timeout
        };
        let (outcome, replies) = self.exchange(c, &batch.calls, tick, timeout).await;
        let ok = self.settle(batch, outcome, &replies, started);
        if !ok {
            // A cluster connection is rebuilt from scratch after a failure; the single
            // connection's manager reconnects by itself.
            if matches!(client, Some(Client::Cluster(_))) {
                *client = None;
            }
        }
        ok
    }
}

#[async_trait]
impl BackgroundService for BudgetSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut client = None;
        let mut tick = tokio::time::interval(self.cfg.sync_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            };
            if self.breaker_open() {
                // No call (requests decide on `limit / N` and do not park); keep only keys
                // with something to say.
                self.syncer().hold(self.clock.now());
                continue;
            }
            let ok = self.tick(&mut client).await;
            self.record(ok);
            *self.published.locked() = client.clone();
        }
        // Leaving: report what was admitted since the last exchange, if the store answers.
        if self.breaker().failures == 0 && client.is_some() {
            let _ = self.tick(&mut client).await;
        }
    }
}

/// The pause after `failures` failed exchanges in a row: 2, 4, 8 … intervals, at most
/// [`MAX_BACKOFF`].
fn backoff(interval: Duration, failures: u32) -> Duration {
    interval
        .saturating_mul(1 << failures.min(16))
        .min(MAX_BACKOFF)
}

/// A random id for this process: 16 hex digits from the standard library's random hasher
/// seeds, the process id and the time.
pub fn replica_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_from_two_intervals_up_to_five_seconds() {
        let i = Duration::from_millis(100);
        let got: Vec<u128> = (1..=7).map(|n| backoff(i, n).as_millis()).collect();
        assert_eq!(got, [200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(backoff(i, u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn replica_ids_differ() {
        let ids: std::collections::HashSet<String> = (0..100).map(|_| replica_id()).collect();
        assert_eq!(ids.len(), 100);
        assert!(ids.iter().all(|i| i.len() == 16));
    }
}
