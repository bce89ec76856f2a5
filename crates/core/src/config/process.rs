//! Settings bound to the process (the listeners' sockets, the log, shutdown, the runtime, the
//! stores, and the two `server` values Pingora's HTTP/2 layer takes at start): a reload that changes one
//! keeps the old value until a restart or an upgrade. They live in one struct, [`Process`],
//! compared whole by [`changed_fields`], so a field added to it is reported by a reload without
//! being listed anywhere else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::file::{FileConfig, FileShutdown, LogFormat};
use super::{cluster, existing_file, socket_addr, Cluster, Env, Invalid, Server, Shutdown, Tls};

/// The longest any one shutdown phase may be (one hour).
pub const MAX_SHUTDOWN_SECONDS: u64 = 3_600;

/// What the process took at start. Field names (as serialized) are those a reload reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Process {
    /// The address the gateway's plain HTTP listener listens on (`listen`).
    pub listen: SocketAddr,
    /// The address the admin listener listens on (`admin_listen`).
    pub admin_listen: SocketAddr,
    /// The TLS listener; `None` when the `tls` block is absent.
    pub tls: Option<Tls>,
    /// The log's format, text or JSON (`log.format`).
    #[serde(rename = "log")]
    pub log_format: LogFormat,
    /// What SIGTERM does, phase by phase (the `shutdown` block).
    pub shutdown: Shutdown,
    /// How the gateway's threads run (the `runtime` block).
    pub runtime: super::Runtime,
    /// Budgets shared across replicas; `None` when the block is absent. The store and its
    /// background exchange are set up with the process.
    pub cluster: Option<Cluster>,
    /// The embedded store overrides are kept in (`state.path`, resolved against the config's
    /// directory); `None` when the block is absent.
    #[serde(rename = "state")]
    pub state_path: Option<PathBuf>,
    /// OpenTelemetry traces (the `tracing` block); `None` when it is absent. The exporter's
    /// thread and queue are set up with the process.
    pub tracing: Option<super::Tracing>,
    /// Pingora's HTTP/2 idle timeout, fixed when the server starts (`server.idle_timeout_seconds`).
    #[serde(rename = "server.idle_timeout_seconds (HTTP/2)")]
    pub h2_idle_timeout: Duration,
    /// Pingora's HTTP/2 header list cap, fixed when the server starts (`server.max_header_bytes`).
    #[serde(rename = "server.max_header_bytes (HTTP/2)")]
    pub h2_max_header_bytes: usize,
}

pub(super) fn process(
    raw: &FileConfig,
    server: &Server,
    base_dir: &Path,
    env: &dyn Env,
) -> Result<Process, Invalid> {
    let tls = match &raw.tls {
        None => None,
        Some(t) => Some(Tls {
            listen: socket_addr(&t.listen, "tls.listen")?,
            cert_file: existing_file(base_dir, &t.cert_file, "tls.cert_file")?,
            key_file: existing_file(base_dir, &t.key_file, "tls.key_file")?,
        }),
    };
    let state_path = match &raw.state {
        None => None,
        Some(st) if st.path.trim().is_empty() => {
            return Err(Invalid::new("state.path", "must name a file"))
        }
        // Opened (and created) when the gateway starts, which refuses a path it cannot use.
        Some(st) => Some(base_dir.join(&st.path)),
    };
    Ok(Process {
        listen: socket_addr(&raw.listen, "listen")?,
        admin_listen: socket_addr(&raw.admin_listen, "admin_listen")?,
        tls,
        log_format: raw.log.format,
        shutdown: shutdown(&raw.shutdown)?,
        runtime: super::runtime::runtime(&raw.runtime)?,
        cluster: raw
            .cluster
            .as_ref()
            .map(|c| cluster::cluster(c, env))
            .transpose()?,
        state_path,
        tracing: raw
            .tracing
            .as_ref()
            .map(super::traces::tracing)
            .transpose()?,
        h2_idle_timeout: server.idle_timeout,
        h2_max_header_bytes: server.max_header_bytes,
    })
}

fn shutdown(f: &FileShutdown) -> Result<Shutdown, Invalid> {
    let seconds = |v: u64, field: &str| {
        if v > MAX_SHUTDOWN_SECONDS {
            Err(Invalid::new(
                field,
                format!("{v} is above the maximum of {MAX_SHUTDOWN_SECONDS}"),
            ))
        } else {
            Ok(v)
        }
    };
    Ok(Shutdown {
        drain_seconds: seconds(f.drain_seconds, "shutdown.drain_seconds")?,
        grace_seconds: seconds(f.grace_seconds, "shutdown.grace_seconds")?,
        timeout_seconds: seconds(f.timeout_seconds, "shutdown.timeout_seconds")?,
    })
}

/// The fields of `old` and `new` that differ, by their serialized names: every field, whatever
/// is added to the struct later.
pub fn changed_fields<T: Serialize>(old: &T, new: &T) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestConfig;

    #[test]
    fn a_field_added_to_the_process_group_is_reported_without_being_listed() {
        // A stand-in for the day `Process` gains a field: nothing but the struct names it.
        #[derive(Serialize)]
        struct Later {
            listen: u16,
            added_later: &'static str,
        }
        let old = Later {
            listen: 1,
            added_later: "a",
        };
        let new = Later {
            listen: 1,
            added_later: "b",
        };
        assert_eq!(changed_fields(&old, &new), ["added_later"]);
    }

    #[test]
    fn every_process_bound_setting_is_reported_by_its_name() {
        let base = TestConfig::new().parse().process;
        let changed = TestConfig::new()
            .listen("127.0.0.1:1")
            .admin_listen("127.0.0.1:2")
            .log_format("json")
            .shutdown(1, 2, 3)
            .server(|s| {
                s.idle_timeout_seconds = 7;
                s.max_header_bytes = 4096;
            })
            .parse()
            .process;
        let mut got = changed_fields(&base, &changed);
        got.sort();
        assert_eq!(
            got,
            [
                "admin_listen",
                "listen",
                "log",
                "server.idle_timeout_seconds (HTTP/2)",
                "server.max_header_bytes (HTTP/2)",
                "shutdown"
            ]
        );
        assert!(changed_fields(&base, &base.clone()).is_empty());
    }
}
