//! Tollgate: an edge policy gateway for a messaging provider's HTTP API, on Pingora.
//!
//! # The request path
//!
//! In order; each step narrows the request or answers it. The order is written once more, as
//! code, where the steps are composed: [`Policy::decide_for`](policy::Policy::decide_for) for
//! the block and steps 1–4, and [`proxy::Gateway::admit`] (the proxy's `request_filter`) for the whole path.
//!
//! | # | step | where | answers with |
//! |---|---|---|---|
//! | — | admit the connection: caps, TLS handshake, a deadline for every phase | [`edge`] | the connection is closed |
//! | 0 | framing: one `Host`, one `Content-Length`, only `chunked` | [`proxy::head::check_framing`] | 400 `bad_request` |
//! | 0 | head caps; the client address; no upgrades | [`proxy::head::check_size`], [`proxy::head::client`], [`proxy::head::strip_upgrade`] | 431 `headers_too_large` |
//! | 0 | the method: only `GET HEAD POST PUT PATCH DELETE OPTIONS` | [`policy::method`] | 405 `method_not_allowed`, 501 `not_implemented` |
//! | 0 | the client address is not blocked | [`policy::blocking`] | 429 `too_many_auth_failures` |
//! | 1 | authenticate the bearer key | [`policy::authenticate`] | 401 `unauthorized` |
//! | 2 | classify method + normalized path into a route; a checked operation only by its own method and spelling | [`policy::classify`], [`path`] | 400 `invalid_path`, 404 `unknown_route`, 405 `method_not_allowed` |
//! | 3 | authorize: credential kind, then the plan's allow-list | [`policy::authorize`] | 403 `wrong_credential`, `plan_restricted` |
//! | 4 | limit: the key's budget (GCRA, one compare-and-swap) | [`limit`] (through [`limit::Store`]) | 429 `rate_limited` |
//! | 5 | check the body, before any upstream connection, within the body deadline | [`proxy::body`], [`policy::body`], [`policy::webhook`] | 413, 415, 408 `request_timeout`, 400 `invalid_json` / `invalid_body`, 403 `not_your_customer` |
//! | 6 | forward: target, headers, peer | [`proxy::head`], [`proxy::upstream`] | 502 `upstream_unavailable`, 504 `upstream_timeout` ([`proxy::answer`]) |
//! | 7 | record: one access line, the metrics, a recorded request's spans | [`proxy::Gateway`]'s `logging`, [`runtime::metrics`], [`traces`] | — |
//!
//! # The house: floors, and what each may import
//!
//! A module imports only from its own floor and the floors below it; `scripts/floors.sh` (run by
//! `scripts/lint.sh`) fails on an import that goes back up, and `scripts/cycles.py` on a loop
//! between files or rooms, within one floor too.
//!
//! | floor | modules | what | may import |
//! |---|---|---|---|
//! | 0 | [`clock`], [`digest`], [`path`], [`refusal`], [`outcome`], [`sync`] | time, the key's digest, the one path normalizer, the refusal codes and how a request ended, the one way a poisoned lock is taken (the `tollgate-core` crate) | std |
//! | 1 | [`config`], [`metering`], [`limit`] | the validated model (config, catalogue, key names); quota and ledger counts; the rate arithmetic and stores (a key's rate state holds its meter) | floor 0, and the ones before it in the row |
//! | 2 | [`policy`], [`usage`] | the decision; the operator's view of the last minute | floors 0–1 |
//! | 3 | [`runtime`] | the ground of the process: the live snapshot and reload, lifecycle, logging, metrics | the core |
//! | 4 | [`fleet_store`], [`traces`] | the one room that speaks to Redis; the one that speaks to the OpenTelemetry collector (W3C trace context in and out, spans exported off the request path) | the core, [`runtime`] |
//! | 5 | [`state`] | the `state.path` file (redb): its disk's faults, the overrides' tables, the backup | the floors below |
//! | 6 | [`shared`], [`keys`], [`ledger`], [`edge`] | shared budgets' sync; a key's life while it serves (issued keys' secrets, every live change: kept, spread, applied by one owner); quota and ledger counts kept and shared; what runs before a request exists | the floors below |
//! | 7 | [`proxy`], [`admin`] | the Pingora adapter; the admin listener | the floors below |
//! | 8 | [`server`] | the roof: assembles everything above the ground | every floor below |
//! | 9 | [`cli`], [`demo`], [`top`] | the commands | everything |
//!
//! Nothing in the core imports from the adapter: the core is another crate, so it cannot.
//! Setup errors are a [`runtime::SetupError`]; request-path errors are refusals
//! ([`policy::Refusal`]); nothing a request or a config file controls can panic.
//!
//! # One name per thing
//!
//! | concept | its name here | in the config and metrics |
//! |---|---|---|
//! | budgets kept by every replica of a fleet together | *shared budgets*: [`limit::SharedStore`] (the leases), [`shared::BudgetSync`] (the exchange) | the `cluster:` block, `tollgate_cluster_*` |
//! | the requests a key may make in the rolling window, as the `RateLimit` fields tell it | *budget*: [`limit::Budget`] (on [`limit::RateState`], the key's GCRA word) | `requests_per_window`, `limits.window_seconds`; 429 `rate_limited` |
//! | the requests a key may make in a calendar day or month | *quota*: [`metering::QuotaState`] (what a decision read), [`metering::Meter`] (counted on the request path) | `quota:`, `partner_quota`; 429 `quota_exhausted`, `tollgate_quota_exhausted_keys` |
//! | a key's change made while it serves (a partner's upgrade, a suspension, a revocation, a live limit or quota), kept and spread | *key record*: [`policy::overrides::KeyRecord`] (one record a digest: plan, partner, suspended, revoked, limit, quota, an issued key and its rotations), [`keys::KeyChanges`] (the owner of every change: where the records are kept, the set in force), [`runtime::live::KeyHook`] (how a reload hands it a config), [`keys::KeyRef`] (the key a change is for) | `state.path`, `cluster:`; `tollgate_plan_overrides`, `tollgate_admin_changes_total` |
//! | what is in force for a key now, read once a request | [`policy::keys::KeyFlags`] (plan override, expired, suspended, revoked, live limit) | the key's `state` |
//! | the config and key table in force, swapped whole on a reload | *snapshot*: [`runtime::live::Snapshot`], held by [`runtime::live::LivePolicy`] | `POST /reload`, SIGHUP |
//! | what each request came to, by key and day | *ledger*: [`ledger::Keeper`] (kept, shared) | `ledger:`; `/api/ledger` |
//! | the `state.path` file | [`state::StateFile`] | `state.path` |
//! | a connection's edge state (phase, deadlines) | [`edge::stream::Conn`] | the `server:` block |
//! | Redis, where the replicas meet | *fleet store*: [`fleet_store::Client`] (a connection) | `cluster.redis_url` |
//! | a request's place in a distributed trace, and the spans it leaves when recorded | *trace*: [`traces::Trace`] (per request), [`traces::Tracer`] (the exporter's handle); *recorded* = sampled | `tracing:`, `traceparent`, `tollgate_spans_*_total`, the access line's `trace_id` |
//! | how a request ended | [`outcome::Outcome`] | the `outcome` label |
//! | why the gateway refused it | [`refusal::Code`] | the problem's `code` |

#![deny(rustdoc::broken_intra_doc_links)]
// The crate's one public face is the binary (and what its own tests and benches reach: the
// config, the server, the runtime's live policy, the CLI); its rooms are `pub(crate)`, so the
// tables above name items private to it, which a private build of these docs resolves.
#![allow(rustdoc::private_intra_doc_links)]

pub use tollgate_core::{
    clock, config, digest, limit, metering, outcome, path, policy, refusal, sync, usage,
};

pub(crate) mod admin;
pub mod cli;
pub(crate) mod demo;
pub(crate) mod edge;
pub(crate) mod fleet_store;
pub(crate) mod keys;
pub(crate) mod ledger;
pub(crate) mod proxy;
pub mod runtime;
pub mod server;
pub mod shared;
pub(crate) mod state;
pub(crate) mod top;
pub(crate) mod traces;
