//! Time for the rate limiter, injectable so tests move it by hand instead of sleeping.
//!
//! The limiter only needs a monotonic count of nanoseconds from some fixed origin; wall-clock
//! time never enters a decision, so a clock step (NTP, DST) cannot refill or drain a budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Nanoseconds since the clock's origin.
pub type Nanos = u64;

pub trait Clock: Send + Sync + 'static {
    /// Monotonic: never smaller than a value returned before.
    fn now(&self) -> Nanos;
}

/// The process's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}
