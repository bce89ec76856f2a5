//! What is kept of the changes to one key: the record ([`KeyRecord`]), its parts ([`Part`],
//! [`Change`], [`LimitChange`], [`QuotaChange`]).

use serde::{Deserialize, Serialize};

use super::part::Part;
use crate::config::QuotaSpec;
use crate::digest::Digest;

/// The changes in force for one digest, as they are kept: a partner's upgrade (`plan_id`,
/// `replaced`, `partner`, `at_ms`: the record of part two, read as it was written then), and
/// the changes of part three, each with when and by whom.
///
/// Each part is kept on its own ([`Part`]): with Redis, replicas that change two parts of one
/// key at once never overwrite each other.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyRecord {
    /// The key's name when the change was made (for the admin API and logs; never the key).
    pub key: String,
    /// The `plan_id` of the plan in force for the key (an upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<u32>,
    /// The `plan_id` of the plan the YAML gave the key when the upgrade was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<u32>,
    /// The partner whose upgrade it was, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partner: Option<String>,
    /// When the upgrade was made, in ms since the Unix epoch.
    #[serde(default)]
    pub at_ms: u64,
    /// Suspended, until resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<Box<Change>>,
    /// Revoked for good: this digest never authenticates again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<Box<Change>>,
    /// The key's own window limit, set live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<Box<LimitChange>>,
    /// The key's own quota, set live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Box<QuotaChange>>,
    /// The key itself, when it was issued through the admin API (not in the YAML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued: Option<Box<IssuedKey>>,
    /// The key's YAML when the suspension, limit or quota was set
    /// ([`Policy::fingerprint`](crate::policy::Policy::fingerprint)): a reload that changes it
    /// drops them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yaml: Option<String>,
}

// A million records are held at once: the parts a record rarely has (and an issued key's,
// which a key of the YAML never has) are boxed, so that a record is small where it sits.
const _: () = assert!(std::mem::size_of::<KeyRecord>() <= 136);

/// When a change was made, and by whom: `admin`, or `partner:<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// ms since the Unix epoch.
    pub since_ms: u64,
    /// `admin` or `partner:<name>`.
    pub by: String,
    /// The operator's words, if any (`{"reason": "..."}` on a suspension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A live window limit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitChange {
    /// Requests per window.
    pub requests_per_window: u32,
    /// When and by whom.
    #[serde(flatten)]
    pub change: Change,
}

/// A live quota.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaChange {
    /// The quota.
    #[serde(flatten)]
    pub quota: QuotaSpec,
    /// When and by whom.
    #[serde(flatten)]
    pub change: Change,
}

/// A key issued through the admin API, as kept: what the YAML would say of it, and its
/// digests. Kept under the digest it was issued with (`id`), which stays its name in every
/// store (its budget, its other parts) through rotations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "IssuedKept", into = "IssuedKept")]
pub struct IssuedKey {
    /// The digest it was issued with.
    pub id: Digest,
    /// The digest in force (the id's until the first rotation).
    pub digest: Digest,
    /// Earlier digests that still authenticate as the key, each until an instant.
    pub previous: Vec<PreviousDigest>,
    /// Its plan, by `plan_id` (stable over reloads that reorder the plans).
    pub plan_id: u32,
    /// The partner that manages it, by name.
    pub partner: Option<String>,
    /// From this instant (ms since the Unix epoch) it is refused.
    pub expires_ms: Option<u64>,
    /// Its own window limit.
    pub requests_per_window: Option<u32>,
    /// Its own quota.
    pub quota: Option<QuotaSpec>,
    /// When it was issued, and by whom.
    pub change: Change,
    /// When it was last rotated (ms since the Unix epoch).
    pub rotated_ms: Option<u64>,
}

/// An [`IssuedKey`] as it is written: the same fields, its [`Change`]'s among them. Spelled
/// out rather than `#[serde(flatten)]`, which reads a record through a buffer of all its
/// fields (and copies of its strings): a start reads a million of them.
#[derive(Serialize, Deserialize)]
struct IssuedKept {
    #[serde(with = "hex_digest")]
    id: Digest,
    #[serde(with = "hex_digest")]
    digest: Digest,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    previous: Vec<PreviousDigest>,
    plan_id: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    partner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    requests_per_window: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quota: Option<QuotaSpec>,
    since_ms: u64,
    by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rotated_ms: Option<u64>,
}

impl From<IssuedKept> for IssuedKey {
    fn from(k: IssuedKept) -> Self {
        IssuedKey {
            id: k.id,
            digest: k.digest,
            previous: k.previous,
            plan_id: k.plan_id,
            partner: k.partner,
            expires_ms: k.expires_ms,
            requests_per_window: k.requests_per_window,
            quota: k.quota,
            change: Change {
                since_ms: k.since_ms,
                by: k.by,
                reason: k.reason,
            },
            rotated_ms: k.rotated_ms,
        }
    }
}

impl From<IssuedKey> for IssuedKept {
    fn from(k: IssuedKey) -> Self {
        IssuedKept {
            id: k.id,
            digest: k.digest,
            previous: k.previous,
            plan_id: k.plan_id,
            partner: k.partner,
            expires_ms: k.expires_ms,
            requests_per_window: k.requests_per_window,
            quota: k.quota,
            since_ms: k.change.since_ms,
            by: k.change.by,
            reason: k.change.reason,
            rotated_ms: k.rotated_ms,
        }
    }
}

/// An earlier digest of an issued key, and until when it authenticates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviousDigest {
    /// The digest.
    #[serde(with = "hex_digest")]
    pub digest: Digest,
    /// Until when (ms since the Unix epoch).
    pub until_ms: u64,
}

/// Who makes the changes an operator makes through the admin API (a [`Change`]'s `by`).
pub(super) const ADMIN: &str = "admin";

impl IssuedKey {
    /// The key issued under `id` on the plan `plan_id` at `since_ms` by `admin`, with nothing
    /// else: never rotated, no partner, expiry, limit or quota of its own.
    pub fn plain(id: Digest, plan_id: u32, since_ms: u64) -> Self {
        IssuedKey {
            id,
            digest: id,
            previous: Vec::new(),
            plan_id,
            partner: None,
            expires_ms: None,
            requests_per_window: None,
            quota: None,
            change: Change {
                since_ms,
                by: ADMIN.to_string(),
                reason: None,
            },
            rotated_ms: None,
        }
    }

    /// Every digest of the key: the id, the one in force, the earlier ones (each once).
    pub fn digests(&self) -> Vec<Digest> {
        let mut all = vec![self.id];
        let more = std::iter::once(self.digest).chain(self.previous.iter().map(|p| p.digest));
        for d in more {
            if !all.contains(&d) {
                all.push(d);
            }
        }
        all
    }

    /// The digests that authenticate at `now_ms`: the one in force, and the earlier ones
    /// whose overlap has not ended, with until when (`u64::MAX`: for good).
    pub fn authenticating(&self, now_ms: u64) -> impl Iterator<Item = (Digest, u64)> + '_ {
        std::iter::once((self.digest, u64::MAX)).chain(
            self.previous
                .iter()
                .filter(move |p| p.until_ms > now_ms && p.digest != self.digest)
                .map(|p| (p.digest, p.until_ms)),
        )
    }
}

/// Digests as 64 lowercase hex characters.
mod hex_digest {
    use serde::{Deserializer, Serializer};

    use crate::digest::Digest;

    pub(super) fn serialize<S: Serializer>(d: &Digest, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&d.to_hex())
    }

    /// Read in place: serde's `Cow<str>` would copy every digest into a `String` first
    /// (two a record, a million records at a start).
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        struct Hex;
        impl serde::de::Visitor<'_> for Hex {
            type Value = Digest;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("64 hex characters")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Digest, E> {
                Digest::from_hex(s).ok_or_else(|| E::custom("not 64 hex characters"))
            }
        }
        d.deserialize_str(Hex)
    }
}

impl KeyRecord {
    /// A record for the key named `key` with nothing in it yet.
    pub fn named(key: &str) -> Self {
        Self {
            key: key.to_string(),
            ..Self::default()
        }
    }

    /// Whether `part` is in the record.
    pub fn has(&self, part: Part) -> bool {
        match part {
            Part::Plan => self.plan_id.is_some(),
            Part::Suspended => self.suspended.is_some(),
            Part::Revoked => self.revoked.is_some(),
            Part::Limit => self.limit.is_some(),
            Part::Quota => self.quota.is_some(),
            Part::Issued => self.issued.is_some(),
        }
    }

    /// When `part` was last changed (ms since the Unix epoch); `None` when it is not in the
    /// record.
    pub fn changed_ms(&self, part: Part) -> Option<u64> {
        match part {
            Part::Plan => self.plan_id.map(|_| self.at_ms),
            Part::Suspended => self.suspended.as_ref().map(|c| c.since_ms),
            Part::Revoked => self.revoked.as_ref().map(|c| c.since_ms),
            Part::Limit => self.limit.as_ref().map(|l| l.change.since_ms),
            Part::Quota => self.quota.as_ref().map(|q| q.change.since_ms),
            Part::Issued => self
                .issued
                .as_ref()
                .map(|k| k.change.since_ms.max(k.rotated_ms.unwrap_or(0))),
        }
    }

    /// Whether nothing is in it.
    pub fn is_empty(&self) -> bool {
        Part::ALL.into_iter().all(|p| !self.has(p))
    }

    /// Take `part` out.
    pub fn clear(&mut self, part: Part) {
        match part {
            Part::Plan => {
                self.plan_id = None;
                self.replaced = None;
                self.partner = None;
                self.at_ms = 0;
            }
            Part::Suspended => self.suspended = None,
            Part::Revoked => self.revoked = None,
            Part::Limit => self.limit = None,
            Part::Quota => self.quota = None,
            Part::Issued => self.issued = None,
        }
        if !self.has(Part::Suspended) && !self.has(Part::Limit) && !self.has(Part::Quota) {
            self.yaml = None;
        }
    }

    /// The record holding `part` alone (with the key's name, and the YAML's fingerprint for
    /// the parts a reload may drop): what is kept under the part's own name. `None` when the
    /// part is not in the record.
    pub fn only(&self, part: Part) -> Option<KeyRecord> {
        if !self.has(part) {
            return None;
        }
        let mut o = self.clone();
        for other in Part::ALL {
            if other != part {
                o.clear(other);
            }
        }
        if matches!(part, Part::Suspended | Part::Limit | Part::Quota) {
            o.yaml.clone_from(&self.yaml);
        }
        Some(o)
    }

    /// Add what `other` holds (one part, as kept) to this record.
    pub fn merge(&mut self, other: KeyRecord) {
        if other.plan_id.is_some() {
            self.plan_id = other.plan_id;
            self.replaced = other.replaced;
            self.partner = other.partner;
            self.at_ms = other.at_ms;
        }
        self.suspended = other.suspended.or(self.suspended.take());
        self.revoked = other.revoked.or(self.revoked.take());
        self.limit = other.limit.or(self.limit.take());
        self.quota = other.quota.or(self.quota.take());
        self.issued = other.issued.or(self.issued.take());
        if other.yaml.is_some() {
            self.yaml = other.yaml;
        }
        if self.key.is_empty() {
            self.key = other.key;
        }
    }
}
