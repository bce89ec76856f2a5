//! Budgets shared across replicas: the background half of [`SharedStore`], talking to Redis.
//!
//! The request path decides on local views (`tollgate_core::limit::shared`) and never waits
//! for Redis. This module is one Pingora background service that, every `sync_interval`:
//!
//! 1. sends this replica's heartbeat (one script on `<prefix>:fleet`, a sorted set of replica
//!    ids by their last heartbeat), which answers how many replicas are alive: `N`;
//! 2. sends each key admitted on since the last exchange to the budget script on
//!    `<prefix>:b:{<hash>}` (to a single Redis 128 keys per call and every call of the exchange
//!    in one pipeline; to a Redis Cluster one key per call, one slot each, all in flight
//!    together), which applies the hits to the fleet's TAT with Redis's clock and answers the
//!    distance ahead and the replicas on the key;
//! 3. settles the answers: views re-anchored, hits of unanswered calls given back.
//!
//! Every script call touches one slot (on a Redis Cluster one key; the budget names carry a hash tag),
//! reads the time with `TIME` (replicas' clocks never matter), and sets an expiry on what it
//! writes. Redis holds no key and no digest: names are a hash of the digest under a fixed
//! label ([`store_key`]), values are times and counts.
//!
//! **Failures.** An exchange that fails or passes `timeout` marks the store down: requests go
//! on, each replica enforcing `limit / N` on its own (`tollgate_cluster_store_up 0`, `/readyz`
//! says `degraded`, one log line). A circuit breaker then waits 2, 4, 8 … intervals (at most
//! [`MAX_BACKOFF`]) between attempts, so a dead Redis costs one timeout per backoff, not one per
//! interval. The first exchange that succeeds brings sharing back (one log line), sending each
//! pending key's view as a floor so that what was admitted while down is neither lost nor
//! counted twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::future::join_all;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, RedisError, Script};

use crate::clock::Clock;
use crate::config::{scrub, Cluster as ClusterConfig};
use crate::digest::Digest;
use crate::limit::shared::{fleet_key, store_key, Batch, Call, Reply, Settled};
use crate::limit::{SharedStore, Syncer, Timing};
use crate::runtime::metrics::Metrics;

/// The longest the breaker waits between two attempts on a store that is down.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A budget call's answer: the script's `{ahead, n, others}`, or why there is none.
type Answer = Result<(u64, u32, u64), Failure>;

/// Keys per budget script call to a single Redis (Redis runs a script alone: a batch of 128
/// keeps each well under a millisecond).
const BATCH: usize = 128;

/// Keys per pipeline (or, on a Redis Cluster, calls in flight at once) in one exchange.
const CHUNK: usize = 1024;

/// The budget script, for one key or a batch of keys (`KEYS[1..n]`, one slot each on a Redis
/// Cluster, so a cluster gets one key per call): `ARGV[1]` the replica id, `ARGV[2]` the key
/// horizon (ms), `ARGV[3]` recent (ms), `ARGV[4]` for each key in order its hits, interval (µs)
/// and floor (µs), packed as little-endian 64-bit integers ([`pack_calls`]). Fields: `t` the
/// TAT; per replica `r<id>` "when:hits" of its last report. Answers, for each key in order,
/// `tat − now`, the replicas within the horizon and the hits the others reported within
/// recent, packed the same way: one string of 3n integers ([`unpack_answers`]). One `TIME`
/// for the batch; per key one `HGETALL` (read before writing: this replica's old report is
/// replaced, so it counts as one), one `HSET`, one `PEXPIRE`, and an `HDEL` for each replica
/// gone past the horizon. Packed arguments and answers are one string each way instead of
/// three numbers per key: Redis makes no object per number, and the gateway parses one reply
/// per batch (docs/benchmarks.md, tuning step 13).
/// Mirrors `tollgate_core::limit::shared::model::Model::budget`.
pub const BUDGET_LUA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local me = 'r' .. ARGV[1]
local horizon = tonumber(ARGV[2])
local recent = tonumber(ARGV[3])
local packed = ARGV[4]
local at_arg = 1
local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local hits, interval, floor
  hits, interval, floor, at_arg = struct.unpack('<I8I8I8', packed, at_arg)
  local all = redis.call('HGETALL', key)
  local tat = 0
  local n = 1
  local others = 0
  for i = 1, #all, 2 do
    local f = all[i]
    if f == 't' then
      tat = tonumber(all[i + 1])
    elseif f ~= me and string.byte(f, 1) == 114 then
      local v = all[i + 1]
      local sep = string.find(v, ':', 1, true)
      local at = tonumber(sep and string.sub(v, 1, sep - 1) or v)
      if at + horizon >= now_ms then
        n = n + 1
        if sep and at + recent >= now_ms then
          others = others + tonumber(string.sub(v, sep + 1))
        end
      else
        redis.call('HDEL', key, f)
      end
    end
  end
  if tat < now then tat = now end
  if tat < now + floor then tat = now + floor end
  tat = tat + hits * interval
  redis.call('HSET', key, 't', string.format('%.0f', tat), me, string.format('%.0f', now_ms) .. ':' .. hits)
  local ahead = tat - now
  redis.call('PEXPIRE', key, math.floor((ahead + 999) / 1000) + horizon)
  out[#out + 1] = ahead
  out[#out + 1] = n
  out[#out + 1] = others
end
return struct.pack('<' .. string.rep('I8', #out), unpack(out))
";

/// The budget script's `ARGV[4]` for `calls`: hits, interval (µs) and floor (µs) of each, as
/// little-endian 64-bit integers.
pub fn pack_calls<'c>(calls: impl IntoIterator<Item = &'c Call>) -> Vec<u8> {
    let calls = calls.into_iter();
    let mut v = Vec::with_capacity(24 * calls.size_hint().0);
    for c in calls {
        v.extend_from_slice(&c.hits.to_le_bytes());
        v.extend_from_slice(&c.interval_us.to_le_bytes());
        v.extend_from_slice(&c.floor_us.to_le_bytes());
    }
    v
}

/// The budget script's answer for `n` keys: per key `(ahead µs, replicas, others' recent
/// hits)`, or `None` when it is not 3n packed integers.
pub fn unpack_answers(packed: &[u8], n: usize) -> Option<Vec<(u64, u32, u64)>> {
    if packed.len() != 24 * n {
        return None;
    }
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    Some(
        packed
            .chunks_exact(24)
            .map(|r| {
                let replicas = u32::try_from(word(&r[8..16])).unwrap_or(u32::MAX);
                (word(&r[..8]), replicas, word(&r[16..]))
            })
            .collect(),
    )
}

/// The heartbeat script: `KEYS[1]` the fleet; `ARGV`: replica id, fleet horizon (ms).
/// Mirrors `Model::heartbeat`.
pub const HEARTBEAT_LUA: &str = r"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local horizon = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.0f', now_ms - horizon))
redis.call('PEXPIRE', KEYS[1], 2 * horizon)
return redis.call('ZCARD', KEYS[1])
";

/// The cluster metrics (registered only when `cluster` is configured).
struct ClusterMetrics {
    up: IntGauge,
    replicas: IntGauge,
    sync_seconds: Histogram,
    sync_keys: Histogram,
    calls: IntCounter,
    errors: IntCounter,
}

impl ClusterMetrics {
    fn new(metrics: &Metrics) -> Self {
        let up = IntGauge::new(
            "tollgate_cluster_store_up",
            "1 when the last exchange with the shared store (Redis) succeeded; 0 while each replica enforces limit / N alone.",
        )
        .expect("valid metric");
        let replicas = IntGauge::new(
            "tollgate_cluster_replicas",
            "Replicas whose heartbeat the shared store saw lately (N).",
        )
        .expect("valid metric");
        let sync_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_cluster_sync_seconds",
                "Time of each exchange with the shared store (heartbeat and keys), successful or not.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        )
        .expect("valid metric");
        let sync_keys = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_cluster_sync_keys",
                "Keys reported to the shared store per exchange.",
            )
            .buckets(vec![0.0, 1.0, 10.0, 100.0, 1000.0, 10_000.0, 100_000.0]),
        )
        .expect("valid metric");
        let calls = IntCounter::new(
            "tollgate_cluster_redis_calls_total",
            "Script calls sent to the shared store (one heartbeat per exchange; one per key on a Redis Cluster, one per 128 keys on a single Redis).",
        )
        .expect("valid metric");
        let errors = IntCounter::new(
            "tollgate_cluster_sync_errors_total",
            "Exchanges with the shared store that failed or timed out.",
        )
        .expect("valid metric");
        for c in [
            Box::new(up.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(replicas.clone()),
            Box::new(sync_seconds.clone()),
            Box::new(sync_keys.clone()),
            Box::new(calls.clone()),
            Box::new(errors.clone()),
        ] {
            metrics.register(c);
        }
        up.set(1);
        Self {
            up,
            replicas,
            sync_seconds,
            sync_keys,
            calls,
            errors,
        }
    }
}

/// A connection to a single Redis (reconnecting by itself) or to a Redis Cluster.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// Run a script invocation on whichever connection this is.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        inv: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        match self.clone() {
            Conn::Single(mut c) => inv.invoke_async(&mut c).await,
            Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
        }
    }
}

/// Connect to the store `cfg` names, within its timeout: a Redis Cluster when the server says
/// `cluster_enabled:1`, else one Redis through a reconnecting connection manager.
pub async fn connect(cfg: &ClusterConfig) -> Result<Conn, Failure> {
    let url = cfg.redis_url.as_str();
    let fail = |e: RedisError| Failure::of(&e, url);
    let t = cfg.timeout;
    let client = Client::open(url).map_err(fail)?;
    let mut probe = client
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(t))
                .set_response_timeout(Some(t)),
        )
        .await
        .map_err(fail)?;
    let info: String = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut probe)
        .await
        .map_err(fail)?;
    if info.contains("cluster_enabled:1") {
        let cluster = redis::cluster::ClusterClient::builder(vec![url])
            .connection_timeout(t)
            .response_timeout(t)
            .retries(0)
            .build()
            .map_err(fail)?;
        let conn = cluster.get_async_connection().await.map_err(fail)?;
        return Ok(Conn::Cluster(conn));
    }
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t))
        .set_response_timeout(Some(t))
        .set_number_of_retries(1)
        .set_max_delay(cfg.sync_interval);
    let manager = ConnectionManager::new_with_config(client, config)
        .await
        .map_err(fail)?;
    Ok(Conn::Single(manager))
}

/// Why an exchange failed, without the URL (which may hold a password).
#[derive(Clone, Debug)]
pub struct Failure(pub String);

impl Failure {
    pub fn of(e: &RedisError, url: &str) -> Self {
        Failure(scrub(&e.to_string(), url))
    }
}

/// The shared store's background service (see the module docs).
pub struct ClusterService {
    cfg: ClusterConfig,
    timing: Timing,
    store: Arc<SharedStore>,
    syncer: Mutex<Syncer>,
    clock: Arc<dyn Clock>,
    /// This process's name in the store: random, so two replicas never share one.
    replica: String,
    fleet_key: String,
    budget: Script,
    heartbeat: Script,
    metrics: ClusterMetrics,
    /// Each key's budget name in the store, computed once (a SHA-256 and a hex string per
    /// key per exchange were half of the exchange's CPU). At most [`NAMES`] entries: past
    /// that it starts again, so memory stays bounded whatever the number of keys.
    names: Mutex<HashMap<Digest, Arc<str>, foldhash::fast::RandomState>>,
}

/// Budget names kept by [`ClusterService`] (about 150 bytes each: 10 MB at most).
const NAMES: usize = 1 << 16;

impl ClusterService {
    /// The store for the policy, and the service that keeps it in step with the fleet.
    pub fn new(
        cfg: ClusterConfig,
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
        let svc = Self {
            fleet_key: fleet_key(&cfg.key_prefix),
            cfg,
            timing,
            store: Arc::clone(&store),
            syncer: Mutex::new(syncer),
            clock,
            replica: replica_id(),
            budget: Script::new(BUDGET_LUA),
            heartbeat: Script::new(HEARTBEAT_LUA),
            metrics: ClusterMetrics::new(metrics),
            names: Mutex::default(),
        };
        (store, svc)
    }

    fn syncer(&self) -> std::sync::MutexGuard<'_, Syncer> {
        // Only this service's one task locks it.
        self.syncer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One heartbeat and every pending key, within `timeout`.
    async fn exchange(
        &self,
        conn: &Conn,
        calls: &[Call],
    ) -> (Result<u32, Failure>, Vec<Option<Reply>>) {
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let fleet = tokio::time::timeout_at(deadline, async {
            let mut inv = self.heartbeat.key(&self.fleet_key);
            inv.arg(&self.replica)
                .arg(self.timing.fleet_horizon().as_millis() as u64);
            self.metrics.calls.inc();
            conn.invoke::<u32>(&inv).await
        })
        .await;
        let fleet = match fleet {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(Failure::of(&e, &self.cfg.redis_url)),
            Err(_) => Err(Failure("no answer within timeout_ms".into())),
        };
        if fleet.is_err() {
            return (fleet, Vec::new());
        }
        let mut replies = Vec::with_capacity(calls.len());
        let mut failure = None;
        for chunk in calls.chunks(CHUNK) {
            let answers = match conn {
                Conn::Single(c) => self.pipelined(c, chunk, deadline).await,
                Conn::Cluster(_) => self.one_by_one(conn, chunk, deadline).await,
            };
            for a in answers {
                match a {
                    Ok((ahead_us, replicas, others_recent)) => replies.push(Some(Reply {
                        ahead_us,
                        replicas,
                        others_recent,
                    })),
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
        (failure.map_or(fleet, Err), replies)
    }

    /// The budget names of `chunk`'s keys, from the cache or computed.
    fn names(&self, chunk: &[Call]) -> Vec<Arc<str>> {
        // Only this service's one task locks it, and never across an await.
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if names.len() + chunk.len() > NAMES {
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

    /// The budget script for `batch` (one key, or several in one slot or on a single Redis).
    fn budget_call<'s>(
        &'s self,
        batch: &[Call],
        names: &[Arc<str>],
        horizon: u64,
        recent: u64,
    ) -> redis::ScriptInvocation<'s> {
        let mut inv = self.budget.prepare_invoke();
        for name in names {
            inv.key(&**name);
        }
        inv.arg(&self.replica)
            .arg(horizon)
            .arg(recent)
            .arg(pack_calls(batch));
        inv
    }

    /// A chunk of budget calls to a single Redis: [`BATCH`] keys per script call, every call
    /// of the chunk in one pipeline (one write, one read), instead of a script call, a future,
    /// a channel message and a timer per key (docs/benchmarks.md, "Part two, everything on",
    /// has the measured effect). A Redis that lost the script (a restart) answers `NOSCRIPT`:
    /// the script is loaded and those batches, and only those (the others have applied their
    /// hits), are sent again.
    async fn pipelined(
        &self,
        conn: &ConnectionManager,
        chunk: &[Call],
        deadline: tokio::time::Instant,
    ) -> Vec<Answer> {
        let horizon = self.timing.key_horizon().as_millis() as u64;
        let recent = self.timing.recent().as_millis() as u64;
        let names = self.names(chunk);
        let batches: Vec<(usize, usize)> = (0..chunk.len())
            .step_by(BATCH)
            .map(|at| (at, (at + BATCH).min(chunk.len())))
            .collect();
        let mut out: Vec<Option<Answer>> = vec![None; chunk.len()];
        let mut todo: Vec<usize> = (0..batches.len()).collect();
        let fail_all = |f: Failure| vec![Err(f); chunk.len()];
        for attempt in 0..2 {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for &b in &todo {
                // EVALSHA sha n KEYS… ARGV… (BUDGET_LUA's layout), as budget_call lays it out.
                let (from, to) = batches[b];
                pipe.cmd("EVALSHA")
                    .arg(self.budget.get_hash())
                    .arg(to - from);
                for name in &names[from..to] {
                    pipe.arg(&**name);
                }
                pipe.arg(&self.replica)
                    .arg(horizon)
                    .arg(recent)
                    .arg(pack_calls(&chunk[from..to]));
            }
            self.metrics.calls.inc_by(todo.len() as u64);
            let mut c = conn.clone();
            let answers = tokio::time::timeout_at(
                deadline,
                pipe.query_async::<Vec<redis::RedisResult<Vec<u8>>>>(&mut c),
            )
            .await;
            let answers = match answers {
                Ok(Ok(a)) if a.len() == todo.len() => a,
                Ok(Ok(_)) => {
                    return fail_all(Failure(
                        "a pipeline answered a different number of replies".into(),
                    ))
                }
                Ok(Err(e)) => return fail_all(Failure::of(&e, &self.cfg.redis_url)),
                Err(_) => return fail_all(Failure("no answer within timeout_ms".into())),
            };
            let mut again = Vec::new();
            for (&b, a) in todo.iter().zip(answers) {
                let (from, to) = batches[b];
                match a {
                    Err(e)
                        if attempt == 0
                            && e.kind()
                                == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        again.push(b);
                    }
                    Err(e) => {
                        let f = Failure::of(&e, &self.cfg.redis_url);
                        out[from..to].fill(Some(Err(f)));
                    }
                    Ok(v) => match unpack_answers(&v, to - from) {
                        Some(answers) => {
                            for (o, a) in out[from..to].iter_mut().zip(answers) {
                                *o = Some(Ok(a));
                            }
                        }
                        None => {
                            let f =
                                Failure("a budget call answered the wrong number of values".into());
                            out[from..to].fill(Some(Err(f)));
                        }
                    },
                }
            }
            if again.is_empty() {
                break;
            }
            let mut c = conn.clone();
            let loaded =
                tokio::time::timeout_at(deadline, self.budget.prepare_invoke().load_async(&mut c))
                    .await;
            let f = match loaded {
                Ok(Ok(_)) => {
                    todo = again;
                    continue;
                }
                Ok(Err(e)) => Failure::of(&e, &self.cfg.redis_url),
                Err(_) => Failure("no answer within timeout_ms".into()),
            };
            for b in again {
                let (from, to) = batches[b];
                out[from..to].fill(Some(Err(f.clone())));
            }
            break;
        }
        out.into_iter()
            .map(|a| a.unwrap_or_else(|| Err(Failure("no answer".into()))))
            .collect()
    }

    /// A chunk of budget calls to a Redis Cluster, one key per script call (the keys' slots
    /// differ), all in flight together.
    async fn one_by_one(
        &self,
        conn: &Conn,
        chunk: &[Call],
        deadline: tokio::time::Instant,
    ) -> Vec<Answer> {
        let horizon = self.timing.key_horizon().as_millis() as u64;
        let recent = self.timing.recent().as_millis() as u64;
        let names = self.names(chunk);
        self.metrics.calls.inc_by(chunk.len() as u64);
        let answers = join_all((0..chunk.len()).map(|i| {
            let conn = conn.clone();
            let inv = self.budget_call(&chunk[i..=i], &names[i..=i], horizon, recent);
            async move { tokio::time::timeout_at(deadline, conn.invoke::<Vec<u8>>(&inv)).await }
        }))
        .await;
        answers
            .into_iter()
            .map(|a| match a {
                Ok(Ok(v)) => match unpack_answers(&v, 1).as_deref() {
                    Some(&[one]) => Ok(one),
                    _ => Err(Failure(
                        "a budget call answered the wrong number of values".into(),
                    )),
                },
                Ok(Err(e)) => Err(Failure::of(&e, &self.cfg.redis_url)),
                Err(_) => Err(Failure("no answer within timeout_ms".into())),
            })
            .collect()
    }

    /// Settle an exchange: views, `N`, up or down, metrics, and a log line on a change.
    fn settle(
        &self,
        batch: Batch,
        outcome: Result<u32, Failure>,
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
        if let Ok(n) = outcome {
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
            (Some(false), Err(Failure(why))) => tracing::warn!(
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

    /// One round: connect if needed, exchange, settle. Whether it succeeded.
    async fn round(&self, conn: &mut Option<Conn>) -> bool {
        let started = Instant::now();
        let batch = self.syncer().begin(self.clock.now());
        if conn.is_none() {
            match tokio::time::timeout(self.cfg.timeout, connect(&self.cfg)).await {
                Ok(Ok(c)) => *conn = Some(c),
                Ok(Err(f)) => return self.settle(batch, Err(f), &[], started),
                Err(_) => {
                    let f = Failure("no connection within timeout_ms".into());
                    return self.settle(batch, Err(f), &[], started);
                }
            }
        }
        let Some(c) = conn.as_ref() else {
            return false;
        };
        let (outcome, replies) = self.exchange(c, &batch.calls).await;
        let ok = self.settle(batch, outcome, &replies, started);
        if !ok {
            // A cluster connection is rebuilt from scratch after a failure; the single
            // connection's manager reconnects by itself.
            if matches!(conn, Some(Conn::Cluster(_))) {
                *conn = None;
            }
        }
        ok
    }
}

#[async_trait]
impl BackgroundService for ClusterService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut conn = None;
        let mut tick = tokio::time::interval(self.cfg.sync_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        let mut next_try = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            }
            if tokio::time::Instant::now() < next_try {
                // The breaker is open: no call; keep only keys with something to say.
                self.syncer().hold(self.clock.now());
                continue;
            }
            if self.round(&mut conn).await {
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
        if failures == 0 && conn.is_some() {
            self.round(&mut conn).await;
        }
    }
}

/// A random id for this process: 16 hex digits from the standard library's random hasher
/// seeds, the process id and the time.
fn replica_id() -> String {
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

    #[test]
    fn calls_and_answers_pack_as_little_endian_words() {
        let calls = [
            Call {
                id: Digest([1; 32]),
                hits: 3,
                interval_us: 66_667,
                floor_us: 0,
            },
            Call {
                id: Digest([2; 32]),
                hits: 0,
                interval_us: 1,
                floor_us: u64::MAX,
            },
        ];
        let packed = pack_calls(&calls);
        assert_eq!(packed.len(), 48);
        assert_eq!(&packed[..8], &3u64.to_le_bytes());
        assert_eq!(&packed[8..16], &66_667u64.to_le_bytes());
        assert_eq!(&packed[40..], &u64::MAX.to_le_bytes());
        // An answer is read the same way: (ahead, replicas, others) per key.
        let answer: Vec<u8> = [7u64, 2, 5, 1 << 40, 1, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(
            unpack_answers(&answer, 2),
            Some(vec![(7, 2, 5), (1 << 40, 1, 0)])
        );
        // Anything but 24 bytes a key is no answer: a short, long or empty reply.
        assert_eq!(unpack_answers(&answer, 1), None);
        assert_eq!(unpack_answers(&answer[..47], 2), None);
        assert_eq!(unpack_answers(&[], 1), None);
        assert_eq!(unpack_answers(&[], 0), Some(vec![]));
        // A replica count past u32 (no store sends one) is held at u32::MAX, not wrapped.
        let huge: Vec<u8> = [0u64, u64::MAX, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        assert_eq!(unpack_answers(&huge, 1), Some(vec![(0, u32::MAX, 0)]));
    }

    #[test]
    fn failures_never_carry_the_password() {
        let e = RedisError::from(std::io::Error::other("auth failed for redis://:s3cret@h"));
        let f = Failure::of(&e, "redis://:s3cret@h:6379");
        assert!(!f.0.contains("s3cret"), "{}", f.0);
    }
}
