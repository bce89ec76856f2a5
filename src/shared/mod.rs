//! Shared budgets: the background half of [`SharedStore`], keeping every key's leases (the
//! requests Redis granted this replica) in step through Redis (the `cluster` block).
//!
//! The request path decides on a key's lease (`tollgate_core::limit::shared`); a request whose
//! key has no lease here parks: it asks this room for an exchange at once and waits for it
//! ([`Settling`], at most `timeout_ms`). This room is one Pingora background service,
//! [`BudgetSync`], that every `sync_interval` (a tick) and whenever a request parks (an urgent
//! exchange):
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
//! | `metrics` | `tollgate_cluster_*` |

pub mod exchange;
mod metrics;
pub mod script;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::clock::Clock;
use crate::config::Cluster;
use crate::digest::Digest;
use crate::limit::shared::fleet_key;
use crate::limit::shared::Batch;
use crate::limit::{SharedStore, Syncer, Timing};
use crate::redis::{Client, Lua, StoreError};
use crate::runtime::metrics::Metrics;
use metrics::SharedMetrics;

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
    /// Whether the master the rider's counts go to has replicas to wait for.
    hold: crate::redis::Hold,
}

/// Commands that ride on each tick's heartbeat, in the same pipeline (one round trip for the
/// heartbeat, the quota counts and the ledger's), and on an urgent round when a request waits
/// for them: [`crate::ledger`]'s fleet half.
pub trait Rider: Send + Sync {
    /// This round's commands (none: nothing rides): at a tick, everything there is to send;
    /// in an urgent round, only what a request waits for. Each names one slot.
    fn commands(&self, tick: bool) -> Vec<redis::Cmd>;
    /// Their answers, in order, or why none came (then nothing of them may be taken as
    /// applied, and nothing is lost: what was sent is sent again, or put back).
    fn answered(&self, answers: Result<Vec<redis::RedisResult<redis::Value>>, StoreError>);
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
    ) -> (Arc<SharedStore>, Self) {
        let timing = Timing {
            sync_interval: cfg.sync_interval,
            timeout: cfg.timeout,
            window,
        };
        let (store, syncer) = SharedStore::new(timing);
        let shared_metrics = SharedMetrics::new(metrics);
        let settling = Arc::new(Settling {
            urgent: tokio::sync::Notify::new(),
            begun: AtomicU64::new(0),
            done: tokio::sync::watch::Sender::new(0),
            timeout: cfg.timeout,
            waits: shared_metrics.settle_seconds.clone(),
        });
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
            hold: crate::redis::Hold::default(),
        };
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
        // Only this service's one task locks it.
        self.syncer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One round: connect if needed, exchange, settle, and wake the requests parked for it.
    /// `tick`: the interval's round (with the heartbeat); otherwise an urgent one, for
    /// requests parked. Whether it succeeded; `None` for an urgent round with nothing to
    /// send (its requests were decided by an earlier answer), which says nothing of the store.
    async fn round(&self, client: &mut Option<Client>, tick: bool) -> Option<bool> {
        let number = self.settling.begun.fetch_add(1, Ordering::AcqRel) + 1;
        let ok = self.exchange_round(client, tick).await;
        self.settling.done.send_replace(number);
        ok
    }

    async fn exchange_round(&self, client: &mut Option<Client>, tick: bool) -> Option<bool> {
        let started = std::time::Instant::now();
        let batch = self.syncer().begin(self.clock.now(), tick);
        let riding = self.rider.get().is_some_and(|r| r.waiting());
        if !tick && batch.is_empty() && !riding {
            return None;
        }
        self.metrics.parked.inc_by(batch.parked());
        Some(self.exchange_batch(client, tick, batch, started).await)
    }

    async fn exchange_batch(
        &self,
        client: &mut Option<Client>,
        tick: bool,
        batch: Batch,
        started: std::time::Instant,
    ) -> bool {
        if client.is_none() {
            match crate::redis::connect(&self.cfg).await {
                Ok(c) => *client = Some(c),
                Err(e) => return self.settle(batch, Err(e), &[], started),
            }
        }
        let Some(c) = client.as_ref() else {
            return false;
        };
        let (outcome, replies) = self.exchange(c, &batch.calls, tick).await;
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
        let mut failures = 0u32;
        let mut next_try = tokio::time::Instant::now();
        loop {
            let ticked = tokio::select! {
                _ = tick.tick() => true,
                _ = self.settling.urgent.notified() => false,
                _ = shutdown.changed() => break,
            };
            if !ticked && !self.store.is_up() {
                // Down: the ticks try the store again. A request that parked just before the
                // store went down is woken to decide on `limit / N`.
                self.settling.pass();
                continue;
            }
            if tokio::time::Instant::now() < next_try {
                // The breaker is open: no call (requests decide on `limit / N` and do not
                // park); keep only keys with something to say.
                self.syncer().hold(self.clock.now());
                self.settling.pass();
                continue;
            }
            let Some(ok) = self.round(&mut client, ticked).await else {
                continue;
            };
            if ok {
                failures = 0;
            } else {
                failures = failures.saturating_add(1);
                let backoff = self
                    .cfg
                    .sync_interval
                    .saturating_mul(1 << failures.min(16))
                    .min(MAX_BACKOFF);
                next_try = tokio::time::Instant::now() + backoff;
            }
        }
        // Leaving: report what was admitted since the last exchange, if the store answers.
        if failures == 0 && client.is_some() {
            let _ = self.round(&mut client, true).await;
        }
    }
}

/// How a request that a replica cannot decide from its lease waits for the exchange that
/// carries it (see `tollgate_core::limit::shared`): it wakes the syncer for an urgent round
/// and waits, at most `cluster.timeout_ms`, until a round that began after it parked has
/// settled. A parked request holds no thread: Pingora's request filter is async.
pub struct Settling {
    urgent: tokio::sync::Notify,
    /// Rounds begun, and (in the channel) the last one settled.
    begun: AtomicU64,
    done: tokio::sync::watch::Sender<u64>,
    timeout: Duration,
    waits: prometheus::Histogram,
}

impl Settling {
    /// A round that sends nothing: the requests waiting are woken to decide again.
    fn pass(&self) {
        let number = self.begun.fetch_add(1, Ordering::AcqRel) + 1;
        self.done.send_replace(number);
    }

    /// The longest a request waits (`cluster.timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Wait until a round that began after this call has settled, or until `deadline`
    /// (whether the round settled in time). The key's `want` was counted before this call,
    /// so that round carries it.
    pub async fn wait(&self, deadline: tokio::time::Instant) -> bool {
        let started = tokio::time::Instant::now();
        let mut done = self.done.subscribe();
        let need = self.begun.load(Ordering::Acquire) + 1;
        self.urgent.notify_one();
        let settled = tokio::time::timeout_at(deadline, done.wait_for(|d| *d >= need))
            .await
            .is_ok_and(|r| r.is_ok());
        self.waits.observe(started.elapsed().as_secs_f64());
        settled
    }
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
    fn replica_ids_differ() {
        let ids: std::collections::HashSet<String> = (0..100).map(|_| replica_id()).collect();
        assert_eq!(ids.len(), 100);
        assert!(ids.iter().all(|i| i.len() == 16));
    }
}
