//! The admin listener (`admin_listen`, loopback by default): for operators and their tools,
//! never for API clients.
//!
//! | request | answer |
//! |---|---|
//! | `GET /metrics` | 200, Prometheus text format (see [`crate::runtime::metrics`]) |
//! | `GET /healthz` | 200 `ok` while the process runs (liveness) |
//! | `GET /readyz` | 200 `ready` once the gateway listener accepts connections; 503 while starting or draining (and 200 `upgrading` while handing over to a new process, which serves the same sockets; 200 `degraded` while the `cluster` store is unreachable and each replica enforces `limit / N` alone, or while the disk under `state.path` fails its writes) |
//! | `POST /reload` | 200 and a JSON summary when the new config is in force; 422 problem+json with file, line, field and reason when it was refused (the old config keeps serving) |
//! | `GET /api/overrides` | 200, `{"overrides": [...]}`: the partner upgrades in force (key name, plan, the plan it replaced, partner, when) |
//! | `DELETE /api/overrides/{key name}` | 204: the key is back on its YAML plan, everywhere the overrides are kept; 404 problem+json when it had no override |
//! | `GET /api/blocks` | 200, `{"blocks": [...]}`: the addresses auth-failure blocking holds now (`address`, `since`, `until`, `failures`, `listener`; `admin/blocks.rs`) |
//! | `GET /api/keys/{name}`, `POST /api/keys/{name}/suspend\|resume\|revoke`, `POST /api/keys/revoke`, `PUT\|DELETE /api/keys/{name}/limit\|quota` | keys that change live ([`keys`]) |
//! | `DELETE /api/blocks/{address}` | 204: the address is served again at once, its failures forgotten, with one log line; 404 problem+json when it is not blocked (also when it is not an address, which the detail says) |
//!
//! With `admin_token_sha256` set, every path but `/healthz` and `/readyz` needs
//! `Authorization: Bearer <token>` (its SHA-256 compared in constant time): else 401
//! problem+json. The token is never logged.
//!
//! Other paths are 404, other methods 405 with `Allow`. `HEAD` works wherever `GET` does.
//! Nothing here echoes a key: config errors name fields, never their values.

use std::sync::Arc;
use std::time::Instant;

mod blocks;
mod body;
mod codes;
pub(crate) mod guard;
pub(crate) mod keys;
pub(crate) mod ledger;
mod reply;
mod usage;
pub(crate) mod view;

use codes::AdminCode;
use reply::{
    bearer_matches, conn_of, json, no_content, not_allowed, page, percent_decode, problem,
    problem_with, reply, text,
};
use view::{BlocksView, ConfigRefusedAt, OverridesView, ReloadView};

use async_trait::async_trait;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, WWW_AUTHENTICATE};
use http::{Method, Response, StatusCode};
use pingora::protocols::http::ServerSession;

use crate::clock::Clock;
use crate::digest::Digest;
use crate::limit::SharedStore;
use crate::overrides::PlanOverrides;
use crate::policy::blocking::FailureTable;
use crate::policy::client::ClientKey;
use crate::runtime::lifecycle::{Health, Readiness};
use crate::runtime::live::LivePolicy;

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
    /// Where the overrides are kept (`DELETE /api/overrides/{name}`).
    pub overrides: Arc<PlanOverrides>,
    /// The quota and ledger counts (`GET /api/ledger`).
    pub ledger: Arc<crate::ledger::Keeper>,
}

/// The usage page: one file, no external asset (works on an air-gapped host).
const PAGE: &str = include_str!("page.html");

impl Admin {
    /// Serving, but short of a store: the `cluster` store is unreachable, or the disk under
    /// `state.path` fails its writes.
    fn degraded(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| !c.is_up())
            || self.overrides.state_file().is_some_and(|f| f.is_failing())
    }

    /// The answer to `method path`, without I/O (the HTTP layer is in `response`).
    pub(crate) fn answer(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
    ) -> Response<Vec<u8>> {
        let get = method == Method::GET || method == Method::HEAD;
        match path {
            "/" | "/api/usage" if !get => not_allowed("GET, HEAD"),
            "/" => page(StatusCode::OK),
            "/api/blocks" | "/api/ledger" if !get => not_allowed("GET, HEAD"),
            "/api/blocks" => json(
                StatusCode::OK,
                &BlocksView {
                    blocks: self.blocks(),
                },
            ),
            p if p.starts_with("/api/blocks/") && method != Method::DELETE => not_allowed("DELETE"),
            "/api/usage" => {
                let search = query.and_then(|q| {
                    form_urlencoded::parse(q.as_bytes())
                        .find(|(k, _)| k == "key")
                        .map(|(_, v)| v.into_owned())
                });
                let body = usage::usage_view(
                    &self.live,
                    self.clock.as_ref(),
                    self.cluster.as_deref(),
                    search.as_deref(),
                    self.blocks(),
                );
                json(StatusCode::OK, &body)
            }
            "/metrics" | "/healthz" | "/readyz" if !get => not_allowed("GET, HEAD"),
            "/metrics" => reply(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                self.live.metrics().render(),
            ),
            "/healthz" => text(StatusCode::OK, "ok\n"),
            "/readyz" => match self.health.readiness() {
                Readiness::Ready if self.degraded() => {
                    // Serving (each replica on limit / N, or keeping counts in memory): still
                    // in rotation.
                    text(StatusCode::OK, "degraded\n")
                }
                Readiness::Ready => text(StatusCode::OK, "ready\n"),
                Readiness::Upgrading => text(StatusCode::OK, "upgrading\n"),
                Readiness::Starting => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n"),
                Readiness::Draining => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
            },
            "/reload" if method != Method::POST => not_allowed("POST"),
            "/reload" => self.reload(),
            "/api/overrides" if !get => not_allowed("GET, HEAD"),
            "/api/overrides" => {
                let snap = self.live.load();
                let overrides = PlanOverrides::shown(&self.live, &snap.policy);
                json(StatusCode::OK, &OverridesView { overrides })
            }
            p if p.starts_with("/api/overrides/") && method != Method::DELETE => {
                not_allowed("DELETE")
            }
            _ => text(StatusCode::NOT_FOUND, "not found\n"),
        }
    }

    fn reload(&self) -> Response<Vec<u8>> {
        match self.live.reload() {
            Ok(r) => {
                let p = &r.snapshot.policy;
                let body = ReloadView {
                    status: "reloaded".into(),
                    file: self.live.path().display().to_string(),
                    keys: p.keys.len(),
                    plans: p.config.plans.iter().map(|p| p.name.clone()).collect(),
                    routes: p.config.catalogue.routes().len() - 1,
                    restart_required: r.restart_required,
                };
                json(StatusCode::OK, &body)
            }
            Err(e) => problem_with(
                AdminCode::ConfigRefused,
                &e.to_string(),
                ConfigRefusedAt {
                    file: e.file.display().to_string(),
                    line: e.line,
                    field: e.field.clone(),
                },
            ),
        }
    }
}

impl Admin {
    /// `DELETE /api/overrides/{key name}`: the key back on its YAML plan.
    async fn delete_override(&self, name: &str) -> Response<Vec<u8>> {
        let name = percent_decode(name);
        match self.overrides.remove(&self.live, &name).await {
            Ok(true) => no_content(),
            Ok(false) => problem(
                AdminCode::NoOverride,
                &format!("no key named `{name}` has a plan override"),
            ),
            Err(why) => problem(AdminCode::OverrideNotKept, &why.to_string()),
        }
    }
}

#[async_trait]
impl pingora::apps::http_app::ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // The head is in: its body (if any) is due within the body deadline, and the answer,
        // once made, starts the connection's idle spell (the edge's deadlines, as on the
        // gateway's listeners).
        let conn = conn_of(session);
        if let Some(c) = &conn {
            c.head_done(Instant::now(), !session.is_body_done());
        }
        // Read the body (the key operations take one), up to a cap; past it, the rest is
        // not read and the connection is closed.
        let mut body: Vec<u8> = Vec::new();
        let mut too_large = false;
        while let Ok(Some(chunk)) = session.read_request_body().await {
            if body.len() + chunk.len() > MAX_ADMIN_BODY {
                session.set_keepalive(None);
                too_large = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        if let Some(c) = &conn {
            c.body_done();
        }
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| ClientKey::of(a.ip()));
        let req = session.req_header();
        let method = req.method.clone();
        let path = req.uri.path().to_string();
        let query = req.uri.query().map(str::to_string);
        // `GET /api/ledger` answers CSV to `Accept: text/csv`.
        let csv = req.headers.get_all(http::header::ACCEPT).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.to_ascii_lowercase().contains("text/csv"))
        });
        let snap = self.live.load();
        let config = &snap.policy.config;
        let open = matches!(path.as_str(), "/healthz" | "/readyz");
        let mut r = if !open && !guard::host_allowed(&req.headers, &config.admin_hosts) {
            problem(
                AdminCode::HostNotAllowed,
                "call it by an address, `localhost`, or a name listed in `admin_hosts`",
            )
        } else if guard::cross_origin(&method, &req.headers) {
            problem(AdminCode::CrossOrigin, "state-changing requests are refused when they come from another site (Origin, Sec-Fetch-Site)",
            )
        } else {
            match config.admin_token {
                Some(want) if !open => match self.token_refusal(req, client, &want) {
                    None => {
                        self.route(&method, &path, query.as_deref(), &body, too_large, csv)
                            .await
                    }
                    Some(refused) => refused,
                },
                _ => {
                    self.route(&method, &path, query.as_deref(), &body, too_large, csv)
                        .await
                }
            }
        };
        let len = r.body().len();
        r.headers_mut().insert(CONTENT_LENGTH, len.into());
        if method == Method::HEAD {
            r.body_mut().clear();
        }
        if let Some(c) = &conn {
            c.exchange_done(Instant::now());
        }
        r
    }
}

impl Admin {
    /// The request past the guards.
    async fn route(
        &self,
        method: &Method,
        path: &str,
        query: Option<&str>,
        body: &[u8],
        too_large: bool,
        csv: bool,
    ) -> Response<Vec<u8>> {
        let get = method == Method::GET || method == Method::HEAD;
        if path == "/api/ledger" && get {
            return ledger::answer(self, query, csv).await;
        }
        if let Some(rest) = path.strip_prefix("/api/keys/") {
            if too_large {
                return problem(
                    AdminCode::BodyTooLarge,
                    &format!("the admin listener reads at most {MAX_ADMIN_BODY} bytes"),
                );
            }
            return keys::route(self, method, rest, body).await;
        }
        if method == Method::DELETE {
            if let Some(name) = path.strip_prefix("/api/overrides/") {
                return self.delete_override(name).await;
            }
            if let Some(address) = path.strip_prefix("/api/blocks/") {
                return self.release_block(address);
            }
        }
        self.answer(method, path, query)
    }

    /// The admin token: the answer that refuses the request, or `None` when it carries the
    /// token. A wrong one counts against the client's address ([`guard::TOKEN_FAILURES`]); a
    /// blocked address is refused whatever it sends, so a right guess during the block does
    /// not show.
    fn token_refusal(
        &self,
        req: &pingora::http::RequestHeader,
        client: Option<ClientKey>,
        want: &Digest,
    ) -> Option<Response<Vec<u8>>> {
        let now = self.clock.now();
        if let Some(secs) = client.and_then(|c| self.failures.blocked(c, now)) {
            let mut r = problem(
                AdminCode::TooManyAuthFailures,
                &format!("retry in {secs} s"),
            );
            r.headers_mut()
                .insert(http::header::RETRY_AFTER, secs.into());
            return Some(r);
        }
        let presented = req.headers.get(AUTHORIZATION);
        if bearer_matches(presented, want) {
            return None;
        }
        if let (Some(c), Some(_)) = (client, presented) {
            if let Some(b) = self.failures.failed(c, now, &guard::TOKEN_FAILURES) {
                tracing::warn!(
                    target: "tollgate::admin",
                    client = %b.key.display(),
                    seconds = b.duration.as_secs(),
                    "admin listener: address blocked after repeated wrong tokens"
                );
            }
        }
        // The page itself holds no data: a browser (one that asks for HTML) gets it, and it
        // asks for the token; every other client gets problem+json.
        let browser = req
            .headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/html"));
        let mut r = if req.uri.path() == "/" && browser {
            page(StatusCode::UNAUTHORIZED)
        } else {
            problem(
                AdminCode::Unauthorized,
                "send `Authorization: Bearer <token>` (admin_token_sha256 is set)",
            )
        };
        r.headers_mut().insert(
            WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"tollgate-admin\""),
        );
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use http::header::{ALLOW, CONTENT_TYPE};
    use tollgate_core::testing::TestConfig;

    fn admin(dir: &tempfile::TempDir) -> (Admin, std::path::PathBuf) {
        let path = dir.path().join("gw.yaml");
        TestConfig::new().write(&path);
        let live = Arc::new(LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap());
        let ledger = Arc::new(crate::ledger::Keeper::open(None, Arc::clone(&live)).unwrap());
        (
            Admin {
                live,
                health: Arc::default(),
                cluster: None,
                clock: Arc::new(crate::clock::ManualClock::new()),
                failures: Arc::default(),
                overrides: Arc::new(PlanOverrides::memory()),
                ledger,
            },
            path,
        )
    }

    fn body(r: &Response<Vec<u8>>) -> String {
        String::from_utf8(r.body().clone()).unwrap()
    }

    #[test]
    fn endpoints_methods_and_paths() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = admin(&dir);
        assert_eq!(a.answer(&Method::GET, "/healthz", None).status(), 200);
        let m = a.answer(&Method::GET, "/metrics", None);
        assert_eq!(m.status(), 200);
        assert!(body(&m).contains("tollgate_keys{state=\"active\"} 7"));
        assert_eq!(a.answer(&Method::GET, "/readyz", None).status(), 503);
        let r = a.answer(&Method::POST, "/metrics", None);
        assert_eq!(r.status(), 405);
        assert_eq!(r.headers()[ALLOW], "GET, HEAD");
        assert_eq!(a.answer(&Method::GET, "/reload", None).status(), 405);
        assert_eq!(a.answer(&Method::GET, "/", None).status(), 200);
        assert_eq!(a.answer(&Method::GET, "/nothing", None).status(), 404);
        assert_eq!(a.answer(&Method::GET, "/metrics/", None).status(), 404);
    }

    #[test]
    fn the_usage_view_round_trips_through_its_json() {
        // What the admin listener serves is what `tollgate top` reads back, field for field.
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = admin(&dir);
        let snap = a.live.load();
        let key = snap.policy.keys.find_by_name("basic-1");
        let now = a.live.usage().ms_at(std::time::Instant::now());
        a.live.usage().record(
            snap.generation,
            now,
            key,
            None,
            crate::policy::Outcome::RateLimited,
            Some(crate::policy::Code::RateLimited as u8),
        );
        let served = a.answer(&Method::GET, "/api/usage", Some("key=basic"));
        assert_eq!(served.status(), 200);
        let read: view::UsageView = serde_json::from_slice(served.body()).unwrap();
        let built = usage::usage_view(&a.live, a.clock.as_ref(), None, Some("basic"), vec![]);
        assert_eq!(read.keys, built.keys);
        assert_eq!(read.config, built.config);
        assert_eq!(read.refusals, built.refusals);
        assert_eq!(read.search.as_deref(), Some("basic"));
        assert_eq!(read.keys[0].key, "basic-1");
        assert_eq!(read.keys[0].refusals.rate_limited, 1);
        assert_eq!(read.refusals[0].code.as_deref(), Some("rate_limited"));
        // And back to the same JSON.
        let again = serde_json::to_value(&read).unwrap();
        let first: serde_json::Value = serde_json::from_slice(served.body()).unwrap();
        assert_eq!(again, first);
    }

    #[test]
    fn readiness_follows_health() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = admin(&dir);
        a.health.set_upgrading();
        assert_eq!(a.answer(&Method::GET, "/readyz", None).status(), 200);
        a.health.set_draining();
        let r = a.answer(&Method::GET, "/readyz", None);
        assert_eq!(
            (r.status().as_u16(), body(&r).as_str()),
            (503, "draining\n")
        );
    }

    #[test]
    fn reload_answers_200_or_422_with_the_place_of_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let (a, path) = admin(&dir);
        let ok = a.answer(&Method::POST, "/reload", None);
        assert_eq!(ok.status(), 200, "{}", body(&ok));
        let v: serde_json::Value = serde_json::from_slice(ok.body()).unwrap();
        assert_eq!(v["keys"], 7);
        assert_eq!(v["restart_required"], serde_json::json!([]));

        // A plain key that is not a usable token: refused, and the value is not echoed.
        TestConfig::new()
            .key_value("pro-1", "pro key secret")
            .write(&path);
        let r = a.answer(&Method::POST, "/reload", None);
        assert_eq!(r.status(), 422);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["field"], "keys[2].key", "{v}");
        assert!(v["line"].as_u64().is_some(), "{v}");
        assert!(!body(&r).contains("secret"), "{}", body(&r));
    }
}
