//! What `tollgate check` shows of the overrides kept where the config says (read-only: a
//! running gateway may hold the file, and Redis is only read).

use std::collections::HashMap;
use std::path::Path;

use super::{disk, redis_set, show, Shown};
use crate::config::{Cluster, Plan};
use crate::policy::overrides::Override;
use crate::redis::{connect, within, StoreError};

/// The overrides kept at `state.path`.
pub fn read_state(path: &Path, plans: &[Plan]) -> Result<Vec<Shown>, disk::DiskError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let db = disk::open_read_only(path)?;
    let set = disk::read_all(&db)?;
    Ok(show(set.values(), plans))
}

/// The overrides kept in the cluster's Redis, with a runtime of its own (`check` has none).
pub fn read_redis(cfg: &Cluster, plans: &[Plan]) -> Result<Vec<Shown>, StoreError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StoreError::Redis(e.to_string()))?;
    rt.block_on(async {
        let client = connect(cfg).await?;
        let deadline =
            tokio::time::Instant::now() + cfg.timeout.max(std::time::Duration::from_secs(1));
        let mut cmd = ::redis::cmd("HGETALL");
        cmd.arg(redis_set::set_key(&cfg.key_prefix));
        let pairs: HashMap<String, String> =
            within(deadline, &cfg.redis_url, client.query(&cmd)).await?;
        Ok(shown_of_fields(&pairs, plans))
    })
}

/// The overrides of a Redis set (field → JSON), shown: one each, whatever their number.
fn shown_of_fields(pairs: &HashMap<String, String>, plans: &[Plan]) -> Vec<Shown> {
    let records: Vec<Override> = pairs
        .values()
        .filter_map(|v| serde_json::from_str::<Override>(v).ok())
        .collect();
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
                let o = Override {
                    plan_id: 3,
                    replaced: 1,
                    key: format!("shop-{i:03}"),
                    partner: None,
                    at_ms: i,
                };
                (format!("field-{i}"), serde_json::to_string(&o).unwrap())
            })
            .collect();
        let shown = shown_of_fields(&pairs, &plans);
        assert_eq!(shown.len(), 300);
        assert_eq!(shown[0].key, "shop-000");
        assert_eq!(shown[299].key, "shop-299");
        assert!(shown
            .iter()
            .all(|s| s.plan == "pro" && s.replaced == "basic"));
    }
}
