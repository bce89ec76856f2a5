//! Overrides in Redis (with the `cluster` block): one hash `{<prefix>:ov}:set` (field: a hash
//! of the key's digest; value: the override as JSON, with the key's *name*) and a version
//! counter `{<prefix>:ov}:v`; both expire 30 days after the last replica touched them.
//! `write.lua` changes one override and bumps the version; `poll.lua` answers the version and,
//! when it moved, the whole set. Both keys share a hash tag: one slot on a Redis Cluster.

use std::collections::HashMap;
use std::time::Duration;

use crate::config::Cluster;
use crate::digest::Digest;
use crate::limit::shared::hashed;
use crate::policy::overrides::Override;
use crate::redis::{connect, within, Client, Lua, StoreError};

/// How long the overrides stay in Redis after the last replica touched them.
const TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The overrides' place in Redis, and a connection to it (made on first use, dropped after a
/// failure).
pub struct RedisSet {
    pub(super) cfg: Cluster,
    set_key: String,
    version_key: String,
    write: Lua,
    poll: Lua,
    client: tokio::sync::Mutex<Option<Client>>,
}

/// What a poll found: the version, and the set (field → JSON) when it moved.
pub struct Polled {
    pub version: String,
    pub pairs: Option<HashMap<String, String>>,
}

impl RedisSet {
    pub fn new(cfg: &Cluster) -> Self {
        let prefix = &cfg.key_prefix;
        Self {
            cfg: cfg.clone(),
            set_key: set_key(prefix),
            version_key: format!("{{{prefix}:ov}}:v"),
            write: Lua::new(include_str!("write.lua")),
            poll: Lua::new(include_str!("poll.lua")),
            client: tokio::sync::Mutex::new(None),
        }
    }

    async fn client(&self) -> Result<Client, StoreError> {
        let mut slot = self.client.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c = connect(&self.cfg).await?;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// A call of `lua` (the set and the version its keys, `args` its `ARGV`), within the
    /// timeout; a failed call drops the connection.
    async fn call<T: ::redis::FromRedisValue>(
        &self,
        lua: &Lua,
        args: impl FnOnce(&mut ::redis::Cmd),
    ) -> Result<T, StoreError> {
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut cmd = lua.evalsha(&[&self.set_key, &self.version_key]);
        args(&mut cmd);
        let r = within(deadline, &self.cfg.redis_url, client.call::<T>(lua, &cmd)).await;
        if r.is_err() {
            self.client.lock().await.take();
        }
        r
    }

    /// Write one override (or its removal) and bump the version; returns when Redis has it.
    pub async fn write(
        &self,
        digest: &Digest,
        record: Option<&Override>,
    ) -> Result<(), StoreError> {
        let ttl = TTL.as_millis() as u64;
        let f = field(digest);
        let json = record.map(super::json).unwrap_or_default();
        let op = if record.is_some() { "put" } else { "del" };
        let _: i64 = self
            .call(&self.write, |c| {
                c.arg(op).arg(&f).arg(&json).arg(ttl);
            })
            .await?;
        Ok(())
    }

    /// The version, and the whole set when it is not `known`.
    pub async fn poll(&self, known: &str) -> Result<Polled, StoreError> {
        let ttl = TTL.as_millis() as u64;
        let reply: ::redis::Value = self
            .call(&self.poll, |c| {
                c.arg(known).arg(ttl);
            })
            .await?;
        let ::redis::Value::Array(items) = reply else {
            return Err(StoreError::Malformed(
                "the overrides' poll answered no list",
            ));
        };
        let version: String = items
            .first()
            .and_then(|v| ::redis::from_redis_value(v.clone()).ok())
            .unwrap_or_default();
        let pairs = items
            .get(1)
            .map(|p| ::redis::from_redis_value(p.clone()).unwrap_or_default());
        Ok(Polled { version, pairs })
    }
}

/// The overrides' set in Redis under `prefix`.
pub fn set_key(prefix: &str) -> String {
    format!("{{{prefix}:ov}}:set")
}

/// The name of a key's override in Redis: a hash of its digest under a label of its own.
pub fn field(d: &Digest) -> String {
    hashed(b"tollgate-cluster-override:", d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redis_field_is_neither_the_key_nor_its_digest() {
        let d = Digest::of(b"a-customer-key");
        let f = field(&d);
        assert_eq!(f.len(), 32);
        assert!(!hex::encode(d.0).contains(&f));
        assert_ne!(f, crate::limit::shared::store_key("x", &d));
    }
}
