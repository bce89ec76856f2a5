//! What `tollgate check` shows of the overrides kept where the config says (read-only: a
//! running gateway may hold the file, and Redis is only read).

use std::collections::HashMap;
use std::path::Path;

use super::redis_set;
use super::shown::{show, UpgradeRow};
use crate::config::{Cluster, Plan};
use crate::fleet_store::{connect, within, StoreError};
use crate::policy::overrides::KeyRecord;
use crate::policy::versions::Kept;
use crate::state::disk;

/// The records kept at `state.path` (upgrades and key changes).
pub(crate) fn read_state(path: &Path) -> Result<Vec<KeyRecord>, disk::DiskError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let db = disk::open_read_only(path)?;
    let set = disk::read_all(&db)?;
    Ok(sorted(set.into_iter().map(|(_, o)| o)))
}

/// The records of a fleet's replica's copy of the set at `path` (the fields it keeps of
/// Redis's, as `state.path` holds them beside `cluster`): what it would start with.
pub(crate) fn read_copy(path: &Path) -> Result<Vec<KeyRecord>, disk::DiskError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let db = disk::open_read_only(path)?;
    let mut pairs = HashMap::new();
    disk::read_copy_pages(&db, |page| {
        pairs.extend(page);
        true
    })?;
    Ok(records_of_fields(&pairs))
}

/// The records kept in the cluster's Redis, with a runtime of its own (`check` has none).
pub(crate) fn read_redis(cfg: &Cluster) -> Result<Vec<KeyRecord>, StoreError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Redis(e.to_string()))?;
    rt.block_on(async {
        let client = connect(cfg).await?;
        let deadline =
            tokio::time::Instant::now() + cfg.timeout.max(std::time::Duration::from_secs(1));
        let key = redis_set::set_key(&cfg.key_prefix);
        let mut cmd = ::redis::cmd("HLEN");
        cmd.arg(&key);
        let about: u64 = within(deadline, &cfg.redis_url, client.query(&cmd)).await?;
        let cfg = Cluster {
            timeout: cfg.timeout.max(std::time::Duration::from_secs(1)),
            ..cfg.clone()
        };
        let pairs: HashMap<String, String> = redis_set::scan(&client, &cfg, &key, about)
            .await?
            .into_iter()
            .collect();
        Ok(records_of_fields(&pairs))
    })
}

/// The records of a Redis set (field → one part as kept), each digest's parts merged: one
/// record per digest, whatever their number; parts taken out (tombstones) hold nothing.
fn records_of_fields(pairs: &HashMap<String, String>) -> Vec<KeyRecord> {
    let mut by_hash: HashMap<&str, KeyRecord> = HashMap::new();
    for (f, v) in pairs {
        let Some((hash, _)) = redis_set::split_field(f) else {
            continue;
        };
        let record = Kept::parse(v).and_then(|k| k.record());
        if let Some(o) = record.filter(|o| !o.is_empty()) {
            by_hash.entry(hash).or_default().merge(o);
        }
    }
    sorted(by_hash.into_values())
}

fn sorted(records: impl Iterator<Item = KeyRecord>) -> Vec<KeyRecord> {
    let mut v: Vec<KeyRecord> = records.collect();
    v.sort_by(|a, b| a.key.cmp(&b.key));
    v
}

/// The upgrades among `records`, as `check` shows them.
pub(crate) fn upgrades(records: &[KeyRecord], plans: &[Plan]) -> Vec<UpgradeRow> {
    show(records.iter(), plans)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_lists_every_override_of_a_large_set() {
        // 300 overrides (the field names are hashes, as in Redis): all 300 are shown. The
        // listing once keyed them by a counter cast to a byte, and showed at most 256.
        let plans = tollgate_core::testing::config().plans;
        let pairs: HashMap<String, String> = (0..300)
            .map(|i| {
                let o = KeyRecord {
                    plan_id: Some(3),
                    replaced: Some(1),
                    at_ms: i,
                    ..KeyRecord::named(&format!("shop-{i:03}"))
                };
                let field = redis_set::field(&crate::digest::Digest::of(&i.to_be_bytes()));
                (field, serde_json::to_string(&o).unwrap())
            })
            .collect();
        let shown = upgrades(&records_of_fields(&pairs), &plans);
        assert_eq!(shown.len(), 300);
        assert_eq!(shown[0].key, "shop-000");
        assert_eq!(shown[299].key, "shop-299");
        assert!(shown
            .iter()
            .all(|s| s.plan == "pro" && s.replaced == "basic"));
    }
}
