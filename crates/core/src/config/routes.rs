//! The route catalogue: every operation the gateway knows, by id, method and path.
//!
//! The catalogue is data (`policies/routes.yaml`, compiled in as the default and replaceable by
//! the `routes:` field of a config) so an operator can correct a path the spec does not show.
//! This module turns the file into lookup tables; [`crate::policy::classify`] does the matching.
//!
//! Matching is by ASCII-case-insensitive path, so no case variant of a catalogued path can slip
//! past its route; the path forwarded upstream is then the catalogue's own spelling.

use std::collections::HashMap;

/// A fast, non-cryptographic hasher for the lookup tables: their keys come from the operator's
/// catalogue, and lookups of attacker-chosen paths only probe them.
type Fast = foldhash::fast::FixedState;

use crate::config::file::{FileCatalogue, FileRoute};
pub use crate::config::operation::{BodyRule, Effect, Family};
use crate::config::Invalid;

/// The catalogue shipped with the gateway, used when a config names none.
pub const BUILTIN_CATALOGUE: &str = include_str!("../../../../policies/routes.yaml");

/// Id of the synthetic route every uncatalogued customer path under `/v2/` maps to.
pub const UNKNOWN_ROUTE_ID: &str = "unknown";

/// Index of a route in its [`Catalogue`]; stable for the life of one config.
pub type RouteIdx = usize;

/// An HTTP method, or any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MethodSel {
    /// Every method (`method: any`).
    Any,
    /// This one method, by its upper-case token (`GET`, `POST`, ...).
    One(String),
}

impl MethodSel {
    fn matches(&self, method: &str) -> bool {
        match self {
            MethodSel::Any => true,
            MethodSel::One(m) => m == method,
        }
    }
}

/// How a route's path is matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathMatch {
    /// This path exactly (one trailing slash either way is tolerated unless the other spelling
    /// is a route of its own, as `/v2/sendGroup` and `/v2/sendGroup/` are).
    Exact(String),
    /// This prefix (ending in `/`) and everything under it, and the prefix without its slash.
    Prefix(String),
}

/// One operation of the catalogue (an entry of its `routes`).
#[derive(Clone, Debug)]
pub struct Route {
    /// The route id, as used in plans' allow-lists, logs and metric labels.
    pub id: String,
    /// The method it takes.
    pub method: MethodSel,
    /// The path it matches.
    pub path: PathMatch,
    /// Which API it belongs to, and so which credential it takes.
    pub family: Family,
    /// The rule its request body is checked against; `None`: the body is not checked.
    pub body: Option<BodyRule>,
    /// The spec does not show this path; the catalogue guesses it.
    pub assumed: bool,
    /// What a 2xx from the upstream does at the edge (partner routes).
    pub effect: Option<Effect>,
    /// The body field naming the customer key (`apiKey` unless the route says another).
    pub key_field: Option<String>,
}

/// Compiled catalogue: routes plus case-folded lookup tables.
#[derive(Clone, Debug)]
pub struct Catalogue {
    routes: Vec<Route>,
    /// Lower-cased exact path → candidate routes (several methods may share a path).
    exact: HashMap<String, Vec<RouteIdx>, Fast>,
    /// Lower-cased prefix (ending in `/`) → candidate routes.
    prefixes: HashMap<String, Vec<RouteIdx>, Fast>,
    /// Lower-cased partner namespaces (ending in `/`).
    partner_prefixes: Vec<String>,
    /// The paths of the checked routes (those with a body rule), guarded against other
    /// methods and near spellings ([`Catalogue::guard`]).
    guarded: Vec<Guarded>,
    unknown: RouteIdx,
    /// The exact paths as spelled, and the route each method reaches there (the one-lookup
    /// path of the policy's classification; empty until the policy sets it).
    spelled: Spellings,
}

/// A catalogue's exact paths as it spells them → (method, route) for every method that
/// reaches a route there with the path forwarded unchanged.
pub(crate) type Spellings = HashMap<Box<str>, Vec<(&'static str, RouteIdx)>, Fast>;

/// The path of a checked route: no other method and no near spelling of it is forwarded
/// unchecked (see [`Catalogue::guard`]).
#[derive(Clone, Debug)]
struct Guarded {
    /// The path or prefix, lower-cased, as registered.
    lower: String,
    /// A prefix route: every path under it is the route's.
    prefix: bool,
    /// The methods the path takes, for `Allow` (`POST`, or `GET, POST`).
    allow: String,
}

/// How a request path that no route of its method matched relates to a checked route's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard<'c> {
    /// The checked path itself (or under a checked prefix), with another method: the methods
    /// it takes, for `405` and `Allow`.
    OtherMethod(&'c str),
    /// A near spelling of a checked path, which an upstream might route to it
    /// (`/set.json`, `/set~`, `/set%20`, `/set/x`): `404`.
    NearSpelling,
}

/// The methods a route's path is tried with (for `Allow`, and the catalogue's spellings).
pub(crate) const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

impl Catalogue {
    /// Build from the file form, refusing anything ambiguous. Errors name the field path.
    pub fn compile(file: FileCatalogue) -> Result<Self, Invalid> {
        let mut partner_prefixes = Vec::new();
        for (i, p) in file.partner_prefixes.iter().enumerate() {
            let field = format!("partner_prefixes[{i}]");
            check_catalogue_path(p, &field)?;
            if !p.ends_with('/') {
                return Err(Invalid::new(field, "a prefix must end with `/`"));
            }
            partner_prefixes.push(p.to_ascii_lowercase());
        }

        let mut routes = Vec::with_capacity(file.routes.len() + 1);
        let mut ids: HashMap<String, usize> = HashMap::new();
        let mut exact: HashMap<String, Vec<RouteIdx>, Fast> = HashMap::default();
        let mut prefixes: HashMap<String, Vec<RouteIdx>, Fast> = HashMap::default();
        for (i, fr) in file.routes.into_iter().enumerate() {
            let at = format!("routes[{i}]");
            let route = compile_route(fr, &at, &partner_prefixes)?;
            if let Some(first) = ids.insert(route.id.clone(), i) {
                return Err(Invalid::new(
                    format!("{at}.id"),
                    format!(
                        "duplicate route id `{}` (first at routes[{first}])",
                        route.id
                    ),
                ));
            }
            let (table, key) = match &route.path {
                PathMatch::Exact(p) => (&mut exact, p.to_ascii_lowercase()),
                PathMatch::Prefix(p) => (&mut prefixes, p.to_ascii_lowercase()),
            };
            let slot = table.entry(key).or_default();
            for &other in slot.iter() {
                let o: &Route = &routes[other];
                let clash = o.method == MethodSel::Any
                    || route.method == MethodSel::Any
                    || o.method == route.method;
                if clash {
                    return Err(Invalid::new(
                        format!("{at}.path"),
                        format!(
                            "route `{}` matches the same requests as `{}`",
                            route.id, o.id
                        ),
                    ));
                }
            }
            slot.push(routes.len());
            routes.push(route);
        }
        let guarded = guarded_paths(&routes);
        let unknown = routes.len();
        routes.push(Route {
            id: UNKNOWN_ROUTE_ID.into(),
            method: MethodSel::Any,
            path: PathMatch::Prefix("/v2/".into()),
            family: Family::Customer,
            body: None,
            assumed: false,
            effect: None,
            key_field: None,
        });
        Ok(Self {
            routes,
            exact,
            prefixes,
            partner_prefixes,
            guarded,
            unknown,
            spelled: HashMap::default(),
        })
    }

    /// Keep the answers for the exact paths as spelled, which the policy computes with its
    /// classification when it is built (this module may not call it); without them every
    /// request is classified step by step, with the same answers.
    pub(crate) fn set_spellings(&mut self, spelled: Spellings) {
        self.spelled = spelled;
    }

    /// Parse and compile the built-in catalogue.
    pub fn builtin() -> Self {
        let file: FileCatalogue =
            serde_yaml::from_str(BUILTIN_CATALOGUE).expect("built-in catalogue parses");
        Self::compile(file).expect("built-in catalogue is valid")
    }

    /// Every route, in file order, with the synthetic `unknown` route last.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The route at `idx` (an index from this catalogue).
    pub fn get(&self, idx: RouteIdx) -> &Route {
        &self.routes[idx]
    }

    /// Index of a catalogued (non-synthetic) route by id.
    pub fn find(&self, id: &str) -> Option<RouteIdx> {
        self.routes[..self.unknown].iter().position(|r| r.id == id)
    }

    /// Index of the synthetic route [`UNKNOWN_ROUTE_ID`], for uncatalogued paths under `/v2/`.
    pub fn unknown(&self) -> RouteIdx {
        self.unknown
    }

    /// The Partner API's path prefixes (`partner_prefixes`), lower-cased, each ending in `/`.
    pub fn partner_prefixes(&self) -> &[String] {
        &self.partner_prefixes
    }

    /// The route a request with exactly this path (as sent) and method is classified to,
    /// when the path is one of the catalogue's own spellings of an exact route's path (see
    /// [`crate::policy::classify`]); `None`: classify it step by step.
    #[inline]
    pub fn spelled(&self, path: &str, method: &str) -> Option<RouteIdx> {
        self.spelled
            .get(path)?
            .iter()
            .find(|&&(m, _)| m == method)
            .map(|&(_, r)| r)
    }

    /// Routes registered at exactly this lower-cased path that accept `method`.
    pub(crate) fn exact(&self, lower_path: &str, method: &str) -> Option<RouteIdx> {
        self.pick(self.exact.get(lower_path)?, method)
    }

    /// Routes registered at exactly this lower-cased prefix that accept `method`.
    pub(crate) fn prefix(&self, lower_prefix: &str, method: &str) -> Option<RouteIdx> {
        self.pick(self.prefixes.get(lower_prefix)?, method)
    }

    /// Whether any exact route is registered at this lower-cased path, whatever its method.
    pub(crate) fn has_exact_path(&self, lower_path: &str) -> bool {
        self.exact.contains_key(lower_path)
    }

    fn pick(&self, candidates: &[RouteIdx], method: &str) -> Option<RouteIdx> {
        candidates
            .iter()
            .copied()
            .find(|&i| self.routes[i].method.matches(method))
    }

    /// The rule that keeps a checked operation (a route with a body rule) from being reached
    /// unchecked, for a lower-cased, normalized path that no exact route of its method matched:
    ///
    /// - **another method** on a checked route's path (one trailing slash either way, as
    ///   matching tolerates it; anything under a checked prefix): [`Guard::OtherMethod`];
    /// - **a near spelling** of a checked path: each of its segments, in order, begins the
    ///   request's segment of the same rank and is followed there by the segment's end or by
    ///   a byte that is not a letter or digit, and the path is not the route's own spelling
    ///   nor another route's exact path: `/set.json`, `/set~`, `/set%20`, `/set-`, `/set/x`.
    ///   Frameworks that strip a format suffix, trailing junk or a path tail would route these
    ///   to the checked operation; no operation of the API is spelt so. [`Guard::NearSpelling`].
    ///
    /// `found` is the route matched otherwise, if any: an exact one settles the request, and a
    /// prefix route at or under a guarded path is the catalogue's own, more specific answer.
    /// `None`: the path is none of these, and classification goes on.
    pub fn guard(&self, lower: &str, found: Option<RouteIdx>) -> Option<Guard<'_>> {
        let found_prefix = match found.map(|f| &self.routes[f].path) {
            Some(PathMatch::Exact(_)) => return None,
            Some(PathMatch::Prefix(p)) => Some(p),
            None => None,
        };
        // Whether `lower` is some route's own exact path: looked up only for a candidate.
        let own_path = || self.has_exact_path(lower);
        for g in &self.guarded {
            let more_specific = found_prefix.is_some_and(|p| {
                p.len() >= g.stem().len() && p[..g.stem().len()].eq_ignore_ascii_case(g.stem())
            });
            if more_specific {
                continue;
            }
            if g.same_path(lower, own_path) {
                return Some(Guard::OtherMethod(&g.allow));
            }
            if near_spelling(lower, g.stem()) && !own_path() {
                return Some(Guard::NearSpelling);
            }
        }
        None
    }

    pub(crate) fn in_partner_namespace(&self, lower_path: &str) -> bool {
        self.partner_prefixes
            .iter()
            .any(|p| lower_path.starts_with(p.as_str()) || lower_path == &p[..p.len() - 1])
    }
}

impl Guarded {
    /// The path without a trailing `/`: what a near spelling begins with.
    fn stem(&self) -> &str {
        self.lower.strip_suffix('/').unwrap_or(&self.lower)
    }

    /// Whether `lower` is this route's own path (or under its prefix). `own_path`: whether
    /// `lower` is the exact path of some route, so that the trailing-slash toggle does not
    /// apply to it.
    fn same_path(&self, lower: &str, own_path: impl Fn() -> bool) -> bool {
        if self.prefix {
            let stem = self.stem();
            return lower
                .strip_prefix(stem)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        }
        lower == self.lower
            || ((lower.strip_suffix('/') == Some(self.lower.as_str())
                || self.lower.strip_suffix('/') == Some(lower))
                && !own_path())
    }
}

/// Whether `lower` is a near spelling of `stem` (see [`Catalogue::guard`]): every segment of
/// `stem` begins the request's segment of the same rank, followed there by the end of the
/// segment or a byte that is not a letter or digit.
fn near_spelling(lower: &str, stem: &str) -> bool {
    let mut request = lower.split('/');
    stem.split('/').all(|want| {
        request.next().is_some_and(|got| {
            got.strip_prefix(want).is_some_and(|rest| {
                !rest
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
            })
        })
    })
}

/// The paths of the routes with a body rule, each with the methods its path takes.
fn guarded_paths(routes: &[Route]) -> Vec<Guarded> {
    let mut out: Vec<Guarded> = Vec::new();
    for r in routes.iter().filter(|r| r.body.is_some()) {
        let (lower, prefix) = match &r.path {
            PathMatch::Exact(p) => (p.to_ascii_lowercase(), false),
            PathMatch::Prefix(p) => (p.to_ascii_lowercase(), true),
        };
        if out.iter().any(|g| g.lower == lower && g.prefix == prefix) {
            continue;
        }
        let mut methods: Vec<&str> = routes
            .iter()
            .filter(|o| match &o.path {
                PathMatch::Exact(p) if !prefix => p.eq_ignore_ascii_case(&lower),
                PathMatch::Prefix(p) if prefix => p.eq_ignore_ascii_case(&lower),
                _ => false,
            })
            .map(|o| match &o.method {
                MethodSel::Any => "any",
                MethodSel::One(m) => m.as_str(),
            })
            .collect();
        // Methods that `any` covers leave nothing to refuse: such a path is never `OtherMethod`
        // (an `any` route matches every method before the guard is asked).
        methods.sort_by_key(|m| METHODS.iter().position(|x| x == m));
        methods.dedup();
        out.push(Guarded {
            lower,
            prefix,
            allow: methods.join(", "),
        });
    }
    out
}

fn compile_route(fr: FileRoute, at: &str, partner_prefixes: &[String]) -> Result<Route, Invalid> {
    let id_ok = !fr.id.is_empty()
        && fr
            .id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !id_ok {
        return Err(Invalid::new(
            format!("{at}.id"),
            "a route id is lower-case letters, digits and `_`",
        ));
    }
    if fr.id == UNKNOWN_ROUTE_ID {
        return Err(Invalid::new(
            format!("{at}.id"),
            "`unknown` is reserved for uncatalogued paths",
        ));
    }
    let method = match fr.method.token() {
        None => MethodSel::Any,
        Some(m) => MethodSel::One(m.to_string()),
    };
    let path = match (fr.path, fr.prefix) {
        (Some(p), None) => {
            check_catalogue_path(&p, &format!("{at}.path"))?;
            PathMatch::Exact(p)
        }
        (None, Some(p)) => {
            check_catalogue_path(&p, &format!("{at}.prefix"))?;
            if !p.ends_with('/') {
                return Err(Invalid::new(
                    format!("{at}.prefix"),
                    "a prefix must end with `/`",
                ));
            }
            PathMatch::Prefix(p)
        }
        _ => {
            return Err(Invalid::new(
                at.to_string(),
                "give exactly one of `path` and `prefix`",
            ))
        }
    };
    let family = fr.family;
    let lower = match &path {
        PathMatch::Exact(p) | PathMatch::Prefix(p) => p.to_ascii_lowercase(),
    };
    let under_partner = partner_prefixes
        .iter()
        .any(|p| lower.starts_with(p.as_str()));
    if under_partner != (family == Family::Partner) {
        let msg = if under_partner {
            "a customer route cannot lie under a partner prefix"
        } else {
            "a partner route must lie under one of partner_prefixes"
        };
        return Err(Invalid::new(format!("{at}.family"), msg));
    }
    let body = fr.body.rule();
    let effect = match (fr.effect, body) {
        (None, Some(BodyRule::ServiceUpgrade)) => Some(Effect::Upgrade),
        (None, _) => None,
        (Some(Effect::Upgrade), Some(BodyRule::ServiceUpgrade)) => Some(Effect::Upgrade),
        (Some(Effect::Upgrade), _) => {
            return Err(Invalid::new(
                format!("{at}.effect"),
                "`upgrade` needs `body: service_upgrade` (the body's planID names the plan)",
            ))
        }
        (Some(e), Some(BodyRule::ServiceKey | BodyRule::ServiceUpgrade)) => Some(e),
        (Some(_), _) => {
            return Err(Invalid::new(
                format!("{at}.effect"),
                "an effect needs a body that names the customer key (`body: service_key`)",
            ))
        }
    };
    if effect.is_some() && family != Family::Partner {
        return Err(Invalid::new(
            format!("{at}.effect"),
            "only a partner route acts on a customer key",
        ));
    }
    if let Some(f) = &fr.key_field {
        if effect.is_none() || f.is_empty() {
            return Err(Invalid::new(
                format!("{at}.key_field"),
                "names the body field holding the customer key, on a route with an `effect`",
            ));
        }
    }
    Ok(Route {
        id: fr.id,
        method,
        path,
        family,
        body,
        assumed: fr.assumed,
        effect,
        key_field: fr.key_field,
    })
}

/// A catalogue path must be one the normalizer would let through unchanged, under `/v2/`.
fn check_catalogue_path(p: &str, field: &str) -> Result<(), Invalid> {
    match crate::path::normalize(p) {
        Ok(n) if n == p => {}
        _ => {
            return Err(Invalid::new(
                field.to_string(),
                format!("`{p}` is not a normalized path (no dot or empty segments, `;`, `%`-escapes or non-ASCII)"),
            ))
        }
    }
    if !p.to_ascii_lowercase().starts_with("/v2/") || p.len() <= 4 {
        return Err(Invalid::new(
            field.to_string(),
            format!("`{p}` is not under /v2/"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalogue_compiles_and_has_the_contract_ids() {
        let c = Catalogue::builtin();
        for id in [
            "send_message",
            "send_group",
            "send_group_event",
            "group_list",
            "client",
            "webhook_set",
            "service_upgrade",
        ] {
            assert!(c.find(id).is_some(), "missing {id}");
        }
        assert!(c.find(UNKNOWN_ROUTE_ID).is_none());
        assert_eq!(c.get(c.unknown()).id, UNKNOWN_ROUTE_ID);
    }
}
