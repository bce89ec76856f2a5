//! The policy in force, swapped whole on reload.
//!
//! Readers take a snapshot with one `ArcSwap` load (no lock, no reference-count contention on
//! the hot path) and keep it for the whole request, so a request never sees half of one config
//! and half of another. A reload validates the new config completely before anything changes;
//! a refused one leaves the old policy serving.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::config::{Config, ConfigError};
use crate::policy::Policy;

pub struct LivePolicy {
    current: ArcSwap<Policy>,
    /// Serializes reloads so two cannot interleave their carry-over of rate state.
    reload_lock: Mutex<()>,
    path: PathBuf,
}

impl LivePolicy {
    pub fn new(config: Config) -> Self {
        let path = config.source.clone();
        Self {
            current: ArcSwap::from_pointee(Policy::new(config, None)),
            reload_lock: Mutex::new(()),
            path,
        }
    }

    /// The policy in force now.
    pub fn load(&self) -> Arc<Policy> {
        self.current.load_full()
    }

    /// A cheap guard for one decision (no reference-count increment).
    pub fn guard(&self) -> arc_swap::Guard<Arc<Policy>> {
        self.current.load()
    }

    /// The file the policy is (re)loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-read the config file; on success swap it in, keeping rate state for keys that remain.
    pub fn reload(&self) -> Result<Arc<Policy>, ConfigError> {
        self.replace(Config::load(&self.path)?)
    }

    /// Swap in an already validated config.
    pub fn replace(&self, config: Config) -> Result<Arc<Policy>, ConfigError> {
        let _serial = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current.load_full();
        let new = Arc::new(Policy::new(config, Some(&old)));
        self.current.store(Arc::clone(&new));
        Ok(new)
    }
}
