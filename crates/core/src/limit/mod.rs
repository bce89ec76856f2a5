//! Rate limiting, in the three parts `governor` separates:
//!
//! | part | where | what |
//! |---|---|---|
//! | the algorithm | [`gcra`] | [`Rate`]: GCRA arithmetic on a key's theoretical arrival time; [`Budget`] and [`Denied`] for the answer |
//! | the state store | [`store`] | [`RateState`] per key, beside its key-table entry; the [`Store`] seam; [`LocalStore`], one compare-and-swap per decision |
//! | budgets shared across replicas | [`shared`] | [`SharedStore`]: one compare-and-swap on a lease of requests Redis granted, or the request waits for an exchange ([`Denied::unsettled`]); [`Syncer`], the I/O-free half that tops leases up and gives them back through Redis in the background |
//! | the clock | [`crate::clock`] | monotonic nanoseconds, injected so tests move time by hand |
//!
//! The policy holds one `Store` and calls it from `decide()`; a store that shares budgets
//! across replicas implements the same trait; the one thing it adds is the answer "not yet"
//! ([`Denied::unsettled`]), which the runtime turns into a wait ([`Store::acquire_now`] after
//! it).

pub mod gcra;
pub mod shared;
pub mod store;

pub use gcra::{Budget, Denied, Rate};
pub use shared::{SharedStore, Syncer, Timing};
pub use store::{LocalStore, RateState, Store};
