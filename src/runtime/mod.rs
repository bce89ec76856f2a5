//! The running process: the server assembled from a config, the config in force and its
//! reload, the process's life (readiness, signals, draining), logging and metrics.
//!
//! | module | what |
//! |---|---|
//! | [`server`] | the Pingora server: gateway and TLS listeners, the admin listener, background services |
//! | [`live`] | the config in force as one snapshot (policy, upstream, metric handles), swapped whole on reload |
//! | [`upstream`] | the upstream resolved once per config |
//! | [`lifecycle`] | readiness, SIGHUP reload, SIGTERM drain, SIGQUIT upgrade |
//! | [`logging`] | `tracing` to stderr, text or JSON, without the `log` bridge |
//! | [`metrics`] | the Prometheus metrics, label handles resolved once per config |
//! | [`error`] | [`SetupError`]: what can stop the gateway from starting |

pub mod error;
pub mod lifecycle;
pub mod live;
pub mod logging;
pub mod metrics;
pub mod server;
pub mod upstream;
pub mod usage;

pub use error::SetupError;
