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

    fn reply(granted: u64, ahead_us: u64) -> Option<Reply> {
        Some(Reply { granted, ahead_us })
    }

    fn lease_of(s: &RateState) -> u64 {
        lease(s.aux().load(Ordering::Relaxed))
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
    fn the_packed_words_hold_a_view_a_count_and_a_lease() {
        let w = pack(123_456_789, 42);
        assert_eq!(unpack(w), (123_456_789, 42));
        assert_eq!(
            unpack(pack((1 << 48) - 1, HIT_MAX)),
            ((1 << 48) - 1, HIT_MAX)
        );
        let aux = 7 | (3 << WANT_SHIFT) | (FIELD_MAX << DEBT_SHIFT);
        assert_eq!((lease(aux), want(aux), debt(aux)), (7, 3, FIELD_MAX));
        assert_eq!(lease(LEASE_MAX | WANT_MASK | DEBT_MASK), LEASE_MAX);
    }

    #[test]
    fn a_key_without_a_lease_parks_and_the_answer_decides_it() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(5);
        let r = rate(40); // T = 250 ms; 40 / 10N = 0: a limit too small for credit
        let s = Arc::<RateState>::default();
        // Three requests, no lease: each waits for the store, none is admitted on a guess.
        for _ in 0..3 {
            let d = store.acquire(&id(1), &s, &r, SEC).unwrap_err();
            assert!(d.unsettled);
        }
        let batch = syncer.begin(SEC, false);
        assert_eq!((batch.calls.len(), batch.parked()), (1, 3));
        assert_eq!(
            (
                batch.calls[0].want,
                batch.calls[0].limit,
                batch.calls[0].interval_us
            ),
            (3, 40, 250_000)
        );
        // Granted: the three take the lease, a fourth parks again.
        let settled = syncer.finish(batch, &[reply(3, 750_000)], SEC);
        assert_eq!((settled.keys, settled.granted), (1, 3));
        for left in (0..3).rev() {
            let q = store.acquire(&id(1), &s, &r, SEC).unwrap();
            assert_eq!(q.remaining, 37 + left);
        }
        assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
        // The store had no room: refused, and until the view says there is room again, no
        // request parks (a spent key costs the store nothing).
        let batch = syncer.begin(SEC, false);
        assert_eq!(batch.calls[0].want, 1);
        syncer.finish(batch, &[reply(0, 10_000_000)], SEC);
        let d = store.acquire(&id(1), &s, &r, SEC).unwrap_err();
        assert!(!d.unsettled);
        assert_eq!(d.retry_after_secs, 1);
        let d = store.acquire(&id(1), &s, &r, SEC + 200 * MS).unwrap_err();
        assert!(!d.unsettled, "still within the view's spent budget");
        assert!(
            store
                .acquire(&id(1), &s, &r, SEC + 250 * MS)
                .unwrap_err()
                .unsettled
        );
    }

    #[test]
    fn a_grant_to_a_parked_request_outlives_a_tick_that_comes_before_the_request_wakes() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(3);
        let r = rate(9); // no credit: 9 / 30 = 0
        let s = Arc::<RateState>::default();
        assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
        let batch = syncer.begin(SEC, false);
        assert_eq!(batch.parked(), 1);
        syncer.finish(batch, &[reply(1, 0)], SEC);
        // A tick before the parked request woke: its target is 0, but the grant stays.
        let batch = syncer.begin(SEC + 100 * MS, true);
        assert!(batch.calls.iter().all(|c| c.give == 0), "{batch:?}");
        syncer.finish(batch, &[], SEC + 100 * MS);
        assert_eq!(lease_of(&s), 1);
        store.acquire(&id(1), &s, &r, SEC + 100 * MS).unwrap();
        // Kept for that one tick only: a grant its request never took goes back at the next
        // (near the end of the budget, as the store says here: no target to keep it).
        assert!(
            store
                .acquire(&id(1), &s, &r, SEC + 100 * MS)
                .unwrap_err()
                .unsettled
        );
        let batch = syncer.begin(SEC + 150 * MS, false);
        syncer.finish(batch, &[reply(1, 4_000_000)], SEC + 150 * MS);
        let batch = syncer.begin(SEC + 200 * MS, true);
        syncer.finish(batch, &[], SEC + 200 * MS);
        assert_eq!(lease_of(&s), 1, "fresh at this tick");
        let batch = syncer.begin(SEC + 300 * MS, true);
        let gave: u64 = batch.calls.iter().map(|c| c.give).sum();
        assert_eq!(gave, 1, "{batch:?}");
    }

    #[test]
    fn a_calm_key_lives_on_credit_and_a_key_with_a_pace_keeps_a_lease_until_idle() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(1);
        let r = rate(1000); // T = 10 ms; the target's cap is L / 20N = 50
        let s = Arc::<RateState>::default();
        // The first request: far from the limit, admitted at once on credit, and owed with
        // the next exchange (here an urgent one, for another key's parked request).
        store.acquire(&id(1), &s, &r, SEC).unwrap();
        let batch = syncer.begin(SEC, false);
        assert_eq!(batch.parked(), 0);
        assert_eq!((batch.calls[0].want, batch.calls[0].debt), (0, 1));
        syncer.finish(batch, &[reply(0, 10_000)], SEC);
        // A tick: one admission in the interval, and the key calm: its credit carries it, no
        // lease is asked for (it would go back unused two ticks later, a call for nothing).
        let batch = syncer.begin(SEC + 100 * MS, true);
        assert!(batch.is_empty(), "{batch:?}");
        syncer.finish(batch, &[], SEC + 100 * MS);
        // Twice in the next interval: the first on credit, the second asks the store.
        store.acquire(&id(1), &s, &r, SEC + 120 * MS).unwrap();
        assert!(
            store
                .acquire(&id(1), &s, &r, SEC + 130 * MS)
                .unwrap_err()
                .unsettled
        );
        // The tick: busy now (two requests), so a lease at the pace's target (2) on top of
        // what was parked.
        let batch = syncer.begin(SEC + 200 * MS, true);
        assert_eq!(
            (
                batch.calls[0].want,
                batch.calls[0].give,
                batch.calls[0].debt
            ),
            (3, 0, 1)
        );
        syncer.finish(batch, &[reply(3, 30_000)], SEC + 200 * MS);
        assert_eq!(
            lease_of(&s),
            3,
            "the parked request's grant, fresh, and the lease"
        );
        store.acquire_now(&id(1), &s, &r, SEC + 200 * MS).unwrap();
        assert_eq!(lease_of(&s), 2);
        // Two more in the interval: taken from the lease, no wait.
        for _ in 0..2 {
            store.acquire(&id(1), &s, &r, SEC + 250 * MS).unwrap();
        }
        let batch = syncer.begin(SEC + 300 * MS, true);
        assert_eq!(batch.calls[0].want, 5, "the pace is now 3: a target of 5");
        syncer.finish(batch, &[reply(5, 50_000)], SEC + 300 * MS);
        // Quiet: the target follows the last two intervals' pace (3, then 0: 5), then keeps
        // one for a second request in an interval while the key was busy lately (the last
        // ten intervals), then none.
        let batch = syncer.begin(SEC + 400 * MS, true);
        assert!(batch.is_empty(), "{batch:?}");
        syncer.finish(batch, &[], SEC + 400 * MS);
        let batch = syncer.begin(SEC + 500 * MS, true);
        assert_eq!((batch.calls[0].want, batch.calls[0].give), (0, 4));
        syncer.finish(batch, &[reply(0, 0)], SEC + 500 * MS);
        assert_eq!(lease_of(&s), 1);
        for k in 6..13 {
            let batch = syncer.begin(SEC + k * 100 * MS, true);
            assert!(batch.is_empty(), "{k}: {batch:?}");
            syncer.finish(batch, &[], SEC + k * 100 * MS);
        }
        let batch = syncer.begin(SEC + 1300 * MS, true);
        assert_eq!((batch.calls[0].want, batch.calls[0].give), (0, 1));
        syncer.finish(batch, &[reply(0, 0)], SEC + 1300 * MS);
        assert_eq!(lease_of(&s), 0);
        // Nothing left to say: the key is dropped.
        let batch = syncer.begin(SEC + 1400 * MS, true);
        assert!(batch.is_empty());
        assert_eq!(syncer.pending(), 0);
    }

    #[test]
    fn a_lease_target_is_capped_at_a_twentieth_of_the_limit_per_replica() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(2);
        let r = rate(1000); // cap: 1000 / 40 = 25
        let s = Arc::<RateState>::default();
        store.acquire(&id(1), &s, &r, SEC).unwrap();
        let batch = syncer.begin(SEC, false);
        assert_eq!(
            (batch.calls[0].want, batch.calls[0].debt),
            (0, 1),
            "an urgent exchange sends what is parked and what is owed"
        );
        syncer.finish(batch, &[reply(0, 10_000)], SEC);
        assert!(syncer.begin(SEC, false).is_empty(), "said once");
        // 100 parked at once (the credit is a quiet key's: the first request since the tick):
        // all asked for, and the target on top at the tick.
        for _ in 0..100 {
            assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
        }
        let batch = syncer.begin(SEC + 100 * MS, true);
        assert_eq!(batch.calls[0].want, 100 + 2);
        syncer.finish(batch, &[reply(102, 0)], SEC + 100 * MS);
        // Decided again, each from the lease its exchange brought.
        for _ in 0..100 {
            store.acquire_now(&id(1), &s, &r, SEC + 100 * MS).unwrap();
        }
        let batch = syncer.begin(SEC + 200 * MS, true);
        assert_eq!(
            batch.calls[0].want,
            25 - 2,
            "topped up to the cap, not to 150"
        );
    }

    #[test]
    fn a_key_whose_plan_changes_asks_with_its_new_limit() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(1);
        let (basic, standard) = (rate(40), rate(70));
        let s = Arc::<RateState>::default();
        store.acquire(&id(1), &s, &basic, SEC).unwrap();
        let batch = syncer.begin(SEC + 100 * MS, true);
        assert_eq!(
            (
                batch.calls[0].want,
                batch.calls[0].debt,
                batch.calls[0].limit
            ),
            (0, 1, 40),
            "a calm key: its credit owed, no lease"
        );
        syncer.finish(batch, &[reply(0, 250_000)], SEC + 100 * MS);
        // Upgraded (an override, or a reload): the interval's first admission hands the key
        // over with its new limit, and the next tick asks with it.
        store
            .acquire(&id(1), &s, &standard, SEC + 150 * MS)
            .unwrap();
        let batch = syncer.begin(SEC + 200 * MS, true);
        assert_eq!(
            (batch.calls[0].limit, batch.calls[0].interval_us),
            (70, standard.micros().interval)
        );
    }

    #[test]
    fn an_interval_s_first_request_goes_on_credit_and_the_lease_keeps_for_the_next() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(1);
        let r = rate(1000); // credit 100, cap 50
        let s = Arc::<RateState>::default();
        // Busy: three in an interval (the first on credit, two parked), then a lease.
        store.acquire(&id(1), &s, &r, SEC).unwrap();
        assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
        assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
        let batch = syncer.begin(SEC, false);
        syncer.finish(batch, &[reply(2, 30_000)], SEC);
        for _ in 0..2 {
            store.acquire_now(&id(1), &s, &r, SEC).unwrap();
        }
        let batch = syncer.begin(SEC + 100 * MS, true);
        assert_eq!(batch.calls[0].want, 5, "a pace of 3: a target of 5");
        syncer.finish(batch, &[reply(5, 80_000)], SEC + 100 * MS);
        // The next interval's first request goes on credit: the lease is kept whole for the
        // requests that follow it, and the credit is owed at the next exchange.
        store.acquire(&id(1), &s, &r, SEC + 110 * MS).unwrap();
        assert_eq!(lease_of(&s), 5);
        store.acquire(&id(1), &s, &r, SEC + 120 * MS).unwrap();
        assert_eq!(lease_of(&s), 4);
        let batch = syncer.begin(SEC + 200 * MS, true);
        assert_eq!(
            (batch.calls[0].debt, batch.calls[0].want),
            (1, 1),
            "the credit owed; the lease topped up to its target, 5"
        );
    }

    #[test]
    fn a_key_refused_here_reserves_what_refills_next_and_spends_it_at_that_pace() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(2);
        let r = rate(100); // T = 100 ms, L·T = 10 s; the lease's cap L / 20N = 2
        let s = Arc::<RateState>::default();
        // A first request on credit; the tick reports it, and the store says the budget is
        // spent (its TAT a whole window ahead: other replicas took it).
        store.acquire(&id(1), &s, &r, SEC).unwrap();
        let batch = syncer.begin(SEC + 100 * MS, true);
        assert_eq!((batch.calls[0].debt, batch.calls[0].early_us), (1, 0));
        syncer.finish(batch, &[reply(0, 10_000_000)], SEC + 100 * MS);
        // Refused here without a call: no wait.
        let e = store.acquire(&id(1), &s, &r, SEC + 150 * MS).unwrap_err();
        assert!(!e.unsettled);
        // The tick asks for the pace's target ahead: what refills within an interval and a
        // half.
        let batch = syncer.begin(SEC + 200 * MS, true);
        let c = batch.calls[0];
        assert_eq!((c.want, c.early_us), (2, 150_000), "{c:?}");
        // One refills within it: granted, the store's TAT 100 ms further.
        syncer.finish(batch, &[reply(1, 10_100_000)], SEC + 200 * MS);
        assert_eq!(lease_of(&s), 1);
        // Not due yet: refused, the lease kept, no wait.
        let e = store.acquire(&id(1), &s, &r, SEC + 250 * MS).unwrap_err();
        assert!(!e.unsettled);
        assert_eq!(lease_of(&s), 1);
        // Due when one process's budget would have refilled it: admitted from the lease.
        store.acquire(&id(1), &s, &r, SEC + 300 * MS).unwrap();
        assert_eq!(lease_of(&s), 0);
        let e = store.acquire(&id(1), &s, &r, SEC + 310 * MS).unwrap_err();
        assert!(!e.unsettled, "refused here again: the view has no room");
        // A lease granted from room is usable at once, all of it, though the grant took the
        // store's TAT to the end of the window (T = 10 ms: the last 30 ms of it).
        let t = Arc::<RateState>::default();
        assert!(store.acquire(&id(2), &t, &rate(1000), SEC).is_ok());
        let batch = syncer.begin(SEC + 400 * MS, true);
        let i = batch.calls.iter().position(|c| c.id == id(2)).unwrap();
        let mut replies = vec![reply(0, 10_000_000); batch.calls.len()];
        replies[i] = reply(3, 9_970_000);
        syncer.finish(batch, &replies, SEC + 400 * MS);
        assert_eq!(lease_of(&t), 3);
        for _ in 0..3 {
            store
                .acquire(&id(2), &t, &rate(1000), SEC + 401 * MS)
                .unwrap();
        }
    }

    #[test]
    fn no_answer_in_time_decides_on_limit_over_n_and_owes_it_to_the_store() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(20);
        let r = rate(100); // T = 100 ms; L / N = 5; 100 / 10N = 0: no credit
        let s = Arc::<RateState>::default();
        assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
        // The wait ran out: decided now, at N × T.
        let admitted = (0..100)
            .filter(|_| store.acquire_now(&id(1), &s, &r, SEC).is_ok())
            .count();
        assert_eq!(admitted, 5);
        // The next exchange carries the debt (and the request still parked).
        let batch = syncer.begin(SEC, false);
        assert_eq!((batch.calls[0].want, batch.calls[0].debt), (1, 5));
        // Lost: the debt is kept for the next tick; the grant, unknown, is not assumed. The
        // view is a whole window ahead (5 admissions at N × T): no room, so no lease is asked
        // for on top (the pace's target, 2, is for a budget with room); but 95 were refused
        // here, so what the budget refills in one and a half intervals (2 of T = 100 ms) is
        // asked for ahead.
        assert_eq!(syncer.finish(batch, &[None], SEC).failed, 1);
        assert!(
            syncer.begin(SEC, false).is_empty(),
            "urgent: nothing parked"
        );
        let batch = syncer.begin(SEC + 100 * MS, true);
        let c = batch.calls[0];
        assert_eq!((c.want, c.debt, c.early_us), (2, 5, 150_000));
    }

    #[test]
    fn with_the_store_down_each_replica_enforces_its_share_and_sends_a_floor_after() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(20);
        let r = rate(100); // no credit (see above)
        let s = Arc::<RateState>::default();
        assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
        let batch = syncer.begin(SEC, false);
        assert_eq!(syncer.finish(batch, &[], SEC).failed, 1);
        assert_eq!(syncer.set_up(false), Some(false));
        // Degraded: L / N = 5 here, no waiting.
        let down = (0..100)
            .filter(|_| store.acquire(&id(1), &s, &r, SEC).is_ok())
            .count();
        assert_eq!(down, 5);
        // Back: the view (a full window ahead: 5 admissions at cost 20) is the floor, and the
        // debt is not sent as well.
        let batch = syncer.begin(SEC, true);
        assert_eq!(batch.calls.len(), 1);
        assert_eq!(
            (batch.calls[0].floor_us, batch.calls[0].debt),
            (10 * 1_000_000, 0)
        );
        syncer.finish(batch, &[reply(0, 10_000_000)], SEC);
        assert_eq!(syncer.set_up(true), Some(true));
        // Recovered: later admissions park again, and exchanges send no floor.
        let later = 11 * SEC;
        assert!(store.acquire(&id(1), &s, &r, later).unwrap_err().unsettled);
        let batch = syncer.begin(later, false);
        assert_eq!((batch.calls[0].want, batch.calls[0].floor_us), (1, 0));
    }

    #[test]
    fn a_quiet_key_gets_credit_once_until_the_store_has_been_told() {
        let (store, mut syncer) = SharedStore::new(timing());
        let r = rate(300); // T = 33.3 ms
        let (a, b) = (Arc::<RateState>::default(), Arc::<RateState>::default());
        // Before the fleet's size is known, no credit: the request asks the store.
        assert!(store.acquire(&id(1), &a, &r, SEC).unwrap_err().unsettled);
        exchange(&mut syncer, SEC, false, |_| reply(0, 0));
        store.set_fleet(30);
        assert_eq!(credit_for(300, 30), 1);
        // Quiet and far from the limit: admitted at once; the next request of the same
        // interval is not quiet, and asks.
        let q = store.acquire(&id(2), &b, &r, SEC).unwrap();
        assert_eq!(q.remaining, 299);
        assert!(store.acquire(&id(2), &b, &r, SEC).unwrap_err().unsettled);
        // The exchange carrying the debt is lost: the debt stays owed, and until the store
        // has it, the key's next quiet request gets no credit.
        let batch = syncer.begin(SEC, false);
        let call = batch.calls.iter().find(|c| c.id == id(2)).unwrap();
        assert_eq!((call.want, call.debt), (1, 1));
        syncer.finish(batch, &[], SEC);
        exchange(&mut syncer, SEC + 100 * MS, true, |_| None);
        assert!(
            store
                .acquire(&id(2), &b, &r, SEC + 150 * MS)
                .unwrap_err()
                .unsettled
        );
        // Told (with the parked request's grant): credit again after the next tick.
        let batch = syncer.begin(SEC + 150 * MS, false);
        let call = batch.calls.iter().find(|c| c.id == id(2)).unwrap();
        assert_eq!((call.want, call.debt), (1, 1));
        let replies: Vec<_> = batch.calls.iter().map(|_| reply(1, 66_666)).collect();
        syncer.finish(batch, &replies, SEC + 150 * MS);
        store.acquire_now(&id(2), &b, &r, SEC + 150 * MS).unwrap();
        exchange(&mut syncer, SEC + 200 * MS, true, |_| reply(0, 66_666));
        assert_eq!(lease_of(&b), 0, "the store granted no lease");
        store.acquire(&id(2), &b, &r, SEC + 250 * MS).unwrap();
        let batch = syncer.begin(SEC + 250 * MS, false);
        let call = batch.calls.iter().find(|c| c.id == id(2)).unwrap();
        assert_eq!((call.want, call.debt), (0, 1), "on credit again");
    }

    #[test]
    fn a_key_the_store_says_is_near_its_limit_gets_no_credit() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(3);
        let r = rate(300); // T = 33.3 ms; credit 10; near: room ≤ 2 × 3 × (5 + 10) = 90
        assert_eq!(near_limit(300, 3), 90);
        let (near, far) = (Arc::<RateState>::default(), Arc::<RateState>::default());
        store.acquire(&id(1), &near, &r, SEC).unwrap();
        store.acquire(&id(2), &far, &r, SEC).unwrap();
        // The store counts the fleet's requests: 8 s of the 10 s window spent for one key
        // (room 60), 1 s for the other (room 270).
        exchange(&mut syncer, SEC, false, |c| {
            reply(0, if c.id == id(1) { 8 * SEC } else { SEC } / 1000)
        });
        exchange(&mut syncer, SEC + 100 * MS, true, |_| None);
        let later = SEC + 150 * MS;
        assert!(
            store
                .acquire(&id(1), &near, &r, later)
                .unwrap_err()
                .unsettled
        );
        store.acquire(&id(2), &far, &r, later).unwrap();
    }

    /// One exchange at `now`, each call answered by `answer`.
    fn exchange(
        syncer: &mut Syncer,
        now: Nanos,
        tick: bool,
        answer: impl Fn(&Call) -> Option<Reply>,
    ) -> Settled {
        let batch = syncer.begin(now, tick);
        let replies: Vec<_> = batch.calls.iter().map(answer).collect();
        syncer.finish(batch, &replies, now)
    }

    #[test]
    fn drained_keys_are_dropped_while_the_store_is_down() {
        let (store, mut syncer) = SharedStore::new(timing());
        store.set_fleet(1);
        let r = rate(100);
        let (a, b) = (Arc::<RateState>::default(), Arc::<RateState>::default());
        syncer.set_up(false);
        for _ in 0..5 {
            store.acquire(&id(1), &a, &r, SEC).unwrap();
        }
        store.acquire(&id(2), &b, &r, SEC).unwrap();
        assert_eq!(syncer.pending(), 2);
        // a's view is 500 ms ahead, b's 100 ms: at 1.2 s only a still has something to say.
        syncer.hold(SEC + 200 * MS);
        assert_eq!(syncer.pending(), 1);
        syncer.hold(3 * SEC);
        assert_eq!(syncer.pending(), 0);
        // Its count went with it, so its next admission hands it over again.
        store.acquire(&id(1), &a, &r, 3 * SEC).unwrap();
        assert_eq!(syncer.pending(), 1);
    }
}
