//! The admin listener's one route table. [`classify`] reads a request's method and path
//! segments in one `match` and names its [`Route`], or the miss (404, or 405 with `Allow`);
//! [`Admin::answer`] hands each route to its handler, in the room's other files. [`ROUTES`]
//! lists what the match answers, so that the docs and the OpenAPI document (`openapi.rs`) are
//! held to it (unit tests hold the match and the document to the list, both ways).

use http::{Method, Response, StatusCode};

use super::body::Refused;
use super::codes::AdminCode;
use super::keys::{self, KeyOp};
use super::reply::{json, not_allowed, page, percent_decode, problem, reply, text};
use super::view::BlocksView;
use super::{issue, ledger, list, openapi, overrides, usage, Admin, MAX_ADMIN_BODY};
use crate::policy::overrides::ChangeKind;

/// Every route the admin listener answers: `(method, path)`, a `{name}` a path segment
/// (percent-decoded; for `DELETE /api/overrides/{name}` and `/api/blocks/{address}`, the rest
/// of the path). `HEAD` goes wherever `GET` does. A known path with another method is 405 with
/// `Allow`; any other path is 404.
// Read by the tests: the router's, and the OpenAPI document's.
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/metrics"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("POST", "/reload"),
    ("GET", "/api/usage"),
    ("GET", "/api/overrides"),
    ("DELETE", "/api/overrides/{name}"),
    ("GET", "/api/blocks"),
    ("DELETE", "/api/blocks/{address}"),
    ("GET", "/api/ledger"),
    ("GET", "/api/keys"),
    ("POST", "/api/keys"),
    ("GET", "/api/keys/{name}"),
    ("DELETE", "/api/keys/{name}"),
    ("POST", "/api/keys/{name}/rotate"),
    ("POST", "/api/keys/revoke"),
    ("POST", "/api/keys/{name}/suspend"),
    ("POST", "/api/keys/{name}/resume"),
    ("POST", "/api/keys/{name}/revoke"),
    ("PUT", "/api/keys/{name}/limit"),
    ("DELETE", "/api/keys/{name}/limit"),
    ("PUT", "/api/keys/{name}/quota"),
    ("DELETE", "/api/keys/{name}/quota"),
    ("GET", "/api/openapi.json"),
];

/// A request past the guards: what the router and the handlers read of it.
pub(crate) struct AdminRequest<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The body, as far as it was read.
    pub body: &'a [u8],
    /// The body was over [`MAX_ADMIN_BODY`]; the rest of it was not read.
    pub too_large: bool,
    /// `Accept` names `text/csv` (`GET /api/ledger`).
    pub csv: bool,
}

/// What a request asks for: one variant per row of [`ROUTES`] but the key changes, which
/// share [`Route::Key`]. Names are percent-decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Page,
    Metrics,
    Healthz,
    Readyz,
    Reload,
    Usage,
    KeyRecords,
    DeleteOverride(String),
    Blocks,
    ReleaseBlock(String),
    Ledger,
    /// `GET /api/keys`: a page of keys.
    ListKeys,
    /// `POST /api/keys`: a new key.
    CreateKey,
    ShowKey(String),
    /// `DELETE /api/keys/{name}`: an issued key revoked and forgotten.
    DeleteKey(String),
    /// `POST /api/keys/{name}/rotate`: an issued key's new secret.
    RotateKey(String),
    /// `POST /api/keys/revoke`: the leak path, by the secret.
    RevokeSecret,
    /// A change to the key named.
    Key(String, KeyOp),
    /// `GET /api/openapi.json`: this table as an OpenAPI document.
    OpenApi,
}

/// Why no route answers.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// 404, `not found` as text.
    NotFound,
    /// 405: a known path, another method; `Allow` lists the methods it takes.
    NotAllowed(&'static str),
    /// 404 problem `not_found`: `/api/keys/{name}/…` with an operation keys do not have.
    NoKeyOperation,
}

/// A request's method as the table reads it: `HEAD` is `GET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Get,
    Post,
    Put,
    Delete,
    Other,
}

impl Verb {
    fn of(method: &Method) -> Verb {
        match *method {
            Method::GET | Method::HEAD => Verb::Get,
            Method::POST => Verb::Post,
            Method::PUT => Verb::Put,
            Method::DELETE => Verb::Delete,
            _ => Verb::Other,
        }
    }
}

/// The route of `method path`, or the miss: the table.
pub(crate) fn classify(method: &Method, path: &str) -> Result<Route, Miss> {
    use Verb::{Delete, Get, Post, Put};
    let Some(path) = path.strip_prefix('/') else {
        return Err(Miss::NotFound);
    };
    let segments: Vec<&str> = path.split('/').collect();
    // The path after its first two segments (`/api/overrides/{name}`: a name may hold `/`).
    let tail = || percent_decode(path.splitn(3, '/').nth(2).unwrap_or(""));
    let key = |name: &str, op| Ok(Route::Key(percent_decode(name), op));
    match (Verb::of(method), segments.as_slice()) {
        (Get, [""]) => Ok(Route::Page),
        (Get, ["metrics"]) => Ok(Route::Metrics),
        (Get, ["healthz"]) => Ok(Route::Healthz),
        (Get, ["readyz"]) => Ok(Route::Readyz),
        (Post, ["reload"]) => Ok(Route::Reload),
        (Get, ["api", "usage"]) => Ok(Route::Usage),
        (Get, ["api", "overrides"]) => Ok(Route::KeyRecords),
        (Delete, ["api", "overrides", _, ..]) => Ok(Route::DeleteOverride(tail())),
        (Get, ["api", "blocks"]) => Ok(Route::Blocks),
        (Delete, ["api", "blocks", _, ..]) => Ok(Route::ReleaseBlock(tail())),
        (Get, ["api", "ledger"]) => Ok(Route::Ledger),
        (Get, ["api", "keys"]) => Ok(Route::ListKeys),
        (Post, ["api", "keys"]) => Ok(Route::CreateKey),
        (Get, ["api", "openapi.json"]) => Ok(Route::OpenApi),
        (Post, ["api", "keys", name]) if percent_decode(name) == "revoke" => {
            Ok(Route::RevokeSecret)
        }
        (Get, ["api", "keys", name]) => Ok(Route::ShowKey(percent_decode(name))),
        (Delete, ["api", "keys", name]) => Ok(Route::DeleteKey(percent_decode(name))),
        (Post, ["api", "keys", name, "rotate"]) => Ok(Route::RotateKey(percent_decode(name))),
        (Post, ["api", "keys", name, "suspend"]) => key(name, KeyOp::Suspend),
        (Post, ["api", "keys", name, "resume"]) => key(name, KeyOp::Resume),
        (Post, ["api", "keys", name, "revoke"]) => key(name, KeyOp::Revoke),
        (Put, ["api", "keys", name, "limit"]) => key(name, KeyOp::SetLimit),
        (Delete, ["api", "keys", name, "limit"]) => key(name, KeyOp::ClearLimit),
        (Put, ["api", "keys", name, "quota"]) => key(name, KeyOp::SetQuota),
        (Delete, ["api", "keys", name, "quota"]) => key(name, KeyOp::ClearQuota),
        // Known paths, other methods.
        (_, [""] | ["metrics" | "healthz" | "readyz"])
        | (_, ["api", "usage" | "overrides" | "blocks" | "ledger" | "openapi.json"]) => {
            Err(Miss::NotAllowed("GET, HEAD"))
        }
        (_, ["api", "keys"]) => Err(Miss::NotAllowed("GET, HEAD, POST")),
        (_, ["api", "keys", _]) => Err(Miss::NotAllowed("GET, HEAD, DELETE")),
        (_, ["reload"]) => Err(Miss::NotAllowed("POST")),
        (_, ["api", "overrides" | "blocks", _, ..]) => Err(Miss::NotAllowed("DELETE")),
        (_, ["api", "keys", _, "suspend" | "resume" | "revoke" | "rotate"]) => {
            Err(Miss::NotAllowed("POST"))
        }
        (_, ["api", "keys", _, "limit" | "quota"]) => Err(Miss::NotAllowed("PUT, DELETE")),
        (_, ["api", "keys", _, ..]) => Err(Miss::NoKeyOperation),
        _ => Err(Miss::NotFound),
    }
}

impl Admin {
    /// The answer to a request past the guards: its route's handler, or the miss.
    pub(super) async fn answer(&self, req: &AdminRequest<'_>) -> Response<Vec<u8>> {
        let route = match classify(req.method, req.path) {
            Ok(route) => route,
            // A body over the cap is refused on the paths that take one, whatever the route.
            Err(_) if req.too_large && is_keys_path(req.path) => return too_large(),
            Err(Miss::NotFound) => return no_route(),
            Err(Miss::NotAllowed(allow)) => return not_allowed(allow),
            Err(Miss::NoKeyOperation) => {
                return problem(
                    AdminCode::NoKeyOperation,
                    "the operations are suspend, resume, revoke, rotate, limit and quota",
                )
            }
        };
        if let Err(refused) = admissible(&route, req) {
            // A change refused before its handler is a change refused all the same.
            if let Some(kind) = route.change_kind() {
                self.live.metrics().admin_change(kind, false);
            }
            return *refused;
        }
        match route {
            Route::Page => page(StatusCode::OK),
            Route::Metrics => self.metrics(),
            Route::Healthz => text(StatusCode::OK, "ok\n"),
            Route::Readyz => self.readyz(),
            Route::Reload => self.reload(),
            Route::Usage => usage::answer(self, req.query),
            Route::KeyRecords => overrides::list(self),
            Route::DeleteOverride(name) => overrides::delete(self, &name).await,
            Route::Blocks => json(
                StatusCode::OK,
                &BlocksView {
                    blocks: self.blocks(),
                },
            ),
            Route::ReleaseBlock(address) => self.release_block(&address),
            Route::Ledger => ledger::answer(self, req.query, req.csv).await,
            Route::ListKeys => list::answer(self, req.query),
            Route::CreateKey => issue::create(self, req.body).await,
            Route::ShowKey(name) => keys::show_found(&self.changes, &name).await,
            Route::DeleteKey(name) => issue::delete(self, &name).await,
            Route::RotateKey(name) => issue::rotate(self, &name, req.body).await,
            Route::RevokeSecret => keys::revoke_secret(self, req.body).await,
            Route::Key(name, op) => keys::change(self, &name, op, req.body).await,
            Route::OpenApi => reply(
                StatusCode::OK,
                "application/json",
                openapi::document().to_vec(),
            ),
        }
    }
}

/// What the router refuses of a classified request before its handler: a body over the cap
/// on the paths that take one, and what the operation does not take, refused rather than
/// dropped unsaid (`?reason=…` or `{"reason": …}` on a revocation), as a body refuses a member
/// it does not have and a query a parameter it does not name.
fn admissible(route: &Route, req: &AdminRequest<'_>) -> Result<(), Refused> {
    if req.too_large && is_keys_path(req.path) {
        return Err(Box::new(too_large()));
    }
    let (method, template) = route.row();
    if super::openapi::refuses_any_query(method, template) {
        super::query::none(req.query, method, template)?;
    }
    if !super::openapi::takes_body(method, template) {
        super::body::none(req.body)?;
    }
    Ok(())
}

/// 404 problem `not_found`: a path the listener does not answer.
fn no_route() -> Response<Vec<u8>> {
    problem(
        AdminCode::NoRoute,
        "the admin listener answers no such path (GET /api/openapi.json lists them)",
    )
}

/// Whether `path` is one of `/api/keys…`, the paths that read a body.
fn is_keys_path(path: &str) -> bool {
    path.starts_with("/api/keys/") || path == "/api/keys"
}

/// 413: a body over the admin listener's cap.
fn too_large() -> Response<Vec<u8>> {
    problem(
        AdminCode::BodyTooLarge,
        &format!("the admin listener reads at most {MAX_ADMIN_BODY} bytes"),
    )
}

impl Route {
    /// The kind of change it makes (the `action` of `tollgate_admin_changes_total`), for a
    /// change of a key.
    fn change_kind(&self) -> Option<ChangeKind> {
        match self {
            Route::CreateKey => Some(ChangeKind::Create),
            Route::RotateKey(_) => Some(ChangeKind::Rotate),
            Route::DeleteKey(_) => Some(ChangeKind::Delete),
            Route::RevokeSecret => Some(ChangeKind::Revoke),
            Route::Key(_, op) => Some(op.kind()),
            _ => None,
        }
    }

    /// Its row of [`ROUTES`] (`HEAD` is the `GET` row).
    fn row(&self) -> (&'static str, &'static str) {
        match self {
            Route::Page => ("GET", "/"),
            Route::Metrics => ("GET", "/metrics"),
            Route::Healthz => ("GET", "/healthz"),
            Route::Readyz => ("GET", "/readyz"),
            Route::Reload => ("POST", "/reload"),
            Route::Usage => ("GET", "/api/usage"),
            Route::KeyRecords => ("GET", "/api/overrides"),
            Route::DeleteOverride(_) => ("DELETE", "/api/overrides/{name}"),
            Route::Blocks => ("GET", "/api/blocks"),
            Route::ReleaseBlock(_) => ("DELETE", "/api/blocks/{address}"),
            Route::Ledger => ("GET", "/api/ledger"),
            Route::ListKeys => ("GET", "/api/keys"),
            Route::CreateKey => ("POST", "/api/keys"),
            Route::ShowKey(_) => ("GET", "/api/keys/{name}"),
            Route::DeleteKey(_) => ("DELETE", "/api/keys/{name}"),
            Route::RotateKey(_) => ("POST", "/api/keys/{name}/rotate"),
            Route::RevokeSecret => ("POST", "/api/keys/revoke"),
            Route::Key(_, op) => op.row(),
            Route::OpenApi => ("GET", "/api/openapi.json"),
        }
    }
}

#[cfg(test)]
#[path = "router_tests.rs"]
mod tests;
