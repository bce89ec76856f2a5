//! How a request that its key's lease cannot decide waits: it runs the urgent round itself, on
//! its own worker thread, and waits for it to settle (or, when a round begun just before took
//! its key and its own has nothing to send, for every round begun before it). It is decided as
//! soon as the round carrying it settles, not after slower rounds begun before it: a grant
//! waiting in the lease for an earlier round could be given back by a tick meanwhile (the
//! simulation found a burst from idle 9 of 40 short when requests waited so).
//!
//! One round trip: the round begins at once (no queue behind a tick or another urgent round in
//! flight: rounds run side by side, each a self-contained batch of the syncer's), and its
//! budget calls and what rides go in flight together on one connection ([`super::exchange`]). No hand-off
//! between threads: the round is a task on the request's own runtime (with Pingora's
//! runtime without work stealing, the request's thread), and so is the connection it uses, one
//! per worker thread, opened in the background on the thread's first wait (until then, and for
//! a round that runs elsewhere, the service's own connection).

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use super::BudgetSync;
use crate::fleet_store::Client;
use crate::sync::Locked;

/// Ids that tell one [`BudgetSync`] from another in a thread's connection slot.
static SERVICES: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's connection for the rounds its requests run, the service it belongs to
    /// and that service's generation of connections: its I/O is driven by this thread's
    /// runtime.
    static HERE: RefCell<Option<(u64, u64, Client)>> = const { RefCell::new(None) };
    /// Whether this thread's connection is being opened.
    static CONNECTING: Cell<bool> = const { Cell::new(false) };
}

/// What a request parked on the shared store waits with (see the module docs). A parked
/// request holds no thread: Pingora's request filter is async.
pub struct Settling {
    /// The service whose rounds a waiting request runs.
    sync: OnceLock<Weak<BudgetSync>>,
    /// This service's id in a thread's connection slot.
    id: u64,
    /// The threads' connections in use: a failed exchange moves it on, and each thread opens
    /// a new one (a connection idle while the store was down would fail its first call after
    /// the store came back, and mark it down again).
    generation: AtomicU64,
    rounds: Mutex<Rounds>,
    /// Bumped each time a round settles (what it settled is in `rounds`).
    done: tokio::sync::watch::Sender<u64>,
    timeout: Duration,
    waits: prometheus::Histogram,
}

/// Rounds numbered in the order they began (under the syncer's lock), and those not settled.
#[derive(Debug, Default)]
struct Rounds {
    begun: u64,
    open: BTreeSet<u64>,
}

impl Rounds {
    fn open(&mut self) -> u64 {
        self.begun += 1;
        self.open.insert(self.begun);
        self.begun
    }

    fn close(&mut self, n: u64) {
        self.open.remove(&n);
    }

    /// Whether a request waiting for round `n` is done waiting: `own`, round `n` carried its
    /// key and has settled; otherwise every round up to `n` has.
    fn settled(&self, n: u64, own: bool) -> bool {
        if n > self.begun {
            return false;
        }
        if own {
            !self.open.contains(&n)
        } else {
            self.open.first().is_none_or(|&first| first > n)
        }
    }
}

impl Settling {
    pub(super) fn new(timeout: Duration, waits: prometheus::Histogram) -> Self {
        Self {
            sync: OnceLock::new(),
            id: SERVICES.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            rounds: Mutex::default(),
            done: tokio::sync::watch::Sender::new(0),
            timeout,
            waits,
        }
    }

    pub(super) fn serve(&self, sync: Weak<BudgetSync>) {
        let _ = self.sync.set(sync);
    }

    /// Every thread's connection is opened anew before its next use (an exchange failed).
    pub(super) fn forget_connections(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.rounds.locked()
    }

    /// Number a round that begins now (called under the syncer's lock, so that numbers follow
    /// the order in which rounds take their batches).
    pub(super) fn open(&self) -> u64 {
        self.rounds().open()
    }

    /// Round `n` settled: wake the requests waiting (the lock on the rounds is released
    /// first: a waiter reads them with the channel's lock held).
    pub(super) fn close(&self, n: u64) {
        self.rounds().close(n);
        self.done.send_modify(|d| *d += 1);
    }

    /// The longest a request waits (`cluster.timeout_ms`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Run an urgent round for this request's key (its `want` was counted before this call,
    /// so the round carries it, or one begun just before did) and wait until it settled (when
    /// it had nothing to send: every earlier one), or until `deadline`: whether in time. With
    /// the store down (or its breaker open) there is no round: at once, `true` (the request is
    /// decided on `limit / N`).
    pub async fn wait(&self, deadline: tokio::time::Instant) -> bool {
        let started = tokio::time::Instant::now();
        let Some(sync) = self.sync.get().and_then(Weak::upgrade) else {
            return false;
        };
        let mut done = self.done.subscribe();
        let settled = match sync.urgent_here() {
            None => true,
            Some((need, own)) => {
                let settled = |_: &u64| self.rounds().settled(need, own);
                tokio::time::timeout_at(deadline, done.wait_for(settled))
                    .await
                    .is_ok_and(|r| r.is_ok())
            }
        };
        self.waits.observe(started.elapsed().as_secs_f64());
        settled
    }
}

impl BudgetSync {
    /// Begin an urgent round for the requests parked now and run it on this runtime (a task of
    /// its own: a request that stops waiting does not cancel it, and what it took from the
    /// syncer is settled whatever happens); its number, and whether it carries anything (else
    /// a round begun just before took this request's key). `None`: the store is down or its
    /// breaker open, and no round is tried.
    fn urgent_here(self: &Arc<Self>) -> Option<(u64, bool)> {
        if !self.store.is_up() || self.breaker_open() {
            return None;
        }
        let started = std::time::Instant::now();
        let (number, batch) = self.begin_round(false);
        // What a request waits for that rides goes with this round unless another round's
        // rider is in flight (one at a time): then that round carries it, as a tick takes
        // every parked count.
        let riding =
            self.rider.get().is_some_and(|r| r.waiting()) && self.riding.try_lock().is_ok();
        if batch.is_empty() && !riding {
            // Its requests were carried by a round begun earlier: wait for every one of them.
            drop(batch);
            self.settling.close(number);
            return Some((number, false));
        }
        self.metrics.parked.inc_by(batch.parked());
        let sync = Arc::clone(self);
        tokio::spawn(async move {
            let mut client = sync.client_here();
            let ok = sync
                .exchange_batch(&mut client, false, batch, started)
                .await;
            sync.record(ok);
            sync.settling.close(number);
        });
        Some((number, true))
    }

    /// The connection for a round run on this thread: the thread's own, else (while it is
    /// opened, in the background) the service's.
    fn client_here(self: &Arc<Self>) -> Option<Client> {
        let id = self.settling.id;
        let generation = self.settling.generation.load(Ordering::Acquire);
        let here = HERE.with_borrow(|h| {
            h.as_ref()
                .filter(|(of, g, _)| *of == id && *g == generation)
                .map(|(_, _, c)| c.clone())
        });
        if here.is_some() {
            return here;
        }
        if !CONNECTING.replace(true) {
            let sync = Arc::clone(self);
            tokio::spawn(async move {
                if let Ok(c) = crate::fleet_store::connect(&sync.cfg).await {
                    HERE.set(Some((sync.settling.id, generation, c)));
                }
                CONNECTING.set(false);
            });
        }
        self.published()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_waits_for_its_own_round_or_for_every_earlier_one() {
        let mut r = Rounds::default();
        let (a, b, c) = (r.open(), r.open(), r.open());
        // The latest settles first: its own requests are done; one whose key an earlier round
        // took (its own round, `c`, had nothing to send) waits on.
        r.close(c);
        assert!(r.settled(c, true));
        assert!(!r.settled(c, false));
        assert!(!r.settled(a, true) && !r.settled(b, true));
        r.close(a);
        assert!(r.settled(a, true) && !r.settled(c, false));
        r.close(b);
        assert!(r.settled(c, false));
        // A round not begun yet has not settled.
        assert!(!r.settled(c + 1, true) && !r.settled(c + 1, false));
    }
}
