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
//! | 0 | the client address is not blocked | [`policy::blocking`] | 429 `too_many_auth_failures` |
//! | 1 | authenticate the bearer key | [`policy::authenticate`] | 401 `unauthorized` |
//! | 2 | classify method + path into a route | [`policy::classify`] | 400 `invalid_path`, 404 `unknown_route` |
//! | 3 | authorize: credential kind, then the plan's allow-list | [`policy::authorize`] | 403 `wrong_credential`, `plan_restricted` |
//! | 4 | limit: the key's budget | [`limit`] (through [`limit::Store`]) | 429 `rate_limited` |
//! | 5 | check the body, before any upstream connection, within the body deadline | [`proxy::body`], [`policy::body`], [`policy::webhook`] | 413, 415, 408 `request_timeout`, 400 `invalid_json` / `invalid_body`, 403 `not_your_customer` |
//! | 6 | forward: target, headers, peer | [`proxy::head`], [`proxy::upstream`] | 502 `upstream_unavailable`, 504 `upstream_timeout` ([`proxy::answer`]) |
//! | 7 | record: one access line, the metrics | [`proxy::Gateway`]'s `logging`, [`runtime::metrics`] | — |
//!
//! # Layout, by concern
//!
//! | module | what | may use |
//! |---|---|---|
//! | [`config`], [`policy`], [`limit`], [`clock`] | the decision, from the `tollgate-core` crate: no Pingora, tokio or network crate can reach it | — |
//! | [`edge`] | what runs before a request exists: connection caps, TLS handshake, deadlines | core, [`runtime`] |
//! | [`proxy`] | the Pingora adapter: context, head handling, bodies, answers, upstream peer | core, [`runtime`], [`edge`] (its connection state) |
//! | [`admin`] | the admin listener | core, [`runtime`] |
//! | [`runtime`] | server assembly, the live snapshot and reload, lifecycle, logging, metrics | core; assembles [`edge`], [`proxy`] and [`admin`] in [`runtime::server`] only |
//! | [`cli`], [`demo`] | the commands | everything |
//!
//! Nothing in the core imports from the proxy: the core is another crate, so it cannot.
//! Setup errors are a [`runtime::SetupError`]; request-path errors are refusals
//! ([`policy::Refusal`]); nothing a request or a config file controls can panic.

#![deny(rustdoc::broken_intra_doc_links)]

pub use tollgate_core::{clock, config, digest, limit, policy};

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod demo;
pub mod edge;
pub mod overrides;
pub mod proxy;
pub mod runtime;
pub mod top;
