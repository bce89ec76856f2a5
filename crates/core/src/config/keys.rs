//! The `partners` and `keys` sections: names, digests (from `sha256`, `key` or `key_env`),
//! plans and partners checked; duplicates refused across both lists (one bearer token, one
//! identity); the demo's published keys pointed out.
//!
//! A million keys are checked for duplicates by sorting (sequential memory), not entry by
//! entry in a hash index (a cache miss per entry). Only when something is wrong are they
//! checked again entry by entry, in file order, so that the error is the first one there is.

use std::collections::HashMap;
use std::hash::BuildHasher;

use super::file::{self, FilePartner, KeyFields};
use super::keyname::{KeyName, MAX_KEYS};
use super::{
    check_name, fast, published, Env, Invalid, KeyExtra, KeySpec, PartnerSpec, Plan, Warning,
};
use crate::digest::{is_token68, Digest};
use std::num::NonZeroU32;

/// The partners, in file order, and their names' positions.
pub(super) fn partners(
    list: &[FilePartner],
    env: &dyn Env,
    warnings: &mut Vec<Warning>,
) -> Result<(Vec<PartnerSpec>, HashMap<String, usize>), Invalid> {
    let mut partners: Vec<PartnerSpec> = Vec::with_capacity(list.len());
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut digests: HashMap<Digest, usize> = HashMap::with_capacity(list.len());
    for (i, fp) in list.iter().enumerate() {
        let at = format!("partners[{i}]");
        check_name(&fp.name, || format!("{at}.name"))?;
        if names.insert(fp.name.clone(), i).is_some() {
            return Err(Invalid::new(
                format!("{at}.name"),
                format!("duplicate partner name `{}`", fp.name),
            ));
        }
        let (digest, field) = key_digest(
            "partners",
            i,
            fp.sha256.as_deref(),
            fp.key.as_deref(),
            fp.key_env.as_deref(),
            env,
            warnings,
        )?;
        if let Some(j) = digests.insert(digest, i) {
            let other = format!("partners[{j}] ({})", partners[j].name);
            return Err(Invalid::new(
                format!("{at}.{field}"),
                format!("is the same key as {other}"),
            ));
        }
        partners.push(PartnerSpec {
            name: fp.name.clone(),
            digest,
        });
    }
    Ok((partners, names))
}

/// The customer keys, checked against the plans and partners (see the module docs).
pub(super) fn keys(
    list: &KeyList<'_>,
    plans: &[Plan],
    partners: &[PartnerSpec],
    partner_names: &HashMap<String, usize>,
    env: &dyn Env,
    warnings: &mut Vec<Warning>,
) -> Result<Vec<KeySpec>, Invalid> {
    let total = partners.len().saturating_add(list.len());
    if total > MAX_KEYS {
        return Err(Invalid::new(
            "keys",
            format!("{total} keys and partners are more than the {MAX_KEYS} the gateway can hold"),
        ));
    }
    let ctx = KeyCheck {
        plans,
        partners,
        partner_names,
        env,
        hasher: &foldhash::fast::RandomState::default(),
    };
    let before = warnings.len();
    match ctx.keys(list, false, warnings) {
        Ok(keys) if !ctx.any_duplicate(&keys) => Ok(keys),
        _ => {
            warnings.truncate(before);
            ctx.keys(list, true, warnings)
        }
    }
}

/// The entries (`keys[3]`, `partners[0]`) whose key is a published demo key, each with a loud
/// warning: anyone can use them; `run` refuses them.
pub(super) fn published_keys(
    partners: &[PartnerSpec],
    keys: &[KeySpec],
    warnings: &mut Vec<Warning>,
) -> Vec<String> {
    let mut found = Vec::new();
    let entries = partners
        .iter()
        .enumerate()
        .map(|(i, p)| ("partners", i, &p.digest))
        .chain(keys.iter().enumerate().map(|(i, k)| ("keys", i, &k.digest)));
    for (list, i, digest) in entries {
        if let Some(key) = published::published(digest) {
            let field = format!("{list}[{i}]");
            warnings.push(Warning {
                line: None,
                field: field.clone(),
                message: format!(
                    "PUBLISHED DEMO KEY: this is `{key}`, printed in Tollgate's README and demo, so anyone can use it; `tollgate run` refuses it (replace it: `tollgate hash-key`)"
                ),
            });
            found.push(field);
        }
    }
    found
}

/// The customer keys of a file, wherever they were read.
pub(super) enum KeyList<'a> {
    File(&'a [file::FileKey]),
    Fast(&'a fast::KeysSection<'a>),
}

impl<'a> KeyList<'a> {
    fn iter(&self) -> Box<dyn ExactSizeIterator<Item = KeyFields<'a>> + '_> {
        match self {
            KeyList::File(keys) => Box::new(keys.iter().map(file::FileKey::fields)),
            KeyList::Fast(section) => Box::new(section.iter()),
        }
    }

    fn len(&self) -> usize {
        match self {
            KeyList::File(keys) => keys.len(),
            KeyList::Fast(section) => section.iter().len(),
        }
    }
}

/// What checking the customer keys needs of the rest of the config.
struct KeyCheck<'c> {
    plans: &'c [Plan],
    partners: &'c [PartnerSpec],
    partner_names: &'c HashMap<String, usize>,
    env: &'c dyn Env,
    hasher: &'c foldhash::fast::RandomState,
}

impl KeyCheck<'_> {
    /// Check every key in file order, each completely before the next. With `exact`, duplicate
    /// names and digests are caught where they occur, so the error is the first in the file;
    /// without, they are not looked for (see [`KeyCheck::any_duplicate`]), and an error is only
    /// a sign that there is one.
    fn keys(
        &self,
        list: &KeyList<'_>,
        exact: bool,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<KeySpec>, Invalid> {
        let n = list.len();
        let n_partners = self.partners.len();
        // Only in the exact pass (a config with a mistake in it): where each name and digest
        // was first seen, partners first.
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut digests: HashMap<Digest, usize> = HashMap::new();
        if exact {
            names.reserve(n);
            digests.reserve(n_partners + n);
            // Distinct: the partners were checked already.
            digests.extend(self.partners.iter().enumerate().map(|(j, p)| (p.digest, j)));
        }
        let mut keys: Vec<KeySpec> = Vec::with_capacity(n);
        for (i, fk) in list.iter().enumerate() {
            check_name(fk.name, || format!("keys[{i}].name"))?;
            if exact && names.insert(fk.name, i).is_some() {
                return Err(Invalid::new(
                    format!("keys[{i}].name"),
                    format!("duplicate key name `{}`", fk.name),
                ));
            }
            let plan = self
                .plans
                .iter()
                .position(|p| p.name == fk.plan)
                .ok_or_else(|| {
                    Invalid::new(
                        format!("keys[{i}].plan"),
                        format!("no plan named `{}`", fk.plan),
                    )
                })?;
            let partner = match fk.partner {
                None => None,
                Some(p) => Some(*self.partner_names.get(p).ok_or_else(|| {
                    Invalid::new(
                        format!("keys[{i}].partner"),
                        format!("no partner named `{p}`"),
                    )
                })?),
            };
            let (digest, field) =
                key_digest("keys", i, fk.sha256, fk.key, fk.key_env, self.env, warnings)?;
            if exact {
                if let Some(j) = digests.insert(digest, n_partners + i) {
                    let other = match j.checked_sub(n_partners) {
                        None => format!("partners[{j}] ({})", self.partners[j].name),
                        Some(k) => format!("keys[{k}] ({})", keys[k].name),
                    };
                    return Err(Invalid::new(
                        format!("keys[{i}].{field}"),
                        format!("is the same key as {other}"),
                    ));
                }
            }
            let extra =
                if fk.file.is_some() || fk.expires_at.is_some() || fk.requests_per_window.is_some()
                {
                    Some(Box::new(key_extra(i, &fk, warnings)?))
                } else {
                    None
                };
            keys.push(KeySpec {
                name: KeyName::new(fk.name),
                digest,
                plan,
                partner,
                extra,
            });
        }
        self.previous_digests(&keys)?;
        Ok(keys)
    }

    /// A `previous` digest must be no other key's, no partner's, and not given twice: it
    /// authenticates as its own key only.
    fn previous_digests(&self, keys: &[KeySpec]) -> Result<(), Invalid> {
        let none = |k: &KeySpec| k.extra.as_ref().is_none_or(|e| e.previous.is_empty());
        if keys.iter().all(none) {
            return Ok(());
        }
        let mut owner: HashMap<Digest, String> = HashMap::with_capacity(keys.len());
        for (j, p) in self.partners.iter().enumerate() {
            owner.insert(p.digest, format!("partners[{j}] ({})", p.name));
        }
        for (k, key) in keys.iter().enumerate() {
            owner.insert(key.digest, format!("keys[{k}] ({})", key.name));
        }
        for (i, key) in keys.iter().enumerate() {
            let Some(extra) = &key.extra else { continue };
            for (j, (d, _)) in extra.previous.iter().enumerate() {
                let at = format!("keys[{i}].previous[{j}]");
                if let Some(other) = owner.insert(*d, at.clone()) {
                    return Err(Invalid::new(
                        format!("{at}.sha256"),
                        format!("is the same key as {other}: a previous digest authenticates as its own key only"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether two keys share a name, or two keys or a key and a partner share a digest.
    fn any_duplicate(&self, keys: &[KeySpec]) -> bool {
        let np = self.partners.len();
        let digest = |i: usize| match i.checked_sub(np) {
            None => &self.partners[i].digest,
            Some(k) => &keys[k].digest,
        };
        any_equal(
            keys.len(),
            |i| self.hasher.hash_one(&*keys[i].name),
            |a, b| keys[a].name == keys[b].name,
        ) || any_equal(
            np + keys.len(),
            |i| self.hasher.hash_one(digest(i).folded()),
            |a, b| digest(a) == digest(b),
        )
    }
}

/// The fields of `keys[i]` beyond its digest, plan and partner, checked.
fn key_extra(
    i: usize,
    fk: &file::KeyFields<'_>,
    warnings: &mut Vec<Warning>,
) -> Result<KeyExtra, Invalid> {
    let instant = |field: String, text: &str| {
        crate::clock::parse_rfc3339_utc(text).ok_or_else(|| {
            Invalid::new(
                field,
                "must be an RFC 3339 instant in UTC, such as `2026-12-01T00:00:00Z`",
            )
        })
    };
    let (previous_list, quota) = fk
        .file
        .map_or((&[][..], None), |f| (&f.previous[..], f.quota));
    let mut previous = Vec::with_capacity(previous_list.len());
    for (j, p) in previous_list.iter().enumerate() {
        let at = format!("keys[{i}].previous[{j}]");
        let d = Digest::from_hex(&p.sha256).ok_or_else(|| {
            Invalid::new(
                format!("{at}.sha256"),
                "must be 64 hexadecimal characters (the SHA-256 of the earlier key)",
            )
        })?;
        previous.push((d, instant(format!("{at}.until"), &p.until)?));
    }
    let expires_ms = match fk.expires_at {
        None => None,
        Some(t) => {
            let field = format!("keys[{i}].expires_at");
            let ms = instant(field.clone(), t)?;
            if ms <= crate::clock::wall_ms() {
                warnings.push(Warning {
                    line: None,
                    field,
                    message: "is already past: the key is refused".into(),
                });
            }
            Some(ms)
        }
    };
    let limit = match fk.requests_per_window {
        None => None,
        Some(n) => Some(
            NonZeroU32::new(n)
                .filter(|n| n.get() <= super::MAX_REQUESTS_PER_WINDOW)
                .ok_or_else(|| {
                    Invalid::new(
                        format!("keys[{i}].requests_per_window"),
                        format!(
                            "must be from 1 to {}, as a plan's",
                            super::MAX_REQUESTS_PER_WINDOW
                        ),
                    )
                })?,
        ),
    };
    let quota = super::quota(quota, &format!("keys[{i}].quota"))?;
    Ok(KeyExtra {
        previous,
        expires_ms,
        limit,
        quota,
    })
}

/// Whether two of `n` items are equal (`eq`), given a `hash` of each: sorts the hashes and
/// compares items only where hashes are equal.
fn any_equal(n: usize, hash: impl Fn(usize) -> u64, eq: impl Fn(usize, usize) -> bool) -> bool {
    let mut by_hash: Vec<(u64, u32)> = (0..n).map(|i| (hash(i), i as u32)).collect();
    by_hash.sort_unstable();
    by_hash.chunk_by(|a, b| a.0 == b.0).any(|run| {
        run.iter()
            .enumerate()
            .any(|(x, a)| run[x + 1..].iter().any(|b| eq(a.1 as usize, b.1 as usize)))
    })
}

/// The digest of entry `i` of `list` (`keys` or `partners`), given as exactly one of `sha256`,
/// `key` or `key_env`, and the field that gave it. A plain `key` adds a warning (its line is
/// looked up once validation is done).
fn key_digest(
    list: &str,
    i: usize,
    sha256: Option<&str>,
    key: Option<&str>,
    key_env: Option<&str>,
    env: &dyn Env,
    warnings: &mut Vec<Warning>,
) -> Result<(Digest, &'static str), Invalid> {
    let field = |name: &str| format!("{list}[{i}].{name}");
    match (sha256, key, key_env) {
        (Some(hex), None, None) => {
            let d = Digest::from_hex(hex).ok_or_else(|| {
                Invalid::new(
                    field("sha256"),
                    "must be 64 hexadecimal characters (the SHA-256 of the key)",
                )
            })?;
            Ok((d, "sha256"))
        }
        (None, Some(plain), None) => {
            if !is_token68(plain.as_bytes()) {
                return Err(Invalid::new(
                    field("key"),
                    "is not a usable bearer token (token68 characters)",
                ));
            }
            warnings.push(Warning {
                line: None,
                field: field("key"),
                message: "a plain key sits in the config file; prefer `sha256` (tollgate hash-key) or `key_env`".into(),
            });
            Ok((Digest::of(plain.as_bytes()), "key"))
        }
        (None, None, Some(var)) => {
            let value = env.var(var).ok_or_else(|| {
                Invalid::new(
                    field("key_env"),
                    format!("environment variable `{var}` is not set"),
                )
            })?;
            if !is_token68(value.as_bytes()) {
                return Err(Invalid::new(
                    field("key_env"),
                    format!("environment variable `{var}` is not a usable bearer token (token68 characters)"),
                ));
            }
            Ok((Digest::of(value.as_bytes()), "key_env"))
        }
        (None, None, None) => Err(Invalid::new(
            format!("{list}[{i}]"),
            "give one of `sha256`, `key` or `key_env`",
        )),
        _ => Err(Invalid::new(
            format!("{list}[{i}]"),
            "give only one of `sha256`, `key` and `key_env`",
        )),
    }
}
