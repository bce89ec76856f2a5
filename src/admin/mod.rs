//! The admin listener (`admin_listen`, loopback by default): for operators and their tools,
//! never for API clients.
//!
//! | request | answer |
//! |---|---|
//! | `GET /metrics` | 200, Prometheus text format (see [`crate::runtime::metrics`]) |
//! | `GET /healthz` | 200 `ok` while the process runs (liveness) |
//! | `GET /readyz` | 200 `ready` once the gateway listener accepts connections; 503 while starting or draining (and 200 `upgrading` while handing over to a new process, which serves the same sockets; 200 `degraded` while the `cluster` store is unreachable and each replica enforces `limit / N` alone, or while the disk under `state.path` fails its writes) |
//! | `POST /reload` | 200 and a JSON summary when the new config is in force; 422 problem+json with file, line, field and reason when it was refused (the old config keeps serving) |
//! | `GET /` | the usage page (`page.html`: no external asset) |
//! | `GET /api/usage` | 200, the operator's view as JSON ([`view::UsageView`]; `?key=` narrows the keys) |
//! | `GET /api/overrides` | 200, `{"overrides": [...]}`: the partner upgrades in force (key name, plan, the plan it replaced, partner, when) |
//! | `DELETE /api/overrides/{key name}` | 204: the key is back on its YAML plan, everywhere the overrides are kept; 404 problem+json when it had no override |
//! | `GET /api/blocks` | 200, `{"blocks": [...]}`: the addresses auth-failure blocking holds now (`address`, `since`, `until`, `failures`, `listener`) |
//! | `DELETE /api/blocks/{address}` | 204: the address is served again at once, its failures forgotten, with one log line; 404 problem+json when it is not blocked (also when it is not an address, which the detail says) |
//! | `GET /api/ledger` | 200, the usage ledger as JSON or CSV ([`ledger`]) |
//! | `GET /api/keys` | 200, one page of keys in name order, filtered, with the next page's cursor ([`list`]) |
//! | `POST /api/keys`, `POST /api/keys/{name}/rotate`, `DELETE /api/keys/{name}` | keys issued through the API: the secret shown once, rotated with an overlap, revoked and forgotten ([`issue`]) |
//! | `GET /api/keys/{name}`, `POST /api/keys/{name}/suspend\|resume\|revoke`, `POST /api/keys/revoke`, `PUT\|DELETE /api/keys/{name}/limit\|quota` | keys that change live ([`keys`]) |
//! | `GET /api/openapi.json` | 200, this table as an OpenAPI 3.1 document: every path, method, parameter, body, answer and problem code ([`openapi`]) |
//!
//! With `admin_token_sha256` set, every path but `/healthz` and `/readyz` needs
//! `Authorization: Bearer <token>` (its SHA-256 compared in constant time): else 401
//! problem+json. The token is never logged.
//!
//! Other paths are 404, other methods 405 with `Allow`. `HEAD` works wherever `GET` does.
//! Nothing here echoes a key: config errors name fields, never their values.
//!
//! A request goes: the HTTP layer here (the body read, up to [`MAX_ADMIN_BODY`]) → the
//! guards ([`guard`]) → the one route table ([`router`]) → its handler. The files:
//!
//! | file | role |
//! |---|---|
//! | `mod.rs` | the [`Admin`] service: the HTTP layer, and the order of the steps |
//! | `guard.rs` | the checks before any route: host, cross-site, the token and its guessing |
//! | `router.rs` | the route table: [`router::ROUTES`], the one `match` of method and path, 404 and 405 |
//! | `codes.rs` | every admin problem code, one row each ([`codes::AdminCode`]) |
//! | `reply.rs` | the writers: problems, typed JSON, text, the page |
//! | `view/` | the typed answers ([`view::UsageView`], [`view::KeyView`], …) |
//! | `body.rs` | the typed request bodies, read so that a 400 names the field |
//! | `process.rs` | `/metrics`, `/readyz`, `POST /reload` |
//! | `usage.rs` | `GET /api/usage`: the operator's view, built |
//! | `overrides.rs` | `GET /api/overrides`, `DELETE /api/overrides/{name}` |
//! | `blocks.rs` | `GET /api/blocks`, `DELETE /api/blocks/{address}` |
//! | `ledger.rs` | `GET /api/ledger`, JSON or CSV |
//! | `keys.rs` | `/api/keys/…`: the handlers of keys that change live |
//! | `issue.rs` | `POST /api/keys`, `POST /api/keys/{name}/rotate`, `DELETE /api/keys/{name}`: keys issued through the API |
//! | `list.rs` | `GET /api/keys`: pages of keys in name order |
//! | `record.rs` | a key's live record in words: its state, the changes in force |
//! | `openapi.rs` | `GET /api/openapi.json`: the document, from `ROUTES`' operations, the views' and bodies' schemas and the codes |
//! | `tests.rs` | the listener's answers, end to end without a socket |
//! | `router_tests.rs`, `openapi_tests.rs` | the route table held to `ROUTES`, and the document to both |

use std::sync::Arc;
use std::time::Instant;

mod blocks;
mod body;
mod codes;
pub(crate) mod guard;
mod issue;
pub(crate) mod keys;
pub(crate) mod ledger;
pub(crate) mod list;
mod openapi;
mod overrides;
mod process;
mod query;
mod record;
mod reply;
pub(crate) mod router;
#[cfg(test)]
mod tests;
mod usage;
pub(crate) mod view;

use async_trait::async_trait;
use http::header::CONTENT_LENGTH;
use http::{Method, Response};
use pingora::protocols::http::ServerSession;

use crate::clock::Clock;
use crate::keys::KeyChanges;
use crate::limit::SharedStore;
use crate::policy::blocking::FailureTable;
use crate::policy::client::ClientKey;
use crate::runtime::lifecycle::Health;
use crate::runtime::live::LivePolicy;
use codes::AdminCode;
use reply::conn_of;
use router::AdminRequest;

/// Bodies sent to the admin listener are read and dropped, up to this many bytes.
const MAX_ADMIN_BODY: usize = 64 * 1024;

pub(crate) struct Admin {
    pub live: Arc<LivePolicy>,
    pub health: Arc<Health>,
    /// The shared store, when `cluster` is configured: `/readyz` says `degraded` while it is
    /// down.
    pub cluster: Option<Arc<SharedStore>>,
    /// The limiter's clock (budgets left, on the usage view; token-guessing blocks).
    pub clock: Arc<dyn Clock>,
    /// Wrong admin tokens per client address ([`guard::TOKEN_FAILURES`]).
    pub failures: Arc<FailureTable>,
    /// The owner of every change to a key (`/api/keys`, `DELETE /api/overrides/{name}`).
    pub changes: Arc<KeyChanges>,
    /// The quota and ledger counts (`GET /api/ledger`).
    pub ledger: Arc<crate::ledger::Keeper>,
    /// The keys in name order, for `GET /api/keys` (sorted once per config).
    pub names: list::NameOrder,
}

/// The usage page: one file, no external asset (works on an air-gapped host).
const PAGE: &str = include_str!("page.html");

#[async_trait]
impl pingora::apps::http_app::ServeHttp for Admin {
    /// The exchange ([`Admin::exchange`]), then the framing every answer shares
    /// (`Content-Length`, no body for `HEAD`).
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // The head is in: its body (if any) is due within the body deadline, and the answer,
        // once made, starts the connection's idle spell (the edge's deadlines, as on the
        // gateway's listeners).
        let conn = conn_of(session);
        if let Some(c) = &conn {
            c.head_done(Instant::now(), !session.is_body_done());
        }
        let mut r = self.exchange(session, conn.as_deref()).await;
        let len = r.body().len();
        r.headers_mut().insert(CONTENT_LENGTH, len.into());
        if session.req_header().method == Method::HEAD {
            r.body_mut().clear();
        }
        if let Some(c) = &conn {
            c.exchange_done(Instant::now());
        }
        r
    }
}

impl Admin {
    /// The steps: the head within the caps, the body read (up to a cap), the guards, the
    /// route table.
    async fn exchange(
        &self,
        session: &mut ServerSession,
        conn: Option<&crate::edge::stream::Conn>,
    ) -> Response<Vec<u8>> {
        // The head within `server.max_header_bytes` and `max_headers`, as on the gateway's
        // listeners (the connection's own settings on HTTP/1.1): else 431, the body unread.
        let snap = self.live.load();
        let limits = conn.map_or(&*snap.policy.config.server, |c| c.settings());
        let raw = session
            .as_http1()
            .map(|h1| h1.get_headers_raw_bytes().len());
        if let Err(r) = crate::proxy::head::check_size(session.req_header(), raw, limits) {
            session.set_keepalive(None);
            return reply::problem(AdminCode::HeadersTooLarge, &r.detail);
        }
        // Read the body (the key operations take one), up to a cap; past it, the rest is
        // not read and the connection is closed. A body that does not finish arriving (the
        // body deadline, or the client closing before its framing's end) is no body: what
        // came of it is never taken for the whole, and nothing is changed.
        let mut body: Vec<u8> = Vec::new();
        let mut too_large = false;
        let read = loop {
            match session.read_request_body().await {
                Ok(Some(chunk)) if body.len() + chunk.len() > MAX_ADMIN_BODY => {
                    session.set_keepalive(None);
                    too_large = true;
                    break Ok(());
                }
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        if let Some(c) = conn {
            c.body_done();
        }
        if read.is_err() {
            session.set_keepalive(None);
            return reply::problem(
                AdminCode::RequestTimeout,
                "the body did not finish arriving (its Content-Length or chunked framing \
                 promised more, within server.body_timeout_seconds): nothing was changed",
            );
        }
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| ClientKey::of(a.ip()));
        let req = session.req_header();
        // `GET /api/ledger` answers CSV to `Accept: text/csv`.
        let csv = req.headers.get_all(http::header::ACCEPT).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.to_ascii_lowercase().contains("text/csv"))
        });
        if let Some(refused) = self.refusal(req, client, &snap.policy.config) {
            return refused;
        }
        // The handlers load the config in force themselves: this one is not held across them.
        drop(snap);
        let asked = AdminRequest {
            method: &req.method,
            path: req.uri.path(),
            query: req.uri.query(),
            body: &body,
            too_large,
            csv,
        };
        self.answer(&asked).await
    }
}
