//! Where a key's limiter state lives, and who decides on it.
//!
//! Each key's state is a [`RateState`] kept beside its entry in the key table (no lookup, no
//! lock on the request path) and carried over a reload for keys that remain. A [`Store`]
//! decides on that state with the [`Rate`] arithmetic: [`LocalStore`] keeps each key's budget
//! in this process, one compare-and-swap per decision. A store that shares budgets across
//! processes plugs in behind the same trait: the policy's `decide()` calls only [`Store`].

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::gcra::{Budget, Denied, Rate};
use crate::clock::Nanos;
use crate::digest::Digest;

/// A key's limiter state: the theoretical arrival time, in ns of the limiter's clock
/// ([`LocalStore`]), or a shared store's packed view of the fleet's ([`super::SharedStore`]),
/// with that store's note of when the view was last anchored.
#[derive(Debug, Default)]
pub struct RateState {
    tat: AtomicU64,
    aux: AtomicU64,
    /// The key's quota and ledger counts ([`crate::metering`]), once it has any: kept over a
    /// reload with the rest of its state.
    pub meter: crate::metering::MeterCell,
}

impl crate::metering::MeterHolder for RateState {
    fn meter_cell(&self) -> &crate::metering::MeterCell {
        &self.meter
    }
}

impl RateState {
    /// The theoretical arrival time, for a store to read and update atomically.
    pub fn tat(&self) -> &AtomicU64 {
        &self.tat
    }

    /// A second word for a store's own use (the local store leaves it at 0).
    pub fn aux(&self) -> &AtomicU64 {
        &self.aux
    }
}

/// Decides on a key's budget. Implementations must not block or wait: this runs on the
/// request path, once per authenticated request.
pub trait Store: Send + Sync + fmt::Debug {
    /// Take one request from the budget of the key whose digest is `id` (what names it beyond
    /// this process) and whose state here is `state`, or refuse. A store that shares budgets
    /// may answer [`Denied::unsettled`]: ask again when its next exchange has settled, or
    /// decide at once with [`Store::acquire_now`].
    fn acquire(
        &self,
        id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now: Nanos,
    ) -> Result<Budget, Denied>;

    /// As [`Store::acquire`], but never [`Denied::unsettled`]: decided now on what is known
    /// here (a request that waited for a shared store's answer and got none in time).
    fn acquire_now(
        &self,
        id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now: Nanos,
    ) -> Result<Budget, Denied> {
        self.acquire(id, state, rate, now)
    }

    /// The budget as it stands, without taking from it (for answers refused before the limit
    /// step, which still carry the rate-limit headers).
    fn peek(&self, state: &RateState, rate: &Rate, now: Nanos) -> Budget;
}

/// Budgets kept in this process: one compare-and-swap on the key's TAT per decision.
///
/// Under contention the CAS may retry, but only because another decision on the same key
/// succeeded (lock-free progress); many threads on one fresh key admit exactly `L`.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalStore;

impl Store for LocalStore {
    fn acquire(
        &self,
        _id: &Digest,
        state: &Arc<RateState>,
        rate: &Rate,
        now: Nanos,
    ) -> Result<Budget, Denied> {
        let mut cur = state.tat.load(Ordering::Acquire);
        loop {
            let next = rate.admit(cur, now)?;
            match state
                .tat
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(rate.budget(next, now)),
                Err(actual) => cur = actual,
            }
        }
    }

    fn peek(&self, state: &RateState, rate: &Rate, now: Nanos) -> Budget {
        rate.budget(state.tat.load(Ordering::Acquire), now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;
    use std::sync::atomic::AtomicU32;

    const SEC: u64 = 1_000_000_000;

    /// A fresh key's state, decided on by the local store.
    fn state() -> Arc<RateState> {
        Arc::default()
    }

    /// The local store's decisions, written as methods of the state they act on.
    trait Local {
        fn acquire(&self, r: &Rate, now: Nanos) -> Result<Budget, Denied>;
        fn peek(&self, r: &Rate, now: Nanos) -> Budget;
    }

    impl Local for Arc<RateState> {
        fn acquire(&self, r: &Rate, now: Nanos) -> Result<Budget, Denied> {
            LocalStore.acquire(&Digest([7; 32]), self, r, now)
        }
        fn peek(&self, r: &Rate, now: Nanos) -> Budget {
            LocalStore.peek(self, r, now)
        }
    }

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
            let s = state();
            let now = 5 * SEC;
            for i in 0..limit {
                let q = s
                    .acquire(&r, now)
                    .unwrap_or_else(|_| panic!("request {i} of {limit} refused"));
                assert_eq!(q.remaining, limit - i - 1);
            }
            let d = s.acquire(&r, now).unwrap_err();
            assert_eq!(d.budget.remaining, 0);
            assert!(d.retry_after_secs >= 1);
        }
    }

    #[test]
    fn retry_after_is_when_the_next_request_is_admitted() {
        let r = rate(40); // T = 250 ms
        let s = state();
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
            let s = state();
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
            let s = state();
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
        let s = state();
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
        let s = state();
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
            let s = state();
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
        let (a, b) = (state(), state());
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
        let s = state();
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
