//! Budgets shared across replicas: every admission reserved in a store (Redis) the replicas
//! share, so that the fleet admits what one process would; hot keys decide on a local lease
//! with one atomic operation and never wait.
//!
//! # The design: leases
//!
//! The store keeps each key's GCRA: its theoretical arrival time (TAT), on the store's clock.
//! A replica never admits a request the store has not counted. It holds, per key, a *lease*:
//! requests the store has already admitted for it (the TAT moved by `T` for each) and that it
//! has not yet used. A decision ([`SharedStore`]'s `acquire`) is:
//!
//! 1. **on credit**: a key's first request here since the last tick, far from its limit, is
//!    admitted at once and owed to the store (`credit_for`, a quiet key never waits); a lease,
//!    if any, is kept for the requests that follow (a request decided again after its wait
//!    takes what its exchange brought first);
//! 2. **from the lease**: one compare-and-swap takes one, once it is due; admitted, no wait
//!    (a hot key; a lease reserved ahead, below, is due at the pace its budget refills);
//! 3. **refused here**: no lease, and the store's TAT as last answered (the *view*) says the
//!    budget has no room yet; refused with the time until it has, no call (a spent key costs
//!    the store at most one call per `T` and replica, however hard it is hammered);
//! 4. **parked** ([`Denied::unsettled`]): no lease and maybe room; the request asks the store
//!    for one (`want`), the runtime runs an exchange at once and the request waits for its
//!    answer, at most `cluster.timeout_ms`, then is decided again: from the lease the answer
//!    brought, or refused (the store had no room), or, with no answer in time, as if the store
//!    were down;
//! 5. **degraded** (the store unreachable, or no answer within the timeout): `L / N` on the
//!    view, each admission charging `N × T`; what is admitted so is sent to the store later
//!    (as a *debt* of requests, or after an outage as the view's distance ahead, a *floor*).
//!
//! The [`Syncer`] reconciles in the background. Every `sync_interval` (a *tick*), one call per
//! key held that has something to say sends: the requests parked and what tops the lease up to
//! its *target* (`want`); the lease beyond the target (`give`: the store's TAT moves back by
//! `T` each); the debt; the floor; how far ahead the room counts (`early`, below). At once
//! when a request parks (an *urgent* exchange), only the keys handed over since the last
//! exchange are sent, each with its parked requests (and its debt), so that an urgent
//! exchange costs what waits, not what is held. The store's
//! script applies, with its own clock, `tat = max(tat, now, now + floor) + debt × T`,
//! `tat = max(now, tat − give × T)`, grants `g = min(want, room)` with
//! `room = ⌊(now + early + L·T − tat) / T⌋`, moves `tat` by `g × T`, and answers `g` and
//! `tat − now`.
//! Only distances from each side's own `now` cross the wire: clocks need not agree.
//!
//! The target is one and a half times the key's pace here (its admissions in the busier of the
//! last two intervals), at most `cap = max(1, L / 20N)`: enough for a key that keeps its pace
//! never to wait, small enough that leases held unused elsewhere cost little when the budget
//! runs out. A key quiet for two intervals gives its lease back, but for one while it had two
//! requests in one of the last ten (its next interval's second request then waits for
//! nothing: the first goes on credit). Near the end of a
//! budget (the store's room, as last answered, at most `2N × cap`) the target is 0: leases go
//! back and each request asks for itself, so that no token sits unused on one replica while
//! another's request is refused (without this, a burst of exactly the limit over three
//! replicas lost its last request about one time in eight, when a tick fell inside it). What
//! an exchange granted to requests parked is kept from the next tick's give-back (their
//! requests may not have woken to take it yet): *fresh* for that one tick.
//!
//! A key refused here in the last two intervals (its demand here passes its budget's refill:
//! a key at its limit) is the exception: its target is the pace's (at least 1, at most `cap`
//! or an interval and a half's refill, whichever is more), asked for with `early` = an
//! interval and a half, so that the store grants ahead what refills before the next tick's
//! answer. A lease's requests are the last the view counted, so one is due
//! when a request would be admitted against the view without the lease (`view − lease × T`):
//! a reserved lease is spent at the pace one process would admit, and one granted from room
//! at once. Without this, each admission of a key at its limit was a wait for the store.
//!
//! # Accuracy, and why
//!
//! *Upper bound, by construction*: every admission while the store answers was granted by the
//! store's GCRA, which counts every grant once. The fleet's admissions are that GCRA's, each
//! used some time after its grant: a window holds the grants made within it and at most the
//! leases outstanding when it began (reserved ones included), `N × cap` = `max(N, L / 20)`;
//! with the store down,
//! `N × (L / N)`, as before.
//!
//! *Lower bound*: the fleet refuses what one process admits only where the store had no room
//! because of requests granted but not used: leases held elsewhere (at most `N × cap`, given
//! back at the first tick beyond their target), the grants for parked requests whose client
//! left (given back the same way), and tokens the store counted for an answer that was lost.
//! From idle, no lease is held: a burst on any split is granted as it arrives, each request
//! waiting for one exchange (a round trip) or two.
//!
//! `sim.rs` checks both on a discrete-event model of this code against `model::Model` (the
//! store's script), with 3 seeds per case by default.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use super::gcra::{Budget, Denied, Rate};
use super::store::{RateState, Store};
use crate::clock::Nanos;
use crate::digest::Digest;

#[cfg(any(test, feature = "testing"))]
pub mod measure;
#[cfg(any(test, feature = "testing"))]
pub mod model;
#[cfg(test)]
mod sim;
mod syncer;

pub use syncer::{Batch, Call, Reply, Settled, Syncer};

/// Bits of the view word (`RateState::tat`) that count admissions since the last tick.
const HIT_BITS: u32 = 16;
const HIT_MAX: u64 = (1 << HIT_BITS) - 1;
/// The lease word (`RateState::aux`): the lease (24 bits), the requests parked since the last
/// exchange (`want`, 16 bits), the admissions made without the store (`debt`, 16 bits) and
/// whether a request was refused here since the last tick ([`STARVED`]).
const LEASE_MAX: u64 = (1 << 24) - 1;
const WANT_SHIFT: u32 = 24;
const DEBT_SHIFT: u32 = 40;
const FIELD_MAX: u64 = (1 << 16) - 1;
const WANT_MASK: u64 = FIELD_MAX << WANT_SHIFT;
const DEBT_MASK: u64 = FIELD_MAX << DEBT_SHIFT;
/// A request of the key was refused here since the last tick: its demand here passes what
/// the budget refills (a key at its limit), and the tick reserves what refills next for it.
const STARVED: u64 = 1 << 56;

fn pack(view_us: u64, hits: u64) -> u64 {
    (view_us << HIT_BITS) | hits
}

fn unpack(word: u64) -> (u64, u64) {
    (word >> HIT_BITS, word & HIT_MAX)
}

fn lease(aux: u64) -> u64 {
    aux & LEASE_MAX
}

fn want(aux: u64) -> u64 {
    (aux >> WANT_SHIFT) & FIELD_MAX
}

fn debt(aux: u64) -> u64 {
    (aux >> DEBT_SHIFT) & FIELD_MAX
}

/// The timings a shared store and its syncer work to (from `cluster:` and `limits:`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// `cluster.sync_interval_ms`: how often each replica reconciles.
    pub sync_interval: Duration,
    /// `cluster.timeout_ms`: the longest one exchange with the store may take, and the
    /// longest a request waits for one.
    pub timeout: Duration,
    /// `limits.window_seconds`.
    pub window: Duration,
}

impl Timing {
    /// How long the store keeps an idle key's entry past its TAT: a window, and at least ten
    /// intervals.
    pub fn key_horizon(&self) -> Duration {
        self.window.max(10 * self.sync_interval)
    }

    /// How far back the store counts the fleet's heartbeats: ten intervals, and at least 1 s.
    pub fn fleet_horizon(&self) -> Duration {
        (10 * self.sync_interval).max(Duration::from_secs(1))
    }
}

/// A key the request path handed to the syncer: admitted on since the last tick, or parked.
#[derive(Debug)]
pub struct Touched {
    /// The key's digest.
    pub id: Digest,
    /// The key's view and lease words.
    pub state: Arc<RateState>,
    /// The key's limit when it was decided on.
    pub rate: Rate,
}

/// The shared store's request-path half: decisions on the leases (see the module's docs).
#[derive(Debug)]
pub struct SharedStore {
    /// Replicas whose heartbeat the store saw within the fleet horizon (0: no heartbeat yet).
    fleet: AtomicU32,
    /// Whether the last exchange with the store succeeded.
    up: AtomicBool,
    sync_us: u64,
    touched: mpsc::Sender<Touched>,
}

impl SharedStore {
    /// A shared store, and the syncer that reconciles it (to be driven by a background task).
    pub fn new(timing: Timing) -> (Arc<Self>, Syncer) {
        let (tx, rx) = mpsc::channel();
        let store = Arc::new(Self {
            fleet: AtomicU32::new(0),
            // Until the first exchange says otherwise, requests ask the store (and wait at
            // most the timeout) rather than admit on `L / N`.
            up: AtomicBool::new(true),
            sync_us: (timing.sync_interval.as_micros() as u64).max(1),
            touched: tx,
        });
        let syncer = Syncer::new(Arc::clone(&store), rx);
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

    /// Tell the syncer about the key (it holds the receiver for the process's life).
    fn hand_over(&self, id: &Digest, state: &Arc<RateState>, rate: &Rate) {
        let _ = self.touched.send(Touched {
            id: *id,
            state: Arc::clone(state),
            rate: *rate,
        });
    }

    /// Count one admission in the view word's hits (the key's pace); the first since the last
    /// tick hands the key to the syncer. The view, as it was.
    #[inline]
    fn hit(&self, id: &Digest, state: &Arc<RateState>, rate: &Rate) -> u64 {
        let before = state
            .tat()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let (view, h) = unpack(w);
                Some(pack(view, (h + 1).min(HIT_MAX)))
            })
            .unwrap_or_else(|w| w);
        if before & HIT_MAX == 0 {
            self.hand_over(id, state, rate);
        }
        unpack(before).0
    }

    /// Note a refusal here: the first since the last tick hands the key to the syncer, which
    /// then reserves for it what the budget refills next (see [`Syncer`]'s tick).
    #[inline]
    fn starve(&self, id: &Digest, state: &Arc<RateState>, rate: &Rate, aux: u64) {
        if aux & STARVED == 0 && state.aux().fetch_or(STARVED, Ordering::AcqRel) & STARVED == 0 {
            self.hand_over(id, state, rate);
        }
    }

    /// The budget a client sees: its lease here and the room the store last reported.
    fn budget(&self, view: u64, lease: u64, rate: &Rate, now_us: u64) -> Budget {
        let mut q = rate.budget_us(view, now_us);
        q.remaining = q
            .remaining
            .saturating_add(u32::try_from(lease).unwrap_or(u32::MAX));
        q
    }

    /// A request of a key without a lease, admitted on credit at `now_us` if the key is far
    /// from its limit as the store last said and its credit here is not spent: the view moves
    /// by one interval, and the request is owed to the store (a debt, sent with the next
    /// exchange). `None`: the request must ask the store.
    fn credit(
        &self,
        id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now_us: u64,
    ) -> Option<Budget> {
        // Most requests of a busy key stop here: not its first since the tick.
        if state.tat().load(Ordering::Acquire) & HIT_MAX != 0 {
            return None;
        }
        let fleet = u64::from(self.fleet.load(Ordering::Relaxed));
        let c = credit_for(rate.limit(), fleet);
        if c == 0 {
            return None;
        }
        let m = rate.micros();
        let near = near_limit(rate.limit(), fleet);
        // Only a key quiet here (its first admission since the last tick: a burst's first
        // request, not the rest of it) and far from its limit as the store last said.
        let far = |w: u64| {
            let (view, hits) = unpack(w);
            let next = view.max(now_us) + m.interval;
            let room = m.tolerance.saturating_sub(next - now_us) / m.interval.max(1);
            hits == 0 && next - now_us <= m.tolerance && room >= near
        };
        if !far(state.tat().load(Ordering::Acquire)) {
            return None;
        }
        // The credit outstanding here: what this replica admitted on its own since its last
        // exchange carried it.
        state
            .aux()
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                (debt(a) < c).then_some(a + (1 << DEBT_SHIFT))
            })
            .ok()?;
        let mut cur = state.tat().load(Ordering::Acquire);
        loop {
            let (view, hits) = unpack(cur);
            let next = view.max(now_us) + m.interval;
            if !far(cur) {
                // Another request of the key took the quiet moment meanwhile (rare: the check
                // above passed an instant ago): the credit is not taken.
                let _ = state
                    .aux()
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                        (debt(a) > 0).then(|| a - (1 << DEBT_SHIFT))
                    });
                return None;
            }
            match state.tat().compare_exchange_weak(
                cur,
                pack(next, (hits + 1).min(HIT_MAX)),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if hits == 0 {
                        self.hand_over(id, state, rate);
                    }
                    let lease = lease(state.aux().load(Ordering::Acquire));
                    return Some(self.budget(next, lease, rate, now_us));
                }
                Err(actual) => cur = actual,
            }
        }
    }

    fn decide(
        &self,
        id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now: Nanos,
        wait: bool,
    ) -> Result<Budget, Denied> {
        let now = now / 1000;
        let m = rate.micros();
        let up = self.up.load(Ordering::Relaxed);
        // 1. A key's first request here since the tick, far from its limit as the store last
        //    said, within a small credit: admitted at once, owed to the store (a quiet key
        //    never waits), and the lease, if any, kept for the requests that follow it. (A
        //    request decided again after its wait takes what its exchange brought first.)
        if up && wait {
            if let Some(q) = self.credit(id, state, rate, now) {
                return Ok(q);
            }
        }
        // 2. From the lease: the store counted it already. The lease's requests are the last
        //    the store's TAT counted when it granted them (the view), and one is used no
        //    sooner than a request would be admitted against the TAT without them: a lease
        //    reserved ahead for a key at its limit is spent at the pace its budget refills,
        //    and one granted from room is usable at once.
        let mut aux = state.aux().load(Ordering::Acquire);
        while lease(aux) > 0 {
            let view = unpack(state.tat().load(Ordering::Acquire)).0;
            if let Err(over) = m.admit(view.saturating_sub(lease(aux) * m.interval), now, 1) {
                self.starve(id, state, rate, aux);
                return Err(rate.denied_after_us(over));
            }
            match state.aux().compare_exchange_weak(
                aux,
                aux - 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let view = self.hit(id, state, rate);
                    return Ok(self.budget(view, lease(aux) - 1, rate, now));
                }
                Err(actual) => aux = actual,
            }
        }
        let mut cur = state.tat().load(Ordering::Acquire);
        if up {
            // 3. No room as the store last said: refused here, without a call.
            let view = unpack(cur).0;
            if let Err(over) = m.admit(view, now, 1) {
                self.starve(id, state, rate, aux);
                return Err(rate.denied_after_us(over));
            }
            // Decided again after its wait, with nothing from its exchange: on credit, as in
            // 1, if the key is still quiet and far from its limit.
            if !wait {
                if let Some(q) = self.credit(id, state, rate, now) {
                    return Ok(q);
                }
            }
            // 4. Past the credit, or near the limit: ask the store, and wait for its answer.
            if wait {
                let before = state
                    .aux()
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                        Some(if want(a) < FIELD_MAX {
                            a + (1 << WANT_SHIFT)
                        } else {
                            a
                        })
                    })
                    .unwrap_or_else(|a| a);
                if want(before) == 0 {
                    self.hand_over(id, state, rate);
                }
                let mut d = rate.denied_after_us(self.sync_us);
                d.unsettled = true;
                return Err(d);
            }
        }
        // 5. Degraded: `L / N` on the view, owed to the store.
        let cost = u64::from(self.fleet.load(Ordering::Relaxed).max(1));
        loop {
            let (view, hits) = unpack(cur);
            let next = m
                .admit(view, now, cost)
                .map_err(|over| rate.denied_after_us(over))?;
            let word = pack(next, (hits + 1).min(HIT_MAX));
            match state
                .tat()
                .compare_exchange_weak(cur, word, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let _ = state
                        .aux()
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                            (debt(a) < FIELD_MAX).then_some(a + (1 << DEBT_SHIFT))
                        });
                    if hits == 0 {
                        self.hand_over(id, state, rate);
                    }
                    return Ok(rate.budget_us(next, now));
                }
                Err(actual) => cur = actual,
            }
        }
    }
}

impl Store for SharedStore {
    fn acquire(
        &self,
        id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now: Nanos,
    ) -> Result<Budget, Denied> {
        self.decide(id, state, rate, now, true)
    }

    fn acquire_now(
        &self,
        id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now: Nanos,
    ) -> Result<Budget, Denied> {
        self.decide(id, state, rate, now, false)
    }

    fn peek(&self, state: &RateState, rate: &Rate, now: Nanos) -> Budget {
        let view = unpack(state.tat().load(Ordering::Acquire)).0;
        let lease = lease(state.aux().load(Ordering::Acquire));
        self.budget(view, lease, rate, now / 1000)
    }
}

/// Requests of a key a replica may admit on its own between two exchanges that carry them (a
/// key without a lease, far from its limit): `⌊L / 10N⌋`, so that the whole fleet's credit is
/// at most a tenth of the limit; none before the fleet's size is known, nor where the limit is
/// too small for one each.
pub fn credit_for(limit: u32, fleet: u64) -> u64 {
    if fleet == 0 {
        return 0;
    }
    u64::from(limit) / (10 * fleet)
}

/// The store's room (as last answered) at or below which a key is near its limit: no credit
/// is given, and requests ask the store. What the fleet's leases and credits together could
/// hold, twice over.
pub fn near_limit(limit: u32, fleet: u64) -> u64 {
    let n = fleet.max(1);
    let cap = (u64::from(limit) / (20 * n)).max(1);
    2 * n * (cap + credit_for(limit, fleet))
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

#[cfg(test)]
mod tests;
