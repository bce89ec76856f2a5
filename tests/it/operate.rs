//! Operating the gateway: the admin listener, metrics, reload under load, signals, draining,
//! logs that never hold a key, and the zero-downtime upgrade. The signal tests run the real
//! `tollgate` binary as its own process; the others run the gateway in-process. Every server
//! binds 127.0.0.1 only, and every wait is bounded.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{
    admin, config_for, eventually, metric, metrics_page, send_raw, try_read_response, wait_ready,
    Gateway, Mode, Process, TestConfig, Upstream, EVENT,
};
use tollgate::config::file::FileKey;

// ---------------------------------------------------------------- admin and metrics

#[test]
fn admin_listener_serves_health_readiness_and_metrics_of_real_traffic() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let a = gw.config.process.admin_listen;
    assert_eq!(gw.admin("GET", "/healthz").status, 200);
    wait_ready(a, 200);
    // HEAD: the head of GET, no body.
    let mut s = TcpStream::connect(a).unwrap();
    s.write_all(b"HEAD /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut head = String::new();
    std::io::Read::read_to_string(&mut s, &mut head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "no body after the head: {head}");
    assert_eq!(gw.admin("DELETE", "/metrics").status, 405);
    assert_eq!(gw.admin("GET", "/nope").status, 404);

    let sent = MESSAGE;
    for _ in 0..3 {
        assert_eq!(
            gw.call("basic-key-1", "POST", "/v2/sendMessage/", sent)
                .status,
            200
        );
    }
    let r = gw.call("basic-key-1", "POST", "/v2/settings/webhook/set", "{}");
    assert_eq!(r.status, 403);
    assert_eq!(gw.call("nobody", "GET", "/v2/client/x", "").status, 401);
    let r = gw.call("acme-partner-key", "POST", "/v2/service/upgrade", "{}");
    assert_eq!(r.status, 400);

    // A request is recorded just after its answer is sent: wait for the last one.
    let mut page = metrics_page(a);
    eventually("the last request is recorded", || {
        page = metrics_page(a);
        metric(&page, r#"tollgate_responses_total{class="4xx"}"#) == Some(3.0)
    });
    let want = [
        (
            r#"tollgate_requests_total{outcome="forwarded",plan="basic",route="send_message"}"#,
            3.0,
        ),
        (
            r#"tollgate_requests_total{outcome="forbidden",plan="basic",route="webhook_set"}"#,
            1.0,
        ),
        (
            r#"tollgate_requests_total{outcome="unauthorized",plan="none",route="none"}"#,
            1.0,
        ),
        (
            r#"tollgate_requests_total{outcome="invalid",plan="partner",route="service_upgrade"}"#,
            1.0,
        ),
        (r#"tollgate_responses_total{class="2xx"}"#, 3.0),
        (r#"tollgate_responses_total{class="4xx"}"#, 3.0),
        (
            r#"tollgate_request_duration_seconds_count{route="send_message"}"#,
            3.0,
        ),
        (
            r#"tollgate_upstream_duration_seconds_count{route="send_message"}"#,
            3.0,
        ),
        (
            r#"tollgate_request_duration_seconds_bucket{route="send_message",le="60"}"#,
            3.0,
        ),
        (r#"tollgate_keys{state="active"}"#, 7.0),
    ];
    for (series, value) in want {
        assert_eq!(metric(&page, series), Some(value), "{series} in\n{page}");
    }
    // Refused requests never reach the upstream leg.
    assert_eq!(
        metric(
            &page,
            r#"tollgate_upstream_duration_seconds_count{route="webhook_set"}"#
        ),
        None
    );
    // Labels are route ids and plan names: no path, no key.
    assert!(!page.contains("/v2/"), "{page}");
    assert!(!page.contains("key-1"), "{page}");
}

// ---------------------------------------------------------------- reload

/// One keep-alive client: requests until `stop`, reconnecting when an answer says
/// `Connection: close`. Returns (answers by status, failures as text, request-id prefixes).
fn client_loop(addr: SocketAddr, request: Vec<u8>, stop: Arc<AtomicBool>) -> ClientResult {
    let mut statuses = Vec::new();
    let mut failures = Vec::new();
    let mut seeds = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        let (w, r) = match conn.as_mut() {
            Some(c) => c,
            None => match TcpStream::connect(addr) {
                Ok(s) => {
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    let r = BufReader::new(s.try_clone().unwrap());
                    conn.insert((s, r))
                }
                Err(e) => {
                    failures.push(format!("connect: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        if let Err(e) = w.write_all(&request) {
            failures.push(format!("write: {e}"));
            conn = None;
            continue;
        }
        match try_read_response(r) {
            Some(resp) => {
                statuses.push(resp.status);
                if let Some(id) = resp.header("x-request-id") {
                    seeds.insert(id.chars().take(16).collect());
                }
                if resp.header("connection") == Some("close") {
                    conn = None;
                }
            }
            None => {
                failures.push("connection ended without an answer".into());
                conn = None;
            }
        }
    }
    (statuses, failures, seeds)
}

fn keep_alive_request(key: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: gateway.test\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const MESSAGE: &str = r#"{"chatId":"1","message":"hi"}"#;

/// `config` with the Standard and Pro plans raised to 1,000,000 requests per window: limits no
/// load in these tests reaches.
fn unlimited(config: TestConfig) -> TestConfig {
    config
        .plan_limit("standard", 1_000_000)
        .plan_limit("pro", 1_000_000)
}

/// Keep-alive clients, one thread per call, each repeating its call until `finish`.
struct Load {
    stop: Arc<AtomicBool>,
    clients: Vec<std::thread::JoinHandle<ClientResult>>,
}

type ClientResult = (Vec<u16>, Vec<String>, std::collections::BTreeSet<String>);

impl Load {
    fn start(addr: SocketAddr, calls: &[(&str, &str, &str)]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let clients = calls
            .iter()
            .map(|&(key, path, body)| {
                let stop = Arc::clone(&stop);
                let req = keep_alive_request(key, path, body);
                std::thread::spawn(move || client_loop(addr, req, stop))
            })
            .collect();
        Self { stop, clients }
    }

    /// Stop the clients; assert that nothing failed and every answer was 200 (`context` is
    /// printed on failure). Returns the number of answers and the request-id seeds seen.
    fn finish(self, context: &dyn Fn() -> String) -> (usize, std::collections::BTreeSet<String>) {
        self.stop.store(true, Ordering::SeqCst);
        let mut answered = 0;
        let mut seeds = std::collections::BTreeSet::new();
        for c in self.clients {
            let (statuses, failures, s) = c.join().unwrap();
            assert!(failures.is_empty(), "{failures:?}\n{}", context());
            assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
            answered += statuses.len();
            seeds.extend(s);
        }
        (answered, seeds)
    }
}

#[test]
fn reload_under_load_fails_no_request_and_a_changed_plan_takes_effect() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    // Limits no load here reaches (the injected clock does not move).
    let base = unlimited(config_for(&up));
    let on_standard = base.clone().key_plan("basic-1", "standard");
    base.write(&path);
    let gw = Gateway::start_file(&path);
    wait_ready(gw.config.process.admin_listen, 200);

    let webhook = r#"{"url":"https://example.com/hook"}"#;
    assert_eq!(
        gw.call("basic-key-1", "POST", "/v2/settings/webhook/set", webhook)
            .code(),
        "plan_restricted"
    );

    let load = Load::start(
        gw.addr,
        &[
            ("pro-key-1", "/v2/sendMessage/", MESSAGE),
            ("pro-key-1", "/v2/sendGroup", EVENT),
            ("standard-key-1", "/v2/client/status", ""),
            ("globex-customer-key", "/v2/settings/webhook/set", webhook),
        ],
    );

    // Forty reloads while the clients run, moving basic-1 between plans each time, and one
    // refused file in the middle.
    for i in 0..40 {
        let config = if i % 2 == 0 { &on_standard } else { &base };
        config.write(&path);
        let r = gw.admin("POST", "/reload");
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        if i == 20 {
            base.clone().key_plan("pro-1", "platinum").write(&path);
            let r = gw.admin("POST", "/reload");
            assert_eq!(r.status, 422);
            let v = r.json();
            assert_eq!(v["code"], "config_refused");
            assert_eq!(v["field"], "keys[2].plan", "{v}");
            assert!(v["line"].as_u64().is_some(), "{v}");
        }
    }
    let (answered, _) = load.finish(&String::new);
    assert!(
        answered >= 40,
        "the load ran through the reloads ({answered})"
    );

    // The last reload (i = 39) left basic-1 on Basic; move it to Standard for good.
    on_standard.write(&path);
    assert_eq!(gw.admin("POST", "/reload").status, 200);
    let r = gw.call("basic-key-1", "POST", "/v2/settings/webhook/set", webhook);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("ratelimit-policy"),
        Some("\"standard\";q=1000000;w=10")
    );

    let page = metrics_page(gw.config.process.admin_listen);
    assert_eq!(
        metric(&page, r#"tollgate_config_reloads_total{result="success"}"#),
        Some(41.0)
    );
    assert_eq!(
        metric(&page, r#"tollgate_config_reloads_total{result="error"}"#),
        Some(1.0)
    );
}

// ---------------------------------------------------------------- the real binary

/// Write `config` to `gateway.yaml` in `dir` for the binary: its path, and the gateway's and
/// the admin listener's addresses.
fn write_config(dir: &Path, config: &TestConfig) -> (std::path::PathBuf, SocketAddr, SocketAddr) {
    let path = dir.join("gateway.yaml");
    config.write(&path);
    let addr = |a: &str| a.parse().expect("a socket address");
    (
        path,
        addr(&config.file.listen),
        addr(&config.file.admin_listen),
    )
}

fn post(addr: SocketAddr, key: &str, path: &str, body: &str) -> crate::harness::Response {
    let mut raw = keep_alive_request(key, path, body);
    let at = raw.windows(2).position(|w| w == b"\r\n").unwrap() + 2;
    raw.splice(at..at, b"Connection: close\r\n".iter().copied());
    send_raw(addr, &raw)
}

/// The real binary in `dir` in front of `up`, blocking an address for `block_secs` after two
/// wrong keys, and 127.0.0.1 blocked that way: the process, its listener and admin listener.
fn blocked_after_two_wrong_keys(
    dir: &Path,
    up: &Upstream,
    block_secs: u64,
) -> (Process, SocketAddr, SocketAddr) {
    let config = config_for(up).auth_failures(2, 60, block_secs);
    let (path, listen, admin_addr) = write_config(dir, &config);
    let p = Process::spawn(
        dir,
        "gw",
        &["run", "--config", path.to_str().unwrap()],
        &[("TOLLGATE_LOG", "info")],
    );
    wait_ready(admin_addr, 200);
    for _ in 0..2 {
        assert_eq!(
            post(listen, "wrong-key", "/v2/sendMessage/", MESSAGE).status,
            401
        );
    }
    assert_eq!(
        post(listen, "pro-key-1", "/v2/sendMessage/", MESSAGE).status,
        429
    );
    (p, listen, admin_addr)
}

#[test]
fn a_block_starts_and_ends_with_one_log_line_each_and_the_access_line_names_the_client() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    // The real binary and its real clock: a one-second block.
    let (mut p, listen, _) = blocked_after_two_wrong_keys(dir.path(), &up, 1);
    eventually("the block ends and is swept", || {
        p.output().contains("auth-failure block ended")
    });
    assert_eq!(
        post(listen, "pro-key-1", "/v2/sendMessage/", MESSAGE).status,
        200
    );
    p.stop();
    let out = p.output();
    let started: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("address blocked after repeated failed authentications"))
        .collect();
    let ended: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("auth-failure block ended"))
        .collect();
    assert_eq!((started.len(), ended.len()), (1, 1), "{out}");
    assert!(started[0].contains("client=127.0.0.1") && started[0].contains("seconds=1"));
    assert!(ended[0].contains("client=127.0.0.1"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.contains("tollgate::access") && l.contains("client=127.0.0.1")),
        "{out}"
    );
    // Never the keys.
    assert!(
        !out.contains("wrong-key") && !out.contains("pro-key-1"),
        "{out}"
    );
}

#[test]
fn an_operator_releasing_a_block_is_one_log_line_and_the_block_never_ends_twice() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let (mut p, listen, admin_addr) = blocked_after_two_wrong_keys(dir.path(), &up, 300);
    assert_eq!(
        admin(admin_addr, "DELETE", "/api/blocks/127.0.0.1").status,
        204
    );
    assert_eq!(
        post(listen, "pro-key-1", "/v2/sendMessage/", MESSAGE).status,
        200
    );
    assert_eq!(
        admin(admin_addr, "DELETE", "/api/blocks/127.0.0.1").status,
        404
    );
    p.stop();
    let out = p.output();
    let released: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("auth-failure block released by an operator"))
        .collect();
    assert_eq!(released.len(), 1, "{out}");
    assert!(
        released[0].contains("client=127.0.0.1") && released[0].contains("listeners=gateway"),
        "{out}"
    );
    // Released, so the sweep has no block to end.
    assert!(!out.contains("auth-failure block ended"), "{out}");
}

#[test]
fn sighup_reloads_the_file_and_a_refused_one_keeps_the_old_config() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(&up);
    let (path, listen, admin_addr) = write_config(dir.path(), &config);
    let p = Process::spawn(
        dir.path(),
        "gw",
        &["run", "--config", path.to_str().unwrap()],
        &[("TOLLGATE_LOG", "info")],
    );
    wait_ready(admin_addr, 200);
    let webhook = r#"{"url":"https://example.com/hook"}"#;
    assert_eq!(
        post(listen, "basic-key-1", "/v2/settings/webhook/set", webhook).status,
        403
    );

    let reloads = |result: &str| {
        metric(
            &metrics_page(admin_addr),
            &format!("tollgate_config_reloads_total{{result=\"{result}\"}}"),
        )
        .unwrap_or(0.0)
    };
    config.clone().key_plan("basic-1", "pro").write(&path);
    p.signal("HUP");
    eventually("SIGHUP reload", || reloads("success") == 1.0);
    assert_eq!(
        post(listen, "basic-key-1", "/v2/settings/webhook/set", webhook).status,
        200
    );

    std::fs::write(&path, "plans: {\n").unwrap();
    p.signal("HUP");
    eventually("refused SIGHUP reload", || reloads("error") == 1.0);
    assert_eq!(
        post(listen, "basic-key-1", "/v2/settings/webhook/set", webhook).status,
        200
    );
    // Stop it the way an operator would, so every queued log line is written.
    let mut p = p;
    p.stop();
    let out = p.output();
    assert!(out.contains("config reloaded"), "{out}");
    assert!(out.contains("config reload refused"), "{out}");
    assert!(
        out.contains("gateway.yaml:2"),
        "the refusal names file and line: {out}"
    );
}

#[test]
fn sigterm_drains_then_lets_requests_in_flight_finish() {
    let up = Upstream::start(Mode::HoldFirst);
    let dir = tempfile::tempdir().unwrap();
    let (path, listen, admin_addr) = write_config(dir.path(), &config_for(&up).shutdown(1, 3, 1));
    let mut p = Process::spawn(
        dir.path(),
        "gw",
        &["run", "--config", path.to_str().unwrap()],
        &[],
    );
    wait_ready(admin_addr, 200);

    // A request whose answer the upstream holds back.
    let held = std::thread::spawn(move || post(listen, "pro-key-1", "/v2/client/status", ""));
    up.wait_for(1);
    // A keep-alive connection that has already been used once.
    let mut idle = TcpStream::connect(listen).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut idle_r = BufReader::new(idle.try_clone().unwrap());
    idle.write_all(&keep_alive_request("pro-key-1", "/v2/client/status", ""))
        .unwrap();
    let first = try_read_response(&mut idle_r).unwrap();
    assert_eq!(
        (first.status, first.header("connection")),
        (200, Some("keep-alive"))
    );

    let t0 = Instant::now();
    p.signal("TERM");
    // Draining: not ready, still serving, and asking clients to close.
    wait_ready(admin_addr, 503);
    idle.write_all(&keep_alive_request("pro-key-1", "/v2/client/status", ""))
        .unwrap();
    let during = try_read_response(&mut idle_r).unwrap();
    assert_eq!(
        (during.status, during.header("connection")),
        (200, Some("close"))
    );
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "drain lasts drain_seconds"
    );

    // After the drain the listener closes...
    eventually("the listener closes", || {
        TcpStream::connect(listen).is_err()
    });
    assert!(t0.elapsed() >= Duration::from_secs(1));
    // ...and the request in flight still gets its answer within the grace period.
    up.release();
    let r = held.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"{}");
    let status = p
        .wait_exit(Duration::from_secs(15))
        .expect("exits after the grace period");
    assert!(status.success(), "{status:?}\n{}", p.output());
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(10),
        "drain 1 s + grace 3 s (+ up to 1 s), took {took:?}"
    );
}

// ---------------------------------------------------------------- secrets

/// A key entry of the test config.
fn key(name: &str, plan: &str, secret: impl FnOnce(&mut FileKey)) -> FileKey {
    let mut k = FileKey {
        name: name.into(),
        sha256: None,
        key: None,
        key_env: None,
        plan: plan.into(),
        partner: None,
        ..FileKey::default()
    };
    secret(&mut k);
    k
}

fn leak_test(format: &str) {
    let up = Upstream::start(Mode::Ok);
    let broken = Upstream::start(Mode::Reset);
    let dir = tempfile::tempdir().unwrap();
    // Every key and secret starts with `sEcReT`, so one search finds any of them: a plain key, a
    // digest, a key from the environment, a partner key.
    let standard_digest = tollgate::digest::Digest::of(b"sEcReT-standard-Zp9").to_hex();
    let mut config = config_for(&up)
        .plan_allow("basic", Some(&["send_message", "group_list", "client"]))
        .log_format(format);
    config.file.partners.truncate(1);
    config.file.partners[0].key = Some("sEcReT-partner-Kd5".into());
    config.file.keys = vec![
        key("shop-basic", "basic", |k| {
            k.key = Some("sEcReT-basic-Qx7".into())
        }),
        key("shop-standard", "standard", |k| {
            k.sha256 = Some(standard_digest.clone())
        }),
        key("shop-pro", "pro", |k| {
            k.key_env = Some("TOLLGATE_TEST_PRO_KEY".into())
        }),
    ];
    let (path, listen, admin_addr) = write_config(dir.path(), &config);
    let p = Process::spawn(
        dir.path(),
        "gw",
        &["run", "--config", path.to_str().unwrap()],
        &[
            ("TOLLGATE_LOG", "trace"),
            ("RUST_LOG", "trace"),
            ("TOLLGATE_TEST_PRO_KEY", "sEcReT-pro-Vb3"),
        ],
    );
    wait_ready(admin_addr, 200);

    let msg = r#"{"chatId":"1","message":"sEcReT-in-a-body"}"#;
    assert_eq!(
        post(listen, "sEcReT-basic-Qx7", "/v2/sendMessage/", msg).status,
        200
    );
    assert_eq!(
        post(listen, "sEcReT-basic-Qx7", "/v2/settings/webhook/set", "{}").status,
        403
    );
    assert_eq!(
        post(
            listen,
            "sEcReT-standard-Zp9",
            "/v2/sendMessage/?token=sEcReT-query",
            msg
        )
        .status,
        200
    );
    let bad_event = EVENT
        .replace("Daily", "sEcReT-in-a-bad-body")
        .replace("\"type\":\"event\"", "\"type\":\"sEcReT-type\"");
    assert_eq!(
        post(listen, "sEcReT-pro-Vb3", "/v2/sendGroup", &bad_event).status,
        400
    );
    assert_eq!(
        post(listen, "sEcReT-unknown-Wr8", "/v2/sendMessage/", msg).status,
        401
    );
    assert_eq!(
        post(listen, "sEcReT-partner-Kd5", "/v2/sendMessage/", msg).status,
        403
    );
    assert_eq!(
        post(listen, "sEcReT-basic-Qx7", "/v2/%2e%2e/sEcReT-path", "").status,
        400
    );
    // Requests Pingora itself cannot parse (it would log their raw bytes, key included).
    for raw in [
        "GET /v2/client/x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer sEcReT-basic-Qx7\r\nno colon here\r\n\r\n",
        "GET /v2/client/x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer sEcReT-basic-Qx7\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "GET /v2/client/x HTTP/9.9\r\nAuthorization: Bearer sEcReT-basic-Qx7\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(listen).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw.as_bytes()).unwrap();
        let _ = try_read_response(&mut BufReader::new(s));
    }
    // A refused reload whose bad value is a key.
    config
        .clone()
        .key_value("shop-basic", "sEcReT basic with spaces")
        .write(&path);
    let r = admin(admin_addr, "POST", "/reload");
    assert_eq!(r.status, 422);
    assert!(!String::from_utf8_lossy(&r.body).contains("sEcReT"));
    // An upstream that breaks the connection mid-answer (Pingora logs such answers' bytes).
    config
        .clone()
        .upstream(&format!("http://{}", broken.addr))
        .write(&path);
    assert_eq!(admin(admin_addr, "POST", "/reload").status, 200);
    assert_eq!(
        post(listen, "sEcReT-basic-Qx7", "/v2/sendMessage/", msg).status,
        502
    );

    // A request's access line follows its answer: wait for the last one (bounded).
    eventually("the last access line", || {
        p.output().contains("upstream_error")
    });
    let page = metrics_page(admin_addr);
    // SIGINT, not a kill: the log writer writes what is queued before the process exits.
    let mut p = p;
    let status = p.stop();
    assert!(status.success(), "{status:?}");
    let out = std::fs::read_to_string(dir.path().join("gw.stdout")).unwrap()
        + &std::fs::read_to_string(dir.path().join("gw.stderr")).unwrap();

    for (what, text) in [("logs", &out), ("/metrics", &page)] {
        for needle in ["sEcReT", "Bearer", &standard_digest] {
            assert!(!text.contains(needle), "{needle} in {what}:\n{text}");
        }
        assert!(
            !text.to_ascii_lowercase().contains("authorization"),
            "{what}:\n{text}"
        );
    }
    // The logs are there, and at the most verbose level.
    assert!(
        out.contains("shop-basic") && out.contains("shop-pro"),
        "{out}"
    );
    assert!(
        out.contains("upstream_error") && out.contains("plan_restricted"),
        "{out}"
    );
    assert!(
        out.contains("DEBUG") || out.contains("\"level\":\"DEBUG\""),
        "{out}"
    );
    let access: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("tollgate::access"))
        .collect();
    assert!(access.len() >= 8, "{out}");
    if format == "json" {
        for line in out.lines() {
            let v: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
            if v["target"] == "tollgate::access" {
                for f in [
                    "request_id",
                    "method",
                    "route",
                    "key",
                    "plan",
                    "status",
                    "outcome",
                    "duration_ms",
                ] {
                    assert!(!v["fields"][f].is_null(), "{f} missing: {line}");
                }
            }
        }
    }
}

#[test]
fn no_key_reaches_text_logs_or_metrics_at_the_most_verbose_level() {
    leak_test("text");
}

#[test]
fn no_key_reaches_json_logs_or_metrics_at_the_most_verbose_level() {
    leak_test("json");
}

// ---------------------------------------------------------------- upgrade

#[test]
fn upgrade_hands_the_sockets_over_with_zero_failed_requests() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let (path, listen, admin_addr) =
        write_config(dir.path(), &unlimited(config_for(&up).shutdown(0, 1, 1)));
    let sock = dir.path().join("upgrade.sock");
    let conf = dir.path().join("pingora.yaml");
    std::fs::write(
        &conf,
        format!(
            "---\nversion: 1\nthreads: 2\nupgrade_sock: {}\npid_file: {}\n",
            sock.display(),
            dir.path().join("tollgate.pid").display()
        ),
    )
    .unwrap();
    let args = [
        "run",
        "--config",
        path.to_str().unwrap(),
        "--conf",
        conf.to_str().unwrap(),
    ];
    let mut old = Process::spawn(dir.path(), "old", &args, &[]);
    wait_ready(admin_addr, 200);

    let load = Load::start(
        listen,
        &[
            ("pro-key-1", "/v2/sendMessage/", MESSAGE),
            ("pro-key-1", "/v2/sendGroup", EVENT),
            ("standard-key-1", "/v2/client/status", ""),
        ],
    );

    // Step 1: start the new process; it waits for the sockets. Step 2: SIGQUIT the old one.
    let mut args_new = args.to_vec();
    args_new.push("--upgrade");
    let new = Process::spawn(dir.path(), "new", &args_new, &[]);
    eventually("the new process listens for the handover", || sock.exists());
    old.signal("QUIT");
    let status = old
        .wait_exit(Duration::from_secs(30))
        .expect("the old process exits");
    assert!(status.success(), "{status:?}\n{}", old.output());
    // The new process serves on the same sockets, admin included.
    wait_ready(admin_addr, 200);
    let before = up.count();
    eventually("the new process serves", || up.count() > before + 20);
    let (answered, seeds) =
        load.finish(&|| format!("old:\n{}\nnew:\n{}", old.output(), new.output()));
    // Request ids start with a per-process seed: both processes answered.
    assert!(seeds.len() >= 2, "{seeds:?}");
    eprintln!(
        "upgrade: {answered} requests, 0 failed, {} processes answered",
        seeds.len()
    );
}

#[test]
fn run_refuses_a_published_demo_key_at_start_and_on_reload_unless_told() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let demo = config_for(&up).key_value("pro-1", "demo-pro-key");
    let (path, listen, admin_addr) = write_config(dir.path(), &demo);
    let config = path.to_str().unwrap();
    // At start: refused, with the file, the line and the entry.
    let mut p = Process::spawn(dir.path(), "refused", &["run", "--config", config], &[]);
    let status = p.wait_exit(Duration::from_secs(20)).expect("exits");
    assert!(!status.success());
    let out = p.output();
    assert!(
        out.contains("field `keys[2]`") && out.contains("published demo key"),
        "{out}"
    );
    assert!(out.contains("gateway.yaml:"), "the line is named: {out}");
    // Told: a local trial serves it.
    let mut p = Process::spawn(
        dir.path(),
        "allowed",
        &["run", "--config", config, "--allow-demo-keys"],
        &[],
    );
    wait_ready(admin_addr, 200);
    assert_eq!(
        post(listen, "demo-pro-key", "/v2/sendMessage/", MESSAGE).status,
        200
    );
    p.stop();
    // A reload to such a config is refused, and the config in force keeps serving.
    let clean = config_for(&up)
        .listen(listen.to_string())
        .admin_listen(admin_addr.to_string());
    clean.write(&path);
    let mut p = Process::spawn(dir.path(), "reload", &["run", "--config", config], &[]);
    wait_ready(admin_addr, 200);
    demo.write(&path);
    let r = crate::harness::admin(admin_addr, "POST", "/reload");
    assert_eq!(r.status, 422, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["field"], "keys[2]");
    assert_eq!(
        post(listen, "pro-key-1", "/v2/sendMessage/", MESSAGE).status,
        200
    );
    assert_eq!(
        post(listen, "demo-pro-key", "/v2/sendMessage/", MESSAGE).status,
        401
    );
    p.stop();
}

// ------------------------------------------------ the admin listener's own edge

/// A raw request to the admin listener at `a` with `Host` and more header lines.
fn admin_raw(
    a: SocketAddr,
    method: &str,
    path: &str,
    host: &str,
    more: &str,
) -> crate::harness::Response {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{more}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    send_raw(a, raw.as_bytes())
}

#[test]
fn the_admin_listener_caps_connections_and_bounds_heads_and_idle_spells() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).server(|s| {
        s.admin_max_connections = 8;
        s.header_timeout_seconds = 1;
        s.idle_timeout_seconds = 2;
    }));
    let a = gw.config.process.admin_listen;
    wait_ready(a, 200);
    // Eight held, two from each of four addresses (one address has a quarter of the cap; not
    // 127.0.0.1, where the harness's own calls come from); the ninth is closed at once,
    // before any byte.
    let held: Vec<TcpStream> = (2..=9)
        .map(|i| crate::harness::connect_from(&format!("127.0.0.{}", i / 2 + 1), a))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut ninth = crate::harness::connect_from("127.0.0.6", a);
    let (_, closed) = crate::harness::read_until_closed(&mut ninth, Duration::from_secs(3));
    assert!(
        closed.is_some_and(|c| c < Duration::from_millis(900)),
        "{closed:?}"
    );
    // The held ones never sent a head: each is cut at the header timeout.
    for mut s in held {
        let (_, closed) = crate::harness::read_until_closed(&mut s, Duration::from_secs(5));
        assert!(closed.is_some(), "a silent connection is cut");
    }
    // A head dripped a byte every 200 ms is cut one header timeout after the opening.
    let mut s = TcpStream::connect(a).unwrap();
    let opened = Instant::now();
    s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
    let dripper = {
        let mut w = s.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..20 {
                std::thread::sleep(Duration::from_millis(200));
                if w.write_all(b"X").is_err() {
                    return;
                }
            }
        })
    };
    let since_open = opened.elapsed();
    let (_, closed) = crate::harness::read_until_closed(&mut s, Duration::from_secs(5));
    let cut = since_open + closed.expect("the dripped head is cut");
    assert!(
        cut >= Duration::from_millis(900) && cut <= Duration::from_secs(3),
        "{cut:?}"
    );
    dripper.join().unwrap();
    // A kept-alive connection: served, then closed at the idle timeout.
    let mut s = TcpStream::connect(a).unwrap();
    s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {a}\r\n\r\n").as_bytes())
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    assert_eq!(crate::harness::read_response(&mut r).status, 200);
    let (_, closed) = crate::harness::read_until_closed(&mut s, Duration::from_secs(6));
    let idle = closed.expect("the idle connection is closed");
    assert!(idle >= Duration::from_millis(1800), "{idle:?}");
    let page = metrics_page(a);
    assert!(
        metric(
            &page,
            r#"tollgate_connections_refused_total{reason="max_connections"}"#
        )
        .is_some_and(|n| n >= 1.0),
        "{page}"
    );
    assert!(metric(&page, r#"tollgate_connections{listener="admin"}"#).is_some());
}

#[test]
fn one_address_holding_the_admin_listener_locks_no_one_else_out() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).server(|s| s.admin_max_connections = 8));
    let a = gw.config.process.admin_listen;
    wait_ready(a, 200);
    // One address opens connections and keeps them, after a `/healthz` each (no token needed):
    // two of the eight are its share, the third is closed at once.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = crate::harness::connect_from("127.0.0.1", a);
        s.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {a}\r\n\r\n").as_bytes())
            .unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        assert_eq!(crate::harness::read_response(&mut r).status, 200);
        held.push(s);
    }
    for _ in 0..3 {
        let mut more = crate::harness::connect_from("127.0.0.1", a);
        let (_, closed) = crate::harness::read_until_closed(&mut more, Duration::from_secs(3));
        assert!(
            closed.is_some_and(|c| c < Duration::from_millis(900)),
            "{closed:?}"
        );
    }
    // Another address is answered, probes and scrapes alike.
    let mut page = String::new();
    for path in ["/healthz", "/readyz", "/metrics"] {
        let mut s = crate::harness::connect_from("127.0.0.2", a);
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {a}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let r = crate::harness::read_response(&mut BufReader::new(s));
        assert_eq!(r.status, 200, "{path}");
        page = String::from_utf8(r.body).unwrap();
    }
    assert!(
        metric(
            &page,
            r#"tollgate_connections_refused_total{reason="max_connections_per_ip"}"#
        )
        .is_some_and(|n| n >= 3.0),
        "{page}"
    );
    drop(held);
}

#[test]
fn the_admin_listener_answers_only_to_its_own_names() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).admin_hosts(&["tollgate-admin.test"]));
    let a = gw.config.process.admin_listen;
    wait_ready(a, 200);
    for host in [
        "attacker.example",
        "attacker.example:9091",
        "127.0.0.1.nip.io",
    ] {
        let r = admin_raw(a, "GET", "/metrics", host, "");
        assert_eq!(
            (r.status, r.code()),
            (403, "host_not_allowed".into()),
            "{host}"
        );
        let r = admin_raw(a, "POST", "/reload", host, "");
        assert_eq!(r.status, 403, "{host}");
    }
    // Probes are not refused for it; addresses, localhost and listed names are served.
    assert_eq!(
        admin_raw(a, "GET", "/healthz", "attacker.example", "").status,
        200
    );
    for host in [
        a.to_string(),
        "localhost".into(),
        "tollgate-admin.test:80".into(),
    ] {
        assert_eq!(
            admin_raw(a, "GET", "/metrics", &host, "").status,
            200,
            "{host}"
        );
    }
    let page = metrics_page(a);
    assert_eq!(
        metric(&page, r#"tollgate_config_reloads_total{result="success"}"#),
        Some(0.0),
        "no refused reload ran"
    );
}

#[test]
fn no_cross_site_request_can_reload_or_delete() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    config_for(&up).write(&path);
    let gw = Gateway::start_file(&path);
    let a = gw.config.process.admin_listen;
    wait_ready(a, 200);
    let host = a.to_string();
    for more in [
        "Origin: https://attacker.example\r\n",
        "Origin: null\r\n",
        "Sec-Fetch-Site: cross-site\r\n",
        "Sec-Fetch-Site: same-site\r\nOrigin: https://sub.attacker.example\r\n",
        "Content-Type: application/x-www-form-urlencoded\r\nOrigin: http://evil.test\r\n",
    ] {
        for (m, p) in [("POST", "/reload"), ("DELETE", "/api/overrides/pro-1")] {
            let r = admin_raw(a, m, p, &host, more);
            assert_eq!(
                (r.status, r.code()),
                (403, "cross_origin".into()),
                "{m} {p} {more:?}"
            );
        }
    }
    let reloads = |page: &str| metric(page, r#"tollgate_config_reloads_total{result="success"}"#);
    assert_eq!(reloads(&metrics_page(a)), Some(0.0), "nothing was reloaded");
    // Same-origin (the usage page) and tools without those headers (curl) are served.
    let same = format!("Origin: http://{host}\r\n");
    assert_eq!(admin_raw(a, "POST", "/reload", &host, &same).status, 200);
    assert_eq!(admin_raw(a, "POST", "/reload", &host, "").status, 200);
    assert_eq!(reloads(&metrics_page(a)), Some(2.0));
}

#[test]
fn wrong_admin_tokens_block_the_address_and_a_right_guess_does_not_show() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).admin_token("the-admin-token"));
    let a = gw.config.process.admin_listen;
    wait_ready(a, 200);
    let host = a.to_string();
    let with = |token: &str| {
        admin_raw(
            a,
            "GET",
            "/metrics",
            &host,
            &format!("Authorization: Bearer {token}\r\n"),
        )
    };
    // No token is no guess: the page and tools are told to send one, and nothing counts.
    for _ in 0..20 {
        assert_eq!(admin_raw(a, "GET", "/metrics", &host, "").status, 401);
    }
    for i in 0..9 {
        assert_eq!(with(&format!("guess-{i}")).status, 401, "guess {i}");
    }
    let r = with("guess-9");
    assert_eq!(r.status, 401);
    // Blocked: the right token does not show.
    let r = with("the-admin-token");
    assert_eq!((r.status, r.code()), (429, "too_many_auth_failures".into()));
    assert!(r.header("retry-after").is_some());
    // Another address is not.
    let mut s = crate::harness::connect_from("127.0.0.2", a);
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer the-admin-token\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        crate::harness::read_response(&mut BufReader::new(s)).status,
        200
    );
    // Probes never need the token, blocked or not.
    assert_eq!(admin_raw(a, "GET", "/healthz", &host, "").status, 200);
    // The block ends.
    gw.clock.advance(Duration::from_secs(61));
    assert_eq!(with("the-admin-token").status, 200);
}
