//! The shared store's background half ([`Syncer`]): the keys the request path hands over,
//! each exchange's calls to the store ([`Call`], in a [`Batch`]) and the settling of its
//! answers ([`Reply`], [`Settled`]). The design it carries out is the module's (`mod.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

use super::{
    credit_for, debt, lease, pack, unpack, want, SharedStore, Touched, DEBT_MASK, DEBT_SHIFT,
    FIELD_MAX, HIT_MAX, LEASE_MAX, STARVED, WANT_MASK,
};
use crate::clock::Nanos;
use crate::digest::Digest;
use crate::limit::gcra::Rate;

/// One key's call to the store: the script runs it as `tat = max(tat, now, now + floor) +
/// debt × T`; `tat = max(now, tat − give × T)`; `g = min(want, room)`; `tat += g × T`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The key's digest (the store's name for it is [`store_key`](super::store_key)).
    pub id: Digest,
    /// Requests asked for: those parked, and what tops the lease up to its target.
    pub want: u64,
    /// Requests of the lease given back (granted earlier, not used).
    pub give: u64,
    /// Requests admitted here without the store (no answer in time).
    pub debt: u64,
    /// The key's emission interval `T`, in µs.
    pub interval_us: u64,
    /// The key's limit `L` (the store's room is `L·T` past its `now`).
    pub limit: u64,
    /// How far ahead of the store's `now` its TAT must be at least, in µs: the view's distance
    /// ahead on the first exchange after an outage, else 0.
    pub floor_us: u64,
    /// How far past the store's `now` the room is counted, in µs: requests the budget refills
    /// within this time may be granted ahead (a lease reserved for a key at its limit, used
    /// at the refill's pace), else 0.
    pub early_us: u64,
}

/// The store's answer to a [`Call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Requests granted: the lease grows by them.
    pub granted: u64,
    /// How far the store's TAT is ahead of the store's clock after the call, in µs.
    pub ahead_us: u64,
}

/// One exchange's worth of keys.
#[derive(Debug, Default)]
pub struct Batch {
    entries: Vec<Held>,
    /// What to send, one call per key.
    pub calls: Vec<Call>,
    recovering: bool,
    /// Requests parked whose `want` this exchange carries.
    parked: u64,
}

impl Batch {
    /// Whether there is no call to send.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// Requests asked for in this exchange (parked ones and lease top-ups).
    pub fn wanted(&self) -> u64 {
        self.calls.iter().map(|c| c.want).sum()
    }

    /// Requests parked that this exchange carries.
    pub fn parked(&self) -> u64 {
        self.parked
    }
}

/// What an exchange settled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Keys answered.
    pub keys: usize,
    /// Keys whose call did not reach the store, or whose answer did not come back.
    pub failed: usize,
    /// Requests granted.
    pub granted: u64,
}

/// A key the syncer keeps: its pace here and its lease's target.
#[derive(Debug)]
struct Held {
    t: Touched,
    /// Admissions here in the interval before the last tick (the target counts the last
    /// two).
    pace: u64,
    target: u64,
    /// What the call in flight carries (given back on a failure).
    give: u64,
    debt: u64,
    /// The requests parked that the call in flight asks for.
    parked: u64,
    /// Granted since the last tick to requests parked, which may not have woken to take it
    /// yet: the next tick keeps it out of what goes back.
    fresh: u64,
    /// Ticks since an interval in which this replica admitted the key more than once (at
    /// most [`CALM`]): a key calm that long is carried by its credit, not by a lease.
    calm: u8,
    /// Ticks since an interval in which a request of the key was refused here (at most
    /// [`CALM`]): a key refused in the last two intervals has its lease reserved ahead.
    refused: u8,
}

/// Ticks without an interval of two admissions or more after which a key admitted at most
/// once an interval holds no lease (a second of the default interval).
const CALM: u8 = 10;

/// The shared store's background half: collects the keys, makes each exchange's calls, and
/// settles the answers. It does no I/O: the runtime (or a test) carries the calls to the
/// store and back.
#[derive(Debug)]
pub struct Syncer {
    store: Arc<SharedStore>,
    rx: mpsc::Receiver<Touched>,
    /// Keys with a pace or a lease here (kept until both are gone).
    held: Vec<Held>,
    /// Keys handed over since the last exchange.
    incoming: Vec<Held>,
    /// The store was unreachable since the last complete exchange: the next exchange sends
    /// each key's view as a floor rather than its debt.
    recovering: bool,
    /// Buffers kept from one exchange to the next, empty, with their capacity: with 10,000
    /// keys held a tick's lists are about a megabyte, and allocated afresh each tick they
    /// were fresh pages from the kernel, each a page fault that zeroes a 2 MiB huge page.
    spare: Spare,
}

/// The [`Syncer`]'s reusable buffers (see its `spare`).
#[derive(Debug, Default)]
struct Spare {
    held: Vec<Held>,
    entries: Vec<Held>,
    calls: Vec<Call>,
    /// Keys seen this pass, and each key's latest rate and fresh grants, by the address of
    /// its state.
    seen: HashSet<usize, foldhash::fast::RandomState>,
    latest: HashMap<usize, (Rate, u64), foldhash::fast::RandomState>,
}

impl Spare {
    /// Give memory back when the keys held (`used`) fell far below what the buffers were
    /// grown for: a fleet that once held 100,000 keys and now holds 1,000 does not keep
    /// room for the 100,000.
    fn trim(&mut self, used: usize) {
        let room = used.max(1024);
        if self.held.capacity() > 4 * room {
            self.held.shrink_to(2 * room);
            self.entries.shrink_to(2 * room);
            self.calls.shrink_to(2 * room);
            self.seen.shrink_to(2 * room);
            self.latest.shrink_to(2 * room);
        }
    }
}

impl Syncer {
    /// The syncer of `store`, whose request path hands it keys through `rx`.
    pub(super) fn new(store: Arc<SharedStore>, rx: mpsc::Receiver<Touched>) -> Self {
        Self {
            store,
            rx,
            held: Vec::new(),
            incoming: Vec::new(),
            recovering: false,
            spare: Spare::default(),
        }
    }

    /// The request-path half this syncer reconciles.
    pub fn store(&self) -> &Arc<SharedStore> {
        &self.store
    }

    fn drain(&mut self) {
        while let Ok(t) = self.rx.try_recv() {
            self.incoming.push(Held {
                t,
                pace: 0,
                target: 0,
                give: 0,
                debt: 0,
                parked: 0,
                fresh: 0,
                calm: CALM,
                refused: CALM,
            });
        }
    }

    /// Keys kept (with a pace, a lease, or something to say; a key handed over again since
    /// the last tick counts twice until then).
    pub fn pending(&mut self) -> usize {
        self.drain();
        self.held.len() + self.incoming.len()
    }

    /// The calls of the next exchange, at `now` of the limiter's clock. `tick`: the exchange
    /// of an interval (paces and targets are updated, leases beyond their target given back);
    /// otherwise an urgent one, for requests parked.
    pub fn begin(&mut self, now: Nanos, tick: bool) -> Batch {
        self.drain();
        let mut batch = Batch {
            recovering: self.recovering,
            entries: std::mem::take(&mut self.spare.entries),
            calls: std::mem::take(&mut self.spare.calls),
            ..Batch::default()
        };
        if tick {
            self.held.append(&mut self.incoming);
            self.tick(now, &mut batch);
        } else {
            self.urgent(&mut batch);
        }
        batch
    }

    /// An urgent exchange: only the keys handed over since the last exchange (a request
    /// parked, or a first admission since the tick), each asking for its parked requests, so
    /// that its cost follows the requests that wait, not the keys held.
    fn urgent(&mut self, batch: &mut Batch) {
        let mut seen = std::mem::take(&mut self.spare.seen);
        seen.clear();
        let mut incoming = std::mem::take(&mut self.incoming);
        for h in incoming.drain(..) {
            if !seen.insert(Arc::as_ptr(&h.t.state) as usize) {
                continue;
            }
            let state = &h.t.state;
            let mask = if self.recovering {
                WANT_MASK
            } else {
                WANT_MASK | DEBT_MASK
            };
            let taken = state.aux().fetch_and(!mask, Ordering::AcqRel);
            let (parked, debt) = (want(taken), if self.recovering { 0 } else { debt(taken) });
            if parked == 0 && debt == 0 {
                self.held.push(h);
                continue;
            }
            self.push_call(batch, h, parked, parked, 0, debt, 0, 0);
        }
        self.incoming = incoming;
        self.spare.seen = seen;
    }

    /// A tick: every key held, its pace and target renewed, its lease topped up or given back.
    fn tick(&mut self, now: Nanos, batch: &mut Batch) {
        let now_us = now / 1000;
        let fleet = u64::from(self.store.fleet().max(1));
        // A key can be handed over more than once (every interval's first admission, a request
        // parked); the first, which carries its pace, is kept, with the latest limit (a plan
        // changed by an override or a reload). Pointers hash with foldhash: they are not the
        // client's to choose.
        let mut latest = std::mem::take(&mut self.spare.latest);
        latest.clear();
        for h in &self.held {
            let e = latest
                .entry(Arc::as_ptr(&h.t.state) as usize)
                .or_insert((h.t.rate, 0));
            *e = (h.t.rate, e.1 + h.fresh);
        }
        let mut seen = std::mem::take(&mut self.spare.seen);
        seen.clear();
        let mut held = std::mem::take(&mut self.held);
        let mut kept = std::mem::take(&mut self.spare.held);
        kept.clear();
        for mut h in held.drain(..) {
            let ptr = Arc::as_ptr(&h.t.state) as usize;
            if !seen.insert(ptr) {
                continue;
            }
            // Grants to requests parked since the last tick stay: their requests take them.
            let mut fresh = 0;
            if let Some(&(rate, f)) = latest.get(&ptr) {
                (h.t.rate, fresh) = (rate, f);
            }
            h.fresh = 0;
            let state = &h.t.state;
            let hits = state.tat().fetch_and(!HIT_MAX, Ordering::AcqRel) & HIT_MAX;
            let pace = hits.max(h.pace);
            h.pace = hits;
            // One and a half intervals at the pace of the last two, at most `L / 20N`; none
            // when the store's room, as last answered, is down to what the fleet's leases could
            // hold twice over: near the end of a budget, tokens held unused on one replica
            // would be refused to a request on another (a burst of the limit from idle must
            // pass whole), so they go back and requests ask for what they need.
            let taken = state
                .aux()
                .fetch_and(!(WANT_MASK | DEBT_MASK | STARVED), Ordering::AcqRel);
            let parked = want(taken);
            let owed = debt(taken);
            h.refused = if taken & STARVED != 0 {
                0
            } else {
                h.refused.saturating_add(1).min(CALM)
            };
            let starved = h.refused < 2;
            // Busy: more than one request here in the interval, admitted or parked, or one
            // refused.
            h.calm = if hits + parked > 1 || starved {
                0
            } else {
                h.calm.saturating_add(1).min(CALM)
            };
            let cap = (u64::from(h.t.rate.limit()) / (20 * fleet)).max(1);
            let m = h.t.rate.micros();
            let ahead = unpack(state.tat().load(Ordering::Acquire))
                .0
                .saturating_sub(now_us);
            let room = m.tolerance.saturating_sub(ahead) / m.interval.max(1);
            // A calm key, admitted here at most once an interval for the last `CALM`, is
            // carried by its credit (one request an interval, owed and reported at the tick):
            // a lease for it would be granted, left unused and given back two ticks later,
            // two store calls for one request. A key that lately came twice in an interval
            // keeps its lease (its second request would otherwise wait), and so does a key
            // whose limit gives no credit.
            let credited = pace <= 1
                && h.calm >= CALM
                && credit_for(h.t.rate.limit(), self.store.fleet().into()) > 0;
            // A key refused here in the last two intervals (its demand here passes what its
            // budget refills) is the exception near its end: what the budget refills before
            // the next tick's answer is reserved for it ahead (`early`), and its requests take it
            // at the pace it refills (see `decide`), instead of each asking the store as the
            // view lets it through. Such a lease is used here as soon as it is due (the demand
            // is here), so it idles on this replica no longer than any other lease: until the
            // tick after its demand stops.
            h.target = if starved {
                // Up to one and a half times what the budget refills in an interval, should
                // that pass the cap (a large fleet): the store grants no more than the next
                // interval's refill (`early`), and the half covers a late tick.
                let refill = (3 * self.store.sync_us).div_ceil(2 * m.interval.max(1));
                (pace * 3).div_ceil(2).clamp(1, cap.max(refill))
            } else if room > 2 * fleet * cap && !credited {
                // A key busy here lately keeps one for the second request of an interval
                // (its first goes on credit, where it has one).
                (pace * 3)
                    .div_ceil(2)
                    .max(u64::from(h.calm < CALM))
                    .min(cap)
            } else {
                0
            };
            // One and a half intervals: the next tick's answer comes a round trip (and a late
            // tick) after the interval ends.
            let early_us = if starved {
                self.store.sync_us * 3 / 2
            } else {
                0
            };
            // What the lease holds beyond its target goes back.
            let mut give = 0;
            let mut have = lease(taken);
            let keep = h.target + fresh;
            if have > keep {
                let _ = state
                    .aux()
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                        give = lease(a).saturating_sub(keep);
                        have = lease(a) - give;
                        Some(a - give)
                    });
            }
            let floor_us = if self.recovering {
                unpack(state.tat().load(Ordering::Acquire))
                    .0
                    .saturating_sub(now_us)
            } else {
                0
            };
            // After an outage the floor carries what was admitted without the store.
            let debt = if self.recovering { 0 } else { owed };
            let ask = parked + h.target.saturating_sub(have);
            if ask == 0 && give == 0 && debt == 0 && floor_us == 0 {
                if h.pace > 0 || have > 0 || starved {
                    kept.push(h);
                }
                continue;
            }
            self.push_call(batch, h, ask, parked, give, debt, floor_us, early_us);
        }
        // Nothing was added to `self.held` meanwhile; the drained list is the next spare.
        kept.append(&mut self.held);
        self.held = kept;
        let used = self.held.len();
        self.spare.held = held;
        self.spare.seen = seen;
        self.spare.latest = latest;
        self.spare.trim(used);
    }

    /// Add `h`'s call to `batch`.
    #[allow(clippy::too_many_arguments)]
    fn push_call(
        &self,
        batch: &mut Batch,
        mut h: Held,
        want: u64,
        parked: u64,
        give: u64,
        debt: u64,
        floor_us: u64,
        early_us: u64,
    ) {
        batch.parked += parked;
        batch.calls.push(Call {
            id: h.t.id,
            want,
            give,
            debt,
            interval_us: h.t.rate.micros().interval,
            limit: u64::from(h.t.rate.limit()),
            floor_us,
            early_us,
        });
        h.give = give;
        h.debt = debt;
        h.parked = parked;
        batch.entries.push(h);
    }

    /// Settle `batch` with an answer per call (`None`, or none at all past the end of
    /// `replies`: it did not reach the store, or its answer did not come back): answered keys
    /// get their grant and a new view; the others get their debt back for the next exchange.
    /// A lost answer's grant and give-back are not restored: whether the store applied them
    /// is unknown, and the error must be toward refusing, never toward admitting.
    pub fn finish(&mut self, mut batch: Batch, replies: &[Option<Reply>], now: Nanos) -> Settled {
        let now_us = now / 1000;
        let mut settled = Settled::default();
        for (i, h) in batch.entries.drain(..).enumerate() {
            let state = &h.t.state;
            let mut fresh = 0;
            match replies.get(i).copied().flatten() {
                Some(reply) => {
                    let _ = state
                        .aux()
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                            let l = (lease(a) + reply.granted).min(LEASE_MAX);
                            Some(a - lease(a) + l)
                        });
                    let _ = state
                        .tat()
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                            Some(pack(now_us + reply.ahead_us, unpack(w).1))
                        });
                    settled.keys += 1;
                    settled.granted += reply.granted;
                    fresh = reply.granted.min(h.parked);
                }
                None => {
                    let d = h.debt;
                    let _ = state
                        .aux()
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |a| {
                            Some(
                                a - (debt(a) << DEBT_SHIFT)
                                    + ((debt(a) + d).min(FIELD_MAX) << DEBT_SHIFT),
                            )
                        });
                    settled.failed += 1;
                }
            }
            self.held.push(Held {
                give: 0,
                debt: 0,
                parked: 0,
                fresh: h.fresh + fresh,
                ..h
            });
        }
        if settled.failed == 0 && batch.recovering {
            self.recovering = false;
        }
        batch.calls.clear();
        self.spare.entries = batch.entries;
        self.spare.calls = batch.calls;
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

    /// While no exchange is tried (the store is down and the breaker open): keys with neither
    /// a lease nor a view ahead of `now` are dropped (a later admission hands them over
    /// again), so what is kept is bounded by the keys active within a window.
    pub fn hold(&mut self, now: Nanos) {
        self.drain();
        self.held.append(&mut self.incoming);
        let now_us = now / 1000;
        self.held.retain(|h| {
            let state = &h.t.state;
            if unpack(state.tat().load(Ordering::Acquire)).0 > now_us
                || lease(state.aux().load(Ordering::Acquire)) > 0
            {
                return true;
            }
            state.tat().fetch_and(!HIT_MAX, Ordering::AcqRel);
            state
                .aux()
                .fetch_and(!(WANT_MASK | DEBT_MASK), Ordering::AcqRel);
            false
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_give_memory_back_when_the_keys_held_fall() {
        let mut spare = Spare::default();
        spare.held.reserve(100_000);
        spare.seen.reserve(100_000);
        spare.trim(50_000);
        assert!(spare.held.capacity() >= 100_000, "still in use: kept");
        spare.trim(10);
        assert!(spare.held.capacity() < 10_000, "{}", spare.held.capacity());
        assert!(spare.seen.capacity() < 10_000, "{}", spare.seen.capacity());
    }
}
