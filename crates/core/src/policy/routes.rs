//! The route catalogue: every operation the gateway knows, by id, method and path.
//!
//! The catalogue is data (`policies/routes.yaml`, compiled in as the default and replaceable by
//! the `routes:` field of a config) so an operator can correct a path the spec does not show.
//! This module turns the file into lookup tables; [`mod@super::classify`] does the matching.
//!
//! Matching is by ASCII-case-insensitive path, so no case variant of a catalogued path can slip
//! past its route; the path forwarded upstream is then the catalogue's own spelling.

use std::collections::HashMap;

/// A fast, non-cryptographic hasher for the lookup tables: their keys come from the operator's
/// catalogue, and lookups of attacker-chosen paths only probe them.
type Fast = foldhash::fast::FixedState;

use crate::config::file::{FileCatalogue, FileRoute};
use crate::config::Invalid;

/// The catalogue shipped with the gateway, used when a config names none.
pub const BUILTIN_CATALOGUE: &str = include_str!("../../../../policies/routes.yaml");

/// Id of the synthetic route every uncatalogued customer path under `/v2/` maps to.
pub const UNKNOWN_ROUTE_ID: &str = "unknown";

/// Index of a route in its [`Catalogue`]; stable for the life of one config.
pub type RouteIdx = usize;

/// Which API family an operation belongs to, and so which credential it takes (spec section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Customer,
    Partner,
}

/// The request-body shapes the spec gives (sections 2.1–2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyRule {
    GroupEvent,
    WebhookSet,
    ServiceUpgrade,
}

impl BodyRule {
    pub fn name(self) -> &'static str {
        match self {
            BodyRule::GroupEvent => "group_event",
            BodyRule::WebhookSet => "webhook_set",
            BodyRule::ServiceUpgrade => "service_upgrade",
        }
    }
}

/// An HTTP method, or any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MethodSel {
    Any,
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

#[derive(Clone, Debug)]
pub struct Route {
    pub id: String,
    pub method: MethodSel,
    pub path: PathMatch,
    pub family: Family,
    pub body: Option<BodyRule>,
    /// The spec does not show this path; the catalogue guesses it.
    pub assumed: bool,
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
    unknown: RouteIdx,
}

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

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
        let unknown = routes.len();
        routes.push(Route {
            id: UNKNOWN_ROUTE_ID.into(),
            method: MethodSel::Any,
            path: PathMatch::Prefix("/v2/".into()),
            family: Family::Customer,
            body: None,
            assumed: false,
        });
        Ok(Self {
            routes,
            exact,
            prefixes,
            partner_prefixes,
            unknown,
        })
    }

    /// Parse and compile the built-in catalogue.
    pub fn builtin() -> Self {
        let file: FileCatalogue =
            serde_yaml::from_str(BUILTIN_CATALOGUE).expect("built-in catalogue parses");
        Self::compile(file).expect("built-in catalogue is valid")
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    pub fn get(&self, idx: RouteIdx) -> &Route {
        &self.routes[idx]
    }

    /// Index of a catalogued (non-synthetic) route by id.
    pub fn find(&self, id: &str) -> Option<RouteIdx> {
        self.routes[..self.unknown].iter().position(|r| r.id == id)
    }

    pub fn unknown(&self) -> RouteIdx {
        self.unknown
    }

    pub fn partner_prefixes(&self) -> &[String] {
        &self.partner_prefixes
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

    pub(crate) fn in_partner_namespace(&self, lower_path: &str) -> bool {
        self.partner_prefixes
            .iter()
            .any(|p| lower_path.starts_with(p.as_str()) || lower_path == &p[..p.len() - 1])
    }
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
    let method = if fr.method.eq_ignore_ascii_case("any") {
        MethodSel::Any
    } else if METHODS.contains(&fr.method.as_str()) {
        MethodSel::One(fr.method.clone())
    } else {
        return Err(Invalid::new(
            format!("{at}.method"),
            format!("`{}` is not one of any, {}", fr.method, METHODS.join(", ")),
        ));
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
    let family = match fr.family.as_str() {
        "customer" => Family::Customer,
        "partner" => Family::Partner,
        other => {
            return Err(Invalid::new(
                format!("{at}.family"),
                format!("`{other}` is not `customer` or `partner`"),
            ))
        }
    };
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
    let body = match fr.body.as_str() {
        "none" => None,
        "group_event" => Some(BodyRule::GroupEvent),
        "webhook_set" => Some(BodyRule::WebhookSet),
        "service_upgrade" => Some(BodyRule::ServiceUpgrade),
        other => {
            return Err(Invalid::new(
                format!("{at}.body"),
                format!("`{other}` is not one of none, group_event, webhook_set, service_upgrade"),
            ))
        }
    };
    Ok(Route {
        id: fr.id,
        method,
        path,
        family,
        body,
        assumed: fr.assumed,
    })
}

/// A catalogue path must be one the normalizer would let through unchanged, under `/v2/`.
fn check_catalogue_path(p: &str, field: &str) -> Result<(), Invalid> {
    match super::classify::normalize(p) {
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
