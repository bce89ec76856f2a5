//! How changes are applied to the key table: an upgrade checked and applied, the records
//! kept put on a config's keys (and what no longer applies dropped), an operator's change
//! turned into the records to keep.

use sha2::Digest as _;

use super::action::{Action, ChangeRefused, Drop, Dropped, Upgrade};
use super::part::Part;
use super::record::{Change, KeyRecord, LimitChange, QuotaChange};
use super::records::{HeldRecord, KeyRecords, PlainIssued};
use crate::digest::Digest;
use crate::policy::keys::{Credential, Found, KeyIdx, REVOKED, SUSPENDED};
use crate::policy::Policy;
use crate::refusal::{Code, FieldError, Refusal};

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
            .filter(|&k| matches!(self.keys.get(k).configured(), Credential::Customer { .. }));
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
    ) -> Option<(Option<KeyRecord>, usize)> {
        let k = upgrade.key?;
        let entry = self.keys.get(k);
        let yaml = entry.configured_plan()?;
        let before = entry.plan_override().unwrap_or(yaml);
        if upgrade.plan == yaml {
            self.keys.set_plan_override(k, None);
            return Some((None, before));
        }
        self.keys.set_plan_override(k, Some(upgrade.plan));
        let partner = match self.keys.get(by).configured() {
            Credential::Partner { partner } => Some(self.config.partners[partner].name.clone()),
            Credential::Customer { .. } => None,
        };
        Some((
            Some(KeyRecord {
                plan_id: Some(self.config.plans[upgrade.plan].plan_id),
                replaced: Some(self.config.plans[yaml].plan_id),
                partner,
                at_ms,
                ..KeyRecord::named(entry.name.as_str())
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
        if let Credential::Customer { plan, limit, .. } = e.configured() {
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
    ///
    /// On a table that holds issued keys already, the records that hold none (a deletion)
    /// are put first: a key deleted leaves its name before another key issued with it comes
    /// (two live keys of one name are a contest: `Issued::keeps_name`).
    pub fn apply_overrides(&self, set: &KeyRecords) -> Vec<Drop> {
        let filling = self.keys.issued().is_empty();
        let issued = if filling { set.issued_count() } else { 0 };
        let mut applying = self.applying(issued);
        let mut put = |issues: Option<bool>| {
            for (digest, held) in set.held() {
                match held {
                    HeldRecord::Whole(o) if issues.is_none_or(|i| o.issued.is_some() == i) => {
                        applying.record(digest, o)
                    }
                    HeldRecord::Plain(key) if issues != Some(false) => applying.plain(digest, &key),
                    _ => {}
                }
            }
        };
        match filling {
            true => put(None),
            false => {
                put(Some(false));
                put(Some(true));
            }
        }
        applying.finish()
    }

    /// [`Policy::apply_overrides`] a record at a time, for a set that comes in pieces: a
    /// start puts each batch of records in force while the next is read. `issued` is about
    /// how many keys the records issue (room is made for them at once, in a table that has
    /// none yet); the records must come in the set's order, each once.
    pub fn applying(&self, issued: usize) -> Applying<'_> {
        if self.keys.issued().is_empty() {
            self.keys.issued().reserve(issued);
        }
        Applying {
            policy: self,
            touched: vec![false; self.keys.len()],
            touched_alias: vec![false; self.keys.aliases().len()],
            now_ms: crate::clock::wall_ms(),
            drops: Vec::new(),
        }
    }

    /// Put the record `o` kept under `digest` on this config's keys (leaving the others as
    /// they are); what of it no longer applies ([`Policy::apply_overrides`]).
    pub fn apply_record(&self, digest: &Digest, o: &KeyRecord) -> Option<Drop> {
        self.apply_one(digest, o, crate::clock::wall_ms()).1
    }

    /// What `digest`'s record is of here, once applied: an issued key is put in the table
    /// first (or taken out, when its record no longer holds it).
    fn found(&self, digest: &Digest, o: &KeyRecord, now_ms: u64) -> Option<Found> {
        let issued_here = || {
            self.keys
                .issued()
                .find(&o.key)
                .map(|s| self.keys.configured() as KeyIdx + s)
                .filter(|&k| self.keys.get(k).digest == *digest)
        };
        match &o.issued {
            // `None`: its plan or partner is not this config's: left alone, never dropped.
            Some(issued) => self.put_issued(&o.key, issued, now_ms).map(Found::Key),
            None => {
                if let Some(k) = issued_here() {
                    // Deleted: its other parts go with it.
                    self.keys.remove_issued(k);
                    return None;
                }
                match self.keys.resolve(digest) {
                    // Another digest of an issued key (the one in force after a rotation):
                    // what is kept under it is its revocation at deletion.
                    Some(Found::Key(k))
                        if self.keys.issued_slot(k).is_some()
                            && self.keys.get(k).digest != *digest =>
                    {
                        None
                    }
                    found => found,
                }
            }
        }
    }

    fn apply_one(
        &self,
        digest: &Digest,
        o: &KeyRecord,
        now_ms: u64,
    ) -> (Option<Found>, Option<Drop>) {
        let found = self.found(digest, o, now_ms);
        (found, self.apply_found(digest, o, found))
    }

    fn apply_found(&self, digest: &Digest, o: &KeyRecord, found: Option<Found>) -> Option<Drop> {
        // Copied only when a part is dropped (a start puts back a million records, each whole).
        let mut after = std::borrow::Cow::Borrowed(o);
        let mut parts = Vec::new();
        let mut why = Dropped::KeyGone;
        let mut drop = |after: &mut std::borrow::Cow<'_, KeyRecord>, part: Part, w: Dropped| {
            if after.has(part) {
                after.to_mut().clear(part);
                parts.push(part);
                why = w;
            }
        };
        let not_revoked = [Part::Plan, Part::Suspended, Part::Limit, Part::Quota];
        match found {
            None if o.issued.is_some() => {}
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
                // A key with nothing in force, and a record with nothing for it but its quota
                // (a key issued, put back at a start: a million of them), is left as it is.
                let sets = [Part::Plan, Part::Suspended, Part::Revoked, Part::Limit];
                if !entry.live().is_plain() || sets.iter().any(|&p| after.has(p)) {
                    self.keys
                        .set_plan_override(k, after.plan_id.and_then(|id| self.plan_by_id(id)));
                    self.keys.set_flag(k, SUSPENDED, after.suspended.is_some());
                    self.keys.set_flag(k, REVOKED, after.revoked.is_some());
                    entry.set_live_limit(after.limit.as_ref().map(|l| l.requests_per_window));
                }
                let yaml = self.keys.extra(k).and_then(|x| x.quota);
                self.keys
                    .set_own_quota(k, after.quota.as_ref().map(|q| q.quota).or(yaml));
            }
        }
        (!parts.is_empty()).then(|| Drop {
            digest: *digest,
            before: o.clone(),
            after: (!after.is_empty()).then(|| after.into_owned()),
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
        in_force: &KeyRecords,
    ) -> Result<Vec<(Digest, Part, KeyRecord)>, ChangeRefused> {
        let entry = self.keys.get(k);
        let name = entry.name.as_str();
        let record = |d: &Digest| {
            let mut o = in_force.record(d).unwrap_or_else(|| KeyRecord::named(name));
            o.key = name.to_string();
            o
        };
        let stamp = |reason: Option<String>| Change {
            since_ms: now_ms,
            by: by.to_string(),
            reason,
        };
        let customer = matches!(entry.configured(), Credential::Customer { .. });
        let mut o = record(&entry.digest);
        let part = match action {
            Action::Revoke => {
                let mut out = Vec::new();
                let digests =
                    std::iter::once(entry.digest).chain(self.keys.aliases_of(k).map(|a| a.digest));
                for d in digests {
                    let mut o = record(&d);
                    o.revoked.get_or_insert_with(|| Box::new(stamp(None)));
                    out.push((d, Part::Revoked, o));
                }
                return Ok(out);
            }
            _ if o.revoked.is_some() => return Err(ChangeRefused::Revoked),
            Action::Suspend(reason) => {
                o.suspended = Some(Box::new(stamp(reason.clone())));
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
                o.limit = n.map(|requests_per_window| {
                    Box::new(LimitChange {
                        requests_per_window,
                        change: stamp(None),
                    })
                });
                Part::Limit
            }
            Action::Quota(q) => {
                o.quota = q.map(|quota| {
                    Box::new(QuotaChange {
                        quota,
                        change: stamp(None),
                    })
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

/// The records of a set being put on a policy's keys, one at a time ([`Policy::applying`]):
/// which keys they touched, and what of them no longer applies.
pub struct Applying<'p> {
    policy: &'p Policy,
    touched: Vec<bool>,
    touched_alias: Vec<bool>,
    now_ms: u64,
    drops: Vec<Drop>,
}

impl Applying<'_> {
    /// Put the record `o`, kept under `digest`, on the keys.
    pub fn record(&mut self, digest: &Digest, o: &KeyRecord) {
        let (found, drop) = self.policy.apply_one(digest, o, self.now_ms);
        self.note(found, drop);
    }

    /// Put a plain issued key's record, read where the set holds it, on the keys: as
    /// [`Applying::record`] would put it whole, without making it whole.
    pub fn plain(&mut self, digest: &Digest, key: &PlainIssued<'_>) {
        let p = self.policy;
        let found = p
            .put_plain_issued(*digest, key, self.now_ms)
            .map(Found::Key);
        // Nothing but the issued part, which is the key itself: no part to put or drop.
        let drop = p.apply_found(digest, &KeyRecord::default(), found);
        self.note(found, drop);
    }

    fn note(&mut self, found: Option<Found>, drop: Option<Drop>) {
        match found {
            Some(Found::Key(k)) => {
                if k as usize >= self.touched.len() {
                    self.touched.resize(k as usize + 1, false);
                }
                self.touched[k as usize] = true;
            }
            Some(Found::Alias(a)) => self.touched_alias[a as usize] = true,
            None => {}
        }
        self.drops.extend(drop);
    }

    /// Every record put: take off what no record touched (an issued key not in the set is
    /// deleted), and return what no longer applies.
    pub fn finish(self) -> Vec<Drop> {
        let Self {
            policy: p,
            touched,
            touched_alias,
            drops,
            ..
        } = self;
        let touched = |k: KeyIdx| touched.get(k as usize).copied().unwrap_or(false);
        // What is in force here but no longer in the set: gone (an issued key: deleted).
        let gone: Vec<KeyIdx> = p
            .keys
            .iter()
            .filter(|&(k, _)| !touched(k))
            .filter_map(|(k, _)| p.keys.issued_slot(k).map(|_| k))
            .collect();
        for k in gone {
            p.keys.remove_issued(k);
        }
        p.keys.issued().settle();
        for (k, e) in p.keys.iter() {
            if touched(k) {
                continue;
            }
            if e.live().changed_beyond_expiry() {
                p.keys.set_plan_override(k, None);
                p.keys.set_flag(k, SUSPENDED | REVOKED, false);
                e.set_live_limit(None);
            }
            let yaml = p.keys.extra(k).and_then(|x| x.quota);
            if e.own_quota() != yaml {
                p.keys.set_own_quota(k, yaml);
            }
        }
        for (a, alias) in p.keys.aliases() {
            if !touched_alias[a as usize] {
                alias.set_flag(REVOKED, false);
            }
        }
        drops
    }
}
