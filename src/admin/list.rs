//! `GET /api/keys`: one page of keys in name order, each as `GET /api/keys/{name}` gives it,
//! filtered by `plan`, `partner`, `state` and `source`, `limit` at a time (1 to 1,000, 100 by
//! default), from `cursor` (the `next` of the page before). Never a digest.
//!
//! The YAML's names are sorted once per config in force ([`NameOrder`], rebuilt on a reload),
//! and the issued keys' are kept in order as they come and go (`Issued::names_after`): a page
//! merges the two from the cursor, so it costs two searches and the keys it reads, however
//! many there are. A filter reads on from the cursor until the page is full: a filter few
//! keys pass reads further.

use std::sync::{Arc, Mutex};

use http::{Response, StatusCode};

use super::body::Refused;
use super::codes::AdminCode;
use super::record::key_view;
use super::reply::{json, problem};
use super::view::{KeyPage, KeyView};
use super::Admin;
use crate::policy::keys::KeyIdx;
use crate::policy::Policy;
use crate::sync::Locked;

/// Keys a page holds at most, and by default.
const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 100;

/// The YAML's keys of the config in force in name order, sorted once per config (its
/// generation).
#[derive(Debug, Default)]
pub(crate) struct NameOrder(Mutex<Option<(u64, Arc<Vec<KeyIdx>>)>>);

impl NameOrder {
    fn of(&self, generation: u64, policy: &Policy) -> Arc<Vec<KeyIdx>> {
        let mut held = self.0.locked();
        if let Some((g, order)) = held.as_ref() {
            if *g == generation {
                return Arc::clone(order);
            }
        }
        let mut order: Vec<KeyIdx> = (0..policy.keys.configured() as KeyIdx).collect();
        order.sort_unstable_by(|&a, &b| {
            policy
                .keys
                .get(a)
                .name
                .as_str()
                .cmp(policy.keys.get(b).name.as_str())
        });
        let order = Arc::new(order);
        *held = Some((generation, Arc::clone(&order)));
        order
    }
}

/// What a request asks for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Query {
    plan: Option<String>,
    partner: Option<String>,
    state: Option<String>,
    source: Option<String>,
    limit: usize,
    /// The last name of the page before.
    after: Option<String>,
}

/// The query read, or the 400 naming the parameter.
fn read(query: Option<&str>) -> Result<Query, Refused> {
    let bad = |name: &str, rule: &str| super::query::refused(&format!("`{name}` {rule}"));
    let mut q = Query {
        limit: DEFAULT_LIMIT,
        ..Query::default()
    };
    for (k, v) in super::query::read(query, "/api/keys")? {
        match k {
            "plan" => q.plan = Some(v),
            "partner" => q.partner = Some(v),
            "state" => match &*v {
                "active" | "expired" | "suspended" | "revoked" => q.state = Some(v),
                _ => {
                    return Err(bad(
                        "state",
                        "is one of active, expired, suspended, revoked",
                    ))
                }
            },
            "source" => match &*v {
                "config" | "api" => q.source = Some(v),
                _ => return Err(bad("source", "is `config` or `api`")),
            },
            "limit" => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => q.limit = n,
                _ => {
                    return Err(bad(
                        "limit",
                        &format!("is a whole number from 1 to {MAX_LIMIT}"),
                    ))
                }
            },
            "cursor" => match cursor_name(&v) {
                Some(name) => q.after = Some(name),
                None => return Err(bad("cursor", "is the `next` of a page this API gave")),
            },
            // The table names no other (`openapi_tests`).
            _ => {}
        }
    }
    Ok(q)
}

/// The cursor after the key named `name`: its name, hex-encoded (opaque to a client, and
/// safe in a query string whatever the name holds).
fn cursor(name: &str) -> String {
    hex::encode(name)
}

fn cursor_name(c: &str) -> Option<String> {
    String::from_utf8(hex::decode(c).ok()?).ok()
}

/// The YAML's keys and the issued ones, merged in name order (names are unique across both).
struct Merged<'p> {
    policy: &'p Policy,
    yaml: &'p [KeyIdx],
    issued: Option<&'p crate::policy::keys::Issued>,
    /// Issued keys read ahead, from `at`.
    batch: Vec<KeyIdx>,
    at: usize,
    /// The last issued name read.
    after: Option<String>,
}

impl Iterator for Merged<'_> {
    type Item = KeyIdx;

    fn next(&mut self) -> Option<KeyIdx> {
        let keys = &self.policy.keys;
        if self.at == self.batch.len() {
            if let Some(issued) = self.issued {
                let base = keys.configured() as KeyIdx;
                self.batch = issued
                    .names_after(self.after.as_deref(), 256)
                    .into_iter()
                    .map(|s| base + s)
                    .collect();
                self.at = 0;
                if let Some(&last) = self.batch.last() {
                    self.after = Some(keys.get(last).name.as_str().to_string());
                }
            }
        }
        let name = |k: KeyIdx| keys.get(k).name.as_str();
        match (self.yaml.first(), self.batch.get(self.at)) {
            (Some(&y), Some(&i)) if name(y) < name(i) => {
                self.yaml = &self.yaml[1..];
                Some(y)
            }
            (_, Some(&i)) => {
                self.at += 1;
                Some(i)
            }
            (Some(&y), None) => {
                self.yaml = &self.yaml[1..];
                Some(y)
            }
            (None, None) => None,
        }
    }
}

/// Whether `view` passes the filters.
fn passes(q: &Query, view: &KeyView) -> bool {
    let given =
        |want: &Option<String>, got: Option<&String>| want.as_ref().is_none_or(|w| Some(w) == got);
    given(&q.plan, Some(&view.plan))
        && given(&q.partner, view.partner.as_ref())
        && given(&q.state, Some(&view.state))
        && given(&q.source, Some(&view.source))
}

/// `GET /api/keys?query`.
pub(super) fn answer(admin: &Admin, query: Option<&str>) -> Response<Vec<u8>> {
    let q = match read(query) {
        Ok(q) => q,
        Err(refusal) => return *refusal,
    };
    let snap = admin.live.load();
    let policy = &snap.policy;
    // A plan or partner no config has is a typo, not an empty page.
    if let Some(p) = &q.plan {
        let known = p == "partner" || policy.config.plans.iter().any(|x| x.name == *p);
        if !known {
            return problem(
                AdminCode::InvalidQuery,
                &format!("`plan`: no plan is named `{p}`"),
            );
        }
    }
    if let Some(p) = &q.partner {
        if !policy.config.partners.iter().any(|x| x.name == *p) {
            return problem(
                AdminCode::InvalidQuery,
                &format!("`partner`: no partner is named `{p}`"),
            );
        }
    }
    let order = admin.names.of(snap.generation, policy);
    let start = q.after.as_deref().map_or(0, |after| {
        order.partition_point(|&k| policy.keys.get(k).name.as_str() <= after)
    });
    let yaml: &[KeyIdx] = match q.source.as_deref() {
        Some("api") => &[],
        _ => &order[start..],
    };
    let issued = (q.source.as_deref() != Some("config")).then(|| policy.keys.issued());
    let merged = Merged {
        policy,
        yaml,
        issued,
        batch: Vec::new(),
        at: 0,
        after: q.after.clone(),
    };
    let mut keys = Vec::with_capacity(q.limit.min(order.len()));
    let mut next = None;
    for k in merged {
        let view = key_view(&admin.changes, policy, k);
        if !passes(&q, &view) {
            continue;
        }
        if keys.len() == q.limit {
            // One more passes: the page is full, and there is a next one.
            next = keys.last().map(|v: &KeyView| cursor(&v.name));
            break;
        }
        keys.push(view);
    }
    json(StatusCode::OK, &KeyPage { keys, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_read_or_refused_naming_the_parameter() {
        let q = read(Some("plan=basic&state=active&source=config&limit=5")).unwrap();
        assert_eq!(
            (
                q.plan.as_deref(),
                q.state.as_deref(),
                q.source.as_deref(),
                q.limit
            ),
            (Some("basic"), Some("active"), Some("config"), 5)
        );
        assert_eq!(read(None).unwrap().limit, DEFAULT_LIMIT);
        let c = cursor("shop/42 é");
        assert_eq!(
            read(Some(&format!("cursor={c}"))).unwrap().after.as_deref(),
            Some("shop/42 é")
        );
        for (query, name) in [
            ("limit=0", "`limit`"),
            ("limit=1001", "`limit`"),
            ("limit=x", "`limit`"),
            ("state=gone", "`state`"),
            ("source=yaml", "`source`"),
            ("cursor=zz", "`cursor`"),
            ("plans=basic", "`plans`"),
        ] {
            let r = read(Some(query)).unwrap_err();
            assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{query}");
            let body = String::from_utf8(r.body().clone()).unwrap();
            assert!(
                body.contains("invalid_query") && body.contains(name),
                "{query}: {body}"
            );
        }
    }
}
