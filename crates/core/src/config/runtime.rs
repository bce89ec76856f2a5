//! The `runtime` block: how the gateway's threads run (Pingora's runtime), chosen by
//! measurement (docs/benchmarks.md, "The runtime"). Bound to the process: a reload that
//! changes it reports `runtime` as needing a restart. Pingora's own settings file (`run
//! --conf FILE`) replaces the whole block.

use serde::{Deserialize, Serialize};

use super::Invalid;

/// The `runtime` block as written.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileRuntime {
    /// Worker threads of each listener's service; 0 (the default): one per CPU the process may
    /// use.
    pub threads: usize,
    /// Tokio's work-stealing scheduler (`true`), or one single-threaded runtime per thread
    /// (`false`, the default: measured cheaper a request, and as even over two threads).
    pub work_stealing: bool,
    /// Idle upstream connections kept for reuse (default 128).
    pub upstream_keepalive_pool_size: usize,
    /// Accept loops per listening socket (default 1).
    pub listener_tasks_per_fd: usize,
}

impl Default for FileRuntime {
    fn default() -> Self {
        Self {
            threads: 0,
            work_stealing: false,
            upstream_keepalive_pool_size: 128,
            listener_tasks_per_fd: 1,
        }
    }
}

/// The most threads a service may ask for.
pub const MAX_THREADS: usize = 1024;

/// The runtime in force: what the server is built with unless `--conf` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Runtime {
    /// Worker threads of each listener's service; 0: one per CPU the process may use.
    pub threads: usize,
    /// Tokio's work-stealing scheduler, or one single-threaded runtime per thread.
    pub work_stealing: bool,
    /// Idle upstream connections kept for reuse.
    pub upstream_keepalive_pool_size: usize,
    /// Accept loops per listening socket.
    pub listener_tasks_per_fd: usize,
}

impl Default for Runtime {
    fn default() -> Self {
        // The file's defaults, which validate.
        let f = FileRuntime::default();
        Self {
            threads: f.threads,
            work_stealing: f.work_stealing,
            upstream_keepalive_pool_size: f.upstream_keepalive_pool_size,
            listener_tasks_per_fd: f.listener_tasks_per_fd,
        }
    }
}

impl Runtime {
    /// The worker threads for a machine where the process may use `cpus` CPUs.
    pub fn threads_for(&self, cpus: usize) -> usize {
        if self.threads == 0 {
            cpus.max(1)
        } else {
            self.threads
        }
    }
}

/// The block, checked.
pub(super) fn runtime(f: &FileRuntime) -> Result<Runtime, Invalid> {
    if f.threads > MAX_THREADS {
        return Err(Invalid::new(
            "runtime.threads",
            format!(
                "{} is above the maximum of {MAX_THREADS} (0: one per CPU)",
                f.threads
            ),
        ));
    }
    if !(1..=65_536).contains(&f.upstream_keepalive_pool_size) {
        return Err(Invalid::new(
            "runtime.upstream_keepalive_pool_size",
            format!("{} is not within 1..=65536", f.upstream_keepalive_pool_size),
        ));
    }
    if !(1..=64).contains(&f.listener_tasks_per_fd) {
        return Err(Invalid::new(
            "runtime.listener_tasks_per_fd",
            format!("{} is not within 1..=64", f.listener_tasks_per_fd),
        ));
    }
    Ok(Runtime {
        threads: f.threads,
        work_stealing: f.work_stealing,
        upstream_keepalive_pool_size: f.upstream_keepalive_pool_size,
        listener_tasks_per_fd: f.listener_tasks_per_fd,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_validate_and_bad_values_name_their_field() {
        assert_eq!(
            runtime(&FileRuntime::default()).unwrap(),
            Runtime::default()
        );
        assert_eq!(Runtime::default().threads_for(2), 2);
        assert_eq!(
            Runtime {
                threads: 3,
                ..Runtime::default()
            }
            .threads_for(2),
            3
        );
        for (f, field) in [
            (
                FileRuntime {
                    threads: 5000,
                    ..FileRuntime::default()
                },
                "runtime.threads",
            ),
            (
                FileRuntime {
                    upstream_keepalive_pool_size: 0,
                    ..FileRuntime::default()
                },
                "runtime.upstream_keepalive_pool_size",
            ),
            (
                FileRuntime {
                    listener_tasks_per_fd: 0,
                    ..FileRuntime::default()
                },
                "runtime.listener_tasks_per_fd",
            ),
        ] {
            assert_eq!(runtime(&f).unwrap_err().field, field);
        }
    }
}
