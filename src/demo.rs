//! `tollgate demo`: the gateway with `policies/demo.yaml` in front of an embedded stand-in for
//! the provider, plus curl lines that show each kind of answer; and `tollgate stand-in`, that
//! stand-in alone ([`stand_in_server`]).

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use http::Response;
use pingora::apps::http_app::{HttpServer, ServeHttp};
use pingora::protocols::http::ServerSession;
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::services::listening::Service;

use crate::clock::MonotonicClock;
use crate::config::{Config, ProcessEnv};
use crate::runtime::logging::{init_logging, LogWriter};
use crate::runtime::SetupError;
use crate::server;

/// The demo policy, compiled in so `tollgate demo` works from any directory.
pub(crate) const DEMO_YAML: &str = include_str!("../policies/demo.yaml");

/// The stand-in provider: every operation answers `200 {}` (spec section 4: "the only
/// illustration is an empty JSON object").
pub(crate) struct StandIn;

#[async_trait]
impl ServeHttp for StandIn {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        // Drain the request body so the connection can be reused.
        while let Ok(Some(_)) = session.read_request_body().await {}
        Response::builder()
            .status(200)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::CONTENT_LENGTH, 2)
            .body(b"{}".to_vec())
            .expect("static response")
    }
}

/// Add the stand-in upstream to `server` on `addr`.
pub(crate) fn add_stand_in(server: &mut Server, addr: &str) {
    let mut svc = Service::new(
        "tollgate demo upstream".into(),
        HttpServer::new_app(StandIn),
    );
    svc.add_tcp(addr);
    server.add_service(svc);
}

/// Pingora's settings for `tollgate stand-in`: those of `run` without `--conf` (one worker
/// thread per CPU), and no wait on SIGTERM.
///
/// On SIGTERM Pingora stops accepting, then sleeps `grace_period_seconds` whatever is in
/// flight (its default: 300 s), then gives each service's runtime
/// `graceful_shutdown_timeout_seconds` (default 5 s) to stop. The stand-in answers `200 {}` at
/// once and keeps nothing, so a request cut by its exit is lost to no one; a load script that
/// stops it with SIGTERM (`kill`) must not wait five minutes. Both are 0: on SIGTERM it exits
/// as on SIGINT, within a few ms (`tests/it/standin.rs` holds it to 1 s). The runtimes'
/// timeout only bounds work on tokio's blocking pool (tasks are dropped at their next await
/// either way), and the stand-in has none, so 0 loses nothing a larger value would keep.
/// SIGQUIT, Pingora's upgrade hand-over (of no use to the stand-in), is not changed: it still
/// takes Pingora's fixed ~10 s (5 s trying the upgrade socket, 5 s before the listeners close).
pub(crate) fn stand_in_server_conf() -> ServerConf {
    ServerConf {
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(0),
        ..server::default_server_conf()
    }
}

/// `tollgate stand-in`: a Pingora server with only the stand-in, on `addr`, with
/// [`stand_in_server_conf`]; `run_forever` it.
pub(crate) fn stand_in_server(addr: &str) -> Server {
    let mut server = Server::new_with_opt_and_conf(None, stand_in_server_conf());
    add_stand_in(&mut server, addr);
    server
}

/// The demo config, listening on `port` with the stand-in on `upstream_port` and the admin
/// listener on `admin_port` (all loopback).
pub(crate) fn config(port: u16, upstream_port: u16, admin_port: u16) -> Result<Config, SetupError> {
    let mut cfg = Config::parse(DEMO_YAML, Path::new("policies/demo.yaml"), &ProcessEnv)?;
    cfg.process.listen.set_port(port);
    cfg.process.admin_listen.set_port(admin_port);
    cfg.upstream.port = upstream_port;
    cfg.upstream.authority = format!("{}:{upstream_port}", cfg.upstream.host);
    Ok(cfg)
}

/// The curl lines the demo prints, for a gateway on `127.0.0.1:port`.
pub(crate) fn curl_lines(port: u16) -> Vec<(&'static str, String)> {
    let base = format!("http://127.0.0.1:{port}");
    let json = "-H 'Content-Type: application/json'";
    vec![
        (
            "200 — a Basic key sends a message (forwarded to the stand-in, which answers {})",
            format!("curl -i -H 'Authorization: Bearer demo-basic-key' {json} -d '{{\"chatId\":\"1234@c.us\",\"message\":\"hi\"}}' {base}/v2/sendMessage/"),
        ),
        (
            "401 — no key",
            format!("curl -i -X POST {base}/v2/sendMessage/"),
        ),
        (
            "403 — setting a webhook needs a plan above Basic (spec 8.2)",
            format!("curl -i -H 'Authorization: Bearer demo-basic-key' {json} -d '{{\"url\":\"https://example.com/hook\"}}' {base}/v2/settings/webhook/set"),
        ),
        (
            "400 — a group event whose startTime is not an ISO 8601 UTC timestamp and whose eventOptions lack a description",
            format!("curl -i -H 'Authorization: Bearer demo-standard-key' {json} -d '{{\"name\":\"Standup\",\"type\":\"event\",\"groupId\":\"g-1\",\"startTime\":\"tomorrow 10am\",\"eventOptions\":{{\"callType\":\"voice\"}}}}' {base}/v2/sendGroup"),
        ),
        (
            "429 — 60 quick calls with a Basic key (40 per 10 s, one more every 250 ms): about 40 pass, the rest are refused with Retry-After",
            format!("for i in $(seq 60); do curl -s -o /dev/null -w '%{{http_code}}\\n' -H 'Authorization: Bearer demo-burst-key' -X POST {base}/v2/sendMessage/; done | sort | uniq -c"),
        ),
    ]
}

/// Run the demo until interrupted.
pub(crate) fn run(port: u16, upstream_port: u16, admin_port: u16) -> Result<(), SetupError> {
    let cfg = config(port, upstream_port, admin_port)?;
    let _log = init_logging(cfg.process.log_format, LogWriter::Background);
    let mut built = server::build(cfg, Arc::new(MonotonicClock::new()), None)?;
    add_stand_in(&mut built.server, &format!("127.0.0.1:{upstream_port}"));
    println!("Tollgate demo: gateway on http://127.0.0.1:{port}, stand-in upstream on http://127.0.0.1:{upstream_port}");
    println!("Policy: policies/demo.yaml (demo-only keys). Try, in another terminal:\n");
    for (what, line) in curl_lines(port) {
        println!("# {what}\n{line}\n");
    }
    println!("Metrics and health: curl http://127.0.0.1:{admin_port}/metrics (also /healthz, /readyz, POST /reload)\n");
    println!("Ctrl-C stops the demo.");
    built.run();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stand_in_does_not_wait_on_sigterm() {
        let conf = stand_in_server_conf();
        assert_eq!(conf.grace_period_seconds, Some(0));
        assert_eq!(conf.graceful_shutdown_timeout_seconds, Some(0));
        assert_eq!(conf.threads, server::default_server_conf().threads);
    }
}
