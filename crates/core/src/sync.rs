//! One way to take a lock whose last holder panicked.
//!
//! Every `Mutex` of the gateway guards state that a panicking holder leaves usable: counters,
//! queues, caches, a connection slot, the keeper's lists (each change to them is a step that a
//! panic either made or did not). Stopping the process over a poisoned lock would turn one
//! panic into an outage, so a poisoned lock is taken as it is, here, and nowhere else.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// [`Mutex::lock`], a poisoned lock taken as it is.
pub trait Locked<T> {
    /// The guard, whether or not a holder panicked.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Condvar::wait`], a poisoned lock taken as it is.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(PoisonError::into_inner)
}

/// [`Condvar::wait_timeout`] (the guard only), a poisoned lock taken as it is.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    d: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(guard, d)
        .unwrap_or_else(PoisonError::into_inner)
        .0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_whose_holder_panicked_is_taken_as_it_is() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let held = std::sync::Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let mut g = held.lock().unwrap();
            *g = 2;
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), 2);
    }
}
