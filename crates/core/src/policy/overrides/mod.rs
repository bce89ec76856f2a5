//! Partner upgrades applied at the edge: plan overrides.
//!
//! When the upstream accepts a partner's `POST /v2/service/upgrade`, the customer key whose
//! digest is the body's `apiKey` moves to the plan whose `plan_id` is `planID`
//! ([`Policy::apply_upgrade`]): one atomic store in the key's entry, so the very next request
//! is decided on the new plan's allow-list and limit. The budget carries over as on a reload:
//! the limiter's state is time, so the share of the window already used is kept.
//!
//! An [`Override`] is what is kept (on disk or in Redis, by the runtime) so that it outlives
//! the process: the plan given, and the plan the YAML gave the key at the time. The YAML stays
//! the operator's: when a config is compiled ([`Policy::apply_overrides`]) an override whose key
//! is gone, whose plan is gone, or whose key the YAML has since put on another plan is dropped
//! (the later decision wins), and each drop is reported to be logged and forgotten.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::keys::{Credential, Found, KeyIdx, REVOKED, SUSPENDED};
use super::Policy;
use crate::config::QuotaSpec;
use crate::digest::Digest;
use crate::refusal::{Code, FieldError, Refusal};

/// The changes in force for one digest, as they are kept: a partner's upgrade (`plan_id`,
/// `replaced`, `partner`, `at_ms`: the record of part two, read as it was written then), and
/// the changes of part three, each with when and by whom.
///
/// Each part is kept on its own ([`Part`]): with Redis, replicas that change two parts of one
/// key at once never overwrite each other.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
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
    pub suspended: Option<Change>,
    /// Revoked for good: this digest never authenticates again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<Change>,
    /// The key's own window limit, set live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitChange>,
    /// The key's own quota, set live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaChange>,
    /// The key's YAML when the suspension, limit or quota was set ([`Policy::fingerprint`]):
    /// a reload that changes it drops them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yaml: Option<String>,
}

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

/// One part of an [`Override`], kept on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    /// A partner's upgrade.
    Plan,
    /// A suspension.
    Suspended,
    /// A revocation.
    Revoked,
    /// A live window limit.
    Limit,
    /// A live quota.
    Quota,
}

impl Part {
    /// Every part.
    pub const ALL: [Part; 5] = [
        Part::Plan,
        Part::Suspended,
        Part::Revoked,
        Part::Limit,
        Part::Quota,
    ];

    /// What is appended to a digest's name for this part (the upgrade's name is the digest's
    /// own, as in part two).
    pub fn suffix(self) -> &'static str {
        match self {
            Part::Plan => "",
            Part::Suspended => ":s",
            Part::Revoked => ":r",
            Part::Limit => ":l",
            Part::Quota => ":q",
        }
    }

    /// The part in words (`upgrade`, `suspended`, `revoked`, `limit`, `quota`).
    pub fn name(self) -> &'static str {
        match self {
            Part::Plan => "upgrade",
            Part::Suspended => "suspended",
            Part::Revoked => "revoked",
            Part::Limit => "limit",
            Part::Quota => "quota",
        }
    }

    /// The part a suffix names.
    pub fn of_suffix(suffix: &str) -> Option<Part> {
        Part::ALL.into_iter().find(|p| p.suffix() == suffix)
    }
}

impl Override {
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
        }
        if !self.has(Part::Suspended) && !self.has(Part::Limit) && !self.has(Part::Quota) {
            self.yaml = None;
        }
    }

    /// The record holding `part` alone (with the key's name, and the YAML's fingerprint for
    /// the parts a reload may drop): what is kept under the part's own name. `None` when the
    /// part is not in the record.
    pub fn only(&self, part: Part) -> Option<Override> {
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
    pub fn merge(&mut self, other: Override) {
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
        if other.yaml.is_some() {
            self.yaml = other.yaml;
        }
        if self.key.is_empty() {
            self.key = other.key;
        }
    }
}

/// Every override kept, by the key's digest.
pub type Overrides = HashMap<Digest, Override>;

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
    /// The `action` label of `tollgate_admin_changes_total` when an operator makes it.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Suspend(_) => "suspend",
            Action::Resume => "resume",
            Action::Revoke => "revoke",
            Action::Limit(_) => "limit",
            Action::Quota(_) => "quota",
        }
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
}

impl std::error::Error for ChangeRefused {}

impl std::fmt::Display for ChangeRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChangeRefused::Revoked => {
                "the key is revoked: only a new sha256 in the config brings it back"
            }
            ChangeRefused::NotACustomerKey => {
                "a partner key has no plan: its window limit is `partner_requests_per_window`"
            }
            ChangeRefused::SuspendedByOperator => {
                "the operator suspended the key: only the operator resumes it"
            }
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
}

impl Dropped {
    /// The reason in words, for the log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::KeyGone => "the key is no longer in the config",
            Dropped::YamlChanged => "the config changed the key since",
            Dropped::PlanGone => "no plan has that plan_id any more",
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
    pub before: Override,
    /// What is left; `None` when nothing is.
    pub after: Option<Override>,
    /// The parts taken out.
    pub parts: Vec<Part>,
    /// Why.
    pub why: Dropped,
}

impl Policy {
    /// The plan (an index) whose `plan_id` is `plan_id`.
    pub fn plan_by_id(&self, plan_id: u32) -> Option<usize> {
        self.config.plans.iter().position(|p| p.plan_id == plan_id)
    }

    /// Step 5 for `service_upgrade`: the plan asked for must exist (else `400 invalid_body` at
    /// `/planID`, and nothing is forwarded).
    pub fn upgrade(&self, target: Digest, plan_id: i128) -> Result<Upgrade, Refusal> {
        let plan = u32::try_from(plan_id)
            .ok()
            .and_then(|id| self.plan_by_id(id))
            .ok_or_else(|| {
                let mut r = Refusal::new(
                    Code::InvalidBody,
                    "1 field of the service_upgrade body breaks the gateway's plans",
                );
                r.errors.push(FieldError::new(
                    "/planID",
                    format!("no plan has plan_id {plan_id}"),
                ));
                r
            })?;
        let key = self
            .keys
            .lookup(&target)
            .filter(|&k| matches!(self.keys.get(k).configured, Credential::Customer { .. }));
        Ok(Upgrade { target, plan, key })
    }

    /// The upstream accepted `upgrade`, asked for by the key `by`: put the customer key on
    /// the plan from the next request, and return what to keep (`None`: the key is unknown
    /// here, or back on its YAML plan, so there is nothing to keep), with the plan it was on.
    pub fn apply_upgrade(
        &self,
        upgrade: &Upgrade,
        by: KeyIdx,
        at_ms: u64,
    ) -> Option<(Option<Override>, usize)> {
        let k = upgrade.key?;
        let entry = self.keys.get(k);
        let yaml = entry.configured_plan()?;
        let before = entry.plan_override().unwrap_or(yaml);
        if upgrade.plan == yaml {
            entry.set_plan_override(None);
            return Some((None, before));
        }
        entry.set_plan_override(Some(upgrade.plan));
        let partner = match self.keys.get(by).configured {
            Credential::Partner { partner } => Some(self.config.partners[partner].name.clone()),
            Credential::Customer { .. } => None,
        };
        Some((
            Some(Override {
                plan_id: Some(self.config.plans[upgrade.plan].plan_id),
                replaced: Some(self.config.plans[yaml].plan_id),
                partner,
                at_ms,
                ..Override::named(entry.name.as_str())
            }),
            before,
        ))
    }

    /// A fingerprint of what the YAML says of the key `k`: its digests, plan, limit, quota
    /// and expiry (a hash, never a digest).
    pub fn fingerprint(&self, k: KeyIdx) -> String {
        let e = self.keys.get(k);
        let mut h = sha2::Sha256::new();
        h.update(b"tollgate-key-yaml:");
        h.update(e.digest.0);
        if let Credential::Customer { plan, limit, .. } = e.configured {
            h.update(self.config.plans[plan].name.as_bytes());
            h.update(b"\0");
            h.update(limit.to_be_bytes());
        }
        if let Some(x) = self.keys.extra(k) {
            for (d, until) in &x.previous {
                h.update(d.0);
                h.update(until.to_be_bytes());
            }
            h.update(x.expires_ms.unwrap_or(0).to_be_bytes());
            if let Some(q) = x.quota {
                h.update(q.requests.to_be_bytes());
                h.update(q.per.as_str().as_bytes());
            }
        }
        hex::encode(&h.finalize()[..8])
    }

    /// Put the overrides in `set` on this config's keys, and take off the ones not in it
    /// (another replica's resume, say); what no longer applies is returned, to be logged and
    /// rewritten where it is kept.
    ///
    /// A revocation is of a digest: it holds whatever the YAML says, even for a digest no key
    /// has now (kept, so that the digest never authenticates again). A suspension, a live
    /// limit or quota hold until the YAML changes the key ([`Policy::fingerprint`]); an
    /// upgrade until the YAML moves the key to another plan.
    pub fn apply_overrides(&self, set: &Overrides) -> Vec<Drop> {
        let mut drops = Vec::new();
        let mut touched = vec![false; self.keys.len()];
        let mut touched_alias = vec![false; self.keys.aliases().len()];
        for (digest, o) in set {
            match self.keys.resolve(digest) {
                Some(Found::Key(k)) => touched[k as usize] = true,
                Some(Found::Alias(a)) => touched_alias[a as usize] = true,
                None => {}
            }
            drops.extend(self.apply_record(digest, o));
        }
        // What is in force here but no longer in the set: gone.
        for (k, e) in self.keys.iter() {
            if touched[k as usize] {
                continue;
            }
            if e.live().changed_beyond_expiry() {
                e.set_plan_override(None);
                e.set_flag(SUSPENDED | REVOKED, false);
                e.set_live_limit(None);
            }
            let yaml = self.keys.extra(k).and_then(|x| x.quota);
            if e.own_quota() != yaml {
                self.keys.set_own_quota(k, yaml);
            }
        }
        for (a, alias) in self.keys.aliases() {
            if !touched_alias[a as usize] {
                alias.set_flag(REVOKED, false);
            }
        }
        drops
    }

    /// Put the record `o` kept under `digest` on this config's keys (leaving the others as
    /// they are); what of it no longer applies ([`Policy::apply_overrides`]).
    pub fn apply_record(&self, digest: &Digest, o: &Override) -> Option<Drop> {
        let mut after = o.clone();
        let mut parts = Vec::new();
        let mut why = Dropped::KeyGone;
        let mut drop = |after: &mut Override, part: Part, w: Dropped| {
            if after.has(part) {
                after.clear(part);
                parts.push(part);
                why = w;
            }
        };
        let not_revoked = [Part::Plan, Part::Suspended, Part::Limit, Part::Quota];
        match self.keys.resolve(digest) {
            None => {
                for part in not_revoked {
                    drop(&mut after, part, Dropped::KeyGone);
                }
            }
            Some(Found::Alias(a)) => {
                // An earlier digest of a key now: only its revocation still applies.
                for part in not_revoked {
                    drop(&mut after, part, Dropped::YamlChanged);
                }
                self.keys
                    .alias(a)
                    .set_flag(REVOKED, after.revoked.is_some());
            }
            Some(Found::Key(k)) => {
                let entry = self.keys.get(k);
                match (entry.configured_plan(), o.plan_id, o.replaced) {
                    (_, None, _) => {}
                    (None, Some(_), _) => drop(&mut after, Part::Plan, Dropped::KeyGone),
                    (Some(yaml), Some(_), replaced)
                        if Some(self.config.plans[yaml].plan_id) != replaced =>
                    {
                        drop(&mut after, Part::Plan, Dropped::YamlChanged);
                    }
                    (Some(_), Some(id), _) if self.plan_by_id(id).is_none() => {
                        drop(&mut after, Part::Plan, Dropped::PlanGone);
                    }
                    _ => {}
                }
                let admin = [Part::Suspended, Part::Limit, Part::Quota];
                if admin.iter().any(|&p| o.has(p))
                    && o.yaml.as_deref() != Some(self.fingerprint(k).as_str())
                {
                    for part in admin {
                        drop(&mut after, part, Dropped::YamlChanged);
                    }
                }
                entry.set_plan_override(after.plan_id.and_then(|id| self.plan_by_id(id)));
                entry.set_flag(SUSPENDED, after.suspended.is_some());
                entry.set_flag(REVOKED, after.revoked.is_some());
                entry.set_live_limit(after.limit.as_ref().map(|l| l.requests_per_window));
                let yaml = self.keys.extra(k).and_then(|x| x.quota);
                self.keys
                    .set_own_quota(k, after.quota.as_ref().map(|q| q.quota).or(yaml));
            }
        }
        (!parts.is_empty()).then(|| Drop {
            digest: *digest,
            before: o.clone(),
            after: (!after.is_empty()).then_some(after),
            parts,
            why,
        })
    }

    /// What to keep for `action` on the key `k`, by `by` (`admin` or `partner:<name>`) at
    /// `now_ms`, given the records in force: each digest's record after the change, with the
    /// part changed (a part absent from the record is one to remove). Nothing is applied:
    /// the caller keeps the records first, then applies them ([`Policy::apply_record`]).
    pub fn change(
        &self,
        k: KeyIdx,
        action: &Action,
        by: &str,
        now_ms: u64,
        in_force: &Overrides,
    ) -> Result<Vec<(Digest, Part, Override)>, ChangeRefused> {
        let entry = self.keys.get(k);
        let name = entry.name.as_str();
        let record = |d: &Digest| {
            let mut o = in_force
                .get(d)
                .cloned()
                .unwrap_or_else(|| Override::named(name));
            o.key = name.to_string();
            o
        };
        let stamp = |reason: Option<String>| Change {
            since_ms: now_ms,
            by: by.to_string(),
            reason,
        };
        let customer = matches!(entry.configured, Credential::Customer { .. });
        let mut o = record(&entry.digest);
        let part = match action {
            Action::Revoke => {
                let mut out = Vec::new();
                let digests =
                    std::iter::once(entry.digest).chain(self.keys.aliases_of(k).map(|a| a.digest));
                for d in digests {
                    let mut o = record(&d);
                    o.revoked.get_or_insert_with(|| stamp(None));
                    out.push((d, Part::Revoked, o));
                }
                return Ok(out);
            }
            _ if o.revoked.is_some() => return Err(ChangeRefused::Revoked),
            Action::Suspend(reason) => {
                o.suspended = Some(stamp(reason.clone()));
                Part::Suspended
            }
            Action::Resume
                if by.starts_with("partner:")
                    && o.suspended
                        .as_ref()
                        .is_some_and(|s| !s.by.starts_with("partner:")) =>
            {
                // The operator's suspension outranks a partner's resume.
                return Err(ChangeRefused::SuspendedByOperator);
            }
            Action::Resume => {
                o.suspended = None;
                Part::Suspended
            }
            Action::Limit(_) | Action::Quota(_) if !customer => {
                return Err(ChangeRefused::NotACustomerKey)
            }
            Action::Limit(n) => {
                o.limit = n.map(|requests_per_window| LimitChange {
                    requests_per_window,
                    change: stamp(None),
                });
                Part::Limit
            }
            Action::Quota(q) => {
                o.quota = q.map(|quota| QuotaChange {
                    quota,
                    change: stamp(None),
                });
                Part::Quota
            }
        };
        if o.has(Part::Suspended) || o.has(Part::Limit) || o.has(Part::Quota) {
            o.yaml = Some(self.fingerprint(k));
        } else {
            o.yaml = None;
        }
        Ok(vec![(entry.digest, part, o)])
    }

    /// Keys with an upgrade in force.
    pub fn overrides_in_force(&self) -> usize {
        self.keys
            .iter()
            .filter(|(_, e)| e.plan_override().is_some())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::authenticate::AuthHeader;
    use crate::policy::RequestHead;
    use crate::testing::{digest, TestConfig};

    fn policy(c: TestConfig) -> Policy {
        Policy::new(c.parse(), None)
    }

    fn plan_of(p: &Policy, key: &str) -> String {
        let k = p.keys.lookup(&digest(key)).unwrap();
        match p.keys.get(k).credential() {
            Credential::Customer { plan, .. } => p.config.plans[plan].name.clone(),
            Credential::Partner { .. } => "partner".into(),
        }
    }

    fn partner(p: &Policy, key: &str) -> KeyIdx {
        p.keys.lookup(&digest(key)).unwrap()
    }

    #[test]
    fn an_unknown_plan_id_is_invalid_body_at_plan_id() {
        let p = policy(TestConfig::new());
        for id in [99, -1, 1 << 40] {
            let r = p.upgrade(digest("basic-key-1"), id).unwrap_err();
            assert_eq!(r.code, Code::InvalidBody);
            assert_eq!(r.errors[0].pointer, "/planID");
        }
        assert!(p.upgrade(digest("basic-key-1"), 2).is_ok());
    }

    #[test]
    fn an_accepted_upgrade_applies_from_the_next_decision_and_back_to_the_yaml_plan_clears_it() {
        let p = policy(TestConfig::new());
        let head = RequestHead {
            method: "POST",
            path: "/v2/settings/webhook/set",
            authorization: AuthHeader::One(b"Bearer acme-customer-key"),
        };
        assert!(
            p.decide(&head, 0).verdict.is_err(),
            "Basic may not set webhooks"
        );
        let by = partner(&p, "acme-partner-key");
        let up = p.upgrade(digest("acme-customer-key"), 2).unwrap();
        let (kept, before) = p.apply_upgrade(&up, by, 1234).unwrap();
        let kept = kept.unwrap();
        assert_eq!((kept.plan_id, kept.replaced), (Some(2), Some(1)));
        assert_eq!(kept.partner.as_deref(), Some("acme"));
        assert_eq!(kept.key, "acme-customer");
        assert_eq!(p.config.plans[before].name, "basic");
        assert_eq!(plan_of(&p, "acme-customer-key"), "standard");
        assert!(p.decide(&head, 0).verdict.is_ok(), "Standard may");
        // Back to Basic, the YAML's plan: nothing to keep.
        let up = p.upgrade(digest("acme-customer-key"), 1).unwrap();
        let (kept, _) = p.apply_upgrade(&up, by, 1235).unwrap();
        assert_eq!(kept, None);
        assert_eq!(plan_of(&p, "acme-customer-key"), "basic");
    }

    #[test]
    fn an_unknown_key_or_a_partner_key_is_forwarded_and_nothing_is_applied() {
        let p = policy(TestConfig::new());
        let by = partner(&p, "acme-partner-key");
        let up = p.upgrade(digest("nobody"), 2).unwrap();
        assert_eq!(up.key, None);
        assert_eq!(p.apply_upgrade(&up, by, 0), None);
        let up = p.upgrade(digest("globex-partner-key"), 2).unwrap();
        assert_eq!(up.key, None);
    }

    #[test]
    fn the_budget_carries_over_as_the_share_of_the_window_used() {
        let p = policy(TestConfig::new());
        let head = RequestHead {
            method: "GET",
            path: "/v2/client/getStatus",
            authorization: AuthHeader::One(b"Bearer basic-key-1"),
        };
        for _ in 0..20 {
            p.decide(&head, 0).verdict.unwrap();
        }
        // Half of Basic's 40: half of Pro's 150 is left after the upgrade.
        let by = partner(&p, "acme-partner-key");
        let up = p.upgrade(digest("basic-key-1"), 3).unwrap();
        p.apply_upgrade(&up, by, 0).unwrap();
        let q = p.decide(&head, 0).budget.unwrap();
        assert_eq!(q.limit, 150);
        assert_eq!(q.remaining, 74);
    }

    #[test]
    fn a_new_config_keeps_an_override_unless_the_yaml_moved_the_key_or_dropped_it() {
        let first = policy(TestConfig::new());
        let by = partner(&first, "acme-partner-key");
        let mut set = Overrides::new();
        for (key, plan) in [
            ("basic-key-1", 2),
            ("acme-customer-key", 3),
            ("standard-key-1", 3),
        ] {
            let up = first.upgrade(digest(key), plan).unwrap();
            let (kept, _) = first.apply_upgrade(&up, by, 0).unwrap();
            set.insert(digest(key), kept.unwrap());
        }
        // The YAML moves standard-key-1 to pro itself, and drops acme-customer.
        let next = Policy::new(
            TestConfig::new()
                .key_plan("standard-1", "pro")
                .without_key("acme-customer")
                .parse(),
            Some(&first),
        );
        let mut dropped = next.apply_overrides(&set);
        dropped.sort_by_key(|d| d.before.key.clone());
        assert!(dropped.iter().all(|d| d.after.is_none()));
        let why: Vec<(&str, Dropped)> = dropped
            .iter()
            .map(|d| (d.before.key.as_str(), d.why))
            .collect();
        assert_eq!(
            why,
            [
                ("acme-customer", Dropped::KeyGone),
                ("standard-1", Dropped::YamlChanged)
            ]
        );
        assert_eq!(plan_of(&next, "basic-key-1"), "standard");
        assert_eq!(plan_of(&next, "standard-key-1"), "pro");
        assert_eq!(next.overrides_in_force(), 1);
        // The set without basic-1's: it is back on its YAML plan.
        let mut left = set.clone();
        left.remove(&digest("basic-key-1"));
        next.apply_overrides(&left);
        assert_eq!(plan_of(&next, "basic-key-1"), "basic");
        assert_eq!(next.overrides_in_force(), 0);
    }
}
