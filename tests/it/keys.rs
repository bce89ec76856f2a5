//! Keys that change live, on the wire: the admin API (suspend, resume, revoke, revoke by the
//! secret, a key's own limit and quota), partners' lifecycle operations at the edge, expiry
//! and rotation, and what survives a restart, a `SIGKILL` and a reload, alone (`state.path`)
//! and as a fleet (Redis).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::{
    admin, config_for, eventually, metric, metrics_page, send_raw, wait_ready, Gateway, Mode,
    Process, RedisServer, Response, TestConfig, Upstream,
};

use crate::harness::{admin_json, get_status as call};

/// A partner's `POST` of `{"apiKey": customer}` to `path`.
fn partner(addr: SocketAddr, partner_key: &str, path: &str, customer: &str) -> Response {
    let body = format!(r#"{{"apiKey":"{customer}"}}"#);
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {partner_key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

/// The answer's problem body without what differs between any two answers.
fn problem(r: &Response) -> serde_json::Value {
    let mut v = r.json();
    v.as_object_mut().unwrap().remove("instance");
    v
}

fn state(addr: SocketAddr, name: &str) -> serde_json::Value {
    let r = admin(addr, "GET", &format!("/api/keys/{name}"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[test]
fn an_operator_suspends_resumes_and_revokes_a_key_and_each_refusal_is_the_one_401() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let a = gw.config.process.admin_listen;
    let s = state(a, "basic-1");
    assert_eq!(
        (
            s["state"].as_str(),
            s["plan"].as_str(),
            s["requests_per_window"].as_u64()
        ),
        (Some("active"), Some("basic"), Some(40))
    );
    assert!(!s
        .to_string()
        .contains(&tollgate::digest::Digest::of(b"basic-key-1").to_hex()));
    let unknown = call(gw.addr, "no-such-key");
    assert_eq!(unknown.status, 401);

    let r = admin_json(
        a,
        "POST",
        "/api/keys/basic-1/suspend",
        r#"{"reason":"unpaid invoice"}"#,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["state"], "suspended");
    assert_eq!(r.json()["overrides"][0]["by"], "admin");
    assert_eq!(r.json()["overrides"][0]["detail"], "unpaid invoice");
    let refused = call(gw.addr, "basic-key-1");
    assert_eq!(refused.status, 401);
    assert_eq!(problem(&refused), problem(&unknown), "no oracle");
    assert_eq!(
        refused.header("www-authenticate"),
        unknown.header("www-authenticate")
    );
    assert!(refused.header("www-authenticate").is_some());
    assert_eq!(refused.header("ratelimit-policy"), None);
    assert_eq!(refused.header("ratelimit"), None);

    // Resumed: served again, from the next request.
    let r = admin(a, "POST", "/api/keys/basic-1/resume");
    assert_eq!(
        (r.status, r.json()["state"].as_str()),
        (200, Some("active"))
    );
    assert_eq!(call(gw.addr, "basic-key-1").status, 200);

    // Revoked: for good; a resume is refused.
    assert_eq!(admin(a, "POST", "/api/keys/basic-1/revoke").status, 200);
    assert_eq!(problem(&call(gw.addr, "basic-key-1")), problem(&unknown));
    let r = admin(a, "POST", "/api/keys/basic-1/resume");
    assert_eq!((r.status, r.code().as_str()), (409, "key_revoked"));
    assert_eq!(state(a, "basic-1")["state"], "revoked");

    let r = admin(a, "POST", "/api/keys/nobody/suspend");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_key"));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // A method a path does not take, and a path the listener does not answer: problems too.
    let r = admin(a, "GET", "/api/keys/basic-1/suspend");
    assert_eq!((r.status, r.code().as_str()), (405, "method_not_allowed"));
    assert_eq!(
        (r.header("content-type"), r.header("allow")),
        (Some("application/problem+json"), Some("POST"))
    );
    let r = admin(a, "GET", "/api/nothing-here");
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    let page = metrics_page(a);
    for (series, want) in [
        (r#"tollgate_key_refusals_total{reason="unknown"}"#, 1.0),
        (r#"tollgate_key_refusals_total{reason="suspended"}"#, 1.0),
        (r#"tollgate_key_refusals_total{reason="revoked"}"#, 1.0),
        (
            r#"tollgate_admin_changes_total{action="suspend",result="applied"}"#,
            1.0,
        ),
        (
            r#"tollgate_admin_changes_total{action="suspend",result="refused"}"#,
            1.0,
        ),
        (
            r#"tollgate_admin_changes_total{action="resume",result="applied"}"#,
            1.0,
        ),
        (
            r#"tollgate_admin_changes_total{action="resume",result="refused"}"#,
            1.0,
        ),
        (
            r#"tollgate_admin_changes_total{action="revoke",result="applied"}"#,
            1.0,
        ),
        (r#"tollgate_keys{state="revoked"}"#, 1.0),
        (r#"tollgate_keys{state="active"}"#, 6.0),
    ] {
        assert_eq!(metric(&page, series), Some(want), "{series}\n{page}");
    }
    // The view: the change, by whom; the refusals are no key's.
    let u = admin(a, "GET", "/api/usage").json();
    let changes = u["key_changes"].as_array().unwrap();
    assert_eq!(changes[0]["key"], "basic-1");
    assert_eq!(changes[0]["change"], "revoked");
}

#[test]
fn a_key_of_its_own_limit_and_quota_set_live_and_taken_back() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let a = gw.config.process.admin_listen;
    for (body, pointer) in [
        ("{}", "/requests_per_window"),
        (r#"{"requests_per_window":0}"#, "/requests_per_window"),
        (r#"{"requests_per_window":"5"}"#, "/requests_per_window"),
        (r#"{"requests_per_window":1000001}"#, "/requests_per_window"),
    ] {
        let r = admin_json(a, "PUT", "/api/keys/basic-1/limit", body);
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_body"),
            "{body}"
        );
        assert_eq!(r.json()["errors"][0]["pointer"], pointer);
    }
    assert_eq!(
        admin_json(a, "PUT", "/api/keys/basic-1/limit", "{").code(),
        "invalid_json"
    );
    let r = admin_json(
        a,
        "PUT",
        "/api/keys/basic-1/limit",
        r#"{"requests_per_window":3}"#,
    );
    assert_eq!(
        (r.status, r.json()["requests_per_window"].as_u64()),
        (200, Some(3))
    );
    let statuses: Vec<u16> = (0..4)
        .map(|_| call(gw.addr, "basic-key-1").status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);
    let r = call(gw.addr, "basic-key-1");
    assert_eq!(r.header("ratelimit-policy"), Some("\"basic-1\";q=3;w=10"));
    assert_eq!(admin(a, "DELETE", "/api/keys/basic-1/limit").status, 200);
    let r = call(gw.addr, "basic-key-1");
    assert_eq!(r.header("ratelimit-policy"), Some("\"basic\";q=40;w=10"));

    let r = admin_json(
        a,
        "PUT",
        "/api/keys/pro-1/quota",
        r#"{"requests":1000,"per":"week"}"#,
    );
    assert_eq!(r.json()["errors"][0]["pointer"], "/per");
    for body in [
        r#"{"requests":0,"per":"day"}"#,
        r#"{"requests":1000000000001,"per":"day"}"#,
        r#"{"requests":18446744073709551615,"per":"day"}"#,
    ] {
        let r = admin_json(a, "PUT", "/api/keys/pro-1/quota", body);
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_body"),
            "{body}"
        );
        assert_eq!(r.json()["errors"][0]["pointer"], "/requests");
    }
    let r = admin_json(
        a,
        "PUT",
        "/api/keys/pro-1/quota",
        r#"{"requests":1000,"per":"month"}"#,
    );
    assert_eq!(r.status, 200);
    let q = &r.json()["quota"];
    assert_eq!(
        (q["requests"].as_u64(), q["per"].as_str()),
        (Some(1000), Some("month"))
    );
    assert!(
        q["resets_at"].as_str().unwrap().ends_with("-01T00:00:00Z"),
        "{q}"
    );
    assert_eq!(
        admin(a, "DELETE", "/api/keys/pro-1/quota").json()["quota"],
        serde_json::Value::Null
    );
    // A partner key has no limit of its own.
    let r = admin_json(
        a,
        "PUT",
        "/api/keys/acme/limit",
        r#"{"requests_per_window":3}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (400, "not_a_customer_key"));
}

#[test]
fn partners_suspend_resume_and_delete_their_customers_at_the_edge() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let a = gw.config.process.admin_listen;
    let r = partner(
        gw.addr,
        "acme-partner-key",
        "/v2/service/suspend",
        "acme-customer-key",
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        call(gw.addr, "acme-customer-key").status,
        401,
        "the next request"
    );
    let s = state(a, "acme-customer");
    assert_eq!(
        (s["state"].as_str(), s["overrides"][0]["by"].as_str()),
        (Some("suspended"), Some("partner:acme"))
    );
    let r = partner(
        gw.addr,
        "acme-partner-key",
        "/v2/service/resume",
        "acme-customer-key",
    );
    assert_eq!(r.status, 200);
    assert_eq!(call(gw.addr, "acme-customer-key").status, 200);
    // Another partner's customer, a key no partner manages (the operator's customer, a
    // partner's own key), a key the gateway does not know: 403, not forwarded, for every
    // operation.
    let before = up.count();
    for path in [
        "/v2/service/delete",
        "/v2/service/suspend",
        "/v2/service/resume",
    ] {
        for (who, customer) in [
            ("globex-partner-key", "acme-customer-key"),
            ("acme-partner-key", "basic-key-1"),
            ("acme-partner-key", "pro-key-1"),
            ("acme-partner-key", "globex-partner-key"),
            ("acme-partner-key", "a-key-nobody-has"),
            ("acme-partner-key", "ACME-CUSTOMER-KEY"),
        ] {
            let r = partner(gw.addr, who, path, customer);
            assert_eq!(
                (r.status, r.code().as_str()),
                (403, "not_your_customer"),
                "{path} {who} {customer}"
            );
        }
    }
    let r = gw.call(
        "acme-partner-key",
        "POST",
        "/v2/service/upgrade",
        r#"{"apiKey":"pro-key-1","planID":1}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (403, "not_your_customer"));
    assert_eq!(up.count(), before, "not forwarded");
    assert_eq!(state(a, "globex")["state"], "active");
    assert_eq!(state(a, "pro-1")["plan"], "pro");
    assert_eq!(call(gw.addr, "basic-key-1").status, 200);
    // The operator's suspension outranks the partner: its resume does not lift it.
    let r = admin_json(
        a,
        "POST",
        "/api/keys/acme-customer/suspend",
        r#"{"reason":"abuse"}"#,
    );
    assert_eq!(r.status, 200);
    let r = partner(
        gw.addr,
        "acme-partner-key",
        "/v2/service/resume",
        "acme-customer-key",
    );
    assert_eq!(r.status, 200, "the provider's answer");
    assert_eq!(call(gw.addr, "acme-customer-key").status, 401);
    assert_eq!(
        metric(
            &metrics_page(a),
            r#"tollgate_admin_changes_total{action="partner_resume",result="refused"}"#
        ),
        Some(1.0)
    );
    let s = state(a, "acme-customer");
    assert_eq!(
        (s["state"].as_str(), s["overrides"][0]["by"].as_str()),
        (Some("suspended"), Some("admin"))
    );
    assert_eq!(
        admin(a, "POST", "/api/keys/acme-customer/resume").status,
        200
    );
    assert_eq!(call(gw.addr, "acme-customer-key").status, 200);
    let r = partner(gw.addr, "acme-partner-key", "/v2/service/delete", "");
    assert_eq!(
        (r.status, r.json()["errors"][0]["pointer"].as_str()),
        (400, Some("/apiKey"))
    );
    // Deleted: revoked for good.
    assert_eq!(
        partner(
            gw.addr,
            "acme-partner-key",
            "/v2/service/delete",
            "acme-customer-key"
        )
        .status,
        200
    );
    assert_eq!(call(gw.addr, "acme-customer-key").status, 401);
    assert_eq!(state(a, "acme-customer")["state"], "revoked");
    let page = metrics_page(a);
    for (series, want) in [
        (
            r#"tollgate_admin_changes_total{action="partner_suspend",result="applied"}"#,
            1.0,
        ),
        (
            r#"tollgate_admin_changes_total{action="partner_resume",result="applied"}"#,
            1.0,
        ),
        (
            r#"tollgate_admin_changes_total{action="partner_delete",result="applied"}"#,
            1.0,
        ),
    ] {
        assert_eq!(metric(&page, series), Some(want), "{series}");
    }
}

#[test]
fn a_partner_operation_the_upstream_refuses_changes_nothing() {
    let up = Upstream::start(Mode::Status(409));
    let gw = Gateway::with(&up);
    let r = partner(
        gw.addr,
        "acme-partner-key",
        "/v2/service/suspend",
        "acme-customer-key",
    );
    assert_eq!(r.status, 409);
    assert_eq!(
        state(gw.config.process.admin_listen, "acme-customer")["state"],
        "active"
    );
}

/// An RFC 3339 instant `ms` from now.
fn in_ms(ms: u64) -> String {
    let at = std::time::SystemTime::now() + Duration::from_millis(ms);
    let t = time::OffsetDateTime::from(at);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

#[test]
fn a_key_expires_and_a_previous_digest_stops_at_their_instant() {
    let up = Upstream::start(Mode::Ok);
    let config = config_for(&up)
        .key_with("basic-1", |k| k.expires_at = Some(in_ms(1500)))
        .key_with("pro-1", |k| {
            k.previous.push(tollgate::config::file::FilePrevious {
                sha256: tollgate::digest::Digest::of(b"old-pro-key").to_hex(),
                until: in_ms(1500),
            })
        });
    let gw = Gateway::start(&config);
    let a = gw.config.process.admin_listen;
    let started = Instant::now();
    assert_eq!(call(gw.addr, "basic-key-1").status, 200);
    let old = call(gw.addr, "old-pro-key");
    assert_eq!(old.status, 200, "the previous key is the same key");
    assert_eq!(old.header("ratelimit-policy"), Some("\"pro\";q=150;w=10"));
    assert_eq!(call(gw.addr, "pro-key-1").remaining(), 148, "one budget");
    eventually("the key expires", || {
        call(gw.addr, "basic-key-1").status == 401
    });
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "not before its instant"
    );
    eventually("the previous digest stops", || {
        call(gw.addr, "old-pro-key").status == 401
    });
    assert_eq!(call(gw.addr, "pro-key-1").status, 200);
    assert_eq!(state(a, "basic-1")["state"], "expired");
    let page = metrics_page(a);
    assert_eq!(
        metric(&page, r#"tollgate_keys{state="expired"}"#),
        Some(1.0)
    );
    assert!(metric(&page, r#"tollgate_key_refusals_total{reason="expired"}"#).unwrap() >= 2.0);
}

/// The binary on `config`, written to `dir/<tag>.yaml`; its listener and admin addresses.
fn spawn(dir: &Path, tag: &str, config: &TestConfig) -> (Process, SocketAddr, SocketAddr) {
    Process::run(dir, tag, config)
}

#[test]
fn changes_kept_on_disk_outlive_a_restart_and_a_kill_and_a_yaml_change_drops_them() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let state_db = dir.path().join("state.db");
    let config = config_for(&up).state_path(state_db.to_str().unwrap());
    let (mut p, listen, a) = spawn(dir.path(), "gw", &config);
    assert_eq!(admin(a, "POST", "/api/keys/basic-1/suspend").status, 200);
    let r = admin_json(
        a,
        "PUT",
        "/api/keys/standard-1/limit",
        r#"{"requests_per_window":5}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(call(listen, "basic-key-1").status, 401);
    p.stop();
    let out = p.output();
    let changed: Vec<&str> = out.lines().filter(|l| l.contains("key changed")).collect();
    assert_eq!(changed.len(), 2, "{out}");
    assert!(
        changed[0].contains("key=basic-1") && changed[0].contains("by=admin"),
        "{}",
        changed[0]
    );
    assert!(
        out.lines().any(|l| l.contains("tollgate::access")
            && l.contains("reason=suspended")
            && l.contains("key=\"basic-1\"")),
        "{out}"
    );
    assert!(!out.contains("basic-key-1"), "a key in the log");

    // A clean restart, then a kill: both changes are there each time.
    let (mut p, listen, _) = spawn(dir.path(), "gw", &config);
    assert_eq!(call(listen, "basic-key-1").status, 401);
    p.signal("KILL");
    let _ = p.wait_exit(Duration::from_secs(10));
    let (_p, listen, a) = spawn(dir.path(), "gw", &config);
    assert_eq!(call(listen, "basic-key-1").status, 401);
    assert_eq!(
        call(listen, "standard-key-1").header("ratelimit-policy"),
        Some("\"standard-1\";q=5;w=10")
    );

    // `check` lists what is in force.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args([
            "check",
            "--config",
            dir.path().join("gw.yaml").to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.contains("key change    basic-1: suspended by admin"),
        "{out}"
    );
    assert!(
        out.contains("key change    standard-1: limit 5 by admin"),
        "{out}"
    );

    // The YAML moves basic-1 to pro: the later decision wins; standard-1's limit stays.
    config
        .clone()
        .key_plan("basic-1", "pro")
        .write(&dir.path().join("gw.yaml"));
    assert_eq!(admin(a, "POST", "/reload").status, 200);
    assert_eq!(call(listen, "basic-key-1").status, 200);
    assert_eq!(state(a, "basic-1")["overrides"], serde_json::json!([]));
    assert_eq!(state(a, "standard-1")["requests_per_window"], 5);
}

#[test]
fn a_damaged_state_file_is_set_aside_and_no_revocation_is_undone() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let state_db = dir.path().join("state.db");
    let config = config_for(&up).state_path(state_db.to_str().unwrap());
    let (mut p, listen, a) = spawn(dir.path(), "gw", &config);
    assert_eq!(admin(a, "POST", "/api/keys/basic-1/revoke").status, 200);
    assert_eq!(admin(a, "POST", "/api/keys/standard-1/suspend").status, 200);
    assert_eq!(call(listen, "basic-key-1").status, 401);
    p.stop();
    // Damaged from outside (a disk fault, a copy cut short): the first 4 KiB of it left.
    let whole = std::fs::read(&state_db).unwrap();
    std::fs::write(&state_db, &whole[..4096]).unwrap();

    let (mut p, listen, a) = spawn(dir.path(), "gw", &config);
    assert_eq!(call(listen, "basic-key-1").status, 401, "revoked still");
    assert_eq!(
        call(listen, "standard-key-1").status,
        401,
        "suspended still"
    );
    assert_eq!(call(listen, "pro-key-1").status, 200);
    assert_eq!(admin(a, "GET", "/readyz").status, 200);
    p.stop();
    let out = p.output();
    let line = out
        .lines()
        .find(|l| l.contains("state.path is not a usable database"))
        .unwrap_or_else(|| panic!("no error line: {out}"));
    assert!(
        line.contains("ERROR") && line.contains("restored=2 overrides"),
        "{line}"
    );
    let aside: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("state.db.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        std::fs::read(dir.path().join(&aside[0])).unwrap(),
        &whole[..4096],
        "kept as it was"
    );
}

#[test]
fn a_leaked_key_revoked_by_its_secret_on_one_replica_is_refused_on_the_other_within_a_second() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = |i: usize| {
        config_for(&up)
            .cluster(&redis.url(), &format!("lk{}", redis.port), 100)
            .log_format(if i == 0 { "text" } else { "json" })
    };
    let (a, b) = (config(0), config(1));
    let (mut pa, la, admin_a) = spawn(dir.path(), "a", &a);
    let (mut pb, lb, _) = spawn(dir.path(), "b", &b);
    assert_eq!(call(lb, "pro-key-1").status, 200);
    let r = admin_json(
        admin_a,
        "POST",
        "/api/keys/revoke",
        r#"{"key":"no-such-secret"}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_key"));
    let r = admin_json(
        admin_a,
        "POST",
        "/api/keys/revoke",
        // As it leaked: an Authorization value, with the line's end.
        r#"{"key":"Bearer pro-key-1\n"}"#,
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json(),
        serde_json::json!({"name": "pro-1", "state": "revoked"})
    );
    assert_eq!(
        call(la, "pro-key-1").status,
        401,
        "at once on the replica that took it"
    );
    let revoked = Instant::now();
    loop {
        if call(lb, "pro-key-1").status == 401 {
            break;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(1),
            "replica b still serves it after 1 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Redis holds neither the key nor its digest.
    let mut con = redis.client();
    let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let digest = tollgate::digest::Digest::of(b"pro-key-1").to_hex();
    for n in &names {
        let dump: Vec<u8> = redis::cmd("DUMP")
            .arg(n)
            .query(&mut con)
            .unwrap_or_default();
        let dump = String::from_utf8_lossy(&dump);
        assert!(!n.contains("pro-key-1") && !dump.contains("pro-key-1") && !dump.contains(&digest));
    }

    // A restarted replica finds it; so does a reload of the same YAML.
    pb.stop();
    let (mut pb, lb, admin_b) = spawn(dir.path(), "b", &b);
    eventually("the restarted replica refuses it", || {
        call(lb, "pro-key-1").status == 401
    });
    assert_eq!(admin(admin_b, "POST", "/reload").status, 200);
    assert_eq!(call(lb, "pro-key-1").status, 401);
    // A new sha256 in the YAML serves again; the revoked secret never does.
    let renewed = b
        .clone()
        .key_with("pro-1", |k| k.key = Some("pro-key-2".into()));
    renewed.write(&dir.path().join("b.yaml"));
    assert_eq!(admin(admin_b, "POST", "/reload").status, 200);
    assert_eq!(call(lb, "pro-key-2").status, 200);
    assert_eq!(call(lb, "pro-key-1").status, 401);

    // Redis stopped: a change cannot be kept, so it is refused, and applied nowhere.
    let _ = redis.kill();
    let r = admin(admin_b, "POST", "/api/keys/basic-1/suspend");
    assert_eq!((r.status, r.code().as_str()), (503, "change_not_kept"));
    assert_eq!(call(lb, "basic-key-1").status, 200);
    assert_eq!(call(la, "basic-key-1").status, 200);
    assert_eq!(state(admin_b, "basic-1")["state"], "active");
    assert_eq!(
        metric(
            &metrics_page(admin_b),
            r#"tollgate_admin_changes_total{action="suspend",result="refused"}"#
        ),
        Some(1.0)
    );
    pa.stop();
    pb.stop();
    for p in [&pa, &pb] {
        let out = p.output();
        assert!(
            !out.contains("pro-key-1") && !out.contains(&digest),
            "a key or digest in the log"
        );
    }
}

#[test]
fn a_reload_that_changes_a_suspended_key_ends_the_suspension_on_every_replica() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = || config_for(&up).cluster(&redis.url(), &format!("rl{}", redis.port), 100);
    let (a, b) = (config(), config());
    let (_pa, la, admin_a) = spawn(dir.path(), "a", &a);
    let (_pb, lb, admin_b) = spawn(dir.path(), "b", &b);
    let r = admin_json(admin_a, "POST", "/api/keys/basic-1/suspend", "{}");
    assert_eq!(r.status, 200);
    eventually("replica b refuses it", || {
        call(lb, "basic-key-1").status == 401
    });
    // Replica b's YAML moves the key to pro: the later decision wins, on b and then on a.
    b.clone()
        .key_plan("basic-1", "pro")
        .write(&dir.path().join("b.yaml"));
    assert_eq!(admin(admin_b, "POST", "/reload").status, 200);
    assert_eq!(call(lb, "basic-key-1").status, 200);
    eventually("replica a serves it too", || {
        call(la, "basic-key-1").status == 200
    });
    assert_eq!(state(admin_a, "basic-1")["state"], "active");
}

/// Two replicas' setting beside one Redis: replica a with `cluster` alone, replica b
/// ([`BesideRedis::b`]) with its copy at `state_db` too.
struct BesideRedis {
    up: Upstream,
    redis: RedisServer,
    /// The replicas' configs and logs.
    dir: tempfile::TempDir,
    /// Where replica b keeps its copy (`b-state.db` in `dir`).
    state_db: std::path::PathBuf,
    /// The Redis's key prefix: the test's tag and the Redis's port.
    prefix: String,
    /// Replica a's config.
    a: TestConfig,
}

fn beside_redis(tag: &str) -> BesideRedis {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let state_db = dir.path().join("b-state.db");
    let prefix = format!("{tag}{}", redis.port);
    let a = config_for(&up).cluster(&redis.url(), &prefix, 100);
    BesideRedis {
        up,
        redis,
        dir,
        state_db,
        prefix,
        a,
    }
}

impl BesideRedis {
    /// Replica b's config: the fleet's Redis at `redis_url` (this Redis, or a proxy in front
    /// of it), its copy at `state_db`.
    fn b(&self, redis_url: &str) -> TestConfig {
        config_for(&self.up)
            .cluster(redis_url, &self.prefix, 100)
            .state_path(self.state_db.to_str().unwrap())
    }
}

/// `pro-key-1` revoked through the admin API at `admin_addr`.
fn revoke_pro_key(admin_addr: SocketAddr) {
    let r = admin_json(
        admin_addr,
        "POST",
        "/api/keys/revoke",
        r#"{"key":"pro-key-1"}"#,
    );
    assert_eq!(r.status, 200);
}

#[test]
fn with_state_path_beside_redis_a_revocation_holds_through_a_restart_while_redis_is_down() {
    let s = beside_redis("mr");
    // No grace to wait out: b stops on SIGTERM at once (below).
    let b = s.b(&s.redis.url()).shutdown(0, 0, 5);
    let (_pa, _, admin_a) = spawn(s.dir.path(), "a", &s.a);
    let (mut pb, lb, _) = spawn(s.dir.path(), "b", &b);
    revoke_pro_key(admin_a);
    eventually("replica b refuses it", || {
        call(lb, "pro-key-1").status == 401
    });
    // Stopped gracefully (SIGTERM: its copy closed clean, for `check` to read below).
    pb.signal("TERM");
    pb.wait_exit(Duration::from_secs(30))
        .expect("exits on SIGTERM");
    // Redis goes away; replica b starts again from its copy at state.path.
    let _ = s.redis.kill();
    let path = s.dir.path().join("b.yaml");
    // `check` says so too: Redis not there, b's own copy read instead.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("not read from Redis") && text.contains("pro-1: revoked by admin"),
        "{text}"
    );
    let p = Process::spawn(
        s.dir.path(),
        "b2",
        &["run", "--config", path.to_str().unwrap()],
        &[("TOLLGATE_LOG", "info")],
    );
    wait_ready(b.file.admin_listen.parse().unwrap(), 200);
    assert_eq!(
        call(lb, "pro-key-1").status,
        401,
        "revoked, with Redis down"
    );
    assert_eq!(call(lb, "basic-key-1").status, 200);
    drop(p);
}

/// A revocation a replica learns through a whole read of the fleet's set is in force there
/// only once its copy at `state.path` holds it: b's disk is held (a write transaction of this
/// test's own on the file) while b reads the set, so b serves the key until the copy is
/// written; then it refuses it, and after a `SIGKILL` and a start with Redis down it still
/// does. (Put in force first and copied after, a kill in between restarted b without it.)
#[test]
fn a_revocation_read_whole_is_in_force_only_once_state_path_holds_it() {
    let s = beside_redis("wr");
    let (mut pa, _, admin_a) = spawn(s.dir.path(), "a", &s.a);
    revoke_pro_key(admin_a);
    pa.stop();
    // b reaches Redis through a proxy that holds its connections until the test lets them
    // through: b starts, serves from its (empty) copy, and has read nothing.
    let gate = crate::harness::DelayProxy::holding_after(
        format!("127.0.0.1:{}", s.redis.port).parse().unwrap(),
        0,
    );
    let b = s.b(&format!("redis://127.0.0.1:{}", gate.port));
    let (mut pb, lb, _) = spawn(s.dir.path(), "b", &b);
    assert_eq!(call(lb, "pro-key-1").status, 200, "nothing read yet");
    // The file as b opens it (redb's multi-process mode): b's next write waits for this one.
    let held = {
        let mut builder = redb::Builder::new();
        builder.set_concurrency_mode(redb::ConcurrencyMode::MultiWriter);
        let db = builder.create(&s.state_db).unwrap();
        db.begin_write().unwrap()
    };
    let hscans = |redis: &RedisServer| -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut redis.client())
            .unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_hscan:calls="))
            .and_then(|v| v.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    assert_eq!(hscans(&s.redis), 0);
    gate.release();
    eventually("b reads the set whole", || hscans(&s.redis) > 0);
    // The set is a few fields: b has read it within milliseconds, and waits for the disk.
    for _ in 0..50 {
        assert_eq!(
            call(lb, "pro-key-1").status,
            200,
            "in force before the copy at state.path holds it"
        );
    }
    drop(held);
    eventually("b refuses it once its copy holds it", || {
        call(lb, "pro-key-1").status == 401
    });
    pb.signal("KILL");
    pb.wait_exit(Duration::from_secs(15)).expect("killed");
    drop(gate);
    let _ = s.redis.kill();
    let (_pb, lb, _) = spawn(s.dir.path(), "b2", &b);
    assert_eq!(
        call(lb, "pro-key-1").status,
        401,
        "revoked, with Redis down, after a SIGKILL"
    );
}

/// The names of a `GET /api/keys` page, and its `next`.
fn page(addr: SocketAddr, query: &str) -> (Vec<String>, Option<String>) {
    let r = admin(addr, "GET", &format!("/api/keys{query}"));
    assert_eq!(
        r.status,
        200,
        "{query}: {}",
        String::from_utf8_lossy(&r.body)
    );
    let v = r.json();
    let names = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["name"].as_str().unwrap().to_string())
        .collect();
    (names, v["next"].as_str().map(String::from))
}

#[test]
fn the_keys_are_listed_in_name_order_page_by_page_and_filtered() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let a = gw.config.process.admin_listen;
    let all = [
        "acme",
        "acme-customer",
        "basic-1",
        "globex",
        "globex-customer",
        "pro-1",
        "standard-1",
    ];
    // One page: every key, in name order, each as GET /api/keys/{name} gives it (with its
    // source), and never a digest.
    let r = admin(a, "GET", "/api/keys");
    let v = r.json();
    assert_eq!(v["next"], serde_json::Value::Null);
    let keys = v["keys"].as_array().unwrap();
    let names: Vec<&str> = keys.iter().map(|k| k["name"].as_str().unwrap()).collect();
    assert_eq!(names, all);
    assert_eq!(keys[2], state(a, "basic-1"));
    assert!(keys.iter().all(|k| k["source"] == "config"));
    let body = String::from_utf8_lossy(&r.body);
    for digest in gw.config.keys.iter().map(|k| k.digest.to_hex()) {
        assert!(!body.contains(&digest), "a digest in the list");
    }
    // Pages of two, each from the `next` of the one before: the same keys, once each.
    let (mut seen, mut next) = page(a, "?limit=2");
    while let Some(cursor) = next {
        let (more, after) = page(a, &format!("?limit=2&cursor={cursor}"));
        assert!(more.len() <= 2 && !more.is_empty());
        seen.extend(more);
        next = after;
    }
    assert_eq!(seen, all);
    // Filters.
    assert_eq!(page(a, "?plan=basic").0, ["acme-customer", "basic-1"]);
    assert_eq!(page(a, "?partner=acme").0, ["acme", "acme-customer"]);
    assert_eq!(
        page(a, "?plan=pro&limit=1"),
        (vec!["pro-1".to_string()], None)
    );
    assert!(page(a, "?source=api").0.is_empty());
    assert!(page(a, "?state=suspended").0.is_empty());
    let r = admin_json(a, "POST", "/api/keys/basic-1/suspend", "");
    assert_eq!(r.status, 200);
    assert_eq!(page(a, "?state=suspended").0, ["basic-1"]);
    assert_eq!(page(a, "?state=active&plan=basic").0, ["acme-customer"]);
    // A filter that names nothing that exists, a bad page size, a parameter unknown or
    // repeated: 400 naming it.
    for (query, name) in [
        ("?plan=gold", "`plan`"),
        ("?partner=initech", "`partner`"),
        ("?limit=0", "`limit`"),
        ("?limit=1001", "`limit`"),
        ("?state=paused", "`state`"),
        ("?cursor=not-hex", "`cursor`"),
        ("?sort=name", "`sort`"),
        ("?plan=basic&plan=pro", "`plan`"),
        ("?limit=2&limit=3", "`limit`"),
    ] {
        let r = admin(a, "GET", &format!("/api/keys{query}"));
        assert_eq!(r.status, 400, "{query}");
        let p = r.json();
        assert_eq!(p["code"], "invalid_query", "{query}");
        assert!(p["detail"].as_str().unwrap().contains(name), "{query}: {p}");
    }
    let r = admin(a, "DELETE", "/api/keys");
    assert_eq!(
        (r.status, r.header("allow")),
        (405, Some("GET, HEAD, POST"))
    );
}
