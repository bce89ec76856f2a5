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

use super::keys::{Credential, KeyIdx};
use super::refusal::{Code, FieldError, Refusal};
use super::Policy;
use crate::digest::Digest;

/// A partner's upgrade of a customer key, as it is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// The `plan_id` of the plan in force for the key.
    pub plan_id: u32,
    /// The `plan_id` of the plan the YAML gave the key when the override was made.
    pub replaced: u32,
    /// The key's name then (for the admin API and logs; never the key).
    pub key: String,
    /// The partner whose upgrade it was, by name.
    pub partner: Option<String>,
    /// When it was made, in ms since the Unix epoch.
    pub at_ms: u64,
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

/// Why an override was dropped when a config was compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// No key has that digest any more.
    KeyGone,
    /// The YAML now gives the key another plan than the one the override replaced.
    YamlChanged,
    /// No plan has the override's `plan_id` any more.
    PlanGone,
}

impl Dropped {
    /// The reason in words, for the log line.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::KeyGone => "the key is no longer in the config",
            Dropped::YamlChanged => "the config gives the key another plan since",
            Dropped::PlanGone => "no plan has that plan_id any more",
        }
    }
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
                plan_id: self.config.plans[upgrade.plan].plan_id,
                replaced: self.config.plans[yaml].plan_id,
                key: entry.name.as_str().to_string(),
                partner,
                at_ms,
            }),
            before,
        ))
    }

    /// Put the overrides in `set` on this config's keys; the ones that no longer apply are
    /// returned with the reason, to be logged and forgotten.
    pub fn apply_overrides(&self, set: &Overrides) -> Vec<(Digest, Override, Dropped)> {
        let mut dropped = Vec::new();
        for (digest, o) in set {
            let Some(k) = self.keys.lookup(digest) else {
                dropped.push((*digest, o.clone(), Dropped::KeyGone));
                continue;
            };
            let entry = self.keys.get(k);
            let Some(yaml) = entry.configured_plan() else {
                dropped.push((*digest, o.clone(), Dropped::KeyGone));
                continue;
            };
            if self.config.plans[yaml].plan_id != o.replaced {
                entry.set_plan_override(None);
                dropped.push((*digest, o.clone(), Dropped::YamlChanged));
                continue;
            }
            match self.plan_by_id(o.plan_id) {
                Some(plan) => entry.set_plan_override(Some(plan)),
                None => {
                    entry.set_plan_override(None);
                    dropped.push((*digest, o.clone(), Dropped::PlanGone));
                }
            }
        }
        dropped
    }

    /// Take the override off the key named `name`: its digest, when it had one.
    pub fn clear_override(&self, name: &str) -> Option<Digest> {
        let k = self.keys.find_by_name(name)?;
        let entry = self.keys.get(k);
        entry.plan_override()?;
        entry.set_plan_override(None);
        Some(entry.digest)
    }

    /// Keys with an override in force.
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
        assert_eq!((kept.plan_id, kept.replaced), (2, 1));
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
        let q = p.decide(&head, 0).quota.unwrap();
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
        dropped.sort_by_key(|d| d.1.key.clone());
        let why: Vec<(&str, Dropped)> = dropped.iter().map(|d| (d.1.key.as_str(), d.2)).collect();
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
        assert_eq!(next.clear_override("basic-1"), Some(digest("basic-key-1")));
        assert_eq!(plan_of(&next, "basic-key-1"), "basic");
        assert_eq!(next.clear_override("basic-1"), None);
    }
}
