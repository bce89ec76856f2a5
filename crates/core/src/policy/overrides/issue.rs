//! Keys issued through the admin API, as records: a new key, a rotation and a deletion turned
//! into what to keep ([`Policy::issue`], [`Policy::rotate`], [`Policy::delete`]), and a kept
//! key put in the table (`Policy::put_issued`). Like every change, nothing is applied here:
//! the caller keeps the records, then applies them ([`Policy::apply_record`]).

use super::action::ChangeRefused;
use super::part::Part;
use super::record::{Change, IssuedKey, KeyRecord, PreviousDigest};
use super::records::{KeyRecords, PlainIssued};
use crate::config::{KeyExtra, QuotaSpec};
use crate::digest::Digest;
use crate::policy::keys::{Credential, KeyIdx, NewIssued};
use crate::policy::Policy;

/// A key to issue. Its plan and partner are by name, found in the config in force when the
/// change is made (a reload between the request's check and the change may have moved them).
#[derive(Clone, Debug)]
pub struct NewKey {
    /// Its name.
    pub name: String,
    /// Its plan's name.
    pub plan: String,
    /// The name of the partner that manages it.
    pub partner: Option<String>,
    /// When it expires (ms since the Unix epoch).
    pub expires_ms: Option<u64>,
    /// Its own window limit.
    pub requests_per_window: Option<u32>,
    /// Its own quota.
    pub quota: Option<QuotaSpec>,
}

impl Policy {
    /// What to keep to issue `key` with the digest `digest`, by `by` at `now_ms`: refused
    /// when a key has that name, or any key has or had that digest (a revoked digest never
    /// authenticates again; one a rotation replaced is never another key's).
    pub fn issue(
        &self,
        key: &NewKey,
        digest: Digest,
        by: &str,
        now_ms: u64,
        in_force: &KeyRecords,
    ) -> Result<Vec<(Digest, Part, KeyRecord)>, ChangeRefused> {
        if self.keys.find_by_name(&key.name).is_some() {
            return Err(ChangeRefused::KeyExists("name"));
        }
        if self.keys.resolve(&digest).is_some() || in_force.holds(&digest) {
            return Err(ChangeRefused::KeyExists("sha256"));
        }
        let plan = self
            .config
            .plan(&key.plan)
            .ok_or(ChangeRefused::NotInConfig("plan"))?;
        if let Some(p) = &key.partner {
            if !self.config.partners.iter().any(|x| &x.name == p) {
                return Err(ChangeRefused::NotInConfig("partner"));
            }
        }
        let issued = IssuedKey {
            id: digest,
            digest,
            previous: Vec::new(),
            plan_id: plan.plan_id,
            partner: key.partner.clone(),
            expires_ms: key.expires_ms,
            requests_per_window: key.requests_per_window,
            quota: key.quota,
            change: Change {
                since_ms: now_ms,
                by: by.to_string(),
                reason: None,
            },
            rotated_ms: None,
        };
        let record = KeyRecord {
            issued: Some(Box::new(issued)),
            ..KeyRecord::named(&key.name)
        };
        Ok(vec![(digest, Part::Issued, record)])
    }

    /// What to keep to rotate the issued key `k` to the digest `digest`: the one in force
    /// authenticates as the key for `overlap_ms` more (0: not at all); earlier ones keep
    /// their own ends. Every digest replaced stays in the record after its end, one entry a
    /// rotation, so that none is issued again.
    pub fn rotate(
        &self,
        k: KeyIdx,
        digest: Digest,
        overlap_ms: u64,
        now_ms: u64,
        in_force: &KeyRecords,
    ) -> Result<Vec<(Digest, Part, KeyRecord)>, ChangeRefused> {
        let (id, mut record) = self.issued_record(k, in_force)?;
        if record.revoked.is_some() {
            return Err(ChangeRefused::Revoked);
        }
        if self.keys.resolve(&digest).is_some() || in_force.holds(&digest) {
            return Err(ChangeRefused::KeyExists("sha256"));
        }
        let issued = record.issued.as_mut().expect("an issued key's record");
        // Kept after its overlap too (0: none, ended at once), so that the digest replaced
        // is never issued again: a secret that was a key's never becomes another's.
        issued.previous.push(PreviousDigest {
            digest: issued.digest,
            until_ms: now_ms.saturating_add(overlap_ms),
        });
        issued.digest = digest;
        issued.rotated_ms = Some(now_ms);
        Ok(vec![(id, Part::Issued, record)])
    }

    /// What to keep to delete the issued key `k`: the key taken out, and each of its digests
    /// revoked for good (kept, so that none authenticates again, nor is issued again).
    pub fn delete(
        &self,
        k: KeyIdx,
        by: &str,
        now_ms: u64,
        in_force: &KeyRecords,
    ) -> Result<Vec<(Digest, Part, KeyRecord)>, ChangeRefused> {
        let (id, record) = self.issued_record(k, in_force)?;
        let issued = record.issued.clone().expect("an issued key's record");
        let revoked = Change {
            since_ms: now_ms,
            by: by.to_string(),
            reason: None,
        };
        let mut out = Vec::new();
        for d in issued.digests() {
            let mut o = in_force
                .record(&d)
                .unwrap_or_else(|| KeyRecord::named(&record.key));
            o.issued = None;
            let first = o.revoked.is_none();
            o.revoked.get_or_insert_with(|| Box::new(revoked.clone()));
            if d == id {
                out.push((d, Part::Issued, o.clone()));
            }
            if first {
                out.push((d, Part::Revoked, o));
            }
        }
        Ok(out)
    }

    /// The issued key `k`'s id and record in force; refused for a key of the YAML.
    fn issued_record(
        &self,
        k: KeyIdx,
        in_force: &KeyRecords,
    ) -> Result<(Digest, KeyRecord), ChangeRefused> {
        let id = self
            .keys
            .issued_slot(k)
            .ok_or(ChangeRefused::DefinedInConfig)?
            .entry
            .digest;
        // An issued slot whose record holds no issued key: deleted by a change made before
        // this one and not yet out of the table (an earlier change of the same batch).
        let record = in_force
            .record(&id)
            .filter(|o| o.issued.is_some())
            .ok_or(ChangeRefused::Deleted)?;
        Ok((id, record))
    }

    /// Put the key `issued` kept under `id` as `name` in the table (or bring it up to date);
    /// its index. `None` when this config has no plan with its `plan_id`, or not its partner
    /// (a replica on an older config: the key is left to a replica that has them, never
    /// dropped), and when another key issued with its name keeps the name (the table's
    /// `take_lost` then names it).
    pub(super) fn put_issued(&self, name: &str, issued: &IssuedKey, now_ms: u64) -> Option<KeyIdx> {
        let digests: Vec<(Digest, u64)> = issued.authenticating(now_ms).collect();
        let plain = PlainIssued {
            name,
            plan_id: issued.plan_id,
            expires_ms: issued.expires_ms,
            requests_per_window: issued.requests_per_window,
            quota: issued.quota,
        };
        self.put_issued_parts(
            &plain,
            issued.id,
            issued.partner.as_deref(),
            &digests,
            now_ms,
        )
    }

    /// [`Policy::put_issued`] for a plain issued key read where the set holds it
    /// ([`HeldRecord::Plain`](super::HeldRecord::Plain)): its `id` is its one digest.
    pub(super) fn put_plain_issued(
        &self,
        id: Digest,
        plain: &PlainIssued<'_>,
        now_ms: u64,
    ) -> Option<KeyIdx> {
        self.put_issued_parts(plain, id, None, &[(id, u64::MAX)], now_ms)
    }

    fn put_issued_parts(
        &self,
        key: &PlainIssued<'_>,
        id: Digest,
        partner: Option<&str>,
        digests: &[(Digest, u64)],
        now_ms: u64,
    ) -> Option<KeyIdx> {
        let plan = self.plan_by_id(key.plan_id)?;
        let partner = match partner {
            Some(p) => Some(self.config.partners.iter().position(|x| x.name == p)?),
            None => None,
        };
        let extra = KeyExtra {
            previous: Vec::new(),
            expires_ms: key.expires_ms,
            limit: key.requests_per_window.and_then(std::num::NonZeroU32::new),
            quota: key.quota,
        };
        let plain = extra == KeyExtra::default();
        self.keys.put_issued(NewIssued {
            name: key.name,
            id,
            credential: Credential::Customer {
                plan,
                partner,
                limit: key.requests_per_window.unwrap_or(0),
            },
            extra: (!plain).then_some(extra),
            digests,
            now_ms,
        })
    }
}

/// Whether the keys issued (the records of `set` that hold one) can live beside `config`:
/// no YAML key has an issued key's name or one of its digests, and every issued key's plan
/// and partner are the config's. A reload that breaks this is refused (a reload never
/// removes an issued key), naming the field, as `tollgate check` refuses the file.
pub fn check_issued(
    config: &crate::config::Config,
    set: &KeyRecords,
) -> Result<(), crate::config::ConfigError> {
    use std::collections::HashMap;
    let mut issued = set.issued().peekable();
    if issued.peek().is_none() {
        return Ok(());
    }
    let fail = |field: String, message: String| {
        Err(crate::config::ConfigError {
            line: crate::config::line_in(&config.source, &field),
            file: config.source.clone(),
            field,
            message,
        })
    };
    let mut names: HashMap<&str, ()> = HashMap::with_capacity(set.len());
    let mut digests: HashMap<Digest, &str> = HashMap::new();
    for i in issued {
        let name = i.name;
        names.insert(name, ());
        for d in i.digests {
            digests.insert(d, name);
        }
        if !config.plans.iter().any(|p| p.plan_id == i.plan_id) {
            return fail(
                "plans".into(),
                format!("no plan has plan_id {} any more, and the issued key `{name}` is on it: keep the plan, or delete the key first (DELETE /api/keys/{name})", i.plan_id),
            );
        }
        if let Some(p) = i.partner {
            if !config.partners.iter().any(|x| x.name.as_str() == p) {
                return fail(
                    "partners".into(),
                    format!("no partner is named `{p}` any more, and it manages the issued key `{name}`: keep the partner, or delete the key first"),
                );
            }
        }
    }
    for (at, k) in config.keys.iter().enumerate() {
        if names.contains_key(k.name.as_str()) {
            return fail(
                format!("keys[{at}].name"),
                format!("`{}` is the name of a key issued through the admin API: name this one otherwise", k.name.as_str()),
            );
        }
        let previous = k.extra.iter().flat_map(|x| x.previous.iter().map(|p| p.0));
        for d in std::iter::once(k.digest).chain(previous) {
            if let Some(owner) = digests.get(&d) {
                return fail(
                    format!("keys[{at}].sha256"),
                    format!("is a digest of the key `{owner}`, issued through the admin API (a digest is one key's)"),
                );
            }
        }
    }
    for (at, p) in config.partners.iter().enumerate() {
        if let Some(owner) = digests.get(&p.digest) {
            return fail(
                format!("partners[{at}].sha256"),
                format!("is a digest of the key `{owner}`, issued through the admin API (a digest is one key's)"),
            );
        }
    }
    Ok(())
}
