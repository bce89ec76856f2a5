//! Traces on the wire, continued: OTLP/JSON from the binary with HTTP/1.1 and HTTP/2 clients
//! and the access line's `trace_id`; a collector down or never answering; a wait on the fleet
//! store as a `fleet_wait` span.

use std::net::SocketAddr;
use std::time::Duration;

use tollgate::config::OtlpProtocol;

use super::{fields, kind, upstream_trace, CLIENT, INTERNAL, SERVER};
use crate::harness::{
    closed_port, config_for, metric, metrics_page, pki, send_raw, settled, write, Answer,
    Collector, Gateway, Mode, Process, RedisServer, Upstream,
};

/// A call over TLS with `client`, answering its status.
async fn call_tls(client: &reqwest::Client, url: &str) -> u16 {
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        client
            .get(url)
            .header("Authorization", "Bearer pro-key-1")
            .send(),
    )
    .await
    .expect("in time")
    .expect("answered");
    r.status().as_u16()
}

#[test]
fn json_spans_and_the_access_line_over_http1_and_http2() {
    let up = Upstream::start(Mode::Ok);
    let col = Collector::start(Answer::Ok);
    let dir = tempfile::tempdir().unwrap();
    let certs = pki("Tollgate Traces Test CA", &["gateway.test", "127.0.0.1"]);
    let cert = write(dir.path(), "edge.pem", &certs.leaf_pem);
    let key = write(dir.path(), "edge-key.pem", &certs.leaf_key_pem);
    let tls_port = closed_port();
    let config = config_for(&up)
        .tls(format!("127.0.0.1:{tls_port}"), &cert, &key)
        .tracing(&col.endpoint(), OtlpProtocol::Json, 1.0);
    let (mut p, _listen, _admin) = Process::run(dir.path(), "traced", &config);
    let tls: SocketAddr = ([127, 0, 0, 1], tls_port).into();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = format!("https://gateway.test:{tls_port}/v2/settings/getSettings");
    let mut traces = Vec::new();
    for (h1_only, version) in [(true, "1.1"), (false, "2")] {
        let mut b = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(certs.ca_pem.as_bytes()).unwrap())
            .tls_built_in_root_certs(false)
            .resolve("gateway.test", tls)
            .no_proxy();
        if h1_only {
            b = b.http1_only();
        }
        let client = b.build().unwrap();
        assert_eq!(rt.block_on(call_tls(&client, &url)), 200);
        let (sent, _) = upstream_trace(&up);
        let (trace, sent_parent, flags) = fields(&sent);
        assert_eq!(flags, "01");
        let spans = col.trace(&trace, 2);
        let server = kind(&spans, SERVER)[0];
        let client_span = kind(&spans, CLIENT)[0];
        assert_eq!(
            server.parent, "",
            "a new trace: the SERVER span is its root"
        );
        assert_eq!(client_span.span_id, sent_parent);
        assert_eq!(server.attr("network.protocol.version"), Some(version));
        assert_eq!(server.attr("url.scheme"), Some("https"));
        assert_eq!(server.name, "GET /v2/settings/getSettings");
        assert_eq!(server.attr("tollgate.route"), Some("settings_get"));
        assert_eq!(server.content_type, "application/json");
        traces.push(trace);
    }
    p.stop();
    let out = p.output();
    for t in &traces {
        assert!(
            out.contains(&format!("trace_id=\"{t}\"")),
            "no trace_id {t} in\n{out}"
        );
    }
}

#[test]
fn a_collector_that_is_down_or_never_answers_slows_no_request() {
    let up = Upstream::start(Mode::Ok);
    let get = |gw: &Gateway| {
        gw.request(
            "GET",
            "/v2/getSettings/",
            &[("Authorization", "Bearer pro-key-1")],
            b"",
        )
        .status
    };
    // Nothing listens: every request answered; its spans counted dropped.
    let down = Gateway::start(&config_for(&up).tracing(
        &format!("http://127.0.0.1:{}", closed_port()),
        OtlpProtocol::Protobuf,
        1.0,
    ));
    for _ in 0..30 {
        assert_eq!(get(&down), 200);
    }
    let admin = down.config.process.admin_listen;
    let dropped = settled(
        || metric(&metrics_page(admin), "tollgate_spans_dropped_total").unwrap_or(0.0),
        |&n| n >= 60.0,
    );
    assert_eq!(
        dropped, 60.0,
        "30 requests, a SERVER and a CLIENT span each"
    );
    assert_eq!(
        metric(&metrics_page(admin), "tollgate_spans_exported_total"),
        Some(0.0)
    );

    // A collector that takes the post and never answers: while the exporter waits on it,
    // every request is answered all the same.
    let col = Collector::start(Answer::Hang);
    let hung = Gateway::start(&config_for(&up).tracing(&col.endpoint(), OtlpProtocol::Json, 1.0));
    assert_eq!(get(&hung), 200);
    crate::harness::eventually("the exporter posts to the collector", || {
        col.connections.load(std::sync::atomic::Ordering::SeqCst) >= 1
    });
    for _ in 0..30 {
        assert_eq!(get(&hung), 200);
    }
    let page = metrics_page(hung.config.process.admin_listen);
    assert_eq!(
        metric(&page, "tollgate_spans_exported_total"),
        Some(0.0),
        "{page}"
    );
    // The post times out; its spans are counted dropped.
    let admin = hung.config.process.admin_listen;
    let dropped = settled(
        || metric(&metrics_page(admin), "tollgate_spans_dropped_total").unwrap_or(0.0),
        |&n| n >= 2.0,
    );
    assert!(dropped >= 2.0, "{dropped}");
}

#[test]
fn a_wait_on_the_fleet_store_is_a_fleet_wait_span() {
    let _fleet = crate::harness::one_fleet();
    let up = Upstream::start(Mode::Ok);
    let col = Collector::start(Answer::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(&up)
        .cluster(&redis.url(), "tgtraces", 20)
        .tracing(&col.endpoint(), OtlpProtocol::Protobuf, 1.0);
    let (_p, listen, admin) = Process::run(dir.path(), "fleet", &config);
    // A burst of one key from idle: past its first lease, requests wait for the store.
    let raw = "GET /v2/settings/getSettings HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer basic-key-1\r\nConnection: close\r\n\r\n";
    for _ in 0..30 {
        let r = send_raw(listen, raw.as_bytes());
        assert!(r.status == 200 || r.status == 429, "{}", r.status);
    }
    let waits = metric(
        &metrics_page(admin),
        "tollgate_cluster_settle_wait_seconds_count",
    )
    .unwrap_or(0.0);
    assert!(
        waits >= 1.0,
        "no request waited for the store: the test proves nothing"
    );
    let waited = settled(
        || {
            col.spans()
                .into_iter()
                .filter(|s| s.name == "fleet_wait")
                .collect::<Vec<_>>()
        },
        |v| !v.is_empty(),
    );
    assert!(!waited.is_empty(), "no fleet_wait span");
    let all = col.spans();
    for w in &waited {
        assert_eq!(w.kind, INTERNAL);
        let server = all
            .iter()
            .find(|s| s.span_id == w.parent && s.kind == SERVER)
            .unwrap_or_else(|| panic!("fleet_wait's parent is a SERVER span: {w:#?}"));
        assert_eq!(server.trace_id, w.trace_id);
        assert!(
            server.start <= w.start && w.end <= server.end,
            "{server:#?} {w:#?}"
        );
    }
}
