//! With `cluster`: every replica polls the overrides' version in Redis each `sync_interval`
//! and, when it moved, puts the whole set in force here.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::redis_set::{field, part_field, split_field};
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
        let Backend::Redis(r, mirror) = &self.overrides.backend else {
            return Ok(());
        };
        let known = self.overrides.version();
        let polled = r.poll(&known).await?;
        let Some(pairs) = polled.pairs else {
            return Ok(());
        };
        // Serialized with the changes made here: a change kept but not yet applied here is
        // applied before this set is put in force (it is in the set).
        let _one = self.overrides.serial.lock().await;
        let snap = self.live.load();
        let mut set = from_fields(&snap.policy, &pairs);
        let dropped = self.live.replace_overrides(&mut set);
        for d in &dropped {
            tracing::info!(target: "tollgate::overrides", key = %d.before.key, reason = d.why.as_str(), "override dropped");
            let gone: Vec<(String, Option<String>)> = d
                .parts
                .iter()
                .map(|&p| (part_field(&d.digest, p), None))
                .collect();
            let _ = r.write(&gone).await;
        }
        if let Some(db) = mirror {
            // The copy a restart starts from while Redis is down.
            let (db, copy) = (Arc::clone(db), set.clone());
            let kept = tokio::task::spawn_blocking(move || {
                db.write(|db| super::disk::replace_all(db, &copy))
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
            if let Err(e) = kept {
                tracing::warn!(target: "tollgate::overrides", error = %e, "the copy of the cluster's overrides at state.path was not written");
            }
        }
        // After a drop, read everything again next time (what was deleted is gone by then).
        self.overrides.set_version(if dropped.is_empty() {
            polled.version
        } else {
            String::new()
        });
        Ok(())
    }
}

/// The records of Redis's `pairs` (field → one part as JSON) for the digests of `policy`'s
/// keys and their `previous` digests. Fields are hashes of digests and each part names its
/// key: a digest counts when its key's name is the part's and it hashes to the field. One
/// pass over the keys, whatever the number of records; only a revocation whose key's name is
/// in no entry any more (a renamed or removed key) makes every digest be hashed, so that it
/// still finds its digest.
fn from_fields(policy: &Policy, pairs: &HashMap<String, String>) -> Overrides {
    let mut by_hash: HashMap<&str, Override> = HashMap::new();
    for (f, v) in pairs {
        let Some((hash, _)) = split_field(f) else {
            continue;
        };
        if let Ok(o) = serde_json::from_str::<Override>(v) {
            by_hash.entry(hash).or_default().merge(o);
        }
    }
    let mut by_name: HashMap<String, Vec<&str>> = HashMap::new();
    for (hash, o) in &by_hash {
        by_name.entry(o.key.clone()).or_default().push(hash);
    }
    let keys = &policy.keys;
    let digests = keys
        .iter()
        .map(|(k, e)| (k, e.digest))
        .chain(keys.aliases().map(|(_, a)| (a.key, a.digest)));
    let mut set = Overrides::new();
    for (k, d) in digests {
        let Some(hashes) = by_name.get(keys.get(k).name.as_str()) else {
            continue;
        };
        let f = field(&d);
        if let Some(&h) = hashes.iter().find(|&&h| h == f) {
            if let Some(o) = by_hash.remove(h) {
                set.insert(d, o);
            }
        }
    }
    if by_hash.values().any(|o| o.revoked.is_some()) {
        let digests = keys
            .iter()
            .map(|(_, e)| e.digest)
            .chain(keys.aliases().map(|(_, a)| a.digest));
        for d in digests {
            if let Some(o) = by_hash.remove(field(&d).as_str()) {
                set.insert(d, o);
            }
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
