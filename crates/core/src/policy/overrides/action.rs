//! What is asked of a key and what comes of it: an upgrade or a partner's operation the
//! upstream has yet to accept ([`Upgrade`], [`Pending`]), an operator's change ([`Action`]),
//! why one is refused ([`ChangeRefused`]), and what a config dropped ([`Dropped`], [`Drop`]).

use super::part::Part;
use super::record::KeyRecord;
use crate::config::QuotaSpec;
use crate::digest::Digest;
use crate::policy::keys::KeyIdx;

/// An upgrade the upstream has yet to accept: which entry, and which plan (an index).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Upgrade {
    /// The digest of the customer key to upgrade (the body's `apiKey`).
    pub target: Digest,
    /// The plan asked for, as an index into the config's plans.
    pub plan: usize,
    /// The entry of the key, when this config has it (an unknown key is forwarded, and the
    /// provider decides; nothing is applied at the edge).
    pub key: Option<KeyIdx>,
}

/// A partner's operation on a customer key whose body was checked: what to do at the edge
/// when the upstream answers 2xx.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pending {
    /// Move the key to another plan.
    Upgrade(Upgrade),
    /// Suspend, resume or delete (revoke) the key.
    Lifecycle {
        /// Which.
        effect: crate::config::routes::Effect,
        /// The digest of the customer key the body names.
        target: Digest,
        /// Its entry, when this config has it.
        key: Option<KeyIdx>,
    },
}

/// A change an operator (or a partner, through the API it calls) makes to one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Refuse it until resumed, with the operator's reason if any.
    Suspend(Option<String>),
    /// Serve it again.
    Resume,
    /// Refuse its digests for good.
    Revoke,
    /// Its own window limit, or back to the YAML's (`None`).
    Limit(Option<u32>),
    /// Its own quota, or back to the YAML's (`None`).
    Quota(Option<QuotaSpec>),
}

impl Action {
    /// The `action` label of `tollgate_admin_changes_total` when an operator makes it (its
    /// row of [`ChangeKind`](super::ChangeKind)).
    pub fn name(&self) -> &'static str {
        super::ChangeKind::of_action(self).as_str()
    }
}

/// Why a change cannot be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeRefused {
    /// The key is revoked: nothing brings it back but a new digest in the YAML.
    Revoked,
    /// A limit or a quota on a partner key.
    NotACustomerKey,
    /// A partner's resume of a key the operator suspended.
    SuspendedByOperator,
    /// A rotation or deletion of a key the YAML defines (it rotates in the YAML).
    DefinedInConfig,
    /// A rotation or deletion of an issued key deleted since its name was looked up (by a
    /// change made before it in the same batch): no such key any more.
    Deleted,
    /// A new key whose name (`name`) or digest (`sha256`) a key has, or had (a revoked
    /// digest never authenticates again).
    KeyExists(&'static str),
    /// A new key on a plan (`plan`) or partner (`partner`) the config in force does not have
    /// (a reload took it away since the request was read).
    NotInConfig(&'static str),
}

impl std::error::Error for ChangeRefused {}

impl std::fmt::Display for ChangeRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChangeRefused::Revoked => {
                "the key is revoked for good (a key of the config comes back only with a new sha256 there; an issued key, as a new key)"
            }
            ChangeRefused::NotACustomerKey => {
                "a partner key has no plan: its window limit is `partner_requests_per_window`"
            }
            ChangeRefused::SuspendedByOperator => {
                "the operator suspended the key: only the operator resumes it"
            }
            ChangeRefused::DefinedInConfig => {
                "the key is defined in the config: it rotates there (`previous`), and leaves it there"
            }
            ChangeRefused::Deleted => "the key was deleted",
            ChangeRefused::KeyExists("name") => "a key with that name exists",
            ChangeRefused::KeyExists(_) => "a key has, or had, that digest",
            ChangeRefused::NotInConfig(_) => "the config in force has no such plan or partner",
        })
    }
}

/// Why part of an override was dropped when a config was compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// No key has that digest any more.
    KeyGone,
    /// The YAML now gives the key another plan than the one the override replaced, or
    /// changes the key since a suspension, limit or quota was set.
    YamlChanged,
    /// No plan has the override's `plan_id` any more.
    PlanGone,
    /// Another key issued with the same name keeps it (two replicas issued the name while
    /// Redis had forgotten the first: the smaller id keeps it); this one is deleted.
    NameTaken,
}

impl Dropped {
    /// The reason in words, for the log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::KeyGone => "the key is no longer in the config",
            Dropped::YamlChanged => "the config changed the key since",
            Dropped::PlanGone => "no plan has that plan_id any more",
            Dropped::NameTaken => {
                "another key was issued with this name while the cluster store had forgotten this one, and keeps it"
            }
        }
    }
}

/// What a config dropped of one digest's record: the record before, what is left of it
/// (`None`: nothing), the parts dropped and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drop {
    /// The digest the record is kept under.
    pub digest: Digest,
    /// The record as it was.
    pub before: KeyRecord,
    /// What is left; `None` when nothing is.
    pub after: Option<KeyRecord>,
    /// The parts taken out.
    pub parts: Vec<Part>,
    /// Why.
    pub why: Dropped,
}
