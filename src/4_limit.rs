//! Step 4 — limit: has this key budget left in its window?
//!
//! The limiter is GCRA (the generic cell rate algorithm, as in `governor`), which is a sliding
//! window without the weighting error of a two-window counter. Per key it keeps one `u64`, the
//! theoretical arrival time (TAT) of the next request, and a decision is one compare-and-swap on
//! it: no lock, no allocation, no per-window reset. For a plan of `L` requests per window `W`,
//! the emission interval is `T = ⌈W / L⌉` and a request at `now` is admitted when
//! `max(TAT, now) + T − now ≤ L·T`, which then becomes the new TAT.
//!
//! # Accuracy
//! - From idle a key gets exactly `L` requests in a burst; the next one is refused.
//! - Any client whose requests are at least `T` apart is never refused (so one sending evenly
//!   at 90 % of its limit never is).
//! - Over any interval of length `D`, at most `L + D / T` requests are admitted: a client
//!   sending faster than its limit for a long time gets its limit, plus at most one window's
//!   worth (`L`), never more. That is the bound of a true sliding window with a burst allowance
//!   of one window; the spec calls the limit approximate.
//! - `T` is rounded up to whole nanoseconds, so the long-run rate is at most `L / W`.
//!
//! Under contention the CAS may retry, but only because another decision on the same key
//! succeeded (lock-free progress); many threads on one fresh key admit exactly `L`.
//! Plan limits may change on reload: the TAT carries over and the new `L` and `T` apply from the
//! next decision. Because the TAT measures time, a key keeps the *share* of its window it has
//! used: half a window spent on Pro is half a window spent on Basic.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::Nanos;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A limit: `limit` requests per `window` seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    limit: NonZeroU32,
    window_secs: NonZeroU32,
    /// Emission interval `T`, in ns.
    interval: u64,
    /// `L·T`, in ns.
    tolerance: u64,
}

impl Rate {
    pub fn new(limit: NonZeroU32, window_secs: NonZeroU32) -> Self {
        let window = u64::from(window_secs.get()) * NANOS_PER_SEC;
        let interval = window.div_ceil(u64::from(limit.get()));
        Self {
            limit,
            window_secs,
            interval,
            tolerance: interval * u64::from(limit.get()),
        }
    }

    pub fn limit(&self) -> u32 {
        self.limit.get()
    }

    pub fn window_secs(&self) -> u32 {
        self.window_secs.get()
    }

    /// What is left when the TAT is `tat_ahead` ns after now: `(remaining, ns until one more)`.
    fn quota(&self, tat_ahead: u64) -> (u32, u64) {
        if tat_ahead == 0 {
            return (self.limit(), 0);
        }
        match self.tolerance.checked_sub(tat_ahead) {
            // A smaller limit since a reload can leave the TAT beyond the tolerance.
            None => (0, tat_ahead - self.tolerance + self.interval),
            Some(room) => {
                let remaining = (room / self.interval) as u32;
                let until_more = self.interval - room % self.interval;
                (remaining, until_more)
            }
        }
    }
}

/// A key's limiter state: the theoretical arrival time, in ns of the limiter's clock.
#[derive(Debug, Default)]
pub struct RateState {
    tat: AtomicU64,
}

/// What the client may know about its budget (the `RateLimit` header fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    pub limit: u32,
    pub window_secs: u32,
    /// Requests that would be admitted right now.
    pub remaining: u32,
    /// Whole seconds (rounded up) until `remaining` grows; 0 when the budget is full.
    pub reset_secs: u64,
}

/// A refused decision: the budget is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    pub quota: Quota,
    /// Whole seconds (rounded up, at least 1) until a request would be admitted.
    pub retry_after_secs: u64,
}

fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_SEC)
}

impl RateState {
    pub fn new() -> Self {
        Self::default()
    }

    /// Take one request from the budget, or refuse. One CAS when uncontended.
    pub fn acquire(&self, rate: &Rate, now: Nanos) -> Result<Quota, Denied> {
        let mut cur = self.tat.load(Ordering::Acquire);
        loop {
            let next = cur.max(now) + rate.interval;
            let ahead = next - now;
            if ahead > rate.tolerance {
                let wait = ahead - rate.tolerance;
                let secs = ceil_secs(wait).max(1);
                return Err(Denied {
                    quota: Quota {
                        limit: rate.limit(),
                        window_secs: rate.window_secs(),
                        remaining: 0,
                        reset_secs: secs,
                    },
                    retry_after_secs: secs,
                });
            }
            match self
                .tat
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let (remaining, until) = rate.quota(ahead);
                    return Ok(Quota {
                        limit: rate.limit(),
                        window_secs: rate.window_secs(),
                        remaining,
                        reset_secs: ceil_secs(until),
                    });
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// The budget as it stands, without taking from it (for answers refused before the limit
    /// step, which still carry the rate-limit headers).
    pub fn peek(&self, rate: &Rate, now: Nanos) -> Quota {
        let ahead = self.tat.load(Ordering::Acquire).saturating_sub(now);
        let (remaining, until) = rate.quota(ahead);
        Quota {
            limit: rate.limit(),
            window_secs: rate.window_secs(),
            remaining,
            reset_secs: ceil_secs(until),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    const SEC: u64 = NANOS_PER_SEC;

    fn rate(limit: u32) -> Rate {
        Rate::new(
            NonZeroU32::new(limit).unwrap(),
            NonZeroU32::new(10).unwrap(),
        )
    }

    #[test]
    fn from_idle_exactly_the_limit_in_a_burst() {
        for limit in [1, 40, 70, 150] {
            let r = rate(limit);
            let s = RateState::new();
            let now = 5 * SEC;
            for i in 0..limit {
                let q = s
                    .acquire(&r, now)
                    .unwrap_or_else(|_| panic!("request {i} of {limit} refused"));
                assert_eq!(q.remaining, limit - i - 1);
            }
            let d = s.acquire(&r, now).unwrap_err();
            assert_eq!(d.quota.remaining, 0);
            assert!(d.retry_after_secs >= 1);
        }
    }

    #[test]
    fn retry_after_is_when_the_next_request_is_admitted() {
        let r = rate(40); // T = 250 ms
        let s = RateState::new();
        for _ in 0..40 {
            s.acquire(&r, 0).unwrap();
        }
        let d = s.acquire(&r, 0).unwrap_err();
        assert_eq!(d.retry_after_secs, 1);
        assert!(s.acquire(&r, 249_999_999).is_err());
        assert!(s.acquire(&r, 250_000_000).is_ok());
        // The refused attempts took nothing.
        assert!(s.acquire(&r, 250_000_000).is_err());
    }

    #[test]
    fn ninety_percent_evenly_is_never_refused() {
        for limit in [40u32, 70, 150] {
            let r = rate(limit);
            let s = RateState::new();
            // 0.9 × limit per 10 s, evenly: one every 10 s / (0.9 × limit).
            let gap = 10 * SEC * 10 / (9 * u64::from(limit));
            let mut now = 1;
            for i in 0..20_000 {
                assert!(
                    s.acquire(&r, now).is_ok(),
                    "limit {limit}: request {i} refused"
                );
                now += gap;
            }
        }
    }

    #[test]
    fn three_times_the_limit_for_a_long_run_stays_within_one_window_of_ideal() {
        for limit in [40u32, 70, 150] {
            let r = rate(limit);
            let s = RateState::new();
            let gap = 10 * SEC / (3 * u64::from(limit));
            let windows = 500u64;
            let end = windows * 10 * SEC;
            let (mut now, mut admitted) = (0u64, 0u64);
            while now < end {
                if s.acquire(&r, now).is_ok() {
                    admitted += 1;
                }
                now += gap;
            }
            let ideal = windows * u64::from(limit);
            let diff = admitted.abs_diff(ideal);
            assert!(
                diff <= u64::from(limit),
                "limit {limit}: admitted {admitted}, ideal {ideal}"
            );
        }
    }

    #[test]
    fn refill_is_gradual_and_full_after_a_window() {
        let r = rate(40);
        let s = RateState::new();
        for _ in 0..40 {
            s.acquire(&r, 0).unwrap();
        }
        assert_eq!(s.peek(&r, 0).remaining, 0);
        assert_eq!(s.peek(&r, 5 * SEC).remaining, 20);
        assert_eq!(s.peek(&r, 10 * SEC).remaining, 40);
        assert_eq!(s.peek(&r, 10 * SEC).reset_secs, 0);
        assert_eq!(s.peek(&r, 100 * SEC).remaining, 40);
    }

    #[test]
    fn peek_takes_nothing() {
        let r = rate(3);
        let s = RateState::new();
        for _ in 0..10 {
            assert_eq!(s.peek(&r, 0).remaining, 3);
        }
        s.acquire(&r, 0).unwrap();
        assert_eq!(s.peek(&r, 0).remaining, 2);
    }

    #[test]
    fn many_threads_on_one_fresh_key_admit_exactly_the_limit() {
        for limit in [40u32, 150, 1000] {
            let r = rate(limit);
            let s = Arc::new(RateState::new());
            let admitted = Arc::new(AtomicU32::new(0));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let (s, admitted) = (Arc::clone(&s), Arc::clone(&admitted));
                    std::thread::spawn(move || {
                        for _ in 0..limit {
                            if s.acquire(&r, 7 * SEC).is_ok() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(admitted.load(Ordering::Relaxed), limit);
        }
    }

    #[test]
    fn one_key_never_touches_another() {
        let r = rate(5);
        let (a, b) = (RateState::new(), RateState::new());
        for _ in 0..100 {
            let _ = a.acquire(&r, 0);
        }
        assert_eq!(b.peek(&r, 0).remaining, 5);
        for _ in 0..5 {
            b.acquire(&r, 0).unwrap();
        }
    }

    #[test]
    fn a_changed_limit_after_reload_applies_to_the_share_of_the_window_used() {
        // The TAT is time, not a count: a key that used half its window at 100 per window has used half
        // of it at 40 too.
        let s = RateState::new();
        for _ in 0..50 {
            s.acquire(&rate(100), 0).unwrap();
        }
        assert_eq!(s.peek(&rate(40), 0).remaining, 20);
        for _ in 0..50 {
            s.acquire(&rate(100), 0).unwrap();
        }
        let small = rate(40);
        assert_eq!(s.peek(&small, 0).remaining, 0);
        assert!(s.acquire(&small, 0).is_err());
    }
}
