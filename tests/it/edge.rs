//! The edge on real sockets, HTTP/1.1: each deadline and cap with small configured values, a
//! flood from one address while another is served, auth-failure blocking, the client address
//! behind trusted proxies, and what never reaches the upstream (upgrades, re-routing fields).
//! HTTP/2 over TLS is in `tests/it/edge_h2.rs`.
//!
//! Deadlines are real time (they are what is under test), set to one or two seconds; every
//! wait is bounded, and a test asserts both that a connection is not closed too early and that
//! it is closed in time.

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::harness::{
    config_for, connect_from, eventually, metric, metrics_page, read_response, read_until_closed,
    Gateway, Mode, TestConfig, Upstream,
};
use tollgate::config::file::FileServer;

/// A gateway in front of `up` with the edge's deadlines at `secs` seconds (idle `idle`).
fn gateway(up: &Upstream, secs: u64, idle: u64, edit: impl FnOnce(&mut FileServer)) -> Gateway {
    Gateway::start(&config_for(up).server(|s| {
        s.header_timeout_seconds = secs;
        s.body_timeout_seconds = secs;
        s.send_timeout_seconds = secs;
        s.tls_handshake_timeout_seconds = secs;
        s.idle_timeout_seconds = idle;
        edit(s);
    }))
}

fn get(key: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: gateway.test\r\nAuthorization: Bearer {key}\r\n\r\n")
}

fn connect(gw: &Gateway) -> TcpStream {
    let s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// Closed after at least `min` and at most `max` from `since`.
fn closed_between(closed: Option<Duration>, since: Duration, min: Duration, max: Duration) {
    let at = closed.map(|c| c + since);
    assert!(
        at.is_some_and(|t| t >= min && t <= max),
        "closed at {at:?}, expected between {min:?} and {max:?}"
    );
}

fn gauge(gw: &Gateway, series: &str) -> f64 {
    metric(&metrics_page(gw.config.process.admin_listen), series).unwrap_or(0.0)
}

/// Wait until the readiness probe has connected and no connection is open (the start-up
/// probes' are gone), before counting places.
fn quiet(gw: &Gateway) {
    crate::harness::wait_ready(gw.config.process.admin_listen, 200);
    eventually("no connection is open", || {
        gauge(gw, r#"tollgate_connections{listener="http"}"#) == 0.0
    });
}

// ---------------------------------------------------------------- deadlines

#[test]
fn a_dripped_first_head_is_cut_at_the_header_timeout_of_the_connection_opening() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 1, 30, |_| {});
    let mut s = connect(&gw);
    let opened = Instant::now();
    s.write_all(b"GET /v2/client/getState HTTP/1.1\r\nHost: a\r\n")
        .unwrap();
    // A byte every 200 ms: each read is quick, the head never completes.
    let dripper = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..25 {
                std::thread::sleep(Duration::from_millis(200));
                if w.write_all(b"X").is_err() {
                    return;
                }
            }
        })
    };
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5));
    let since = opened.elapsed() - closed.unwrap_or_default();
    closed_between(
        closed,
        since,
        Duration::from_millis(900),
        Duration::from_secs(3),
    );
    dripper.join().unwrap();
    assert_eq!(up.count(), 0);
}

#[test]
fn a_later_head_is_due_from_its_first_byte_not_from_the_last_answer() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 1, 5, |_| {});
    let mut s = connect(&gw);
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(get("pro-key-1", "/v2/client/getState").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    // Idle for longer than the header timeout (but not the idle one), then a whole request.
    std::thread::sleep(Duration::from_millis(1500));
    s.write_all(get("pro-key-1", "/v2/client/getState").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    // A third head begins and stops: cut one header timeout after its first byte.
    s.write_all(b"GET /v2/client/getState HTTP/1.1\r\n")
        .unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5));
    let since = started.elapsed() - closed.unwrap_or_default();
    closed_between(
        closed,
        since,
        Duration::from_millis(900),
        Duration::from_secs(3),
    );
    assert_eq!(up.count(), 2);
}

#[test]
fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 5, 1, |_| {});
    let mut s = connect(&gw);
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(get("pro-key-1", "/v2/client/getState").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    let answered = Instant::now();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(6));
    let since = answered.elapsed() - closed.unwrap_or_default();
    closed_between(
        closed,
        since,
        Duration::from_millis(900),
        Duration::from_secs(4),
    );
    eventually("the connection is no longer counted", || {
        gauge(&gw, r#"tollgate_connections{listener="http"}"#) == 0.0
    });
}

#[test]
fn a_checked_body_that_stops_is_408_and_never_forwarded() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 1, 30, |_| {});
    let mut s = connect(&gw);
    let head = "POST /v2/sendGroup HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer pro-key-1\r\n\
                Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"name\":";
    s.write_all(head.as_bytes()).unwrap();
    let sent = Instant::now();
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap()));
    let took = sent.elapsed();
    assert_eq!((r.status, r.code().as_str()), (408, "request_timeout"));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    // Recorded just after the answer is sent.
    eventually("the timeout is counted", || {
        gauge(
            &gw,
            r#"tollgate_requests_total{outcome="timeout",plan="pro",route="send_group_event"}"#,
        ) == 1.0
    });
}

/// A stalled checked body on `s` (a connection already open): its answer, and how long after
/// the head it came.
fn stall_a_checked_body(s: &TcpStream) -> (crate::harness::Response, Duration) {
    let sent = send_a_stalling_head(s);
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap()));
    (r, sent.elapsed())
}

/// The head of a checked body on `s`, and the body's first bytes only: when it was sent.
fn send_a_stalling_head(s: &TcpStream) -> Instant {
    let head = "POST /v2/sendGroup HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer pro-key-1\r\n\
                Content-Type: application/json\r\nContent-Length: 200\r\n\r\n{\"name\":";
    s.try_clone().unwrap().write_all(head.as_bytes()).unwrap();
    Instant::now()
}

/// A gateway started from a file (so that a test can rewrite it and reload) whose connections
/// get `body_timeout` seconds for a body and 30 s of idle: the file's directory, its path, the
/// config written there, and the gateway.
fn reloadable(
    up: &Upstream,
    body_timeout: u64,
) -> (tempfile::TempDir, PathBuf, TestConfig, Gateway) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.yaml");
    let config = config_for(up).server(|s| {
        s.body_timeout_seconds = body_timeout;
        s.idle_timeout_seconds = 30;
    });
    config.write(&path);
    let gw = Gateway::start_file(&path);
    (dir, path, config, gw)
}

#[test]
fn a_kept_alive_connection_keeps_the_server_settings_it_was_accepted_under() {
    // Accepted under a one-second body deadline; a reload then makes it two. The connection,
    // kept alive across the reload, runs its next request on one version of `server:` only:
    // the request path's checked-body deadline is its stream's, so a stalled body is answered
    // 408 at one second (not cut by the stream while the request path waits for two).
    let up = Upstream::start(Mode::Ok);
    let (_dir, path, config, gw) = reloadable(&up, 1);
    let old = connect(&gw);
    let mut w = old.try_clone().unwrap();
    w.write_all(get("pro-key-1", "/v2/client/getStatus").as_bytes())
        .unwrap();
    let r = read_response(&mut BufReader::new(old.try_clone().unwrap()));
    assert_eq!(r.status, 200);

    config
        .clone()
        .server(|s| s.body_timeout_seconds = 2)
        .write(&path);
    gw.live.reload().unwrap();
    assert_eq!(
        gw.live.load().policy.config.server.body_timeout.as_secs(),
        2
    );

    let (r, took) = stall_a_checked_body(&old);
    timed_out_after(
        &r,
        took,
        1,
        "the connection's own deadline, not the reloaded one",
    );
    assert!(
        r.json()["detail"].as_str().unwrap().contains("1 s"),
        "{:?}",
        r.json()
    );

    // A connection accepted after the reload runs the new setting.
    let new = connect(&gw);
    let (r, took) = stall_a_checked_body(&new);
    timed_out_after(&r, took, 2, "accepted after the reload");
    assert_eq!(up.count(), 1, "only the first GET reached the upstream");
}

/// `r` is the 408 `request_timeout` of a `secs`-second body deadline, answered `took` after
/// the stall began: between 90 % and 180 % of the deadline (a deadline twice as long is out).
fn timed_out_after(r: &crate::harness::Response, took: Duration, secs: u64, why: &str) {
    assert_eq!(
        (r.status, r.code().as_str()),
        (408, "request_timeout"),
        "{why}: {r:?}"
    );
    let deadline = Duration::from_secs(secs);
    assert!(
        took >= deadline * 9 / 10 && took < deadline * 9 / 5,
        "{why}: a {secs} s deadline, answered after {took:?}"
    );
}

#[test]
fn a_reload_mid_request_leaves_the_request_its_connections_deadline() {
    // Accepted under a two-second body deadline; a request's body stalls, and while it waits
    // a reload makes the deadline one second: the request in flight keeps its connection's
    // two seconds (answered 408 at two, not one), and a connection accepted after the reload
    // runs the new second.
    let up = Upstream::start(Mode::Ok);
    let (_dir, path, config, gw) = reloadable(&up, 2);
    let s = connect(&gw);
    // An answer first: the connection is accepted (under the two seconds) before the reload,
    // not merely queued in the kernel's backlog.
    s.try_clone()
        .unwrap()
        .write_all(get("pro-key-1", "/v2/client/getStatus").as_bytes())
        .unwrap();
    assert_eq!(
        read_response(&mut BufReader::new(s.try_clone().unwrap())).status,
        200
    );
    let sent = send_a_stalling_head(&s);
    config
        .clone()
        .server(|s| s.body_timeout_seconds = 1)
        .write(&path);
    gw.live.reload().unwrap();
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap()));
    timed_out_after(
        &r,
        sent.elapsed(),
        2,
        "the connection's own deadline, not the reloaded one",
    );
    let (r, took) = stall_a_checked_body(&connect(&gw));
    timed_out_after(&r, took, 1, "accepted after the reload");
    assert_eq!(up.count(), 1, "only the first GET reached the upstream");
}

#[test]
fn a_kept_alive_connection_takes_a_next_head_longer_than_its_wait_reads() {
    // Between requests the edge reads ahead what arrives (2 KiB at most) while it waits; a
    // next head of 6 KiB, and one sent with its body in the same write, are read whole.
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 2, 30, |_| {});
    let s = connect(&gw);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    w.write_all(get("pro-key-1", "/v2/client/getStatus").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    let filler: String = (0..60)
        .map(|i| format!("X-Filler-{i:02}: {}\r\n", "a".repeat(90)))
        .collect();
    let long = format!(
        "GET /v2/client/getStatus HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer pro-key-1\r\n{filler}\r\n"
    );
    assert!(long.len() > 6000);
    w.write_all(long.as_bytes()).unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    let body = r#"{"chatId":"1234@c.us","message":"hi"}"#;
    let post = format!(
        "POST /v2/sendMessage/ HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer pro-key-1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    w.write_all(post.as_bytes()).unwrap();
    assert_eq!(read_response(&mut r).status, 200);
    assert_eq!(up.count(), 3);
}

#[test]
fn a_streamed_body_that_stops_ends_the_exchange() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 1, 30, |_| {});
    let mut s = connect(&gw);
    let head = "POST /v2/sendMessage/ HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer pro-key-1\r\n\
                Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"chatId\"";
    s.write_all(head.as_bytes()).unwrap();
    let sent = Instant::now();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(6));
    let since = sent.elapsed() - closed.unwrap_or_default();
    closed_between(
        closed,
        since,
        Duration::from_millis(900),
        Duration::from_secs(4),
    );
    // The upstream never got a whole request.
    assert_eq!(up.count(), 0);
}

#[test]
fn a_client_that_never_reads_its_answer_is_dropped() {
    let up = Upstream::start(Mode::Big);
    let gw = gateway(&up, 1, 30, |_| {});
    let s = connect(&gw);
    (&s).write_all(get("pro-key-1", "/v2/client/download").as_bytes())
        .unwrap();
    // The answer is 64 MiB; the client reads none of it. Once the socket buffers are full the
    // gateway's writes stall, and one send timeout later the connection is gone.
    eventually("the stalled connection is dropped", || {
        gauge(&gw, r#"tollgate_connections{listener="http"}"#) == 0.0
    });
    drop(s);
}

// ---------------------------------------------------------------- caps

#[test]
fn heads_over_the_caps_are_431_and_never_forwarded() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 5, 30, |s| {
        s.max_header_bytes = 2048;
        s.max_headers = 10;
    });
    let many: Vec<(String, String)> = (0..12).map(|i| (format!("X-F{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let r = gw.request("GET", "/v2/client/getState", &many, b"");
    assert_eq!((r.status, r.code().as_str()), (431, "headers_too_large"));
    let long = "v".repeat(3000);
    let r = gw.request(
        "GET",
        "/v2/client/getState",
        &[("Authorization", "Bearer pro-key-1"), ("X-Long", &long)],
        b"",
    );
    assert_eq!((r.status, r.code().as_str()), (431, "headers_too_large"));
    // Far over: the connection is closed before Pingora buffers it all.
    let mut s = connect(&gw);
    let huge = format!(
        "GET /v2/client/getState HTTP/1.1\r\nHost: a\r\nX-Huge: {}\r\n\r\n",
        "v".repeat(200_000)
    );
    let _ = s.write_all(huge.as_bytes());
    let (got, closed) = read_until_closed(&mut s, Duration::from_secs(5));
    assert!(closed.is_some());
    assert!(!String::from_utf8_lossy(&got).contains(" 200 "), "{got:?}");
    // Within the caps: served.
    let r = gw.call("pro-key-1", "GET", "/v2/client/getState", "");
    assert_eq!(r.status, 200);
    assert_eq!(up.count(), 1);
}

#[test]
fn the_last_request_on_a_connection_is_answered_with_connection_close() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 5, 30, |s| s.max_requests_per_connection = 3);
    let mut s = connect(&gw);
    let mut r = BufReader::new(s.try_clone().unwrap());
    for i in 1..=3 {
        s.write_all(get("pro-key-1", "/v2/client/getState").as_bytes())
            .unwrap();
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 200);
        let close = resp.header("connection") == Some("close");
        assert_eq!(close, i == 3, "request {i}");
    }
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5));
    assert!(closed.is_some());
}

#[test]
fn one_address_over_its_cap_is_refused_while_another_is_served() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 5, 30, |s| s.max_connections_per_ip = 20);
    quiet(&gw);
    // 60 connections from one address, all held open.
    let mut held: Vec<TcpStream> = (0..60).map(|_| connect(&gw)).collect();
    let mut closed = 0;
    for s in held.iter_mut() {
        if read_until_closed(s, Duration::from_millis(150)).1.is_some() {
            closed += 1;
        }
    }
    assert_eq!(closed, 40, "20 are admitted, the rest closed at once");
    let page = metrics_page(gw.config.process.admin_listen);
    assert_eq!(
        metric(
            &page,
            r#"tollgate_connections_refused_total{reason="max_connections_per_ip"}"#
        ),
        Some(40.0)
    );
    assert_eq!(
        metric(&page, r#"tollgate_connections{listener="http"}"#),
        Some(20.0)
    );
    // Another address is served.
    let mut other = connect_from("127.0.0.2", gw.addr);
    other
        .write_all(get("pro-key-1", "/v2/client/getState").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut BufReader::new(other)).status, 200);
    // Places come back as connections close.
    drop(held);
    eventually("every connection is given back", || {
        gauge(&gw, r#"tollgate_connections{listener="http"}"#) == 0.0
    });
    assert_eq!(gw.call("pro-key-1", "GET", "/v2/client/x", "").status, 200);
}

#[test]
fn max_connections_caps_every_address_together() {
    let up = Upstream::start(Mode::Ok);
    let gw = gateway(&up, 5, 30, |s| {
        s.max_connections = 5;
        s.max_connections_per_ip = 0;
    });
    quiet(&gw);
    let mut held: Vec<TcpStream> = (0..5).map(|_| connect(&gw)).collect();
    for s in held.iter_mut() {
        assert_eq!(read_until_closed(s, Duration::from_millis(100)).1, None);
    }
    // (The gateway's own readiness probe may have been refused too: count from here.)
    let refused = || {
        gauge(
            &gw,
            r#"tollgate_connections_refused_total{reason="max_connections"}"#,
        )
    };
    let before = refused();
    let mut sixth = connect_from("127.0.0.2", gw.addr);
    assert!(read_until_closed(&mut sixth, Duration::from_secs(2))
        .1
        .is_some());
    assert_eq!(refused() - before, 1.0);
    held.pop();
    eventually("a place is free", || {
        gauge(&gw, r#"tollgate_connections{listener="http"}"#) == 4.0
    });
    let mut s = connect_from("127.0.0.2", gw.addr);
    s.write_all(get("pro-key-1", "/v2/client/getState").as_bytes())
        .unwrap();
    assert_eq!(read_response(&mut BufReader::new(s)).status, 200);
}

// ---------------------------------------------------------------- blocking

/// One request from `from` with `key`, on its own connection.
fn call_from(gw: &Gateway, from: &str, key: &str, extra: &str) -> crate::harness::Response {
    let mut s = connect_from(from, gw.addr);
    let raw = format!(
        "GET /v2/client/getState HTTP/1.1\r\nHost: a\r\nConnection: close\r\nAuthorization: Bearer {key}\r\n{extra}\r\n"
    );
    s.write_all(raw.as_bytes()).unwrap();
    read_response(&mut BufReader::new(s))
}

#[test]
fn a_blocked_address_gets_429_and_no_key_it_sends_is_evaluated() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&crate::harness::config_for(&up).auth_failures(3, 60, 30));
    for i in 0..3 {
        let r = call_from(&gw, "127.0.0.1", "wrong-key", "");
        assert_eq!(r.status, 401, "failure {i}");
    }
    // Blocked: the right key gets the same 429, with no rate-limit headers (no key was read).
    let r = call_from(&gw, "127.0.0.1", "pro-key-1", "");
    assert_eq!(
        (r.status, r.code().as_str()),
        (429, "too_many_auth_failures")
    );
    assert_eq!(r.header("retry-after"), Some("30"));
    assert!(r.header("ratelimit").is_none());
    // Another address is served.
    assert_eq!(call_from(&gw, "127.0.0.2", "pro-key-1", "").status, 200);
    assert_eq!(gauge(&gw, "tollgate_auth_blocked_ips"), 1.0);
    eventually("the blocked request is counted", || {
        gauge(
            &gw,
            r#"tollgate_requests_total{outcome="blocked",plan="none",route="none"}"#,
        ) == 1.0
    });
    // The block ends with time (the injected clock), and the sweep lowers the gauge.
    gw.clock.advance(Duration::from_secs(30));
    assert_eq!(call_from(&gw, "127.0.0.1", "pro-key-1", "").status, 200);
    eventually("the gauge falls to 0", || {
        gauge(&gw, "tollgate_auth_blocked_ips") == 0.0
    });
    assert_eq!(up.count(), 2);
}

#[test]
fn an_operator_lists_blocked_addresses_and_releases_one_with_the_admin_token() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(
        &crate::harness::config_for(&up)
            .auth_failures(3, 60, 300)
            .admin_token("the-admin-token"),
    );
    let a = gw.config.process.admin_listen;
    let token = Some("the-admin-token");
    let blocks = |t| crate::harness::admin_with(a, "GET", "/api/blocks", t);
    assert_eq!(blocks(token).json()["blocks"], serde_json::json!([]));
    for _ in 0..3 {
        assert_eq!(call_from(&gw, "127.0.0.2", "wrong-key", "").status, 401);
    }
    assert_eq!(call_from(&gw, "127.0.0.2", "pro-key-1", "").status, 429);
    // Listed (the token applies), with when it began and ends and the failures that did it.
    assert_eq!(blocks(None).status, 401);
    let listed = blocks(token);
    assert_eq!(listed.status, 200);
    let rows = listed.json()["blocks"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["address"], "127.0.0.2");
    assert_eq!(row["failures"], 3);
    assert_eq!(row["listener"], "gateway");
    let instant = |v: &serde_json::Value| {
        time::OffsetDateTime::parse(
            v.as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap()
    };
    assert_eq!(
        instant(&row["until"]) - instant(&row["since"]),
        time::Duration::seconds(300)
    );
    // The usage view (the page, `top`) shows the same rows.
    let usage = crate::harness::admin_with(a, "GET", "/api/usage", token).json();
    assert_eq!(usage["blocks"], serde_json::Value::Array(rows.clone()));
    // Released: not without the token; with it, at once, and the address is served again.
    let delete = |path: &str, t| crate::harness::admin_with(a, "DELETE", path, t);
    assert_eq!(delete("/api/blocks/127.0.0.2", None).status, 401);
    assert_eq!(call_from(&gw, "127.0.0.2", "pro-key-1", "").status, 429);
    assert_eq!(delete("/api/blocks/127.0.0.2", token).status, 204);
    assert_eq!(call_from(&gw, "127.0.0.2", "pro-key-1", "").status, 200);
    assert_eq!(blocks(token).json()["blocks"], serde_json::json!([]));
    let page = crate::harness::admin_with(a, "GET", "/metrics", token);
    let page = String::from_utf8(page.body.clone()).unwrap();
    assert_eq!(metric(&page, "tollgate_auth_blocked_ips"), Some(0.0));
    // Its failures were forgotten: two more wrong keys do not block it again.
    for _ in 0..2 {
        assert_eq!(call_from(&gw, "127.0.0.2", "wrong-key", "").status, 401);
    }
    assert_eq!(call_from(&gw, "127.0.0.2", "pro-key-1", "").status, 200);
    // Not blocked, not an address, other methods.
    let r = delete("/api/blocks/127.0.0.2", token);
    assert_eq!((r.status, r.code()), (404, "not_blocked".to_string()));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let r = delete("/api/blocks/not-an-address", token);
    assert_eq!((r.status, r.code()), (404, "not_blocked".to_string()));
    assert!(r.json()["detail"]
        .as_str()
        .unwrap()
        .starts_with("not an address"));
    let r = crate::harness::admin_with(a, "POST", "/api/blocks", token);
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    let r = crate::harness::admin_with(a, "GET", "/api/blocks/127.0.0.2", token);
    assert_eq!((r.status, r.header("allow")), (405, Some("DELETE")));
}

#[test]
fn behind_a_trusted_proxy_the_forwarded_client_is_blocked_and_forwarded() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(
        &crate::harness::config_for(&up)
            .auth_failures(2, 60, 60)
            .server(|s| s.trusted_proxies = vec!["127.0.0.1/32".into()]),
    );
    let xff = |client: &str| format!("X-Forwarded-For: 6.6.6.6, {client}\r\n");
    // From the trusted proxy, the client named last is blocked, not the proxy.
    for _ in 0..2 {
        assert_eq!(
            call_from(&gw, "127.0.0.1", "wrong", &xff("198.51.100.2")).status,
            401
        );
    }
    let r = call_from(&gw, "127.0.0.1", "pro-key-1", &xff("198.51.100.2"));
    assert_eq!(r.code(), "too_many_auth_failures");
    assert_eq!(
        call_from(&gw, "127.0.0.1", "pro-key-1", &xff("198.51.100.3")).status,
        200
    );
    // The upstream sees the entries up to the client, and the client last.
    let seen = up.seen();
    assert_eq!(
        seen.last().unwrap().header("x-forwarded-for"),
        Some("6.6.6.6, 198.51.100.3")
    );
    // From an untrusted peer, its own address is the client, whatever it claims.
    assert_eq!(
        call_from(&gw, "127.0.0.2", "pro-key-1", &xff("198.51.100.2")).status,
        200
    );
    assert_eq!(
        up.seen().last().unwrap().header("x-forwarded-for"),
        Some("6.6.6.6, 198.51.100.2, 127.0.0.2")
    );
}

#[test]
fn a_query_naming_a_checked_member_is_refused_and_one_content_type_is_required() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let good = br#"{"url":"https://hooks.example.com/in"}"#;
    let json = ("Content-Type", "application/json");
    let auth = ("Authorization", "Bearer pro-key-1");
    for q in [
        "?url=http://169.254.169.254/latest/meta-data/",
        "?Url=x",
        "?url%5B%5D=x",
        "?a=1;url=x",
        "?webhook.url=x",
    ] {
        let r = gw.request(
            "POST",
            &format!("/v2/settings/webhook/set{q}"),
            &[auth, json],
            good,
        );
        assert_eq!((r.status, r.code()), (400, "invalid_body".into()), "{q}");
        assert!(r.json()["errors"][0]["parameter"].is_string(), "{q}");
    }
    // A partner's upgrade: another customer and plan in the query.
    let body = br#"{"apiKey":"acme-customer-key","planID":2}"#;
    let r = gw.request(
        "POST",
        "/v2/service/upgrade?apiKey=globex-customer-key&planID=3",
        &[("Authorization", "Bearer acme-partner-key"), json],
        body,
    );
    assert_eq!((r.status, r.code()), (400, "invalid_body".into()));
    let named: Vec<_> = r.json()["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["parameter"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(named, ["apiKey", "planID"]);
    // A second Content-Type (a form a server behind could parse): 400.
    let r = gw.request(
        "POST",
        "/v2/settings/webhook/set",
        &[
            auth,
            json,
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        good,
    );
    assert_eq!((r.status, r.code()), (400, "bad_request".into()));
    // Spelled with `_`, as servers that read `_` as `-` take it, a second one all the same.
    let r = gw.request(
        "POST",
        "/v2/settings/webhook/set",
        &[auth, json, ("Content_Type", "text/plain")],
        good,
    );
    assert_eq!((r.status, r.code()), (400, "bad_request".into()));
    // A member of the body in another case (alone: no duplicate to find) is the member to a
    // case-insensitive reader behind: an error naming it.
    for (body, at) in [
        (
            &br#"{"url":"https://hooks.example.com/in","SIGNING":"maybe"}"#[..],
            "/SIGNING",
        ),
        (br#"{"URL":"http://169.254.169.254/"}"#, "/URL"),
    ] {
        let r = gw.request("POST", "/v2/settings/webhook/set", &[auth, json], body);
        assert_eq!((r.status, r.code()), (400, "invalid_body".into()), "{at}");
        let pointers: Vec<_> = r.json()["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["pointer"].as_str().unwrap().to_string())
            .collect();
        assert!(pointers.contains(&at.to_string()), "{pointers:?}");
    }
    assert_eq!(up.count(), 0, "nothing forwarded");
    // Other query parameters pass.
    let r = gw.request(
        "POST",
        "/v2/settings/webhook/set?trace=1",
        &[auth, json],
        good,
    );
    assert_eq!(r.status, 200);
}

#[test]
fn a_unicode_spelling_of_a_checked_operation_is_refused() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let hook = br#"{"url":"http://169.254.169.254/latest/meta-data/"}"#;
    for p in [
        "/v2/%C5%BFettings/webhook/set",
        "/v2/settings/webhoo%E2%84%AA/set",
        "/v2/sett%C4%B0ngs/webhook/set",
        "/v2/sett%C4%B1ngs/webhook/set",
        "/v2/%C5%BFervice/upgrade",
        // Beside a byte that is not UTF-8, or a letter that stays non-ASCII.
        "/v2/sett%C4%B0ngs/webhook/set%C2",
        "/v2/%C5%BFettings/webhook/set%C3%A9",
    ] {
        let r = gw.request(
            "POST",
            p,
            &[
                ("Authorization", "Bearer pro-key-1"),
                ("Content-Type", "application/json"),
            ],
            hook,
        );
        assert_eq!((r.status, r.code()), (404, "unknown_route".into()), "{p}");
    }
    assert_eq!(up.count(), 0, "nothing forwarded");
}

#[test]
fn a_blocked_address_stays_blocked_however_many_others_fail() {
    let up = Upstream::start(Mode::Ok);
    let mut config = crate::harness::config_for(&up)
        .auth_failures(2, 60, 60)
        .server(|s| s.trusted_proxies = vec!["127.0.0.1/32".into()]);
    // A table of eight addresses, and ten times as many failing.
    config.file.auth_failures.as_mut().unwrap().max_tracked_ips = 8;
    let gw = Gateway::start(&config);
    let xff = |client: &str| format!("X-Forwarded-For: {client}\r\n");
    for _ in 0..2 {
        let r = call_from(&gw, "127.0.0.1", "wrong", &xff("198.51.100.2"));
        assert_eq!(r.status, 401);
    }
    let blocked = || call_from(&gw, "127.0.0.1", "pro-key-1", &xff("198.51.100.2"));
    assert_eq!(blocked().code(), "too_many_auth_failures");
    for i in 0..80 {
        let r = call_from(&gw, "127.0.0.1", "wrong", &xff(&format!("203.0.113.{i}")));
        assert_eq!(r.status, 401, "203.0.113.{i}");
    }
    let r = blocked();
    assert_eq!(
        (r.status, r.code()),
        (429, "too_many_auth_failures".into()),
        "the block outlived the table's evictions"
    );
    assert_eq!(
        call_from(&gw, "127.0.0.1", "pro-key-1", &xff("198.51.100.3")).status,
        200
    );
}

// ---------------------------------------------------------------- no tunnels

#[test]
fn upgrades_are_never_forwarded_and_nothing_pipelined_behind_one_reaches_the_upstream() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let mut s = connect(&gw);
    let mut r = BufReader::new(s.try_clone().unwrap());
    // A Basic key: an upgrade, and a webhook change pipelined behind it in the same write (the
    // attack: once tunnelled, the second request would reach the upstream undecided).
    let hook = r#"{"url":"https://hooks.example.com/x"}"#;
    let webhook = format!(
        "POST /v2/settings/webhook/set HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer basic-key-1\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{hook}",
        hook.len()
    );
    let raw = format!(
        "GET /v2/client/socket HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer basic-key-1\r\n\
         Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n{webhook}"
    );
    s.write_all(raw.as_bytes()).unwrap();
    // The upgrade is answered as a plain request; Pingora serves no pipelined request (it
    // closes the connection after the first answer), so the second is never forwarded.
    let first = read_response(&mut r);
    assert_eq!(first.status, 200);
    assert_eq!(read_until_closed(&mut s, Duration::from_secs(5)).0, b"");
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path(), "/v2/client/socket");
    assert_eq!(seen[0].header("upgrade"), None);
    assert!(!seen[0]
        .header("connection")
        .is_some_and(|c| c.to_ascii_lowercase().contains("upgrade")));
    // Sent on its own, the webhook change is decided as always.
    let alone = gw.send(
        webhook
            .replace("Host: a\r\n", "Host: a\r\nConnection: close\r\n")
            .as_bytes(),
    );
    assert_eq!(
        (alone.status, alone.code().as_str()),
        (403, "plan_restricted")
    );
    assert_eq!(up.count(), 1);
}

#[test]
fn an_upstream_that_answers_101_is_an_upstream_error_not_a_tunnel() {
    let up = Upstream::start(Mode::Switch);
    let gw = Gateway::with(&up);
    let r = gw.request(
        "GET",
        "/v2/client/socket",
        &[
            ("Authorization", "Bearer pro-key-1"),
            ("Connection", "Upgrade"),
            ("Upgrade", "websocket"),
        ],
        b"",
    );
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"));
}

#[test]
fn fields_that_re_route_a_request_or_claim_an_address_are_dropped() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let dropped = [
        ("X-Original-URL", "/v2/settings/webhook/set"),
        ("X-Rewrite-URL", "/v2/settings/webhook/set"),
        ("X-Forwarded-Prefix", "/admin"),
        ("X-HTTP-Method-Override", "DELETE"),
        ("X-HTTP-Method", "DELETE"),
        ("X-Method-Override", "DELETE"),
        ("X-Real-IP", "10.0.0.1"),
        ("Forwarded", "for=10.0.0.1"),
    ];
    let mut headers = vec![("Authorization", "Bearer basic-key-1")];
    headers.extend(dropped);
    assert_eq!(
        gw.request("GET", "/v2/client/getState", &headers, b"")
            .status,
        200
    );
    let seen = &up.seen()[0];
    for (name, _) in dropped {
        assert_eq!(seen.header(&name.to_ascii_lowercase()), None, "{name}");
    }
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
}

#[test]
fn a_content_length_goes_as_the_number_and_other_codings_are_refused() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let body = r#"{"chatId":1}"#;
    let raw = format!(
        "POST /v2/sendMessage/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\nAuthorization: Bearer pro-key-1\r\n\
         Content-Type: application/json\r\nContent-Length: 00{}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(gw.send(raw.as_bytes()).status, 200);
    assert_eq!(
        up.seen()[0].headers_named("content-length"),
        [body.len().to_string().as_str()]
    );
    let raw = "POST /v2/sendMessage/ HTTP/1.1\r\nHost: a\r\nConnection: close\r\nAuthorization: Bearer pro-key-1\r\n\
               Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(gw.send(raw.as_bytes()).status, 400);
    assert_eq!(up.count(), 1);
}

// ------------------------------------------------ checked operations, methods, claims

const METADATA_HOOK: &str = r#"{"url":"http://169.254.169.254/latest/meta-data/"}"#;

#[test]
fn a_checked_operation_is_never_reached_by_another_method_or_a_near_spelling() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let post = |path: &str, method: &str| gw.call("pro-key-1", method, path, METADATA_HOOK);
    // Its own method and spelling: checked (the guard refuses the address).
    let r = post("/v2/settings/webhook/set", "POST");
    assert_eq!((r.status, r.code()), (400, "invalid_body".into()));
    // Every other method: 405, `Allow: POST`, never forwarded.
    for method in ["PUT", "PATCH", "DELETE", "GET", "OPTIONS"] {
        for path in [
            "/v2/settings/webhook/set",
            "/V2/SETTINGS/webhook/Set/",
            "/v2/sendGroup",
        ] {
            let r = post(path, method);
            assert_eq!(
                (r.status, r.code(), r.header("allow")),
                (405, "method_not_allowed".into(), Some("POST")),
                "{method} {path}"
            );
        }
    }
    // A method in another case is not POST: never forwarded.
    let r = post("/v2/settings/webhook/set", "post");
    assert_eq!((r.status, r.code()), (501, "not_implemented".into()));
    // Near spellings: 404, whatever the method.
    for path in [
        "/v2/settings/webhook/set.json",
        "/v2/settings/webhook/set~",
        "/v2/settings/webhook/set%20",
        "/v2/settings/webhook/set%2E",
        "/v2/settings/webhook/set-",
        "/v2/settings/webhook/set/x",
        "/v2/settings/webhook.json/set",
        "/v2/sendGroup.json",
        "/v2/service/upgrade.json",
    ] {
        for method in ["POST", "PUT"] {
            let r = post(path, method);
            assert_eq!(
                (r.status, r.code()),
                (404, "unknown_route".into()),
                "{method} {path}"
            );
        }
    }
    assert_eq!(up.count(), 0, "nothing reached the upstream");
    // Neighbours that are operations of their own still go through.
    let r = gw.call("pro-key-1", "PUT", "/v2/settings/webhook/setup", "{}");
    assert_eq!(r.status, 200);
    let r = gw.call(
        "pro-key-1",
        "POST",
        "/v2/settings/webhook/set",
        r#"{"url":"https://hooks.example.com/in"}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(up.count(), 2);
}

#[test]
fn json_members_that_differ_only_in_case_are_refused_and_never_forwarded() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    for body in [
        r#"{"url":"https://hooks.example.com/in","URL":"http://169.254.169.254/"}"#,
        r#"{"URL":"http://169.254.169.254/","url":"https://hooks.example.com/in"}"#,
        r#"{"url":"https://hooks.example.com/in","Url":"http://10.0.0.1/"}"#,
        "{\"url\":\"https://hooks.example.com/in\",\"signing\":\"on\",\"\u{17F}igning\":\"off\"}",
    ] {
        let r = gw.call("pro-key-1", "POST", "/v2/settings/webhook/set", body);
        assert_eq!((r.status, r.code()), (400, "invalid_json".into()), "{body}");
    }
    let r = gw.call(
        "acme-partner-key",
        "POST",
        "/v2/service/upgrade",
        r#"{"apiKey":"acme-customer-key","APIKEY":"globex-customer-key","planID":3}"#,
    );
    assert_eq!((r.status, r.code()), (400, "invalid_json".into()));
    assert_eq!(up.count(), 0);
}

#[test]
fn a_partner_acts_only_on_its_own_customers_by_the_exact_key() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let upgrade = |api_key: &str| {
        let body = serde_json::json!({ "apiKey": api_key, "planID": 3 }).to_string();
        gw.call("acme-partner-key", "POST", "/v2/service/upgrade", &body)
    };
    for spelling in [
        "globex-customer-key",
        " globex-customer-key",
        "globex-customer-key ",
        "globex-customer-key\n",
        "Bearer globex-customer-key",
        "GLOBEX-CUSTOMER-KEY",
        "a-key-no-one-configured",
    ] {
        let r = upgrade(spelling);
        assert_eq!(
            (r.status, r.code()),
            (403, "not_your_customer".into()),
            "{spelling:?}"
        );
    }
    assert_eq!(up.count(), 0);
    assert_eq!(upgrade("acme-customer-key").status, 200);
    assert_eq!(up.count(), 1);
}

#[test]
fn every_client_claim_is_dropped_and_the_operator_may_pass_one() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).pass_headers(&["X-Forwarded-Proto"]));
    let claims = [
        ("X-Forwarded-Host", "admin.internal"),
        ("X-Forwarded-Port", "8443"),
        ("X-Forwarded-Scheme", "https"),
        ("X-Forwarded-Server", "admin.internal"),
        ("X-Forwarded-Uri", "/v2/settings/webhook/set"),
        ("X-Forwarded-Path", "/v2/settings/webhook/set"),
        ("X-Original-URI", "/v2/settings/webhook/set"),
        ("X-Original-Host", "admin.internal"),
        ("X-Original-Method", "POST"),
        ("X-Host", "admin.internal"),
        ("X-HTTP-Host-Override", "admin.internal"),
        ("X-Url-Scheme", "https"),
        ("Front-End-Https", "on"),
        ("X-Client-IP", "10.0.0.1"),
        ("X-Cluster-Client-IP", "10.0.0.1"),
        ("True-Client-IP", "10.0.0.1"),
        ("CF-Connecting-IP", "10.0.0.1"),
        ("Fastly-Client-IP", "10.0.0.1"),
        ("Client-IP", "10.0.0.1"),
        ("X-Remote-Addr", "10.0.0.1"),
        ("X-Envoy-Original-Path", "/v2/settings/webhook/set"),
        ("X-Envoy-Internal", "true"),
        // As CGI, WSGI and Rack read names: `_` is `-`, `HTTP_` their prefix.
        ("X_Forwarded_Host", "admin.internal"),
        ("X-Real_IP", "10.0.0.1"),
        ("HTTP_X_FORWARDED_FOR", "10.0.0.1"),
        ("X_Forwarded_For", "10.0.0.1"),
        ("Forwarded-For", "10.0.0.1"),
        ("X-Azure-ClientIP", "10.0.0.1"),
        ("CF-Connecting-IPv6", "::1"),
        ("Proxy", "http://evil.example:3128"),
        ("X-Script-Name", "/admin"),
        ("Request-URI", "/v2/settings/webhook/set"),
        ("Destination", "/v2/settings/webhook/set"),
    ];
    let mut headers = vec![
        ("Authorization", "Bearer pro-key-1"),
        ("X-Forwarded-Proto", "https"),
        ("X-Idempotency-Key", "k-1"),
        ("X_Custom", "1"),
    ];
    headers.extend(claims);
    let r = gw.request("GET", "/v2/client/getState", &headers, b"");
    assert_eq!(r.status, 200);
    let seen = &up.seen()[0];
    for (name, _) in claims {
        assert_eq!(seen.header(&name.to_ascii_lowercase()), None, "{name}");
    }
    assert_eq!(
        seen.header("x-forwarded-proto"),
        Some("https"),
        "passed by the operator"
    );
    assert_eq!(seen.header("x-idempotency-key"), Some("k-1"), "not a claim");
    assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(
        seen.header("x_custom"),
        Some("1"),
        "an underscore alone is no claim"
    );
}

#[test]
fn trace_connect_and_unknown_methods_are_refused_before_anything_else() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let long = "A".repeat(300);
    for (method, status) in [
        ("TRACE", 405),
        ("PURGE", 501),
        ("PROPFIND", 501),
        ("get", 501),
        ("post", 501),
        (long.as_str(), 501),
    ] {
        for key in ["pro-key-1", "not-a-key"] {
            let r = gw.request(
                method,
                "/v2/client/getState",
                &[
                    ("Authorization", &format!("Bearer {key}")),
                    ("Max-Forwards", "0"),
                ],
                b"",
            );
            assert_eq!(r.status, status, "{method:.20} with {key}");
            if status == 405 {
                assert_eq!(
                    r.header("allow"),
                    Some("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
                );
            }
        }
    }
    // CONNECT never opens a tunnel (Pingora refuses it before the request path).
    let r = gw.send(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n");
    assert!(r.status == 405 || r.status == 400, "{}", r.status);
    assert_eq!(up.count(), 0);
}
