//! Key records in Redis (with the `cluster` block): one hash `{<prefix>:ov}:set`, a version
//! counter `{<prefix>:ov}:v`, a log of the fields by the version that last wrote each
//! `{<prefix>:ov}:log` (a sorted set) and the version the log is up to `{<prefix>:ov}:lv`; all
//! expire 30 days after the last replica touched them. Each
//! part of a key's record ([`Part`]) is a field of its own: a hash of the digest, then the
//! part's suffix (none for an upgrade, as in part two; `:s`, `:r`, `:l`, `:q`), its value the
//! part as kept ([`Kept`]: a version and the JSON, with the key's *name*; a part taken out is
//! a tombstone). Two replicas changing two parts of one key never overwrite each other.
//!
//! The set also holds its *epoch*, a random mark in the field `~epoch`: a set without it, or
//! with another than the one a replica read last, is not the data that replica last saw (a
//! Redis restarted empty, a failover to a replica that lost it, eviction). Tombstones keep a
//! set whose every change was taken back non-empty and marked, so an emptied set is never
//! mistaken for one.
//!
//! | script | what |
//! |---|---|
//! | `write.lua` | changes parts, each later than the copy it replaces, and bumps the version, in one step |
//! | `poll.lua` | the epoch, then the version and, when it moved, the fields changed since the replica's version (a delta: what a change costs a replica is that change, not the set), or word to read the whole set when the log cannot say (a first read, a write by a version without the log, a delta over [`MAX_DELTA`] fields) |
//! | `restore.lua` | merges a replica's copy in (the merge rule of `policy::versions`) and marks the epoch |
//! | `compact.lua` | the compact copy's status (is there one of use, how far behind), and its header put in place ([`compact`]) |
//!
//! A whole read comes in pages ([`RedisSet::read_whole`]: `HSCAN`, each page within
//! `timeout_ms`), never as one `HGETALL`: a million issued keys are a set of about a gigabyte,
//! which one call would hold Redis for seconds to answer, past the timeout, again and again.
//! A set of a page or more also has a compact copy ([`compact`]): its fields and texts as of
//! one version in a few large values, which a whole read takes instead of the pages when the
//! log covers what changed since. The log keeps the newest [`LOG_LEN`] fields (`kept.lua`,
//! which `write.lua` and `restore.lua` are sent after: the versions, the revocations and the
//! log they share), so it stays bounded too.
//!
//! The keys share a hash tag: one slot on a Redis Cluster.

use std::time::Duration;

use crate::config::Cluster;
use crate::digest::Digest;
use crate::fleet_store::{connect, within, Client, Hold, Lua, StoreError};
use crate::limit::shared::hashed;
use crate::policy::overrides::Part;
use crate::policy::versions::{Kept, VERSION_DIGITS};

pub(crate) mod compact;

/// How long the overrides stay in Redis after the last replica touched them.
const TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The most fields a poll answers as a delta; more, and it answers the whole set.
const MAX_DELTA: usize = 10_000;

/// The entries the log keeps: one more than a delta's most, so that a replica behind by a
/// trimmed entry finds more than a delta holds and reads whole (`poll.lua`, `kept.lua`).
const LOG_LEN: usize = MAX_DELTA + 1;

/// Fields a page of a whole read asks for (`HSCAN … COUNT`): about half a megabyte of
/// records, answered in a millisecond or two.
const PAGE: usize = 2000;

/// Fields per call of `restore.lua` (Redis runs a script alone: a few thousand fields keep
/// each call within a few milliseconds).
const RESTORE_BATCH: usize = 1000;

/// The overrides' place in Redis, and a connection to it (made on first use, dropped after a
/// failure).
pub(crate) struct RedisSet {
    pub(super) cfg: Cluster,
    set_key: String,
    version_key: String,
    log_key: String,
    logged_key: String,
    write: Lua,
    poll: Lua,
    restore: Lua,
    compact: Lua,
    client: tokio::sync::Mutex<Option<Client>>,
    /// Whether the master of the set's slot has replicas to wait for.
    hold: Hold,
}

/// What a poll found.
pub(crate) enum Polled {
    /// The set is the one this replica read last, unchanged.
    Same,
    /// It moved, and the log cannot say what changed: its version, and how many fields it
    /// holds; read it with [`RedisSet::read_whole`].
    Whole { version: String, fields: u64 },
    /// It moved: its version, and the fields changed since the version this replica has,
    /// each with its text.
    Delta {
        version: String,
        fields: Vec<(String, String)>,
    },
    /// Its epoch is not the one this replica knows: the set was emptied or replaced, or this
    /// replica has read none yet. Its epoch (empty: none) and how many fields it holds.
    Unknown { epoch: String, fields: u64 },
}

/// Where a whole read hands its pages (each field with its text) as they come.
pub(crate) type Pages = tokio::sync::mpsc::Sender<Vec<(String, String)>>;

/// A part to write: its field, its version, its JSON.
pub(crate) struct NewPart {
    pub field: String,
    pub version: u64,
    pub json: String,
}

/// What a write asks of the set before it writes anything (`write.lua`): the changes of
/// issued keys made on two replicas at once (each deciding on its own copy, which the other's
/// change reaches only at its next poll) must not both be acknowledged when one undoes the
/// other. A name or a digest is *claimed* for [`CLAIM_TTL`], far longer than a change takes
/// to reach every replica, after which each replica's own check refuses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Condition {
    /// The issued part of the key issued as `id` is absent (`was: None`: a new key; a field
    /// left as a tombstone is a deleted key's, whose digest is never issued again), or holds
    /// a key whose digest in force is `was` (the record this replica changed is the one in
    /// Redis: no other replica rotated or deleted it meanwhile).
    Issued { id: Digest, was: Option<Digest> },
    /// The name `name` is claimed by the key issued as `id`: not by another key still issued.
    Name { name: String, id: Digest },
    /// The digest `digest` is claimed by the key issued as `id`: by no other.
    Secret { digest: Digest, id: Digest },
    /// The key issued as `id` was deleted: its claim on `name`, if it holds one, is let go.
    Free { name: String, id: Digest },
    /// The key issued as `id` is not revoked (asked of a rotation: a replica that has not
    /// polled another's revocation of the key would hand out a secret the next poll revokes).
    Unrevoked { id: Digest },
}

/// Which condition of a write did not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Clash {
    /// Another key holds the name.
    Name,
    /// Another key has or had the digest.
    Sha256,
    /// The key was changed (rotated, deleted) on another replica since this one read it.
    Changed,
}

/// What a write did: kept every part (their texts as kept, in order), or nothing, for the
/// condition (its index) that did not hold.
pub(crate) enum Written {
    Kept(Vec<Kept>),
    Clash { condition: usize, clash: Clash },
}

/// How long a claim on a name or a digest lasts in Redis: sixty times the second within
/// which a change reaches every replica (then each replica's own check refuses it).
const CLAIM_TTL: Duration = Duration::from_secs(60);

/// The first text of a write refused by a condition (`write.lua`).
const CLASH: &str = "~clash";

impl Condition {
    /// The Redis key of its claim under `prefix` (`None`: no claim).
    fn claim(&self, prefix: &str) -> Option<String> {
        match self {
            Condition::Issued { .. } | Condition::Unrevoked { .. } => None,
            Condition::Name { name, .. } | Condition::Free { name, .. } => {
                Some(format!("{{{prefix}:ov}}:claim:name:{name}"))
            }
            Condition::Secret { digest, .. } => {
                Some(format!("{{{prefix}:ov}}:claim:digest:{}", field(digest)))
            }
        }
    }

    /// Its kind, its field in the set (`None` for a claim, whose first word `write.lua`
    /// reads is the index of its key in `KEYS`) and its second word (the digest a key is
    /// expected to have, or the field of the key that claims).
    fn args(&self) -> (&'static str, Option<String>, String) {
        let issued = |id: &Digest| part_field(id, Part::Issued);
        match self {
            Condition::Issued { id, was } => (
                "k",
                Some(issued(id)),
                was.as_ref().map(Digest::to_hex).unwrap_or_default(),
            ),
            Condition::Name { id, .. } => ("n", None, issued(id)),
            Condition::Secret { id, .. } => ("d", None, issued(id)),
            Condition::Free { id, .. } => ("f", None, issued(id)),
            Condition::Unrevoked { id } => {
                ("u", Some(part_field(id, Part::Revoked)), String::new())
            }
        }
    }

    /// The key issued as `id` that the condition is of.
    pub(crate) fn id(&self) -> &Digest {
        match self {
            Condition::Issued { id, .. }
            | Condition::Name { id, .. }
            | Condition::Secret { id, .. }
            | Condition::Free { id, .. }
            | Condition::Unrevoked { id } => id,
        }
    }
}

impl std::fmt::Display for Clash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Clash::Name => "another key holds the name",
            Clash::Sha256 => "another key has, or had, the digest",
            Clash::Changed => "the key was changed on another replica meanwhile",
        })
    }
}

impl Clash {
    fn parse(word: &str) -> Option<Clash> {
        match word {
            "name" => Some(Clash::Name),
            "sha256" => Some(Clash::Sha256),
            "changed" => Some(Clash::Changed),
            _ => None,
        }
    }
}

impl RedisSet {
    pub(crate) fn new(cfg: &Cluster) -> Self {
        let prefix = &cfg.key_prefix;
        Self {
            cfg: cfg.clone(),
            set_key: set_key(prefix),
            version_key: format!("{{{prefix}:ov}}:v"),
            log_key: format!("{{{prefix}:ov}}:log"),
            logged_key: format!("{{{prefix}:ov}}:lv"),
            write: Lua::new(concat!(include_str!("kept.lua"), include_str!("write.lua"))),
            poll: Lua::new(include_str!("poll.lua")),
            restore: Lua::new(concat!(
                include_str!("kept.lua"),
                include_str!("restore.lua")
            )),
            compact: Lua::new(include_str!("compact.lua")),
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

    /// A call of `lua` (the set, the version, the log and the logged version its keys, then
    /// `more`; `args` its `ARGV`), within the timeout; a failed call drops the connection.
    async fn call<T: ::redis::FromRedisValue>(
        &self,
        lua: &Lua,
        more: &[&str],
        args: impl FnOnce(&mut ::redis::Cmd),
    ) -> Result<T, StoreError> {
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut keys = vec![
            self.set_key.as_str(),
            &self.version_key,
            &self.log_key,
            &self.logged_key,
        ];
        keys.extend_from_slice(more);
        let mut cmd = lua.evalsha(&keys);
        args(&mut cmd);
        let r = within(deadline, &self.cfg.redis_url, client.call::<T>(lua, &cmd)).await;
        self.settled(r).await
    }

    /// `r`, the connection dropped first when it failed (the next call connects afresh).
    async fn settled<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if r.is_err() {
            self.client.lock().await.take();
        }
        r
    }

    /// Write parts of overrides (a part taken out as a tombstone), each at its version or
    /// later than the copy it replaces, and bump the version, all in one script, once every
    /// one of `conditions` holds: all of them are kept, or none. The texts as kept, in order,
    /// or the first condition that failed ([`Written::Clash`]: nothing was written). Returns
    /// when Redis has them; behind Sentinel or on a Redis Cluster, when a replica has them
    /// too (else [`StoreError::NotReplicated`]: the change is not acknowledged).
    pub(crate) async fn write(
        &self,
        parts: &[NewPart],
        conditions: &[Condition],
    ) -> Result<Written, StoreError> {
        let ttl = TTL.as_millis() as u64;
        let claims: Vec<String> = conditions
            .iter()
            .filter_map(|c| c.claim(&self.cfg.key_prefix))
            .collect();
        let more: Vec<&str> = claims.iter().map(String::as_str).collect();
        let reply: ::redis::Value = self
            .call(&self.write, &more, |c| {
                c.arg(ttl).arg(new_epoch()).arg(LOG_LEN);
                c.arg(CLAIM_TTL.as_millis() as u64).arg(conditions.len());
                // Each claim's key is KEYS[5], KEYS[6], … in the order of the conditions.
                let mut key = 4;
                for cond in conditions {
                    let (kind, field, owner) = cond.args();
                    let first = match field {
                        Some(f) => f,
                        None => {
                            key += 1;
                            key.to_string()
                        }
                    };
                    c.arg(kind).arg(first).arg(owner);
                }
                for p in parts {
                    let v = format!("{:0width$}", p.version, width = VERSION_DIGITS);
                    c.arg(&p.field).arg(v).arg(&p.json);
                }
            })
            .await?;
        let texts: Vec<String> = ::redis::from_redis_value(reply)
            .map_err(|_| StoreError::Malformed("the overrides' write answered another shape"))?;
        if texts.first().map(String::as_str) == Some(CLASH) {
            let condition = texts.get(1).and_then(|i| i.parse::<usize>().ok());
            let clash = texts.get(2).and_then(|w| Clash::parse(w));
            return match (condition, clash) {
                (Some(condition), Some(clash)) if condition < conditions.len() => {
                    Ok(Written::Clash { condition, clash })
                }
                _ => Err(StoreError::Malformed(
                    "the overrides' write answered a clash it cannot name",
                )),
            };
        }
        let kept: Vec<Kept> = texts.iter().filter_map(|t| Kept::parse(t)).collect();
        if kept.len() != parts.len() {
            return Err(StoreError::Malformed(
                "the overrides' write answered other texts",
            ));
        }
        self.held().await?;
        Ok(Written::Kept(kept))
    }

    /// The texts of the fields `names` as the set holds them now (`None`: absent), within
    /// the timeout.
    pub(crate) async fn read_fields(
        &self,
        names: &[String],
    ) -> Result<Vec<Option<String>>, StoreError> {
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut cmd = ::redis::cmd("HMGET");
        cmd.arg(&self.set_key).arg(names);
        let r = within(deadline, &self.cfg.redis_url, client.query(&cmd)).await;
        self.settled(r).await
    }

    /// The field of the issued key that claims the name `name` now (a key issued within
    /// [`CLAIM_TTL`], by any replica), within the timeout.
    pub(crate) async fn claimed_by(&self, name: &str) -> Result<Option<String>, StoreError> {
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut cmd = ::redis::cmd("GET");
        cmd.arg(
            Condition::Name {
                name: name.to_string(),
                id: Digest([0; 32]),
            }
            .claim(&self.cfg.key_prefix),
        );
        let r = within(deadline, &self.cfg.redis_url, client.query(&cmd)).await;
        self.settled(r).await
    }

    /// Behind Sentinel or on a Redis Cluster, whether a replica holds what was written.
    async fn held(&self) -> Result<(), StoreError> {
        let client = self.client().await?;
        if !client.replicated() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let r = within(
            deadline,
            &self.cfg.redis_url,
            client.held(&self.hold, &self.set_key, self.cfg.timeout / 2),
        )
        .await;
        if self.settled(r).await? {
            Ok(())
        } else {
            Err(StoreError::NotReplicated)
        }
    }

    /// What the set is now, against the version and epoch this replica knows.
    pub(crate) async fn poll(&self, known: &str, epoch: &str) -> Result<Polled, StoreError> {
        let ttl = TTL.as_millis() as u64;
        let reply: ::redis::Value = self
            .call(&self.poll, &[], |c| {
                c.arg(known).arg(ttl).arg(epoch).arg(MAX_DELTA);
            })
            .await?;
        let malformed = || StoreError::Malformed("the overrides' poll answered another shape");
        let ::redis::Value::Array(items) = reply else {
            return Err(malformed());
        };
        let text = |i: usize| -> Option<String> {
            items
                .get(i)
                .and_then(|v| ::redis::from_redis_value(v.clone()).ok())
        };
        let version = text(0).ok_or_else(malformed)?;
        if version.is_empty() {
            let fields = items
                .get(2)
                .and_then(|v| ::redis::from_redis_value::<u64>(v.clone()).ok())
                .unwrap_or(0);
            return Ok(Polled::Unknown {
                epoch: text(1).unwrap_or_default(),
                fields,
            });
        }
        let fields = |v: &::redis::Value| -> Result<Vec<(String, String)>, StoreError> {
            ::redis::from_redis_value(v.clone()).map_err(|_| malformed())
        };
        match (items.get(2), text(3).as_deref()) {
            (None, _) => Ok(Polled::Same),
            (Some(changed), Some("delta")) => Ok(Polled::Delta {
                version,
                fields: fields(changed)?,
            }),
            (Some(n), Some("whole")) => Ok(Polled::Whole {
                version,
                fields: ::redis::from_redis_value(n.clone()).map_err(|_| malformed())?,
            }),
            (Some(_), _) => Err(malformed()),
        }
    }

    /// Every field of the set (`~epoch` included) with its text, read in pages, each within
    /// the timeout and handed to `pages` as it comes; whether the set still has the epoch
    /// `epoch` at the end of the read (when not, what was handed is to be let go: the set was
    /// emptied or replaced meanwhile, and the next poll finds it so). `about` is how many
    /// fields the poll found: the read gives up after many times the pages that should take
    /// (a set growing faster than it is read). A field changed during the read may be found
    /// as before or after the change: each change is logged at a version after the one the
    /// poll found, so the next poll reads it again.
    pub(crate) async fn read_whole(
        &self,
        epoch: &str,
        about: u64,
        pages: &Pages,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let r = scan_into(&client, &self.cfg, &self.set_key, about, pages).await;
        self.settled(r).await?;
        self.has_epoch(epoch).await
    }

    /// Whether the set has the epoch `epoch` now, within the timeout.
    pub(crate) async fn has_epoch(&self, epoch: &str) -> Result<bool, StoreError> {
        let client = self.client().await?;
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let mut cmd = ::redis::cmd("HGET");
        cmd.arg(&self.set_key).arg("~epoch");
        let r: Result<Option<String>, _> =
            within(deadline, &self.cfg.redis_url, client.query(&cmd)).await;
        Ok(self.settled(r).await?.as_deref() == Some(epoch))
    }

    /// Merge `fields` (a replica's copy: name and text) into the set and mark its epoch
    /// (`epoch`, unless it has one): the set's epoch, and how many fields changed.
    pub(crate) async fn restore(
        &self,
        fields: &[(String, String)],
        epoch: &str,
    ) -> Result<(String, u64), StoreError> {
        let ttl = TTL.as_millis() as u64;
        let mut changed = 0;
        let mut marked = String::new();
        let mut batches: Vec<&[(String, String)]> = fields.chunks(RESTORE_BATCH).collect();
        if batches.is_empty() {
            batches.push(&[]);
        }
        for batch in batches {
            let (e, n): (String, u64) = self
                .call(&self.restore, &[], |c| {
                    c.arg(ttl).arg(epoch).arg(LOG_LEN);
                    for (f, raw) in batch {
                        c.arg(f).arg(raw);
                    }
                })
                .await?;
            changed += n;
            marked = e;
        }
        self.held().await?;
        Ok((marked, changed))
    }
}

/// Every field of the hash `key` with its text: [`scan_into`], gathered.
pub(crate) async fn scan(
    client: &Client,
    cfg: &Cluster,
    key: &str,
    about: u64,
) -> Result<Vec<(String, String)>, StoreError> {
    let (pages, mut rx) = tokio::sync::mpsc::channel(4);
    let read = async move { scan_into(client, cfg, key, about, &pages).await };
    let gather = async {
        let mut fields = Vec::with_capacity(usize::try_from(about).unwrap_or(0));
        while let Some(page) = rx.recv().await {
            fields.extend(page);
        }
        fields
    };
    let (read, fields) = tokio::join!(read, gather);
    read.map(|()| fields)
}

/// Every field of the hash `key` with its text, in pages of [`PAGE`] (`HSCAN`), each within
/// `cfg`'s timeout and handed to `pages` as it comes; given up after twenty times the pages
/// `about` fields take (an `HSCAN` page holds about its count, fewer where the table is
/// sparse).
async fn scan_into(
    client: &Client,
    cfg: &Cluster,
    key: &str,
    about: u64,
    pages: &Pages,
) -> Result<(), StoreError> {
    let most = 20 * (about / PAGE as u64 + 1) + 100;
    let mut cursor: u64 = 0;
    for _ in 0..most {
        let deadline = tokio::time::Instant::now() + cfg.timeout;
        let mut cmd = ::redis::cmd("HSCAN");
        cmd.arg(key).arg(cursor).arg("COUNT").arg(PAGE);
        let (next, page): (u64, Vec<(String, String)>) =
            within(deadline, &cfg.redis_url, client.query(&cmd)).await?;
        if pages.send(page).await.is_err() {
            return Err(StoreError::Malformed(
                "the overrides' read was let go before its end",
            ));
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
    Err(StoreError::Malformed(
        "the overrides' set grew faster than it was read",
    ))
}

/// A random epoch for a set that has none: 16 hex digits.
pub(crate) fn new_epoch() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

/// The overrides' set in Redis under `prefix`.
pub(crate) fn set_key(prefix: &str) -> String {
    format!("{{{prefix}:ov}}:set")
}

/// The name of a key's override in Redis: a hash of its digest under a label of its own.
pub(crate) fn field(d: &Digest) -> String {
    hashed(b"tollgate-cluster-override:", d)
}

/// The name of one part of a digest's record in Redis.
pub(crate) fn part_field(d: &Digest, part: Part) -> String {
    let mut f = field(d);
    f.push_str(part.suffix());
    f
}

/// A field split into the digest's hash and the part it holds (`None`: not a field of ours).
pub(crate) fn split_field(f: &str) -> Option<(&str, Part)> {
    let part = crate::policy::versions::part_of_field(f)?;
    Some((&f[..32], part))
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
