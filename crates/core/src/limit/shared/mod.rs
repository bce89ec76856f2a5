//! Budgets shared across replicas: every decision local, one atomic operation; the replicas
//! reconcile through a store (Redis) in the background.
//!
//! # The design
//!
//! Each replica keeps, per key, a *view* of the fleet's GCRA: a theoretical arrival time in µs
//! of this process's clock, packed in one word with the count of requests admitted here since
//! the last reconciliation (`view << 16 | hits`). A decision is one compare-and-swap on that
//! word, as in [`LocalStore`](super::LocalStore), except that an admitted request moves the
//! view by `cost × T` rather than `T`:
//!
//! - **fresh** (the key was reconciled within `2 × sync_interval + timeout`): `cost` is the
//!   number of replicas that admitted the key within the key horizon, as the store counted them
//!   at the last reconciliation. With `n` replicas sharing a key evenly, each charging `n × T`
//!   keeps the fleet's pace at `1/T` between reconciliations. Until the second answer after a
//!   cold spell (*warming*), `cost` is at least `N` and the cold cap applies: the first answer
//!   may not count replicas that started on the key in the same interval, whose reports were
//!   still on their way;
//! - **cold** (never reconciled here, or not lately): `cost` is the fleet's size `N` (replicas
//!   whose heartbeat the store saw lately), and at most `cap = max(1, ⌊L / 20N⌋, ⌈S / T⌉)`
//!   requests are admitted here until the key is reconciled (those of an exchange in flight
//!   count until its answer): a replica that has not seen a key lately cannot know that the
//!   others have spent its budget, and the cap bounds what it can give away (`⌈S / T⌉`, one
//!   interval's share at the full rate, is there so that a client sending evenly is never held
//!   by it). A replica alone in the fleet (`N = 1`) has no cap;
//! - **degraded** (the store unreachable): `cost` is `N` and there is no cap: each replica
//!   enforces `L / N` on its own, which is the fallback the contract names.
//!
//! The first admission after a reconciliation sends the key to the [`Syncer`] (a lock-free
//! channel send, once per key per interval). Every `sync_interval` the syncer takes each
//! touched key's hits (an atomic `fetch_and`) and sends them to the store, which applies, in
//! one single-key script and with the store's own clock, `tat = max(tat, now) + hits × T` and
//! answers how far `tat` is ahead of its `now`, how many replicas admitted the key within the
//! horizon, and what the others last reported. The replica re-anchors its view there:
//! `view = now + ahead + lag × T + p × n × T`, where `p` is what it admitted while the answer
//! was on its way and `lag` the lag allowance ([`SharedStore`]'s `anchor`). Clocks never cross the wire (only
//! distances from each side's own `now`), so the replicas' clocks need not agree with each
//! other or with the store's.
//!
//! When the store comes back after an outage, the first exchange for each key sends the view's
//! distance ahead of `now` as a *floor* instead of its hits (`tat = max(tat, now + floor)`):
//! what was admitted under `L / N` is neither forgotten (which would let the fleet admit a
//! second window's worth) nor counted twice.
//!
//! # Accuracy, and why
//!
//! Against one process that sees the merged traffic, the fleet can admit more than it only
//! where a replica decides on a view that lacks admissions made elsewhere:
//!
//! 1. *Lag.* A fresh view lacks what the other replicas admitted since their last exchange and
//!    this one's: at most one interval plus a round trip of the fleet's traffic. While the
//!    budget is spent that traffic is at most the fleet's pace `1/T`, so the excess held at any
//!    instant is at most `(S + rtt) / T` requests, `L × (S + rtt) / W` (1 % of `L` at the
//!    defaults); it is charged to the store when it is reported and repaid by every replica's
//!    next view, so it does not accumulate from window to window.
//! 2. *Cold replicas.* A replica that has not reconciled a key admits at most `cap` requests
//!    on it before it has: at most `N × cap` in all, `max(N, L / 20, N × S / T)`: 5 % of `L`, or
//!    `N × S / W` = 3 % for three replicas at the defaults, or `N` requests for small limits.
//! 3. *Weights that lag the split.* `n` counts the replicas that served the key within the
//!    horizon, not their shares: a replica with a small share charges more than its share
//!    (under-admitting), one with a large share less, and the store's TAT, which counts every
//!    admission once, corrects both at each exchange (again within the lag of 1.).
//!
//! Summed, a window can hold about `N × cap + L × (S + rtt) / W` more than one process would
//! admit, and the long-run rate is the store's, `1/T` (every admission is charged to the store
//! exactly once). Why fresh means two intervals and not longer: a view anchored a second ago
//! misses a burst admitted elsewhere since, and would give away its room a second time.
//!
//! `sim.rs` checks the contract's figures on a discrete-event model of this code against
//! `model::Model` (the store's scripts), with 3 seeds per case by default. With 8 seeds the
//! worst window over one process was 2.5 % of `L` (1 replica: one request of 40), 7.5 % (2),
//! 10.0 % (3), 17.5 % (5) and 40 % (10, at `L` = 40, where the floor of one request per cold
//! replica is 10 of 40); the long run within 0.41 % for up to 3 replicas and 1.46 % for 10;
//! no refusal at 90 % evenly.
//!
//! What the fleet admits *less* than one process: a burst from idle that lands on cold
//! replicas is admitted `cap` at a time until the key is reconciled (within one interval);
//! the rest of the burst gets `Retry-After: 1`.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use super::gcra::{Denied, Quota, Rate};
use super::store::{RateState, Store};
use crate::clock::Nanos;
use crate::digest::Digest;

#[cfg(any(test, feature = "testing"))]
pub mod model;
#[cfg(test)]
mod sim;

/// Bits of the packed word that count admissions since the last exchange.
const HIT_BITS: u32 = 16;
const HIT_MAX: u64 = (1 << HIT_BITS) - 1;
/// The anchor word (`RateState::aux`): `anchored_ms + 1` (0: never) above [`WARMING`] (the
/// first answer after a cold spell) and [`FLIGHT`] (a cold key's exchange in flight), and 16 low
/// bits holding the key's replica count once anchored, or while `FLIGHT` is set the hits that
/// exchange took.
const N_BITS: u32 = 16;
const N_MAX: u64 = (1 << N_BITS) - 1;
const FLIGHT: u64 = 1 << N_BITS;
/// Set by the first answer after a cold spell: `n` may not count replicas whose reports were
/// on their way, so until the next answer the key costs `N`.
const WARMING: u64 = 1 << (N_BITS + 1);
const ANCHOR_SHIFT: u32 = N_BITS + 2;

fn pack(view_us: u64, hits: u64) -> u64 {
    (view_us << HIT_BITS) | hits
}

fn unpack(word: u64) -> (u64, u64) {
    (word >> HIT_BITS, word & HIT_MAX)
}

/// The timings a shared store and its syncer work to (from `cluster:` and `limits:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// `cluster.sync_interval_ms`: how often each replica reconciles.
    pub sync_interval: Duration,
    /// `cluster.timeout_ms`: the longest one exchange with the store may take.
    pub timeout: Duration,
    /// `limits.window_seconds`.
    pub window: Duration,
}

impl Timing {
    /// How long a key's anchor counts as fresh: two intervals and a slow exchange, so that a
    /// key this replica admits on at least every other interval stays fresh.
    ///
    /// Longer would trust views that miss a burst elsewhere: the simulation (`sim.rs`, the
    /// `HotBursts` loads) puts a window at 42 % over one process with 1 s, 7.5 % with this.
    pub fn fresh(&self) -> Duration {
        2 * self.sync_interval + self.timeout
    }

    /// How far back the store counts the replicas that admitted a key: a window, and at least
    /// ten intervals.
    pub fn key_horizon(&self) -> Duration {
        self.window.max(10 * self.sync_interval)
    }

    /// How far back the store sums the other replicas' last reports for the lag allowance: two
    /// intervals.
    pub fn recent(&self) -> Duration {
        2 * self.sync_interval
    }

    /// How far back the store counts the fleet's heartbeats: ten intervals, and at least 1 s.
    pub fn fleet_horizon(&self) -> Duration {
        (10 * self.sync_interval).max(Duration::from_secs(1))
    }
}

/// A key admitted on since the last exchange: what the syncer needs to report it.
#[derive(Debug)]
pub struct Touched {
    /// The key's digest.
    pub id: Digest,
    /// The key's view (the packed TAT and hits) and anchor word.
    pub state: Arc<RateState>,
    /// The key's limit when it was admitted on.
    pub rate: Rate,
}

/// The shared store's request-path half: decisions on the views (see the module's docs).
#[derive(Debug)]
pub struct SharedStore {
    /// Replicas whose heartbeat the store saw within the fleet horizon (0: no heartbeat yet).
    fleet: AtomicU32,
    /// Whether the last exchange with the store succeeded.
    up: AtomicBool,
    fresh_ms: u64,
    sync_us: u64,
    touched: mpsc::Sender<Touched>,
}

impl SharedStore {
    /// A shared store, and the syncer that reconciles it (to be driven by a background task).
    pub fn new(timing: Timing) -> (Arc<Self>, Syncer) {
        let (tx, rx) = mpsc::channel();
        let store = Arc::new(Self {
            fleet: AtomicU32::new(0),
            // Until the first exchange says otherwise, keys are cold (capped) rather than
            // degraded (uncapped): a replica that joins a fleet does not give away budgets.
            up: AtomicBool::new(true),
            fresh_ms: timing.fresh().as_millis() as u64,
            sync_us: (timing.sync_interval.as_micros() as u64).max(1),
            touched: tx,
        });
        let syncer = Syncer {
            store: Arc::clone(&store),
            rx,
            pending: Vec::new(),
            recovering: false,
        };
        (store, syncer)
    }

    /// Replicas seen alive lately (0 before the first heartbeat).
    pub fn fleet(&self) -> u32 {
        self.fleet.load(Ordering::Relaxed)
    }

    /// Record the replicas the store's heartbeat counted (held at least 1).
    pub fn set_fleet(&self, n: u32) {
        self.fleet.store(n.max(1), Ordering::Relaxed);
    }

    /// Whether the last exchange with the store succeeded.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The cost of one admission, in intervals, and how many may be admitted before the next
    /// exchange (`u64::MAX`: no cap), for a key whose anchor word is `aux`.
    #[inline]
    fn weigh(&self, aux: u64, now_us: u64, interval_us: u64, limit: u32) -> (u64, u64) {
        // 0 until the first heartbeat: one, as far as anyone knows, but maybe not alone.
        let seen = self.fleet.load(Ordering::Relaxed);
        let fleet = u64::from(seen.max(1));
        if !self.up.load(Ordering::Relaxed) {
            return (fleet, u64::MAX);
        }
        let fresh = self.is_fresh(aux, now_us);
        if fresh && aux & WARMING == 0 {
            return (aux & N_MAX, u64::MAX);
        }
        if seen == 1 {
            // Alone in the fleet: nobody else spends the budget.
            return (1, u64::MAX);
        }
        let cap = (u64::from(limit) / (20 * fleet))
            .max(self.sync_us.div_ceil(interval_us))
            .max(1);
        if fresh {
            // Warming: the view holds the fleet's budget now, but the others' first reports
            // may still be on their way; `N` a request and the cold cap until the next answer.
            return ((aux & N_MAX).max(fleet), cap);
        }
        // What an exchange in flight took counts against the cap until its answer comes.
        let in_flight = if aux & FLIGHT != 0 { aux & N_MAX } else { 0 };
        (fleet, cap.saturating_sub(in_flight))
    }

    #[inline]
    fn is_fresh(&self, aux: u64, now_us: u64) -> bool {
        let anchored = aux >> ANCHOR_SHIFT;
        anchored != 0 && aux & FLIGHT == 0 && now_us / 1000 + 1 < anchored + self.fresh_ms
    }

    /// Take the hits admitted since the last exchange (they go to the store). On a cold key
    /// they stay counted against its cap until the answer.
    fn take(&self, state: &RateState, now_us: u64) -> u64 {
        let hits = state.tat().fetch_and(!HIT_MAX, Ordering::AcqRel) & HIT_MAX;
        if hits > 0 && !self.is_fresh(state.aux().load(Ordering::Acquire), now_us) {
            let _ = state
                .aux()
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                    let before = if a & FLIGHT != 0 { a & N_MAX } else { 0 };
                    let anchored = a >> ANCHOR_SHIFT << ANCHOR_SHIFT;
                    Some(anchored | FLIGHT | (before + hits).min(N_MAX))
                });
        }
        hits
    }

    /// Give back hits that did not reach the store.
    fn restore(&self, state: &RateState, hits: u64) {
        let _ = state
            .aux()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                (a & FLIGHT != 0).then_some(a >> ANCHOR_SHIFT << ANCHOR_SHIFT)
            });
        if hits == 0 {
            return;
        }
        let _ = state
            .tat()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (view, h) = unpack(w);
                Some(pack(view, (h + hits).min(HIT_MAX)))
            });
    }

    /// How far (µs) the view is ahead of `now_us`.
    fn ahead(&self, state: &RateState, now_us: u64) -> u64 {
        unpack(state.tat().load(Ordering::Acquire))
            .0
            .saturating_sub(now_us)
    }

    /// Re-anchor the view on the store's answer.
    ///
    /// The answer lacks what the other replicas admitted since their own last reports. The view
    /// is charged that as a *lag allowance*: the larger of the others' last reports (the
    /// store's `others_recent`, the hits they reported within the last two intervals: their
    /// pace) and `n − 1` times this replica's own report (their pace if they are ramping up as
    /// this one is, in a burst). It is what keeps replicas from each taking their share of the
    /// same room; in a steady state it is at most one interval's worth of pessimism, which the
    /// next answer replaces.
    fn anchor(&self, state: &RateState, rate: &Rate, now_us: u64, reply: Reply, reported: u64) {
        let n = u64::from(reply.replicas).clamp(1, N_MAX);
        let interval = rate.micros().interval;
        let lag = reply.others_recent.max((n - 1) * reported) * interval;
        let _ = state
            .tat()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (_, p) = unpack(w);
                Some(pack(now_us + reply.ahead_us + lag + p * n * interval, p))
            });
        // An exchange that took a cold key's hits (FLIGHT) ends its cold spell: warming.
        let cold = state.aux().load(Ordering::Acquire) & FLIGHT != 0;
        let warming = if cold { WARMING } else { 0 };
        state.aux().store(
            ((now_us / 1000 + 1) << ANCHOR_SHIFT) | warming | n,
            Ordering::Release,
        );
    }
}

impl Store for SharedStore {
    fn acquire(
        &self,
        id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now: Nanos,
    ) -> Result<Quota, Denied> {
        let now = now / 1000;
        let m = rate.micros();
        let aux = state.aux().load(Ordering::Acquire);
        let (cost, cap) = self.weigh(aux, now, m.interval, rate.limit());
        let mut cur = state.tat().load(Ordering::Acquire);
        loop {
            let (view, hits) = unpack(cur);
            if hits >= cap {
                return Err(rate.denied_after_us(self.sync_us));
            }
            let next = m
                .admit(view, now, cost)
                .map_err(|over| rate.denied_after_us(over))?;
            let word = pack(next, (hits + 1).min(HIT_MAX));
            match state
                .tat()
                .compare_exchange_weak(cur, word, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if hits == 0 {
                        // The first admission since the last exchange: the syncer learns of
                        // the key (it holds the receiver for the process's life).
                        let _ = self.touched.send(Touched {
                            id: *id,
                            state: Arc::clone(state),
                            rate: *rate,
                        });
                    }
                    return Ok(rate.quota_us(next, now));
                }
                Err(actual) => cur = actual,
            }
        }
    }

    fn peek(&self, state: &RateState, rate: &Rate, now: Nanos) -> Quota {
        rate.quota_us(unpack(state.tat().load(Ordering::Acquire)).0, now / 1000)
    }
}

/// The store's name for a key's budget: `<prefix>:b:{<32 hex>}`, the hex being the first 16
/// bytes of SHA-256 over a fixed label and the key's digest. Never the key, nor even its
/// digest (which is the SHA-256 of the key, a fast hash to guess short keys against); the
/// braces are a Redis Cluster hash tag (the whole name is one slot's either way).
pub fn store_key(prefix: &str, id: &Digest) -> String {
    format!("{prefix}:b:{{{}}}", hashed(b"tollgate-cluster-budget:", id))
}

/// 32 hex digits naming a key in a shared store: the first 16 bytes of SHA-256 over `label`
/// and the key's digest. Each use has a label of its own, so no two names coincide.
pub fn hashed(label: &[u8], id: &Digest) -> String {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    h.update(label);
    h.update(id.0);
    hex::encode(&h.finalize()[..16])
}

/// The store's name for the fleet's heartbeats.
pub fn fleet_key(prefix: &str) -> String {
    format!("{prefix}:fleet")
}

/// One key's report to the store: the store's script runs it as
/// `tat = max(tat, now, now + floor_us) + hits × interval_us`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The key's digest (the store's name for it is [`store_key`]).
    pub id: Digest,
    /// Requests admitted here since the last report (0 when the call sends a floor).
    pub hits: u64,
    /// The key's emission interval `T`, in µs.
    pub interval_us: u64,
    /// How far ahead of the store's `now` its TAT must be at least, in µs: the view's distance
    /// ahead on the first exchange after an outage, else 0.
    pub floor_us: u64,
}

/// The store's answer to a [`Call`]: how far its TAT is ahead of its clock, how many replicas
/// admitted the key within the key horizon (this one included), and how many hits the other
/// replicas reported within the last two intervals (their pace, for the lag allowance).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// How far the store's TAT is ahead of the store's clock, in µs.
    pub ahead_us: u64,
    /// Replicas that reported the key within the key horizon, this one included.
    pub replicas: u32,
    /// Hits the other replicas reported within the last two intervals.
    pub others_recent: u64,
}

/// One exchange's worth of keys.
#[derive(Debug, Default)]
pub struct Batch {
    entries: Vec<Touched>,
    taken: Vec<u64>,
    /// What to send, one call per key.
    pub calls: Vec<Call>,
    recovering: bool,
}

impl Batch {
    /// Whether there is no call to send.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Hits taken for this exchange.
    pub fn hits(&self) -> u64 {
        self.taken.iter().sum()
    }
}

/// What an exchange settled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Keys re-anchored.
    pub keys: usize,
    /// Keys whose call did not reach the store (kept for the next exchange).
    pub failed: usize,
}

/// The shared store's background half: collects the touched keys, makes each exchange's
/// calls, and settles the answers. It does no I/O: the runtime (or a test) carries the calls
/// to the store and back.
#[derive(Debug)]
pub struct Syncer {
    store: Arc<SharedStore>,
    rx: mpsc::Receiver<Touched>,
    /// Keys touched and not yet reported.
    pending: Vec<Touched>,
    /// The store was unreachable since the last complete exchange: the next exchange sends
    /// each key's view as a floor rather than its hits.
    recovering: bool,
}

impl Syncer {
    /// The request-path half this syncer reconciles.
    pub fn store(&self) -> &Arc<SharedStore> {
        &self.store
    }

    fn drain(&mut self) {
        while let Ok(t) = self.rx.try_recv() {
            self.pending.push(t);
        }
    }

    /// Keys waiting to be reported.
    pub fn pending(&mut self) -> usize {
        self.drain();
        self.pending.len()
    }

    /// The calls of the next exchange, at `now` of the limiter's clock: each touched key's
    /// hits, taken (a key is reported once however many times it was sent).
    pub fn begin(&mut self, now: Nanos) -> Batch {
        self.drain();
        let now_us = now / 1000;
        // A key can be pending more than once (sent again after a failed exchange). Pointers
        // hash with foldhash: they are not the client's to choose.
        let mut seen: HashSet<*const RateState, foldhash::fast::RandomState> =
            HashSet::with_capacity_and_hasher(self.pending.len(), Default::default());
        let n = self.pending.len();
        let mut batch = Batch {
            recovering: self.recovering,
            entries: Vec::with_capacity(n),
            taken: Vec::with_capacity(n),
            calls: Vec::with_capacity(n),
        };
        // Drained in place: `pending` keeps its capacity for the next interval's keys.
        let mut pending = std::mem::take(&mut self.pending);
        for t in pending.drain(..) {
            if !seen.insert(Arc::as_ptr(&t.state)) {
                continue;
            }
            let hits = self.store.take(&t.state, now_us);
            let (hits_sent, floor_us) = if self.recovering {
                (0, self.store.ahead(&t.state, now_us))
            } else {
                (hits, 0)
            };
            if hits_sent == 0 && floor_us == 0 {
                // Nothing to say: an idle view, or a key already reported.
                continue;
            }
            batch.calls.push(Call {
                id: t.id,
                hits: hits_sent,
                interval_us: t.rate.micros().interval,
                floor_us,
            });
            batch.taken.push(hits);
            batch.entries.push(t);
        }
        self.pending = pending;
        batch
    }

    /// Settle `batch` with an answer per call (`None`, or none at all past the end of
    /// `replies`: it did not reach the store, or its answer did not come back): answered keys
    /// are re-anchored at `now`; the others get their hits back and are kept for the next
    /// exchange. A call that reached the store but whose answer was lost is counted again
    /// next time: the error is toward refusing, never toward admitting.
    pub fn finish(&mut self, batch: Batch, replies: &[Option<Reply>], now: Nanos) -> Settled {
        let now_us = now / 1000;
        let mut settled = Settled::default();
        for (i, (t, hits)) in batch.entries.into_iter().zip(batch.taken).enumerate() {
            match replies.get(i).copied().flatten() {
                Some(reply) => {
                    let reported = if batch.recovering { 0 } else { hits };
                    self.store
                        .anchor(&t.state, &t.rate, now_us, reply, reported);
                    settled.keys += 1;
                }
                None => {
                    self.store.restore(&t.state, hits);
                    self.pending.push(t);
                    settled.failed += 1;
                }
            }
        }
        if settled.failed == 0 && batch.recovering {
            self.recovering = false;
        }
        settled
    }

    /// Record whether the store answered the last exchange (its heartbeat and every call);
    /// `Some(up)` when that changed. Down, each replica enforces `L / N` on its own; the first
    /// exchange after sends floors (see the module's docs).
    pub fn set_up(&mut self, up: bool) -> Option<bool> {
        if !up {
            self.recovering = true;
        }
        let was = self.store.up.swap(up, Ordering::Relaxed);
        (was != up).then_some(up)
    }

    /// While no exchange is tried (the store is down and the breaker open): keys whose view has
    /// drained are dropped (a later admission sends them again), so what is kept is bounded by
    /// the keys active within a window.
    pub fn hold(&mut self, now: Nanos) {
        self.drain();
        let now_us = now / 1000;
        let store = &self.store;
        self.pending.retain(|t| {
            if store.ahead(&t.state, now_us) > 0 {
                return true;
            }
            store.take(&t.state, now_us);
            store.restore(&t.state, 0);
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000 * MS;

    fn timing() -> Timing {
        Timing {
            sync_interval: Duration::from_millis(100),
            timeout: Duration::from_millis(100),
            window: Duration::from_secs(10),
        }
    }

    fn rate(limit: u32) -> Rate {
        Rate::new(
            NonZeroU32::new(limit).unwrap(),
            NonZeroU32::new(10).unwrap(),
        )
    }

    fn id(n: u8) -> Digest {
        Digest([n; 32])
    }

    #[test]
    fn store_names_hold_neither_the_key_nor_its_digest() {
        let key = "sk_live_secret";
        let d = Digest::of(key.as_bytes());
        let name = store_key("tollgate", &d);
        assert!(name.starts_with("tollgate:b:{") && name.ends_with('}'));
        assert_eq!(name.len(), "tollgate:b:{}".len() + 32);
        assert!(!name.contains(key));
        assert!(!name.contains(&hex::encode(d.0)[..16]));
        assert_eq!(name, store_key("tollgate", &d), "stable across replicas");
        assert_ne!(name, store_key("tollgate", &Digest::of(b"other")));
    }

    #[test]
    fn the_packed_word_holds_a_view_and_a_count() {
        let w = pack(123_456_789, 42);
        assert_eq!(unpack(w), (123_456_789, 42));
        assert_eq!(
            unpack(pack((1 << 48) - 1, HIT_MAX)),
            ((1 << 48) - 1, HIT_MAX)
        );
    }

    #[test]
    fn a_cold_key_is_capped_until_it_is_reconciled() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(3);
        let r = rate(1000); // T = 10 ms; cap = max(1000 / 60, 100 ms / 10 ms) = 16
        let s = Arc::<RateState>::default();
        let admitted = (0..100)
            .filter(|_| store.acquire(&id(1), &s, &r, 5 * SEC).is_ok())
            .count();
        assert_eq!(admitted, 16);
        // Each of them cost N = 3 intervals.
        assert_eq!(
            unpack(s.tat().load(Ordering::Relaxed)).0,
            5_000_000 + 16 * 3 * 10_000
        );
        // Reconciled: the store counted 16 hits, one replica.
        let batch = syncer.begin(5 * SEC);
        assert_eq!(batch.calls.len(), 1);
        assert_eq!(batch.calls[0].hits, 16);
        assert_eq!(batch.calls[0].interval_us, 10_000);
        let settled = syncer.finish(
            batch,
            &[Some(Reply {
                ahead_us: 160_000,
                replicas: 1,
                others_recent: 0,
            })],
            5 * SEC,
        );
        assert_eq!(settled.keys, 1);
        // Warming (the first answer after a cold spell): the view holds the fleet's budget,
        // but the others' first reports may have been on their way: N = 3 a request and the
        // cap again, until the next answer.
        let warming = (0..2000)
            .filter(|_| store.acquire(&id(1), &s, &r, 5 * SEC).is_ok())
            .count();
        assert_eq!(warming, 16);
        assert_eq!(
            unpack(s.tat().load(Ordering::Relaxed)).0,
            5_000_000 + 160_000 + 16 * 3 * 10_000
        );
        // The next answer: alone on the key, cost 1; the rest of the budget.
        let batch = syncer.begin(5 * SEC);
        assert_eq!(batch.calls[0].hits, 16);
        syncer.finish(
            batch,
            &[Some(Reply {
                ahead_us: 32 * 10_000,
                replicas: 1,
                others_recent: 0,
            })],
            5 * SEC,
        );
        let more = (0..2000)
            .filter(|_| store.acquire(&id(1), &s, &r, 5 * SEC).is_ok())
            .count();
        assert_eq!(more, 1000 - 32);
    }

    #[test]
    fn a_fresh_key_charges_each_admission_by_the_replicas_on_it() {
        let (store, mut syncer) = SharedStore::new(timing());
        let r = rate(90); // T = 111,112 µs
        let s = Arc::<RateState>::default();
        // Two answers: the first after a cold spell only warms the key up.
        for _ in 0..2 {
            store.acquire(&id(1), &s, &r, SEC).unwrap();
            let batch = syncer.begin(SEC);
            syncer.finish(
                batch,
                &[Some(Reply {
                    ahead_us: 111_112,
                    replicas: 3,
                    others_recent: 0,
                })],
                SEC,
            );
        }
        // 89 left in the fleet; this replica, one of three, gets a third of them until the
        // next exchange.
        let here = (0..100)
            .filter(|_| store.acquire(&id(1), &s, &r, SEC).is_ok())
            .count();
        assert_eq!(here, 29);
    }

    #[test]
    fn hits_admitted_while_an_exchange_is_on_its_way_stay_in_the_view() {
        let (store, mut syncer) = SharedStore::new(timing());
        let r = rate(100); // T = 100 ms
        let s = Arc::<RateState>::default();
        for _ in 0..3 {
            store.acquire(&id(1), &s, &r, SEC).unwrap();
        }
        let batch = syncer.begin(SEC);
        assert_eq!(batch.hits(), 3);
        // Two more before the answer, which counts the three only.
        syncer.set_up(true);
        for _ in 0..2 {
            store.acquire(&id(1), &s, &r, SEC).unwrap();
        }
        syncer.finish(
            batch,
            &[Some(Reply {
                ahead_us: 300_000,
                replicas: 2,
                others_recent: 0,
            })],
            SEC + MS,
        );
        let (view, hits) = unpack(s.tat().load(Ordering::Relaxed));
        assert_eq!(hits, 2);
        // The answer, the lag allowance (the other replica taken to admit as this one did:
        // 3 intervals), and the two in flight at n = 2.
        assert_eq!(view, 1_001_000 + 300_000 + 3 * 100_000 + 2 * 2 * 100_000);
        // And those two go with the next exchange.
        let next = syncer.begin(SEC + 2 * MS);
        assert_eq!(next.calls.len(), 1);
        assert_eq!(next.calls[0].hits, 2);
    }

    #[test]
    fn a_failed_exchange_gives_the_hits_back_and_the_next_sends_the_view_as_a_floor() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(2);
        let r = rate(100); // T = 100 ms; cold cap max(100 / 40, 1) = 2
        let s = Arc::<RateState>::default();
        for _ in 0..2 {
            store.acquire(&id(1), &s, &r, SEC).unwrap();
        }
        let batch = syncer.begin(SEC);
        assert_eq!(syncer.finish(batch, &[], SEC).failed, 1);
        assert_eq!(syncer.set_up(false), Some(false));
        assert_eq!(unpack(s.tat().load(Ordering::Relaxed)).1, 2);
        // Degraded: L / N = 50 here, no cap.
        let down = (0..100)
            .filter(|_| store.acquire(&id(1), &s, &r, SEC).is_ok())
            .count();
        assert_eq!(down, 50 - 2);
        // Back: the view (a full window ahead: 50 admissions at cost 2) is the floor.
        let batch = syncer.begin(SEC);
        assert_eq!(batch.calls.len(), 1);
        assert_eq!(batch.calls[0].hits, 0);
        assert_eq!(batch.calls[0].floor_us, 10 * 1_000_000);
        syncer.finish(
            batch,
            &[Some(Reply {
                ahead_us: 10_000_000,
                replicas: 1,
                others_recent: 0,
            })],
            SEC,
        );
        assert_eq!(syncer.set_up(true), Some(true));
        // Recovered: later exchanges send hits again.
        let later = 11 * SEC;
        store.acquire(&id(1), &s, &r, later).unwrap();
        let batch = syncer.begin(later);
        assert_eq!((batch.calls[0].hits, batch.calls[0].floor_us), (1, 0));
    }

    #[test]
    fn a_key_is_sent_once_per_exchange_and_drained_keys_are_dropped_while_down() {
        let (store, mut syncer) = SharedStore::new(timing());
        let r = rate(100); // T = 100 ms; cold cap max(100 / 20, 1) = 5
        let (a, b) = (Arc::<RateState>::default(), Arc::<RateState>::default());
        let admitted = (0..10)
            .filter(|_| store.acquire(&id(1), &a, &r, SEC).is_ok())
            .count();
        assert_eq!(admitted, 5);
        store.acquire(&id(2), &b, &r, SEC).unwrap();
        assert_eq!(syncer.pending(), 2);
        syncer.set_up(false);
        // a's view is 500 ms ahead, b's 100 ms: at 1.2 s only a still has something to say.
        syncer.hold(SEC + 200 * MS);
        assert_eq!(syncer.pending(), 1);
        syncer.hold(3 * SEC);
        assert_eq!(syncer.pending(), 0);
        // Its hits went with it, so its next admission sends it again.
        assert_eq!(unpack(a.tat().load(Ordering::Relaxed)).1, 0);
        store.acquire(&id(1), &a, &r, 3 * SEC).unwrap();
        assert_eq!(syncer.pending(), 1);
    }
}
