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
    /// Tokio's work-stealing scheduler (`true`), one single-threaded runtime per thread
    /// (`false`), or `auto` (the default): off for one thread, on for several, each where it
    /// measured cheaper a request.
    pub work_stealing: Stealing,
    /// Idle upstream connections kept for reuse (default 128).
    pub upstream_keepalive_pool_size: usize,
    /// Accept loops per listening socket (default 1).
    pub listener_tasks_per_fd: usize,
}

impl Default for FileRuntime {
    fn default() -> Self {
        Self {
            threads: 0,
            work_stealing: Stealing::Auto,
            upstream_keepalive_pool_size: 128,
            listener_tasks_per_fd: 1,
        }
    }
}

/// `runtime.work_stealing`: `true`, `false` or `auto`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stealing {
    /// Off for one thread, on for several.
    #[default]
    Auto,
    /// Tokio's work-stealing scheduler.
    On,
    /// A single-threaded runtime per thread.
    Off,
}

impl Stealing {
    /// Whether `threads` worker threads steal work.
    pub fn for_threads(self, threads: usize) -> bool {
        match self {
            Stealing::Auto => threads > 1,
            Stealing::On => true,
            Stealing::Off => false,
        }
    }
}

impl Serialize for Stealing {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Stealing::Auto => s.serialize_str("auto"),
            Stealing::On => s.serialize_bool(true),
            Stealing::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Stealing {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Stealing;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true, false or auto")
            }
            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Stealing, E> {
                Ok(if b { Stealing::On } else { Stealing::Off })
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Stealing, E> {
                match s {
                    "auto" => Ok(Stealing::Auto),
                    _ => Err(E::invalid_value(serde::de::Unexpected::Str(s), &self)),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// The most threads a service may ask for.
pub const MAX_THREADS: usize = 1024;

/// The runtime in force: what the server is built with unless `--conf` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Runtime {
    /// Worker threads of each listener's service; 0: one per CPU the process may use.
    pub threads: usize,
    /// Tokio's work-stealing scheduler, one single-threaded runtime per thread, or either by
    /// the thread count.
    pub work_stealing: Stealing,
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

    /// Whether the worker threads steal work where the process may use `cpus` CPUs.
    pub fn stealing_for(&self, cpus: usize) -> bool {
        self.work_stealing.for_threads(self.threads_for(cpus))
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
    fn work_stealing_is_off_for_one_thread_and_on_for_several_unless_told() {
        let r = Runtime::default();
        assert!(!r.stealing_for(1));
        assert!(r.stealing_for(2));
        let yaml = |v: &str| serde_yaml::from_str::<FileRuntime>(&format!("work_stealing: {v}"));
        assert_eq!(yaml("auto").unwrap().work_stealing, Stealing::Auto);
        assert_eq!(yaml("true").unwrap().work_stealing, Stealing::On);
        assert_eq!(yaml("false").unwrap().work_stealing, Stealing::Off);
        assert!(yaml("sometimes").is_err());
        assert!(Stealing::On.for_threads(1) && !Stealing::Off.for_threads(8));
    }

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
