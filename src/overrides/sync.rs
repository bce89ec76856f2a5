//! With `cluster`: every replica polls the overrides' version in Redis each `sync_interval`
//! and, when it moved, puts the whole set in force here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::redis_set::field;
use super::{Backend, PlanOverrides};
use crate::policy::overrides::{Override, Overrides};
use crate::policy::Policy;
use crate::redis::StoreError;
use crate::runtime::live::LivePolicy;

/// The overrides' sync (a background service, with `cluster` only).
pub struct OverrideSync {
    pub overrides: Arc<PlanOverrides>,
    pub live: Arc<LivePolicy>,
    pub every: Duration,
}

impl OverrideSync {
    async fn round(&self) -> Result<(), StoreError> {
        let Backend::Redis(r) = &self.overrides.backend else {
            return Ok(());
        };
        let known = self.overrides.version();
        let polled = r.poll(&known).await?;
        let Some(pairs) = polled.pairs else {
            return Ok(());
        };
        let snap = self.live.load();
        let policy = &snap.policy;
        let mut set = from_fields(policy, &pairs);
        // Keys that lost their override elsewhere go back to their YAML plan here.
        for (_, e) in policy.keys.iter() {
            if e.plan_override().is_some() && !set.contains_key(&e.digest) {
                e.set_plan_override(None);
            }
        }
        let dropped = policy.apply_overrides(&set);
        for (d, o, why) in &dropped {
            set.remove(d);
            tracing::info!(target: "tollgate::overrides", key = %o.key, reason = why.as_str(), "plan override dropped");
            let _ = r.write(d, None).await;
        }
        self.live.with_overrides(|in_force| *in_force = set);
        // After a drop, read everything again next time (what was deleted is gone by then).
        self.overrides.set_version(if dropped.is_empty() {
            polled.version
        } else {
            String::new()
        });
        Ok(())
    }
}

/// The overrides of Redis's `pairs` (field → JSON) for the keys of `policy`. Fields are hashes
/// of digests and each record names its key: a key counts when its name is the record's and
/// its digest hashes to the field. One pass over the keys, whatever the number of overrides.
fn from_fields(policy: &Policy, pairs: &HashMap<String, String>) -> Overrides {
    let mut by_name: HashMap<String, Vec<(&str, Override)>> = HashMap::new();
    for (f, v) in pairs {
        if let Ok(o) = serde_json::from_str::<Override>(v) {
            by_name.entry(o.key.clone()).or_default().push((f, o));
        }
    }
    let mut set = Overrides::new();
    for (_, e) in policy.keys.iter() {
        let Some(records) = by_name.get(e.name.as_str()) else {
            continue;
        };
        let f = field(&e.digest);
        if let Some((_, o)) = records.iter().find(|(rf, _)| *rf == f) {
            set.insert(e.digest, o.clone());
        }
    }
    set
}

#[async_trait]
impl BackgroundService for OverrideSync {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if let Err(why) = self.round().await {
                tracing::debug!(target: "tollgate::overrides", error = %why, "overrides not read from the cluster store");
            }
        }
    }
}
