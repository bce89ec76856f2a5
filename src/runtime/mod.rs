//! The ground floor of the running process: the config in force and its reload, the
//! process's life (readiness, signals, draining), logging and metrics. Everything above imports
//! from here; nothing here imports from above (the server is assembled in [`crate::server`]).
//!
//! | module | what |
//! |---|---|
//! | [`alloc`] | the binary's allocator: mimalloc's plain entry points |
//! | [`live`] | the config in force as one snapshot (policy, upstream, metric handles), swapped whole on reload |
//! | [`upstream`] | the upstream resolved once per config |
//! | [`lifecycle`] | readiness, SIGHUP reload, SIGTERM drain, SIGQUIT upgrade |
//! | [`logging`] | `tracing` to stderr, text or JSON, without the `log` bridge |
//! | [`metrics`] | the Prometheus metrics, label handles resolved once per config |
//! | [`error`] | [`SetupError`]: what can stop the gateway from starting |

pub mod alloc;
pub mod error;
pub mod lifecycle;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod upstream;

pub use error::SetupError;
