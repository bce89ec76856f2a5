//! The policy in force, swapped whole on reload.
//!
//! Readers take a snapshot with one `ArcSwap` load (no lock) and keep it for the whole request, so a request never sees half of one config
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

    /// The file the policy is (re)loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-read the config file; on success swap it in, keeping rate state for keys that remain.
    pub fn reload(&self) -> Result<Arc<Policy>, ConfigError> {
        Ok(self.replace(Config::load(&self.path)?))
    }

    /// Swap in an already validated config.
    pub fn replace(&self, config: Config) -> Arc<Policy> {
        let _serial = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current.load_full();
        let new = Arc::new(Policy::new(config, Some(&old)));
        self.current.store(Arc::clone(&new));
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authenticate::AuthHeader;
    use crate::policy::RequestHead;
    use crate::refusal::Code;

    fn send(live: &LivePolicy) -> Result<u32, Code> {
        let head = RequestHead {
            method: "POST",
            path: "/v2/sendMessage/",
            authorization: AuthHeader::One(b"Bearer basic-key-1"),
        };
        let d = live.load().decide(&head, 0);
        d.verdict
            .map(|_| d.quota.unwrap().remaining)
            .map_err(|r| r.code)
    }

    #[test]
    fn reload_swaps_whole_keeps_budgets_and_refuses_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.yaml");
        std::fs::write(&path, crate::testing::CONFIG_YAML).unwrap();
        let live = LivePolicy::new(Config::load(&path).unwrap());
        for _ in 0..10 {
            send(&live).unwrap();
        }
        assert_eq!(send(&live), Ok(29));

        // A bigger Basic limit takes effect, and what was spent stays spent: 11 requests at
        // 250 ms each used 2.75 s of the window, which is 22 requests at 80 per window; this
        // one makes 23.
        let bigger = crate::testing::CONFIG_YAML
            .replace("requests_per_window: 40", "requests_per_window: 80");
        std::fs::write(&path, bigger).unwrap();
        live.reload().unwrap();
        assert_eq!(live.load().config.plan("basic").unwrap().limit.get(), 80);
        assert_eq!(send(&live), Ok(80 - 23));

        // A broken file is refused with its line; the old policy keeps serving.
        std::fs::write(&path, "plans: [oops\n").unwrap();
        let err = live.reload().unwrap_err();
        assert!(err.line.is_some(), "{err}");
        assert_eq!(live.load().config.plan("basic").unwrap().limit.get(), 80);
        assert!(send(&live).is_ok());
    }
}
