//! The process's own answers: `GET /metrics`, `GET /readyz` and `POST /reload` (`/healthz`
//! is the router's plain `ok`).

use http::{Response, StatusCode};

use super::codes::AdminCode;
use super::reply::{json, problem_with, reply, text};
use super::view::{ConfigRefusedAt, ReloadView};
use super::Admin;
use crate::runtime::lifecycle::Readiness;

impl Admin {
    /// `GET /metrics`: the Prometheus text format.
    pub(super) fn metrics(&self) -> Response<Vec<u8>> {
        self.changes.refresh_gauges();
        reply(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            self.live.metrics().render(),
        )
    }

    /// `GET /readyz`: 200 while the gateway is in rotation (`ready`, `degraded`, `upgrading`),
    /// 503 while it starts or drains.
    pub(super) fn readyz(&self) -> Response<Vec<u8>> {
        match self.health.readiness() {
            Readiness::Ready if self.degraded() => {
                // Serving (each replica on limit / N, or keeping counts in memory): still in
                // rotation.
                text(StatusCode::OK, "degraded\n")
            }
            Readiness::Ready => text(StatusCode::OK, "ready\n"),
            Readiness::Upgrading => text(StatusCode::OK, "upgrading\n"),
            Readiness::Starting => text(StatusCode::SERVICE_UNAVAILABLE, "starting\n"),
            Readiness::Draining => text(StatusCode::SERVICE_UNAVAILABLE, "draining\n"),
        }
    }

    /// Serving, but short of a store: the `cluster` store is unreachable, or the disk under
    /// `state.path` fails its writes.
    fn degraded(&self) -> bool {
        self.cluster.as_ref().is_some_and(|c| !c.is_up())
            || self.changes.state_file().is_some_and(|f| f.is_failing())
    }

    /// `POST /reload`: 200 and a summary when the new config is in force, 422
    /// `config_refused` with its file, line and field when it was refused.
    pub(super) fn reload(&self) -> Response<Vec<u8>> {
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
