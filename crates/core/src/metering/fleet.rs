//! Quotas shared by a fleet (`cluster`): when a replica may charge a key's quota on its own
//! view of the fleet's count, and when it must have the store's word first.
//!
//! A replica's view of a key's count is the fleet's total as the store last answered for it
//! (the keeper's exchange, each tick for a key charged here), plus what it charged since. On
//! its own that view lets every replica spend the same remainder: two replicas that both saw
//! 0 of 3 could admit 3 each. So a request is charged on the view ([`Ticket::Local`]) only
//! where nothing the rest of the fleet can have admitted since the view was taken could reach
//! the quota:
//!
//! | the key here | charged | waits |
//! |---|---|---|
//! | view fresh (the store answered within [`STALE_AFTER_MS`]) and more than the *margin* left | on the view | never |
//! | the store reserved requests for this replica (a *grant*, answering a wait) | one of them | never |
//! | view stale, known before (an earlier answer, or the counts read at start), no blind charge outstanding | on the view, *blind*: the next tick reports it and brings the fleet's count | never |
//! | near the quota (the margin or less left), or stale with a blind charge outstanding, or never known | *parked*: the store reserves what it has room for (`min(wanted, quota − count)`, atomically), and the request takes a grant or is refused | one exchange, at most `timeout_ms` |
//! | the store down, or no answer in time | on the view (as one process would) | — |
//!
//! **The margin.** In the time a fresh view can be old (the staleness allowed, a sync interval
//! and a timeout: `Δ`), the whole fleet admits at most what the key's window allows, `L` from
//! idle and `L · Δ / W` more, and the window's fleet bound adds 10 %: `margin = ⌈1.1 · L ·
//! (1 + Δ / W)⌉ + 1`. Charged on a fresh view with more than that left, the request cannot
//! take the fleet past the quota. Reservations are atomic in the store, so they never do.
//!
//! **The bound.** What can pass the quota is a blind charge that found the quota already spent
//! elsewhere; the answer that reports it says the key is spent, and the replica refuses from
//! then on, blind or not. Hence at most the quota plus one request per replica, whatever the
//! restarts (a replica reads the fleet's counts before it serves, [`FleetQuotas::loaded`]) and
//! however the traffic spreads; with the store down or slow, each replica decides on its view
//! (the window's outage bound applies).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How long a view stays fresh after the store's answer.
pub const STALE_AFTER_MS: u64 = 1_000;

/// The fleet's side of quota decisions (one per process, shared by every policy).
#[derive(Debug, Default)]
pub struct FleetQuotas {
    /// Quotas are shared with a fleet (`cluster`).
    enabled: AtomicBool,
    /// The last exchange with the store succeeded.
    up: AtomicBool,
    /// When the fleet's counts were read whole (at start), ms since the Unix epoch; 0: not.
    loaded_ms: AtomicU64,
    /// The margin's factor, in thousandths of a key's window limit.
    margin_permille: AtomicU64,
}

/// How a request will be charged to its quota, decided before the window limit (a request
/// that must wait for the fleet waits before it takes from its budget).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ticket {
    /// Charged on this replica's view (alone, a fresh view far from the quota, the store
    /// down, or no time left to wait).
    Local,
    /// One of the requests the store reserved for this replica.
    Grant,
    /// Charged on a stale view; reported at the next tick.
    Blind,
    /// Waits for the store to reserve it (one exchange).
    Park,
}

impl FleetQuotas {
    /// Share quotas with a fleet whose window is `window_ms`, synced every `interval_ms` with
    /// exchanges of at most `timeout_ms`.
    pub fn enable(&self, window_ms: u64, interval_ms: u64, timeout_ms: u64) {
        let window = window_ms.max(1);
        let old = STALE_AFTER_MS + interval_ms + timeout_ms;
        self.margin_permille
            .store(1_100 * (window + old) / window, Ordering::Relaxed);
        self.up.store(true, Ordering::Relaxed);
        self.enabled.store(true, Ordering::Release);
    }

    /// Whether quotas are shared with a fleet.
    #[inline]
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Whether the last exchange with the store succeeded (set by the runtime).
    pub fn set_up(&self, up: bool) {
        self.up.store(up, Ordering::Relaxed);
    }

    /// Whether the store answers.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The fleet's counts were read whole at `wall_ms`: every key's view is known from then.
    pub fn loaded(&self, wall_ms: u64) {
        self.loaded_ms.store(wall_ms, Ordering::Relaxed);
    }

    /// When the fleet's counts were read whole (0: not).
    pub fn loaded_ms(&self) -> u64 {
        self.loaded_ms.load(Ordering::Relaxed)
    }

    /// The margin for a key whose window limit is `limit` (see the module's docs).
    pub fn margin(&self, limit: u32) -> u64 {
        u64::from(limit) * self.margin_permille.load(Ordering::Relaxed) / 1000 + 1
    }
}
