//! What can stop the gateway from starting: each with the file, field or flag at fault.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::ConfigError;

/// A gateway that cannot be set up. (A request never produces one: request-path errors are
/// refusals.)
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The config file was refused, or its upstream cannot be resolved.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener's address cannot be bound.
    #[error("{}: field `{field}`: cannot listen on {addr}: {source}", file.display())]
    Listen {
        file: PathBuf,
        field: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// Pingora's own `--conf` file cannot be read.
    #[error("pingora --conf: {0}")]
    PingoraConf(String),
    /// The TLS certificate or key does not load.
    #[error("tls: {0}")]
    Tls(String),
    /// The `state.path` store cannot be opened (another process holds it, or it is not one).
    #[error("{}: field `state.path`: {message}", file.display())]
    State { file: PathBuf, message: String },
    /// The trace exporter's thread cannot be started.
    #[error("tracing: cannot start the exporter: {0}")]
    Traces(std::io::Error),
}
