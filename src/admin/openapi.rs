//! `GET /api/openapi.json`: the admin API as an OpenAPI 3.1 document, built once from the
//! route table ([`OPS`], one row per row of [`super::router::ROUTES`], a unit test holds the
//! two together), the answers' and bodies' types (their `ToSchema` derives follow their serde
//! shapes) and the [`AdminCode`] table (each error answer lists the codes it can carry, as
//! `x-codes`, and the `Problem` schema's `code` is the enum of them all).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use utoipa::openapi::extensions::ExtensionsBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{AllOfBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, Content, InfoBuilder, OpenApi, OpenApiBuilder, PathItem, PathsBuilder, Ref,
    RefOr, Required, ResponseBuilder,
};
use utoipa::ToSchema;

use super::body::{LimitBody, QuotaBody, SecretBody, SuspendBody};
use super::codes::AdminCode;
use super::issue::{CreateBody, IssuedView, RotateBody};
use super::view::{
    BlocksView, ConfigRefusedAt, FieldErrorView, KeyPage, KeyView, LedgerView, OverridesView,
    ReloadView, RevokedView, UsageView,
};

/// What a route answers when it succeeds.
#[derive(Clone, Copy)]
enum Answer {
    /// `200` + this schema as `application/json`.
    Json(&'static str),
    /// `200` + text of this media type (`text/plain`, `text/html`).
    Text(&'static str),
    /// `201` + this schema as `application/json`.
    Created(&'static str),
    /// `204`, no body.
    NoContent,
}

/// A request body: its schema, and whether it is required (`suspend`'s may be left out).
type Body = Option<(&'static str, bool)>;

/// One operation: its row of `ROUTES`, a summary, its parameters (`{…}` in the path are
/// added from the path itself), its body, its answer, and the codes its handler can refuse
/// with (the guards' are added by [`guard_codes`]).
struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    query: &'static [(&'static str, &'static str)],
    body: Body,
    answer: Answer,
    codes: &'static [AdminCode],
}

use AdminCode::*;

#[rustfmt::skip]
const KEY_CHANGE: &[AdminCode] = &[UnknownKey, KeyRevoked, NotACustomerKey, SuspendedByOperator, ChangeNotKept, InvalidJson, InvalidBody, BodyTooLarge];
#[rustfmt::skip]
const KEY_CHANGE_NO_BODY: &[AdminCode] = &[UnknownKey, KeyRevoked, NotACustomerKey, SuspendedByOperator, ChangeNotKept, BodyTooLarge];

/// The query parameters `GET path` takes, as its row of [`OPS`] names them (none for a
/// path without a `GET`): what [`super::query::read`] accepts.
pub(super) fn query_names(path: &str) -> Vec<&'static str> {
    op("GET", path)
        .map(|op| op.query.iter().map(|&(name, _)| name).collect())
        .unwrap_or_default()
}

/// The row of [`OPS`] of `method path` (a row of `ROUTES`).
fn op(method: &str, path: &str) -> Option<&'static Op> {
    OPS.iter().find(|op| op.method == method && op.path == path)
}

/// Every operation of the admin API, in the order of `ROUTES`.
#[rustfmt::skip]
const OPS: &[Op] = &[
    Op { method: "GET", path: "/", summary: "The usage page (HTML; without the token, a browser gets the page at 401 and it asks for it)", query: &[], body: None, answer: Answer::Text("text/html"), codes: &[] },
    Op { method: "GET", path: "/metrics", summary: "Prometheus metrics, text format", query: &[], body: None, answer: Answer::Text("text/plain"), codes: &[] },
    Op { method: "GET", path: "/healthz", summary: "Liveness: `ok` while the process runs (no host check, no token)", query: &[], body: None, answer: Answer::Text("text/plain"), codes: &[] },
    Op { method: "GET", path: "/readyz", summary: "Readiness: `ready`, `upgrading` or `degraded` (200); `starting` or `draining` (503, text)", query: &[], body: None, answer: Answer::Text("text/plain"), codes: &[] },
    Op { method: "POST", path: "/reload", summary: "Read the config file again and put it in force", query: &[], body: None, answer: Answer::Json("ReloadView"), codes: &[ConfigRefused] },
    Op { method: "GET", path: "/api/usage", summary: "The operator's view: what the page shows", query: &[("key", "Narrows the keys to names that contain it (any case)")], body: None, answer: Answer::Json("UsageView"), codes: &[InvalidQuery] },
    Op { method: "GET", path: "/api/overrides", summary: "The partner upgrades in force", query: &[], body: None, answer: Answer::Json("OverridesView"), codes: &[] },
    Op { method: "DELETE", path: "/api/overrides/{name}", summary: "Put the key back on its YAML plan (the name may hold `/`)", query: &[], body: None, answer: Answer::NoContent, codes: &[NoOverride, ChangeNotKept] },
    Op { method: "GET", path: "/api/blocks", summary: "The addresses auth-failure blocking holds now", query: &[], body: None, answer: Answer::Json("BlocksView"), codes: &[] },
    Op { method: "DELETE", path: "/api/blocks/{address}", summary: "Serve the address again at once (an address, or an IPv6 /64 as listed)", query: &[], body: None, answer: Answer::NoContent, codes: &[NotBlocked] },
    Op { method: "GET", path: "/api/ledger", summary: "The usage ledger, per key and day (CSV with `Accept: text/csv`)", query: &[("from", "The first day, YYYY-MM-DD (UTC); default `to`"), ("to", "The last day, inclusive, YYYY-MM-DD (UTC); default today"), ("key", "Only the key of this name")], body: None, answer: Answer::Json("LedgerView"), codes: &[InvalidQuery, LedgerUnavailable] },
    Op { method: "GET", path: "/api/keys", summary: "One page of keys in name order, filtered", query: &[("plan", "Only keys on this plan (`partner`: partner keys)"), ("partner", "Only keys this partner manages"), ("state", "`active`, `expired`, `suspended` or `revoked`"), ("source", "`config` or `api`"), ("limit", "Keys per page, 1 to 1000 (default 100)"), ("cursor", "The `next` of the page before")], body: None, answer: Answer::Json("KeyPage"), codes: &[InvalidQuery] },
    Op { method: "POST", path: "/api/keys", summary: "Issue a key: its secret, shown this once, beside its state", query: &[], body: Some(("CreateBody", true)), answer: Answer::Created("IssuedView"), codes: &[KeyExists, ChangeNotKept, InvalidJson, InvalidBody, BodyTooLarge] },
    Op { method: "GET", path: "/api/keys/{name}", summary: "A key's state (never a digest)", query: &[], body: None, answer: Answer::Json("KeyView"), codes: &[UnknownKey, BodyTooLarge] },
    Op { method: "DELETE", path: "/api/keys/{name}", summary: "Revoke and forget an issued key (its ledger rows stay)", query: &[], body: None, answer: Answer::NoContent, codes: &[UnknownKey, DefinedInConfig, ChangeNotKept] },
    Op { method: "POST", path: "/api/keys/{name}/rotate", summary: "A new secret for an issued key; the one it replaces authenticates for the overlap", query: &[], body: Some(("RotateBody", false)), answer: Answer::Json("IssuedView"), codes: &[UnknownKey, DefinedInConfig, KeyRevoked, KeyExists, ChangeNotKept, InvalidJson, InvalidBody, BodyTooLarge] },
    Op { method: "POST", path: "/api/keys/revoke", summary: "Revoke the key a leaked secret is", query: &[], body: Some(("SecretBody", true)), answer: Answer::Json("RevokedView"), codes: &[UnknownSecret, ChangeNotKept, InvalidJson, InvalidBody, BodyTooLarge] },
    Op { method: "POST", path: "/api/keys/{name}/suspend", summary: "Suspend the key", query: &[], body: Some(("SuspendBody", false)), answer: Answer::Json("KeyView"), codes: KEY_CHANGE },
    Op { method: "POST", path: "/api/keys/{name}/resume", summary: "Resume a suspended key", query: &[], body: None, answer: Answer::Json("KeyView"), codes: KEY_CHANGE_NO_BODY },
    Op { method: "POST", path: "/api/keys/{name}/revoke", summary: "Revoke the key", query: &[], body: None, answer: Answer::Json("KeyView"), codes: KEY_CHANGE_NO_BODY },
    Op { method: "PUT", path: "/api/keys/{name}/limit", summary: "Give the key a window limit of its own", query: &[], body: Some(("LimitBody", true)), answer: Answer::Json("KeyView"), codes: KEY_CHANGE },
    Op { method: "DELETE", path: "/api/keys/{name}/limit", summary: "Take the key's own window limit away", query: &[], body: None, answer: Answer::Json("KeyView"), codes: KEY_CHANGE_NO_BODY },
    Op { method: "PUT", path: "/api/keys/{name}/quota", summary: "Give the key a quota of its own", query: &[], body: Some(("QuotaBody", true)), answer: Answer::Json("KeyView"), codes: KEY_CHANGE },
    Op { method: "DELETE", path: "/api/keys/{name}/quota", summary: "Take the key's own quota away", query: &[], body: None, answer: Answer::Json("KeyView"), codes: KEY_CHANGE_NO_BODY },
    Op { method: "GET", path: "/api/openapi.json", summary: "This document", query: &[], body: None, answer: Answer::Json("OpenApiDocument"), codes: &[] },
];

/// The document as JSON, made on the first call.
pub(super) fn document() -> &'static [u8] {
    static DOC: OnceLock<Vec<u8>> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut b = serde_json::to_vec(&build()).unwrap_or_default();
        b.push(b'\n');
        b
    })
}

/// Whether `path` is open: no host check, no token (`guard.rs`).
fn open(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// Whether `method path` (a row of `ROUTES`) takes a body: one that takes none and is not a
/// `GET` refuses a body with anything in it (`body::none`, before its handler).
pub(super) fn takes_body(method: &str, path: &str) -> bool {
    method == "GET" || op(method, path).is_some_and(|op| op.body.is_some())
}

/// Whether any parameter in the query of `method path` (a row of `ROUTES`) is refused, before
/// its handler (`query::none`): where the operation takes no query and is a change or under
/// `/api/`. The page, the metrics and the probes, which browsers, scrapers and orchestrators
/// fetch with parameters of their own, ignore a query.
pub(super) fn refuses_any_query(method: &str, path: &str) -> bool {
    let takes_none = op(method, path).is_none_or(|op| op.query.is_empty());
    takes_none && (method != "GET" || path.starts_with("/api/"))
}

/// The codes the guards can answer an operation with, before its handler (and, for one that
/// takes no body, the refusal of a body with something in it; for one that takes no query,
/// of a parameter).
fn guard_codes(op: &Op) -> Vec<AdminCode> {
    let mut codes = Vec::new();
    if !open(op.path) {
        codes.push(HostNotAllowed);
    }
    if op.method != "GET" {
        codes.push(CrossOrigin);
    }
    if !open(op.path) {
        codes.extend([TooManyAuthFailures, Unauthorized]);
    }
    if !takes_body(op.method, op.path) {
        codes.extend([InvalidJson, InvalidBody]);
    }
    if refuses_any_query(op.method, op.path) {
        codes.push(InvalidQuery);
    }
    codes
}

fn method(m: &str) -> HttpMethod {
    match m {
        "GET" => HttpMethod::Get,
        "POST" => HttpMethod::Post,
        "PUT" => HttpMethod::Put,
        _ => HttpMethod::Delete,
    }
}

fn string() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::String))
        .into()
}

fn json_ref(name: &str) -> Content {
    Content::new(Some(Ref::from_schema_name(name)))
}

/// The operation `op` describes.
fn operation(op: &Op) -> utoipa::openapi::path::Operation {
    let mut b = OperationBuilder::new().summary(Some(op.summary));
    for seg in op.path.split('/') {
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            b = b.parameter(
                ParameterBuilder::new()
                    .name(name)
                    .parameter_in(ParameterIn::Path)
                    .required(Required::True)
                    .description(Some(
                        "Percent-encoded where it holds characters a URL escapes",
                    ))
                    .schema(Some(string())),
            );
        }
    }
    for (name, what) in op.query {
        b = b.parameter(
            ParameterBuilder::new()
                .name(*name)
                .parameter_in(ParameterIn::Query)
                .required(Required::False)
                .description(Some(*what))
                .schema(Some(string())),
        );
    }
    if let Some((schema, required)) = op.body {
        let required = if required {
            Required::True
        } else {
            Required::False
        };
        b = b.request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(required))
                .content("application/json", json_ref(schema))
                .build(),
        ));
    }
    b = match op.answer {
        Answer::Json(schema) => {
            let mut r = ResponseBuilder::new()
                .description("OK")
                .content("application/json", json_ref(schema));
            if op.path == "/api/ledger" {
                r = r.content("text/csv", Content::new(Some(string())));
            }
            b.response("200", r.build())
        }
        Answer::Text(media) => b.response(
            "200",
            ResponseBuilder::new()
                .description("OK")
                .content(media, Content::new(Some(string())))
                .build(),
        ),
        Answer::Created(schema) => b.response(
            "201",
            ResponseBuilder::new()
                .description("Created")
                .content("application/json", json_ref(schema))
                .build(),
        ),
        Answer::NoContent => b.response("204", ResponseBuilder::new().description("Done").build()),
    };
    if op.path == "/readyz" {
        let text = Content::new(Some(string()));
        let r = ResponseBuilder::new().description("`starting` or `draining`");
        b = b.response("503", r.content("text/plain", text).build());
    }
    // The refusals, by status: each lists its codes.
    let mut by_status: BTreeMap<u16, Vec<&'static str>> = BTreeMap::new();
    for code in guard_codes(op).into_iter().chain(op.codes.iter().copied()) {
        let codes = by_status.entry(code.status().as_u16()).or_default();
        if !codes.contains(&code.as_str()) {
            codes.push(code.as_str());
        }
    }
    for (status, codes) in by_status {
        let schema: RefOr<Schema> = if codes == ["config_refused"] {
            AllOfBuilder::new()
                .item(Ref::from_schema_name("Problem"))
                .item(Ref::from_schema_name("ConfigRefusedAt"))
                .into()
        } else {
            Ref::from_schema_name("Problem").into()
        };
        let ext = ExtensionsBuilder::new()
            .add("x-codes", codes.clone())
            .build();
        let content = Content::new(Some(schema));
        let r = ResponseBuilder::new()
            .description(format!("A problem (RFC 9457): {}", codes.join(", ")))
            .content("application/problem+json", content)
            .extensions(Some(ext));
        b = b.response(status.to_string(), r.build());
    }
    if open(op.path) {
        b = b.security(SecurityRequirement::default());
    }
    b.build()
}

/// The problem+json every refusal is: `code` one of the table's.
fn problem_schema() -> Schema {
    let mut codes: Vec<&str> = Vec::new();
    for c in AdminCode::ALL {
        if !codes.contains(&c.as_str()) {
            codes.push(c.as_str());
        }
    }
    let int = || ObjectBuilder::new().schema_type(SchemaType::Type(Type::Integer));
    ObjectBuilder::new()
        .description(Some("RFC 9457 problem details; `code` says why"))
        .property("type", string())
        .property("title", string())
        .property("status", int())
        .property("detail", string())
        .property(
            "code",
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::String))
                .enum_values(Some(codes)),
        )
        .property(
            "errors",
            utoipa::openapi::schema::ArrayBuilder::new()
                .items(Ref::from_schema_name("FieldErrorView"))
                .description(Some("`invalid_body`: the fields that broke")),
        )
        .required("type")
        .required("title")
        .required("status")
        .required("detail")
        .required("code")
        .into()
}

/// `T`'s schema and those it refers to.
fn with<T: ToSchema>(all: &mut Vec<(String, RefOr<Schema>)>) {
    T::schemas(all);
    all.push((T::name().into_owned(), T::schema()));
}

/// The document.
fn build() -> OpenApi {
    let mut paths = PathsBuilder::new();
    for op in OPS {
        paths = paths.path(op.path, PathItem::new(method(op.method), operation(op)));
    }
    let mut schemas = Vec::new();
    with::<UsageView>(&mut schemas);
    with::<ReloadView>(&mut schemas);
    with::<OverridesView>(&mut schemas);
    with::<BlocksView>(&mut schemas);
    with::<LedgerView>(&mut schemas);
    with::<KeyPage>(&mut schemas);
    with::<KeyView>(&mut schemas);
    with::<RevokedView>(&mut schemas);
    with::<IssuedView>(&mut schemas);
    with::<CreateBody>(&mut schemas);
    with::<RotateBody>(&mut schemas);
    with::<SuspendBody>(&mut schemas);
    with::<LimitBody>(&mut schemas);
    with::<QuotaBody>(&mut schemas);
    with::<SecretBody>(&mut schemas);
    with::<ConfigRefusedAt>(&mut schemas);
    with::<FieldErrorView>(&mut schemas);
    schemas.push(("Problem".into(), problem_schema().into()));
    let doc = ObjectBuilder::new().description(Some("An OpenAPI 3.1 document"));
    schemas.push(("OpenApiDocument".into(), Schema::from(doc.build()).into()));
    let bearer = HttpBuilder::new()
        .scheme(HttpAuthScheme::Bearer)
        .description(Some("The admin token, when `admin_token_sha256` is set"))
        .build();
    let components = ComponentsBuilder::new()
        .schemas_from_iter(schemas)
        .security_scheme("admin_token", SecurityScheme::Http(bearer))
        .build();
    let info = InfoBuilder::new()
        .title("Tollgate admin API")
        .version(env!("CARGO_PKG_VERSION"))
        .description(Some(
            "The admin listener. Without `admin_token_sha256` no token is asked for. \
             `HEAD` is answered wherever `GET` is; a known path with another method is 405 \
             with `Allow`, any other path 404 (`/api/keys/{name}/…` with an operation keys \
             do not have: problem `not_found`).",
        ))
        .build();
    OpenApiBuilder::new()
        .info(info)
        .paths(paths.build())
        .components(Some(components))
        .security(Some([
            SecurityRequirement::new("admin_token", Vec::<String>::new()),
            SecurityRequirement::default(),
        ]))
        .build()
}

#[cfg(test)]
#[path = "openapi_tests.rs"]
mod tests;
