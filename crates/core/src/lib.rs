//! Tollgate's core: everything that decides what happens to a request, and nothing that moves
//! bytes.
//!
//! | module | what |
//! |---|---|
//! | [`config`] | the YAML file → one validated [`Config`](config::Config) (file, line and field for every error) |
//! | [`policy`] | the decision: [`authenticate`](policy::authenticate) → [`classify`](policy::classify) → [`authorize`](policy::authorize) → limit → [`check the body`](policy::body), composed in [`Policy::decide`](policy::Policy::decide); refusals and outcomes |
//! | [`limit`] | the GCRA arithmetic, the per-key state and the [`Store`](limit::Store) seam |
//! | [`digest`] | the SHA-256 of a key: what is stored and compared instead of the key |
//! | [`clock`] | monotonic nanoseconds, injectable; the only reader of the system's clocks |
//! | [`metering`] | quotas and the usage ledger's counts, per key, without a lock |
//! | [`sync`] | the one way a poisoned lock is taken |
//! | [`refusal`], [`outcome`] | the refusal codes (one table: status, title, outcome) and how a request ended: the ground floor every room names them from |
//! | [`usage`] | per-key counts of the last minute and the latest refusals, for the operator's view |
//!
//! This crate has no Pingora, tokio or network dependency, and `.ci/run` checks that it stays
//! so (`scripts/lint.sh`, for its tests and benches too): the decision is pure and synchronous, time comes in as an
//! argument, and it is unit-tested, property-tested, fuzzed and benchmarked without a server.
//! The `tollgate` crate is the adapter that puts it on the wire.
//!
//! The `testing` feature adds the `testing` module: plain test keys and a typed config builder, for tests
//! and benchmarks only (never in the release binary).

#![deny(rustdoc::broken_intra_doc_links)]

pub mod clock;
pub mod config;
pub mod digest;
pub mod limit;
pub mod metering;
pub mod outcome;
pub mod path;
pub mod policy;
pub mod refusal;
pub mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod usage;
