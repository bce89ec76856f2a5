//! The GCRA arithmetic: pure functions of a theoretical arrival time and the time now.
//!
//! The limiter is GCRA (the generic cell rate algorithm, as in `governor`), which is a sliding
//! window without the weighting error of a two-window counter. Per key it keeps one `u64`, the
//! theoretical arrival time (TAT) of the next request. For a plan of `L` requests per window `W`,
//! the emission interval is `T = ⌈W / L⌉` and a request at `now` is admitted when
//! `max(TAT, now) + T − now ≤ L·T`, which then becomes the new TAT ([`Rate::admit`]).
//!
//! Nothing here stores anything: where the TAT lives, and how it is updated atomically, is a
//! [`Store`](super::Store)'s business.
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
//! Plan limits may change on reload: the TAT carries over and the new `L` and `T` apply from the
//! next decision. Because the TAT measures time, a key keeps the *share* of its window it has
//! used: half a window spent on Pro is half a window spent on Basic.

use std::num::NonZeroU32;

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
    /// The same arithmetic in µs, for budgets shared across replicas.
    micros: Micros,
}

/// GCRA in whole microseconds, with a cost per request: the shared store's arithmetic
/// ([`super::shared`]), where a TAT must fit 48 bits and Redis keeps time in µs.
///
/// `T` is rounded up to whole µs (at least 1), so the long-run rate stays at most `L / W`; a
/// limit of more than a million requests per second per key is held at a million.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Micros {
    /// `T`, in µs.
    pub interval: u64,
    /// `L·T`, in µs.
    pub tolerance: u64,
}

impl Micros {
    /// The TAT after admitting a request of `cost` intervals at `now` against `tat` (all in
    /// µs), or by how many µs it would pass the tolerance.
    #[inline]
    pub fn admit(&self, tat: u64, now: u64, cost: u64) -> Result<u64, u64> {
        let next = tat.max(now) + cost * self.interval;
        let ahead = next - now;
        if ahead <= self.tolerance {
            Ok(next)
        } else {
            Err(ahead - self.tolerance)
        }
    }

    /// Requests of one interval each that would be admitted at `now`, and µs until one more is.
    pub fn room(&self, tat: u64, now: u64) -> (u32, u64) {
        let ahead = tat.saturating_sub(now);
        if ahead == 0 {
            return ((self.tolerance / self.interval) as u32, 0);
        }
        match self.tolerance.checked_sub(ahead) {
            None => (0, ahead - self.tolerance + self.interval),
            Some(room) => (
                (room / self.interval) as u32,
                self.interval - room % self.interval,
            ),
        }
    }
}

/// What the client may know about its budget (the `RateLimit` header fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Requests per window: the plan's (or the key's own) limit `L`.
    pub limit: u32,
    /// The window `W`, in seconds.
    pub window_secs: u32,
    /// Requests that would be admitted right now.
    pub remaining: u32,
    /// Whole seconds (rounded up) until `remaining` grows; 0 when the budget is full.
    pub reset_secs: u64,
}

/// A refused decision: the budget is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Denied {
    /// The budget as the client sees it: nothing remaining.
    pub budget: Budget,
    /// Whole seconds (rounded up, at least 1) until a request would be admitted.
    pub retry_after_secs: u64,
    /// Not decided yet: a shared store needs its answer on this key first (the request may
    /// wait for it, then be decided again with [`Store::acquire_now`](super::Store::acquire_now)).
    pub unsettled: bool,
}

fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_SEC)
}

impl Rate {
    /// `limit` requests per `window_secs` seconds.
    pub fn new(limit: NonZeroU32, window_secs: NonZeroU32) -> Self {
        let window = u64::from(window_secs.get()) * NANOS_PER_SEC;
        let interval = window.div_ceil(u64::from(limit.get()));
        let micros = interval.div_ceil(1000);
        Self {
            limit,
            window_secs,
            interval,
            tolerance: interval * u64::from(limit.get()),
            micros: Micros {
                interval: micros,
                tolerance: micros * u64::from(limit.get()),
            },
        }
    }

    /// The same limit in µs, for budgets shared across replicas.
    #[inline]
    pub fn micros(&self) -> &Micros {
        &self.micros
    }

    /// A refusal `excess_us` past the tolerance: no request left, and the wait in whole
    /// seconds (at least 1).
    pub fn denied_after_us(&self, excess_us: u64) -> Denied {
        let secs = excess_us.div_ceil(1_000_000).max(1);
        Denied {
            budget: Budget {
                limit: self.limit(),
                window_secs: self.window_secs(),
                remaining: 0,
                reset_secs: secs,
            },
            retry_after_secs: secs,
            unsettled: false,
        }
    }

    /// The budget at `now` (µs) of a shared view whose TAT is `tat` (µs).
    pub fn budget_us(&self, tat: u64, now: u64) -> Budget {
        let (remaining, until_more) = self.micros.room(tat, now);
        Budget {
            limit: self.limit(),
            window_secs: self.window_secs(),
            remaining,
            reset_secs: until_more.div_ceil(1_000_000),
        }
    }

    /// Requests per window (`L`).
    pub fn limit(&self) -> u32 {
        self.limit.get()
    }

    /// The window (`W`), in seconds.
    pub fn window_secs(&self) -> u32 {
        self.window_secs.get()
    }

    /// The emission interval `T`, in ns: the budget one request takes.
    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// The GCRA test of one request at `now` against the key's TAT `tat`: the TAT after
    /// admitting it, or the denial (and then the TAT stays as it is).
    pub fn admit(&self, tat: Nanos, now: Nanos) -> Result<Nanos, Denied> {
        let next = tat.max(now) + self.interval;
        let ahead = next - now;
        if ahead <= self.tolerance {
            return Ok(next);
        }
        let secs = ceil_secs(ahead - self.tolerance).max(1);
        Err(Denied {
            budget: Budget {
                limit: self.limit(),
                window_secs: self.window_secs(),
                remaining: 0,
                reset_secs: secs,
            },
            retry_after_secs: secs,
            unsettled: false,
        })
    }

    /// The budget at `now` of a key whose TAT is `tat`.
    pub fn budget(&self, tat: Nanos, now: Nanos) -> Budget {
        let ahead = tat.saturating_sub(now);
        let (remaining, until_more) = if ahead == 0 {
            (self.limit(), 0)
        } else {
            match self.tolerance.checked_sub(ahead) {
                // A smaller limit since a reload can leave the TAT beyond the tolerance.
                None => (0, ahead - self.tolerance + self.interval),
                Some(room) => (
                    (room / self.interval) as u32,
                    self.interval - room % self.interval,
                ),
            }
        };
        Budget {
            limit: self.limit(),
            window_secs: self.window_secs(),
            remaining,
            reset_secs: ceil_secs(until_more),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = NANOS_PER_SEC;

    fn rate(limit: u32) -> Rate {
        Rate::new(
            NonZeroU32::new(limit).unwrap(),
            NonZeroU32::new(10).unwrap(),
        )
    }

    #[test]
    fn the_interval_is_the_window_over_the_limit_rounded_up() {
        assert_eq!(rate(40).interval(), SEC / 4);
        assert_eq!(rate(3).interval(), 3_333_333_334);
        assert_eq!(rate(1_000_000).interval(), 10_000);
    }

    #[test]
    fn admit_moves_the_tat_by_one_interval_from_now_or_from_the_tat() {
        let r = rate(40);
        // Idle (TAT in the past): from now.
        assert_eq!(r.admit(0, 5 * SEC), Ok(5 * SEC + SEC / 4));
        // Busy (TAT ahead): from the TAT.
        assert_eq!(r.admit(6 * SEC, 5 * SEC), Ok(6 * SEC + SEC / 4));
        // Exactly the tolerance ahead is still admitted; one ns more is not.
        assert_eq!(r.admit(5 * SEC + 10 * SEC - SEC / 4, 5 * SEC), Ok(15 * SEC));
        let d = r.admit(15 * SEC, 5 * SEC).unwrap_err();
        assert_eq!((d.retry_after_secs, d.budget.remaining), (1, 0));
    }

    #[test]
    fn quota_counts_whole_intervals_left_and_rounds_the_wait_up() {
        let r = rate(40);
        assert_eq!(r.budget(0, SEC).remaining, 40);
        assert_eq!(r.budget(0, SEC).reset_secs, 0);
        // Ten intervals spent: 30 left; one more in 250 ms, shown as 1 s.
        let q = r.budget(SEC + 10 * (SEC / 4), SEC);
        assert_eq!((q.remaining, q.reset_secs), (30, 1));
        // A TAT beyond the tolerance (a smaller limit since a reload): nothing left.
        let q = r.budget(SEC + 20 * SEC, SEC);
        assert_eq!((q.remaining, q.reset_secs), (0, 11));
    }
}
