//! Tollgate: an edge policy gateway for a messaging provider's HTTP API.
//!
//! The request path, in order, is in the numbered files:
//!
//! 1. [`authenticate`] — bearer key → key entry (digests only, constant-time compare)
//! 2. [`classify`] — method + normalized path → route id (ambiguous paths refused)
//! 3. [`authorize`] — credential kind, then the plan's allow-list
//! 4. [`limit`] — the key's 10-second budget (GCRA, one atomic CAS)
//! 5. [`check_body`] — the body shapes the spec gives
//!
//! [`policy`] composes them; [`config`] and [`routes`] feed them. All of it is pure and
//! synchronous, free of Pingora types.
//!
//! 6. [`forward`] — the Pingora layer: runs the steps above, forwards or answers the refusal
//! 7. [`metrics`] — record: counters and histograms per route, plan and outcome
//!
//! Around them: [`live`] (the config in force, swapped whole on reload), [`admin`] (the
//! operators' listener), [`lifecycle`] (readiness, signals, draining) and [`serve`] (the
//! Pingora server that holds it all).

#[path = "1_authenticate.rs"]
pub mod authenticate;
#[path = "3_authorize.rs"]
pub mod authorize;
#[path = "5_check_body.rs"]
pub mod check_body;
#[path = "2_classify.rs"]
pub mod classify;
#[path = "4_limit.rs"]
pub mod limit;

pub mod admin;
pub mod cli;
pub mod clock;
pub mod config;
pub mod demo;
#[path = "6_forward.rs"]
pub mod forward;
pub mod lifecycle;
pub mod live;
pub mod metrics;
pub mod policy;
pub mod refusal;
pub mod routes;
pub mod serve;
pub mod slots;
pub mod testing;
