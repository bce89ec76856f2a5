//! Partner upgrades at the edge, on the wire: applied from the next request when the upstream
//! accepts them, kept across reloads, restarts and a crash, shared by replicas through Redis,
//! and managed on the admin listener behind its token.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{
    admin, admin_with, config_for, eventually, metric, metrics_page, send_raw, wait_ready, Gateway,
    Mode, Process, RedisServer, Response, TestConfig, Upstream,
};

const HOOK: &str = r#"{"url":"https://hooks.example.com/x"}"#;

fn upgrade_body(key: &str, plan_id: i64) -> String {
    format!(r#"{{"apiKey":"{key}","planID":{plan_id}}}"#)
}

/// `POST /v2/service/upgrade` from acme's partner key.
fn upgrade(addr: SocketAddr, customer: &str, plan_id: i64) -> Response {
    post(
        addr,
        "acme-partner-key",
        "/v2/service/upgrade",
        &upgrade_body(customer, plan_id),
    )
}

fn post(addr: SocketAddr, key: &str, path: &str, body: &str) -> Response {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

fn overrides(addr: SocketAddr, token: Option<&str>) -> Vec<serde_json::Value> {
    let r = admin_with(addr, "GET", "/api/overrides", token);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["overrides"].as_array().unwrap().clone()
}

#[test]
fn an_accepted_upgrade_applies_from_the_next_request_and_the_operator_can_take_it_back() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let admin_addr = gw.config.process.admin_listen;
    // Basic: no webhooks.
    let r = gw.call(
        "acme-customer-key",
        "POST",
        "/v2/settings/webhook/set",
        HOOK,
    );
    assert_eq!((r.status, r.code().as_str()), (403, "plan_restricted"));
    assert_eq!(upgrade(gw.addr, "acme-customer-key", 2).status, 200);
    // The very next request: Standard's allow-list and limit.
    let r = gw.call(
        "acme-customer-key",
        "POST",
        "/v2/settings/webhook/set",
        HOOK,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("ratelimit-policy"), Some("\"standard\";q=70;w=10"));
    let list = overrides(admin_addr, None);
    assert_eq!(list.len(), 1);
    let o = &list[0];
    assert_eq!(o["key"], "acme-customer");
    assert_eq!(
        (o["plan"].as_str(), o["plan_id"].as_u64()),
        (Some("standard"), Some(2))
    );
    assert_eq!(o["replaced"], "basic");
    assert_eq!(o["partner"], "acme");
    let page = metrics_page(admin_addr);
    assert_eq!(metric(&page, "tollgate_plan_overrides"), Some(1.0));
    assert!(!page.contains("acme-customer-key"));

    // The operator takes it back: Basic again, from the next request.
    let r = admin(admin_addr, "DELETE", "/api/overrides/acme-customer");
    assert_eq!(r.status, 204);
    let r = gw.call(
        "acme-customer-key",
        "POST",
        "/v2/settings/webhook/set",
        HOOK,
    );
    assert_eq!(r.status, 403);
    assert_eq!(
        metric(&metrics_page(admin_addr), "tollgate_plan_overrides"),
        Some(0.0)
    );
    let r = admin(admin_addr, "DELETE", "/api/overrides/acme-customer");
    assert_eq!(r.status, 404);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(r.json()["code"], "no_override");
}

#[test]
fn the_budget_carries_over_and_an_upgrade_back_to_the_yaml_plan_ends_the_override() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    for _ in 0..20 {
        assert_eq!(
            gw.call("acme-customer-key", "GET", "/v2/client/getStatus", "")
                .status,
            200
        );
    }
    // Half of Basic's window spent: half of Pro's is left.
    assert_eq!(upgrade(gw.addr, "acme-customer-key", 3).status, 200);
    let r = gw.call("acme-customer-key", "GET", "/v2/client/getStatus", "");
    assert_eq!(r.header("ratelimit-policy"), Some("\"pro\";q=150;w=10"));
    assert_eq!(r.remaining(), 74);
    assert_eq!(upgrade(gw.addr, "acme-customer-key", 1).status, 200);
    let r = gw.call("acme-customer-key", "GET", "/v2/client/getStatus", "");
    assert_eq!(r.header("ratelimit-policy"), Some("\"basic\";q=40;w=10"));
    assert!(overrides(gw.config.process.admin_listen, None).is_empty());
}

#[test]
fn an_unknown_plan_is_400_and_not_forwarded_and_a_refused_upgrade_changes_nothing() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let r = upgrade(gw.addr, "acme-customer-key", 99);
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_body"));
    assert_eq!(r.json()["errors"][0]["pointer"], "/planID");
    assert_eq!(up.count(), 0, "not forwarded");

    let refusing = Upstream::start(Mode::Status(409));
    let gw = Gateway::with(&refusing);
    assert_eq!(upgrade(gw.addr, "acme-customer-key", 2).status, 409);
    let r = gw.call(
        "acme-customer-key",
        "POST",
        "/v2/settings/webhook/set",
        HOOK,
    );
    assert_eq!(r.status, 403, "a non-2xx answer changes nothing");
    assert!(overrides(gw.config.process.admin_listen, None).is_empty());
}

#[test]
fn a_reload_that_moves_the_key_or_drops_it_drops_the_override() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.yaml");
    // basic-1 managed by acme too: a partner acts only on its own customers.
    let config = config_for(&up).key_with("basic-1", |k| k.partner = Some("acme".into()));
    config.write(&path);
    let gw = Gateway::start_file(&path);
    for key in ["acme-customer-key", "basic-key-1"] {
        assert_eq!(upgrade(gw.addr, key, 2).status, 200);
    }
    // A reload that changes nothing for them keeps both.
    gw.live.reload().unwrap();
    assert_eq!(overrides(gw.config.process.admin_listen, None).len(), 2);
    // The YAML puts acme-customer on Pro itself and drops basic-1: the later decision wins.
    config
        .clone()
        .key_plan("acme-customer", "pro")
        .without_key("basic-1")
        .write(&path);
    gw.live.reload().unwrap();
    assert!(overrides(gw.config.process.admin_listen, None).is_empty());
    let r = gw.call("acme-customer-key", "GET", "/v2/client/getStatus", "");
    assert_eq!(r.header("ratelimit-policy"), Some("\"pro\";q=150;w=10"));
    assert_eq!(
        gw.call("basic-key-1", "GET", "/v2/client/getStatus", "")
            .status,
        401
    );
    // Back in the YAML, basic-1 is on Basic: its override is gone for good.
    config.write(&path);
    gw.live.reload().unwrap();
    let r = gw.call("basic-key-1", "GET", "/v2/client/getStatus", "");
    assert_eq!(r.header("ratelimit-policy"), Some("\"basic\";q=40;w=10"));
}

#[test]
fn the_admin_listener_needs_its_token_but_for_the_probes() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up).admin_token("admin-secret-1"));
    let a = gw.config.process.admin_listen;
    // The probes need no token (wait_ready sends none).
    wait_ready(a, 200);
    for path in ["/metrics", "/api/overrides"] {
        for token in [None, Some("wrong")] {
            let r = admin_with(a, "GET", path, token);
            assert_eq!(r.status, 401, "{path} {token:?}");
            assert_eq!(r.header("content-type"), Some("application/problem+json"));
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer realm=\"tollgate-admin\"")
            );
            assert!(!String::from_utf8_lossy(&r.body).contains("admin-secret"));
        }
        assert_eq!(
            admin_with(a, "GET", path, Some("admin-secret-1")).status,
            200
        );
    }
    assert_eq!(admin_with(a, "POST", "/reload", None).status, 401);
    assert_eq!(
        admin_with(a, "DELETE", "/api/overrides/x", None).status,
        401
    );
    assert_eq!(admin_with(a, "GET", "/healthz", None).status, 200);
    assert_eq!(admin_with(a, "GET", "/readyz", None).status, 200);
}

/// The binary on `config`, written to `dir/<tag>.yaml`; its listener and admin addresses.
fn spawn(dir: &Path, tag: &str, config: &TestConfig) -> (Process, SocketAddr, SocketAddr) {
    Process::run(dir, tag, config)
}

/// `n` more customer keys managed by acme, on Basic: `cust-NN` / `cust-key-NN`.
fn with_customers(mut c: TestConfig, n: usize) -> TestConfig {
    for i in 0..n {
        c = c.add_key(
            &format!("cust-{i:02}"),
            &format!("cust-key-{i:02}"),
            "basic",
        );
        if let Some(k) = c.file.keys.last_mut() {
            k.partner = Some("acme".into());
        }
    }
    c
}

#[test]
fn upgrades_are_kept_on_disk_across_a_restart_and_a_crash() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.db");
    let config = with_customers(config_for(&up), 40).state_path(state.to_str().unwrap());

    // Applied, logged, kept; a clean restart finds it.
    let (mut p, listen, _) = spawn(dir.path(), "first", &config);
    assert_eq!(upgrade(listen, "acme-customer-key", 2).status, 200);
    p.stop();
    let out = p.output();
    let applied: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("plan override applied"))
        .collect();
    assert_eq!(applied.len(), 1, "{out}");
    for field in [
        "key=acme-customer",
        "from=basic",
        "to=standard",
        "partner=acme",
    ] {
        assert!(applied[0].contains(field), "{}", applied[0]);
    }
    assert!(
        out.lines()
            .any(|l| l.contains("tollgate::access") && l.contains("upgrade=\"basic->standard\"")),
        "{out}"
    );
    assert!(!out.contains("acme-customer-key"), "a key in the log");
    let (mut p, listen, _) = spawn(dir.path(), "second", &config);
    let r = post(
        listen,
        "acme-customer-key",
        "/v2/settings/webhook/set",
        HOOK,
    );
    assert_eq!(r.status, 200, "the override outlived the process");

    // A crash while upgrades are being written: every acknowledged one is there after.
    let acked: Arc<Mutex<HashMap<usize, i64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop) = (Arc::clone(&acked), Arc::clone(&stop));
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(20);
            let mut i = 0usize;
            while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                let (cust, plan) = (i % 40, 2 + (i / 40 % 2) as i64);
                let body = upgrade_body(&format!("cust-key-{cust:02}"), plan);
                let raw = format!(
                    "POST /v2/service/upgrade HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer acme-partner-key\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                if let Some(r) = crate::harness::try_send_raw(listen, raw.as_bytes()) {
                    if r.status == 200 {
                        acked.lock().unwrap().insert(cust, plan);
                    }
                }
                i += 1;
            }
        })
    };
    eventually("some upgrades acknowledged", || {
        acked.lock().unwrap().len() >= 30
    });
    p.signal("KILL");
    let _ = p.wait_exit(Duration::from_secs(10));
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    let (_p, _, admin_addr) = spawn(dir.path(), "third", &config);
    let kept: HashMap<String, String> = overrides(admin_addr, None)
        .iter()
        .map(|o| {
            (
                o["key"].as_str().unwrap().to_string(),
                o["plan"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (cust, plan) in &acked {
        let want = if *plan == 2 { "standard" } else { "pro" };
        assert_eq!(
            kept.get(&format!("cust-{cust:02}")).map(String::as_str),
            Some(want),
            "the acknowledged upgrade of cust-{cust:02} was lost"
        );
    }
    assert_eq!(
        kept.get("acme-customer").map(String::as_str),
        Some("standard")
    );
}

#[test]
fn with_a_cluster_every_replica_applies_an_upgrade_within_a_second_and_keeps_it() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = |i: usize| {
        crate::harness::config_for(&up)
            .cluster(&redis.url(), &format!("ov{}", redis.port), 100)
            .listen(format!("127.0.0.1:{}", crate::harness::closed_port()))
            .admin_listen(format!("127.0.0.1:{}", crate::harness::closed_port()))
            .log_format(if i == 0 { "text" } else { "json" })
    };
    let (a, b) = (config(0), config(1));
    let (_pa, la, _) = spawn(dir.path(), "a", &a);
    let (mut pb, lb, admin_b) = spawn(dir.path(), "b", &b);
    assert_eq!(
        post(lb, "acme-customer-key", "/v2/settings/webhook/set", HOOK).status,
        403
    );
    assert_eq!(upgrade(la, "acme-customer-key", 2).status, 200);
    let applied = Instant::now();
    loop {
        if post(lb, "acme-customer-key", "/v2/settings/webhook/set", HOOK).status == 200 {
            break;
        }
        assert!(
            applied.elapsed() < Duration::from_secs(1),
            "replica b did not apply it within 1 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(overrides(admin_b, None).len(), 1);
    // Redis holds no key: the override's name in Redis is a hash.
    let mut con = redis.client();
    let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let set_name = format!("{{ov{}:ov}}:set", redis.port);
    assert!(names.contains(&set_name), "{names:?}");
    let mut fields: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&set_name)
        .query(&mut con)
        .unwrap();
    // The set's epoch (how a replica tells a set emptied since it last read it), and one
    // field: the upgrade, a version before its JSON.
    let epoch = fields.remove("~epoch").expect("the set carries its epoch");
    assert_eq!(epoch.len(), 16, "{epoch}");
    assert_eq!(fields.len(), 1);
    for (f, v) in &fields {
        assert!(!f.contains("acme-customer-key") && !v.contains("acme-customer-key"));
        assert_eq!(f.len(), 32);
        let (version, json) = v.split_once('|').unwrap();
        assert_eq!(version.len(), 16, "{v}");
        assert!(json.contains(r#""plan_id":2"#), "{v}");
    }
    let ttl: i64 = redis::cmd("PTTL").arg(&set_name).query(&mut con).unwrap();
    assert!(ttl > 0, "it expires");
    // A replica restarted finds it in Redis.
    pb.stop();
    let (_pb, lb, _) = spawn(dir.path(), "b2", &b);
    eventually("the restarted replica applies the kept override", || {
        post(lb, "acme-customer-key", "/v2/settings/webhook/set", HOOK).status == 200
    });
    // Taken back on one replica: back to Basic on the other too.
    let r = admin_with(
        a.file.admin_listen.parse().unwrap(),
        "DELETE",
        "/api/overrides/acme-customer",
        None,
    );
    assert_eq!(r.status, 204);
    eventually("the other replica drops it", || {
        post(lb, "acme-customer-key", "/v2/settings/webhook/set", HOOK).status == 403
    });
}

#[test]
fn upgraded_through_one_replica_a_key_bursts_on_another_as_one_process_would() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = |_: usize| {
        crate::harness::config_for(&up)
            .cluster(&redis.url(), &format!("ub{}", redis.port), 100)
            .listen(format!("127.0.0.1:{}", crate::harness::closed_port()))
            .admin_listen(format!("127.0.0.1:{}", crate::harness::closed_port()))
    };
    let (a, b) = (config(0), config(1));
    let (_pa, la, _) = spawn(dir.path(), "a", &a);
    let (_pb, lb, _) = spawn(dir.path(), "b", &b);
    // Basic: a few requests on each replica first (the key has a budget share on both).
    for addr in [la, lb] {
        let r = send_raw(
            addr,
            b"GET /v2/client/getStatus HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer acme-customer-key\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
    }
    assert_eq!(upgrade(la, "acme-customer-key", 2).status, 200);
    eventually("replica b applies the upgrade", || {
        post(lb, "acme-customer-key", "/v2/settings/webhook/set", HOOK).status == 200
    });
    // Standard's limit is far above this burst: one process admits every request of it.
    let statuses: Vec<u16> = (0..30)
        .map(|_| post(lb, "acme-customer-key", "/v2/settings/webhook/set", HOOK).status)
        .collect();
    assert!(
        statuses.iter().all(|s| *s == 200),
        "after the upgrade through replica a, a burst on replica b: {statuses:?}"
    );
}

#[test]
fn check_warns_when_upgrades_are_kept_nowhere_and_lists_those_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.yaml");
    crate::harness::test_config("http://127.0.0.1:9").write(&path);
    let check = |p: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check", "--config", p.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(check(&path).contains("warning: partner upgrades, keys changed live (suspend, revoke, limit, quota) and keys issued through the admin API (POST /api/keys) last until the process stops"));

    let up = Upstream::start(Mode::Ok);
    let state = dir.path().join("state.db");
    let config = config_for(&up).state_path(state.to_str().unwrap());
    let (_p, listen, _) = spawn(dir.path(), "gw", &config);
    assert_eq!(upgrade(listen, "acme-customer-key", 3).status, 200);
    let cfg = dir.path().join("gw.yaml");
    let out = check(&cfg);
    assert!(
        out.contains("override      acme-customer on pro (plan_id 3; the YAML says basic) by acme"),
        "{out}"
    );
    assert!(!out.contains("warning: partner upgrades"));
}
