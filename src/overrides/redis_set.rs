//! Overrides in Redis (with the `cluster` block): one hash `{<prefix>:ov}:set` and a version
//! counter `{<prefix>:ov}:v`; both expire 30 days after the last replica touched them. Each
//! part of a key's record ([`Part`]) is a field of its own: a hash of the digest, then the
//! part's suffix (none for an upgrade, as in part two; `:s`, `:r`, `:l`, `:q`), its value
//! that part as JSON, with the key's *name*. Two replicas changing two parts of one key never
//! overwrite each other. `write.lua` changes parts and bumps the version in one step;
//! `poll.lua` answers the version and, when it moved, the whole set. Both keys share a hash
//! tag: one slot on a Redis Cluster.

use std::collections::HashMap;
use std::time::Duration;

use crate::config::Cluster;
use crate::digest::Digest;
use crate::limit::shared::hashed;
use crate::policy::overrides::Part;
use crate::redis::{connect, within, Client, Hold, Lua, StoreError};

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
    /// Whether the master of the set's slot has replicas to wait for.
    hold: Hold,
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
            hold: Hold::default(),
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

    /// Write parts of overrides (each `(field, JSON)` put, or deleted when the JSON is
    /// `None`) and bump the version, all in one script: all of them are kept, or none.
    /// Returns when Redis has them; behind Sentinel or on a Redis Cluster, when a replica has
    /// them too (else [`StoreError::NotReplicated`]: the change is not acknowledged).
    pub async fn write(&self, parts: &[(String, Option<String>)]) -> Result<(), StoreError> {
        let ttl = TTL.as_millis() as u64;
        let _: i64 = self
            .call(&self.write, |c| {
                c.arg(ttl);
                for (f, json) in parts {
                    let op = if json.is_some() { "put" } else { "del" };
                    c.arg(op).arg(f).arg(json.as_deref().unwrap_or(""));
                }
            })
            .await?;
        let client = self.client().await?;
        if !client.replicated() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        match within(
            deadline,
            &self.cfg.redis_url,
            client.held(&self.hold, &self.set_key, self.cfg.timeout / 2),
        )
        .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(StoreError::NotReplicated),
            Err(e) => {
                self.client.lock().await.take();
                Err(e)
            }
        }
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

/// The name of one part of a digest's record in Redis.
pub fn part_field(d: &Digest, part: Part) -> String {
    let mut f = field(d);
    f.push_str(part.suffix());
    f
}

/// A field split into the digest's hash and the part it holds (`None`: not a field of ours).
pub fn split_field(f: &str) -> Option<(&str, Part)> {
    let (hash, suffix) = f.split_at_checked(32)?;
    Some((hash, Part::of_suffix(suffix)?))
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
