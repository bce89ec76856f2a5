//! Rate limiting, in the three parts `governor` separates:
//!
//! | part | where | what |
//! |---|---|---|
//! | the algorithm | [`gcra`] | [`Rate`]: GCRA arithmetic on a key's theoretical arrival time; [`Quota`] and [`Denied`] for the answer |
//! | the state store | [`store`] | [`RateState`] per key, beside its key-table entry; the [`Store`] seam; [`LocalStore`], one compare-and-swap per decision |
//! | budgets shared across replicas | [`shared`] | [`SharedStore`]: the same one compare-and-swap on a view of the fleet's budget; [`Syncer`], the I/O-free half that reconciles views with Redis in the background |
//! | the clock | [`crate::clock`] | monotonic nanoseconds, injected so tests move time by hand |
//!
//! The policy holds one `Store` and calls it from `decide()`; a store that shares budgets
//! across replicas implements the same trait and needs no change to the decision.

pub mod gcra;
pub mod shared;
pub mod store;

pub use gcra::{Denied, Quota, Rate};
pub use shared::{SharedStore, Syncer, Timing};
pub use store::{LocalStore, RateState, Store};
