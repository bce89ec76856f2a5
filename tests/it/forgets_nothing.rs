//! The fleet forgets nothing: a Redis that restarts empty, is flushed while the replicas run,
//! or is failed over to a replica that lost its data never undoes an acknowledged change.
//! Every kind of change (revocations by name and by secret, suspensions, a resume after a
//! suspension, live limits and quotas, a partner's upgrade and lifecycle operations) is made,
//! the store loses it, and every replica keeps refusing and limiting as before, puts the
//! changes back, and logs it once; with and without `state.path`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::harness::{
    admin, config_for, eventually, metric, metrics_page, send_raw, DelayProxy, Mode, Process,
    RedisSentinel, RedisServer, Response, TestConfig, Upstream,
};

/// The test config with a key for each kind of change, sharing through `redis_url`; one
/// thread, as a replica with one CPU runs (the runtime without work stealing: the other
/// tests' replicas run with work stealing, on two).
fn fleet(up: &Upstream, redis_url: &str, prefix: &str) -> TestConfig {
    let managed = |k: &mut tollgate_core::config::file::FileKey| k.partner = Some("acme".into());
    config_for(up)
        .cluster(redis_url, prefix, 100)
        .runtime(|r| r.threads = 1)
        .add_key("rev", "rev-key", "basic")
        .add_key("leak", "leak-key", "pro")
        .add_key("sus", "sus-key", "basic")
        .add_key("res", "res-key", "basic")
        .add_key("lim", "lim-key", "basic")
        .add_key("quo", "quo-key", "basic")
        .add_key("acme-paused", "acme-paused-key", "basic")
        .key_with("acme-paused", managed)
        .add_key("acme-gone", "acme-gone-key", "basic")
        .key_with("acme-gone", managed)
}

use crate::harness::{admin_json, get_status as call};

fn partner(addr: SocketAddr, path: &str, body: &str) -> Response {
    let raw = format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer acme-partner-key\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

fn state(addr: SocketAddr, name: &str) -> serde_json::Value {
    let r = admin(addr, "GET", &format!("/api/keys/{name}"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// Every kind of change, made through the replica at (`listen`, `admin`); the resume of `res`
/// through `other_admin`, after its suspension was seen there.
fn make_every_change(listen: SocketAddr, admin_addr: SocketAddr, other_admin: SocketAddr) {
    let ok = |r: Response, what: &str| {
        assert_eq!(
            r.status,
            200,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
    };
    ok(admin(admin_addr, "POST", "/api/keys/rev/revoke"), "revoke");
    ok(
        admin_json(
            admin_addr,
            "POST",
            "/api/keys/revoke",
            r#"{"key":"leak-key"}"#,
        ),
        "revoke by the secret",
    );
    ok(
        admin(admin_addr, "POST", "/api/keys/sus/suspend"),
        "suspend",
    );
    ok(
        admin(admin_addr, "POST", "/api/keys/res/suspend"),
        "suspend",
    );
    eventually("the other replica sees res suspended", || {
        state(other_admin, "res")["state"] == "suspended"
    });
    ok(admin(other_admin, "POST", "/api/keys/res/resume"), "resume");
    ok(
        admin_json(
            admin_addr,
            "PUT",
            "/api/keys/lim/limit",
            r#"{"requests_per_window":5}"#,
        ),
        "limit",
    );
    ok(
        admin_json(
            admin_addr,
            "PUT",
            "/api/keys/quo/quota",
            r#"{"requests":7,"per":"day"}"#,
        ),
        "quota",
    );
    ok(
        partner(
            listen,
            "/v2/service/upgrade",
            r#"{"apiKey":"acme-customer-key","planID":3}"#,
        ),
        "upgrade",
    );
    ok(
        partner(
            listen,
            "/v2/service/suspend",
            r#"{"apiKey":"acme-paused-key"}"#,
        ),
        "partner suspend",
    );
    ok(
        partner(
            listen,
            "/v2/service/delete",
            r#"{"apiKey":"acme-gone-key"}"#,
        ),
        "partner delete",
    );
}

/// The keys refused for good or until resumed, and those served.
const REFUSED: [&str; 5] = [
    "rev-key",
    "leak-key",
    "sus-key",
    "acme-paused-key",
    "acme-gone-key",
];
const SERVED: [&str; 4] = ["res-key", "lim-key", "quo-key", "acme-customer-key"];

/// What every change left on the replica at (`listen`, `admin`): `None` when it holds, else
/// what differs.
fn changes_in_force(listen: SocketAddr, admin_addr: SocketAddr) -> Option<String> {
    for key in REFUSED {
        let s = call(listen, key).status;
        if s != 401 {
            return Some(format!("{key} answered {s}"));
        }
    }
    // Served: authenticated (a 429 of the window is fine: the tests call often).
    for key in SERVED {
        let s = call(listen, key).status;
        if s == 401 {
            return Some(format!("{key} answered {s}"));
        }
    }
    let want = [
        ("rev", "revoked"),
        ("leak", "revoked"),
        ("sus", "suspended"),
        ("res", "active"),
        ("acme-paused", "suspended"),
        ("acme-gone", "revoked"),
    ];
    for (name, st) in want {
        let s = state(admin_addr, name);
        if s["state"] != st {
            return Some(format!("{name}: {}", s["state"]));
        }
    }
    let lim = state(admin_addr, "lim");
    if lim["requests_per_window"] != 5 {
        return Some(format!("lim: {}", lim["requests_per_window"]));
    }
    let quo = state(admin_addr, "quo");
    if quo["quota"]["requests"] != 7 || quo["quota"]["per"] != "day" {
        return Some(format!("quo: {}", quo["quota"]));
    }
    let up = state(admin_addr, "acme-customer");
    if up["plan"] != "pro" {
        return Some(format!("acme-customer: {}", up["plan"]));
    }
    let page = metrics_page(admin_addr);
    for (series, n) in [
        (r#"tollgate_keys{state="revoked"}"#, 3.0),
        (r#"tollgate_keys{state="suspended"}"#, 2.0),
        ("tollgate_plan_overrides", 1.0),
    ] {
        if metric(&page, series) != Some(n) {
            return Some(format!("{series} {:?}", metric(&page, series)));
        }
    }
    None
}

/// For `secs` seconds, every refused key stays refused on every replica (`listens`), and the
/// resumed one authenticated: the store's loss is never seen as "no changes".
fn never_undone(listens: &[SocketAddr], secs: u64) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        for &l in listens {
            for key in REFUSED {
                assert_eq!(call(l, key).status, 401, "{key} served on {l} meanwhile");
            }
            assert_ne!(call(l, "res-key").status, 401, "res-key refused on {l}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The overrides' set in Redis holds every change again, with an epoch.
fn put_back_in(redis: &mut redis::Connection, prefix: &str) {
    let set = format!("{{{prefix}:ov}}:set");
    eventually("the replicas put the changes back in Redis", || {
        let n: u64 = redis::cmd("HLEN").arg(&set).query(redis).unwrap_or(0);
        // Nine parts (three revocations, two suspensions, a resume's tombstone, a limit, a
        // quota, an upgrade), and the epoch.
        n >= 10
    });
    let epoch: Option<String> = redis::cmd("HGET")
        .arg(&set)
        .arg("~epoch")
        .query(redis)
        .unwrap();
    assert!(epoch.is_some(), "the set is marked with its epoch");
}

/// How many times the process logged that it found the store's overrides emptied.
fn restored_lines(p: &Process) -> usize {
    p.output()
        .lines()
        .filter(|l| l.contains("overrides were found emptied or replaced"))
        .count()
}

fn restarted_empty(with_state_path: bool) {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("fn{}", redis.port);
    let config = |tag: &str| {
        let c = fleet(&up, &redis.url(), &prefix);
        if with_state_path {
            let path = dir.path().join(format!("{tag}-state.db"));
            c.state_path(path.to_str().unwrap())
        } else {
            c
        }
    };
    let (a, b) = (config("a"), config("b"));
    let (pa, la, admin_a) = Process::run(dir.path(), "a", &a);
    let (pb, lb, admin_b) = Process::run(dir.path(), "b", &b);
    make_every_change(la, admin_a, admin_b);
    for (l, ad) in [(la, admin_a), (lb, admin_b)] {
        let seen = crate::harness::settled(|| changes_in_force(l, ad), Option::is_none);
        assert_eq!(seen, None, "every change in force on {l} before the loss");
    }

    // Redis stopped, and started again empty on the same port (no persistence).
    let port = redis.kill();
    let redis = RedisServer::start_on(port);
    never_undone(&[la, lb], 3);
    put_back_in(&mut redis.client(), &prefix);
    for (l, ad) in [(la, admin_a), (lb, admin_b)] {
        assert_eq!(changes_in_force(l, ad), None, "after the loss, on {l}");
    }
    for p in [&pa, &pb] {
        assert_eq!(restored_lines(p), 1, "one warning per replica");
    }
    // Sharing goes on: a change on one replica reaches the other.
    assert_eq!(admin(admin_b, "POST", "/api/keys/sus/resume").status, 200);
    eventually("replica a serves the resumed key", || {
        call(la, "sus-key").status == 200
    });
}

#[test]
fn a_redis_restarted_empty_undoes_no_change_without_state_path() {
    restarted_empty(false);
}

#[test]
fn a_redis_restarted_empty_undoes_no_change_with_state_path() {
    restarted_empty(true);
}

#[test]
fn a_redis_flushed_while_the_replicas_run_undoes_no_change() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("fl{}", redis.port);
    let a = fleet(&up, &redis.url(), &prefix);
    let b = fleet(&up, &redis.url(), &prefix)
        .state_path(dir.path().join("b-state.db").to_str().unwrap());
    let (pa, la, admin_a) = Process::run(dir.path(), "a", &a);
    let (pb, lb, admin_b) = Process::run(dir.path(), "b", &b);
    make_every_change(la, admin_a, admin_b);
    eventually("every change in force on b", || {
        changes_in_force(lb, admin_b).is_none()
    });
    let mut con = redis.client();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    never_undone(&[la, lb], 2);
    put_back_in(&mut con, &prefix);
    for (l, ad) in [(la, admin_a), (lb, admin_b)] {
        assert_eq!(changes_in_force(l, ad), None, "after FLUSHALL, on {l}");
    }
    for p in [&pa, &pb] {
        assert_eq!(restored_lines(p), 1, "one warning per replica");
    }
}

/// The fields of the overrides' set that name a part (not the store's own marks), as Redis
/// holds them, by name.
fn part_fields(redis: &mut redis::Connection, prefix: &str) -> Vec<(String, String)> {
    let set = format!("{{{prefix}:ov}}:set");
    let mut all: Vec<(String, String)> = redis::cmd("HGETALL").arg(&set).query(redis).unwrap();
    all.retain(|(f, _)| !f.starts_with('~'));
    all.sort_unstable();
    all
}

/// Without `state.path` a replica's copy holds no text of an issued key's own part that its
/// set in force makes again: what it puts back when Redis forgets is still, byte for byte,
/// what Redis held. Replica `b` reads the fleet's issued keys whole (they were issued on `a`
/// before `b` started), then `a` suspends one, deletes one and limits one (each changes the
/// record `b` made a part from); `a` stops, Redis is flushed, and `b` alone puts back.
#[test]
fn issued_keys_put_back_by_a_replica_without_state_path_are_what_redis_held() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("mk{}", redis.port);
    let (a, b) = (
        fleet(&up, &redis.url(), &prefix),
        fleet(&up, &redis.url(), &prefix),
    );
    let (pa, _, admin_a) = Process::run(dir.path(), "a", &a);
    let names = ["made-1", "made-2", "made-3", "made-4", "made-5"];
    let mut secrets = Vec::new();
    for name in names {
        let body = format!(r#"{{"name":"{name}","plan":"basic"}}"#);
        let created = admin_json(admin_a, "POST", "/api/keys", &body);
        assert_eq!(
            created.status,
            201,
            "{}",
            String::from_utf8_lossy(&created.body)
        );
        secrets.push(created.json()["key"].as_str().unwrap().to_string());
    }
    let (pb, lb, admin_b) = Process::run(dir.path(), "b", &b);
    for secret in &secrets {
        assert_eq!(call(lb, secret).status, 200, "b serves what a issued");
    }
    let ok = |r: Response| assert_eq!(r.status / 100, 2, "{}", String::from_utf8_lossy(&r.body));
    ok(admin(admin_a, "POST", "/api/keys/made-1/suspend"));
    ok(admin(admin_a, "DELETE", "/api/keys/made-2"));
    ok(admin_json(
        admin_a,
        "PUT",
        "/api/keys/made-3/limit",
        r#"{"requests_per_window":5}"#,
    ));
    eventually("b has a's changes", || {
        state(admin_b, "made-1")["state"] == "suspended"
            && admin(admin_b, "GET", "/api/keys/made-2").status == 404
            && state(admin_b, "made-3")["requests_per_window"] == 5
    });
    let mut con = redis.client();
    let held = part_fields(&mut con, &prefix);
    assert_eq!(
        held.len(),
        8,
        "five issued parts, a suspension, a deletion's, a limit"
    );
    drop(pa);
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    eventually("b puts the set back", || {
        part_fields(&mut con, &prefix).len() >= held.len()
    });
    assert_eq!(part_fields(&mut con, &prefix), held, "byte for byte");
    eventually("b logs the put-back", || restored_lines(&pb) == 1);
    assert_eq!(call(lb, &secrets[0]).status, 401, "made-1 suspended");
    assert_eq!(call(lb, &secrets[1]).status, 401, "made-2 deleted");
    for secret in &secrets[2..] {
        assert_eq!(call(lb, secret).status, 200);
    }
}

/// A change read from the fleet is put in force with the key's other parts as this
/// replica's copy holds them: with `state.path`, read from the file (memory holds only what
/// the file may lack). `b` suspends a configured key and an issued one; once `a` has them
/// (and its file holds them), `b` sets a limit on each: the delta `a` reads names only the
/// limit's field, and `a` must find the suspension (and the issued key's own part, which
/// names its digest) in the file, or put the key back in force unsuspended.
#[test]
fn a_change_read_from_the_fleet_keeps_the_parts_state_path_holds() {
    let (two, la, admin_a) = two_replicas("pp");
    let admin_b = two.admin_b;
    let ok = |r: Response| assert_eq!(r.status / 100, 2, "{}", String::from_utf8_lossy(&r.body));
    let created = admin_json(
        admin_b,
        "POST",
        "/api/keys",
        r#"{"name":"shop","plan":"basic"}"#,
    );
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let secret = created.json()["key"].as_str().unwrap().to_string();
    for name in ["sus", "shop"] {
        ok(admin(admin_b, "POST", &format!("/api/keys/{name}/suspend")));
    }
    eventually("a has both suspensions", || {
        ["sus", "shop"]
            .iter()
            .all(|n| state(admin_a, n)["state"] == "suspended")
    });
    for name in ["sus", "shop"] {
        ok(admin_json(
            admin_b,
            "PUT",
            &format!("/api/keys/{name}/limit"),
            r#"{"requests_per_window":5}"#,
        ));
    }
    eventually("a has both limits", || {
        ["sus", "shop"]
            .iter()
            .all(|n| state(admin_a, n)["requests_per_window"] == 5)
    });
    for name in ["sus", "shop"] {
        assert_eq!(state(admin_a, name)["state"], "suspended", "{name} on a");
    }
    for key in ["sus-key", secret.as_str()] {
        assert_eq!(call(la, key).status, 401, "suspended on a");
    }
}

/// Two replicas sharing a Redis of their own, `a` keeping its copy at `state.path` and `b`
/// nothing ([`two_replicas`]); with every change made and in force on `a` for the tests that
/// restart `a` ([`a_keeps_a_copy`]).
struct AKeepsACopy {
    a: TestConfig,
    b: TestConfig,
    pa: Process,
    pb: Process,
    lb: SocketAddr,
    admin_b: SocketAddr,
    redis: RedisServer,
    prefix: String,
    dir: tempfile::TempDir,
    up: Upstream,
}

/// [`AKeepsACopy`], its Redis's prefix starting with `tag`.
fn a_keeps_a_copy(tag: &str) -> AKeepsACopy {
    let (two, la, admin_a) = two_replicas(tag);
    make_every_change(la, admin_a, two.admin_b);
    eventually("every change in force on a", || {
        changes_in_force(la, admin_a).is_none()
    });
    two
}

/// The two replicas of [`AKeepsACopy`] before any change, and `a`'s listener and admin
/// listener.
fn two_replicas(tag: &str) -> (AKeepsACopy, SocketAddr, SocketAddr) {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("{tag}{}", redis.port);
    let a = fleet(&up, &redis.url(), &prefix)
        .state_path(dir.path().join("a-state.db").to_str().unwrap());
    let b = fleet(&up, &redis.url(), &prefix);
    let (pa, la, admin_a) = Process::run(dir.path(), "a", &a);
    let (pb, lb, admin_b) = Process::run(dir.path(), "b", &b);
    let two = AKeepsACopy {
        a,
        b,
        pa,
        pb,
        lb,
        admin_b,
        redis,
        prefix,
        dir,
        up,
    };
    (two, la, admin_a)
}

#[test]
fn every_replica_and_redis_restarted_together_keep_what_state_path_holds() {
    // b keeps nothing on disk: it learns the changes from a's copy, put back in Redis.
    let AKeepsACopy {
        a,
        b,
        mut pa,
        mut pb,
        redis,
        prefix,
        dir,
        up: _up,
        ..
    } = a_keeps_a_copy("tg");
    pa.stop();
    pb.stop();
    let port = redis.kill();
    let redis = RedisServer::start_on(port);
    let (pa, la, admin_a) = Process::run(dir.path(), "a2", &a);
    assert_eq!(
        changes_in_force(la, admin_a),
        None,
        "a, from its state.path"
    );
    put_back_in(&mut redis.client(), &prefix);
    let (_pb, lb, admin_b) = Process::run(dir.path(), "b2", &b);
    let seen = crate::harness::settled(|| changes_in_force(lb, admin_b), Option::is_none);
    assert_eq!(seen, None, "b, from what a put back");
    assert_eq!(
        restored_lines(&pa),
        1,
        "a found it empty and put its copy back"
    );
}

/// A replica restarted with its copy at `state.path` while Redis kept the set (its epoch)
/// reads only what changed while it was away: every change in force at once from its copy,
/// the one made meanwhile on the other replica in force after its first poll, and neither its
/// whole copy put back into Redis nor the whole set read (a million fields each way).
#[test]
fn a_replica_restarted_while_redis_kept_the_set_reads_only_what_changed() {
    let AKeepsACopy {
        a,
        mut pa,
        pb: _pb,
        lb,
        admin_b,
        redis: _redis,
        dir,
        up: _up,
        ..
    } = a_keeps_a_copy("rs");
    pa.stop();
    // Made while a is away: `sus` resumed.
    assert_eq!(admin(admin_b, "POST", "/api/keys/sus/resume").status, 200);
    assert_eq!(call(lb, "sus-key").status, 200);
    let (pa, la, admin_a) = Process::run(dir.path(), "a2", &a);
    assert_eq!(call(la, "rev-key").status, 401, "a's copy in force at once");
    eventually("the resume made while a was away is in force on a", || {
        call(la, "sus-key").status == 200
    });
    assert_eq!(state(admin_a, "leak")["state"], "revoked");
    let out = pa.output();
    assert!(
        !out.contains("read whole"),
        "a read what changed, not the whole set:\n{out}"
    );
    assert!(!out.contains("put back"), "a put nothing back:\n{out}");
    assert_eq!(restored_lines(&pa), 0);
}

/// A replica with `cluster` and no `state.path` knows the fleet's changes only once it has
/// read them: its `/readyz` says `503 starting` while Redis does not answer the read (behind
/// a proxy that holds the connections made once the replica has read the fleet's quota
/// counts, within a long `timeout_ms`), though its listener accepts; from the first `200` on, every change (revocations among
/// them) is in force and a key issued through the other replica authenticates.
#[test]
fn a_replica_without_state_path_is_ready_only_once_the_fleets_changes_are_in_force() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("rd{}", redis.port);
    let config = |url: &str| fleet(&up, url, &prefix).cluster_with(|c| c.timeout_ms = 30_000);
    let (_pa, la, admin_a) = Process::run(dir.path(), "a", &config(&redis.url()));
    make_every_change(la, admin_a, admin_a);
    let issued = "a-secret-only-the-caller-keeps";
    let body = format!(
        r#"{{"name":"shop","plan":"basic","sha256":"{}"}}"#,
        tollgate_core::digest::Digest::of(issued.as_bytes()).to_hex()
    );
    assert_eq!(admin_json(admin_a, "POST", "/api/keys", &body).status, 201);

    // The first connect (the fleet's quota counts, read before it serves: a probe and the
    // connection) goes through;
    // the later ones wait for `release`.
    let gate = DelayProxy::holding_after(([127, 0, 0, 1], redis.port).into(), 2);
    let b = config(&gate.redis_url());
    let path = dir.path().join("b.yaml");
    b.write(&path);
    let pb = Process::spawn(
        dir.path(),
        "b",
        &["run", "--config", path.to_str().unwrap()],
        &[("TOLLGATE_LOG", "info")],
    );
    let (lb, admin_b): (SocketAddr, SocketAddr) = (
        b.file.listen.parse().unwrap(),
        b.file.admin_listen.parse().unwrap(),
    );
    eventually("b's listener accepts (its own probe says so)", || {
        pb.output()
            .contains("the gateway listener accepts connections")
    });
    let r = admin(admin_b, "GET", "/readyz");
    assert_eq!(
        (
            r.status,
            String::from_utf8_lossy(&r.body).trim().to_string()
        ),
        (503, "starting".to_string()),
        "not ready while the fleet's changes are unread"
    );
    gate.release();
    crate::harness::wait_ready(admin_b, 200);
    assert_eq!(changes_in_force(lb, admin_b), None, "from the first 200 on");
    assert_ne!(call(lb, issued).status, 401, "the key issued on a");
    // Logged before it became ready; the log is written off the thread that logs it.
    eventually("b says why it is ready", || {
        pb.output().contains("the fleet's key changes are in force")
    });
}

#[test]
fn check_warns_that_a_fleet_without_state_path_keeps_only_the_yaml_when_all_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.yaml");
    tollgate_core::testing::TestConfig::new()
        .cluster("redis://127.0.0.1:1/0", "w", 100)
        .write(&path);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("cluster without state.path"),
        "check names the risk: {text}"
    );
    let with = dir.path().join("with.yaml");
    tollgate_core::testing::TestConfig::new()
        .cluster("redis://127.0.0.1:1/0", "w", 100)
        .state_path(dir.path().join("s.db").to_str().unwrap())
        .write(&with);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config", with.to_str().unwrap()])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("cluster without state.path"), "{text}");
}

#[test]
fn a_sentinel_failover_to_a_replica_that_lost_the_data_undoes_no_change() {
    let up = Upstream::start(Mode::Ok);
    let mut sentinel = RedisSentinel::start();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("sf{}", sentinel.port);
    let a = fleet(&up, &sentinel.url(), &prefix);
    let b = fleet(&up, &sentinel.url(), &prefix);
    let (_pa, la, admin_a) = Process::run(dir.path(), "a", &a);
    let (_pb, lb, admin_b) = Process::run(dir.path(), "b", &b);
    make_every_change(la, admin_a, admin_b);
    eventually("every change in force on b", || {
        changes_in_force(lb, admin_b).is_none()
    });
    // The primary dies; Sentinel promotes the replica, which comes up without the data (as
    // a replica restarted without persistence would, or one that never synced).
    sentinel.fail_over();
    let mut con = sentinel.replica.client();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    never_undone(&[la, lb], 2);
    put_back_in(&mut con, &prefix);
    for (l, ad) in [(la, admin_a), (lb, admin_b)] {
        let seen = crate::harness::settled(|| changes_in_force(l, ad), Option::is_none);
        assert_eq!(seen, None, "after the failover, on {l}");
    }
}

/// An overrides' script as the gateway sends it: after `kept.lua`, the part the writing
/// scripts share.
fn sent_after_kept(script: &str) -> redis::Script {
    redis::Script::new(&format!(
        "{}{script}",
        include_str!("../../src/keys/kept.lua")
    ))
}

/// Pseudo-random draws below `n` from `seed` (xorshift): the same cases at every run.
fn draws(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |n| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    }
}

/// `restore.lua` merges copies as the replicas' own rule does (`policy::versions::merge`):
/// random copies of a few fields (revocations, suspensions, tombstones, ties of versions),
/// put back in a random order on a real Redis, end as the rule says, whatever the order.
#[test]
fn the_store_merges_copies_by_the_replicas_rule() {
    use std::collections::HashMap;
    use tollgate::policy::overrides::{Change, KeyRecord, Part};
    use tollgate::policy::versions::{merge, Kept};

    let redis = RedisServer::start();
    let mut con = redis.client();
    let script = sent_after_kept(include_str!("../../src/keys/restore.lua"));
    let mut next = draws(0x9E37_79B9_7F4A_7C15);
    for case in 0..300 {
        let mut copies: Vec<Vec<(String, Kept)>> = Vec::new();
        for _ in 0..(1 + next(4)) {
            let mut copy = Vec::new();
            for _ in 0..next(6) {
                let part = [Part::Revoked, Part::Suspended, Part::Plan][next(3) as usize];
                let field = format!("{}{}", "d".repeat(31) + &next(2).to_string(), part.suffix());
                let mut o = KeyRecord::named("k");
                if next(3) > 0 {
                    let c = Change {
                        since_ms: next(3),
                        by: "admin".into(),
                        reason: None,
                    };
                    match part {
                        Part::Revoked => o.revoked = Some(Box::new(c)),
                        Part::Suspended => o.suspended = Some(Box::new(c)),
                        _ => o.plan_id = Some(next(3) as u32 + 1),
                    }
                }
                copy.push((field, Kept::new(next(4), &o)));
            }
            copies.push(copy);
        }
        let set = format!("case{case}:set");
        let mut want = HashMap::new();
        for copy in &copies {
            merge(&mut want, copy.clone());
            let mut inv = script.prepare_invoke();
            inv.key(&set)
                .key(format!("case{case}:v"))
                .key(format!("case{case}:log"))
                .key(format!("case{case}:lv"))
                .arg(60_000)
                .arg("e")
                .arg(1000);
            for (f, k) in copy {
                inv.arg(f).arg(k.raw());
            }
            let _: (String, u64) = inv.invoke(&mut con).unwrap();
        }
        let mut got: HashMap<String, String> =
            redis::cmd("HGETALL").arg(&set).query(&mut con).unwrap();
        assert_eq!(got.remove("~epoch").as_deref(), Some("e"));
        let want: HashMap<String, String> = want.into_iter().map(|(f, k)| (f, k.raw())).collect();
        assert_eq!(got, want, "case {case}: {copies:?}");
    }
}

/// The log of changes is trimmed to its newest entries (`write.lua`, `restore.lua`), and a
/// poll (`poll.lua`) never answers a delta that misses a change: random writes and put-backs
/// on a real Redis, with a log of `keep` entries and deltas of at most `keep - 1` fields; from
/// every version a replica may know, the poll answers either exactly the fields written since
/// or `whole`.
#[test]
fn a_trimmed_log_never_answers_a_delta_that_misses_a_change() {
    use std::collections::{BTreeMap, BTreeSet};

    let redis = RedisServer::start();
    let mut con = redis.client();
    let write = sent_after_kept(include_str!("../../src/keys/write.lua"));
    let restore = sent_after_kept(include_str!("../../src/keys/restore.lua"));
    let poll = redis::Script::new(include_str!("../../src/keys/poll.lua"));
    let mut next = draws(0x2545_F491_4F6C_DD1D);
    let mut wholes = 0;
    let mut deltas = 0;
    for case in 0..40 {
        let keys: Vec<String> = ["set", "v", "log", "lv"]
            .iter()
            .map(|k| format!("t{case}:{k}"))
            .collect();
        let keep = 2 + next(5);
        // The version each field was last written at, as the replicas would see it.
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        let mut version = 0;
        for _ in 0..(5 + next(30)) {
            let fields: Vec<String> = (0..1 + next(3))
                .map(|_| format!("{:032}", next(12)))
                .collect();
            let put_back = next(4) == 0;
            let mut inv = if put_back {
                restore.prepare_invoke()
            } else {
                write.prepare_invoke()
            };
            for k in &keys {
                inv.key(k);
            }
            inv.arg(60_000).arg("e").arg(keep);
            if !put_back {
                // No claim's life, no conditions (write.lua).
                inv.arg(60_000).arg(0);
            }
            for f in &fields {
                if put_back {
                    // A put-back that always wins: a later version than any written.
                    inv.arg(f)
                        .arg(format!("{:016}|{{\"key\":\"k\"}}", 1_000_000 + version));
                } else {
                    inv.arg(f)
                        .arg(format!("{:016}", version))
                        .arg(r#"{"key":"k"}"#);
                }
            }
            let _: redis::Value = inv.invoke(&mut con).unwrap();
            version += 1;
            for f in fields {
                last.insert(f, version);
            }
            let log: u64 = redis::cmd("ZCARD").arg(&keys[2]).query(&mut con).unwrap();
            assert!(log <= keep, "case {case}: the log holds {log} > {keep}");
        }
        let now: u64 = redis::cmd("GET").arg(&keys[1]).query(&mut con).unwrap();
        assert_eq!(now, version, "case {case}");
        for known in 0..=version {
            let mut inv = poll.prepare_invoke();
            for k in &keys {
                inv.key(k);
            }
            inv.arg(known.to_string())
                .arg(60_000)
                .arg("e")
                .arg(keep - 1);
            let reply: Vec<redis::Value> = inv.invoke(&mut con).unwrap();
            let kind: Option<String> = reply
                .get(3)
                .map(|v| redis::from_redis_value(v.clone()).unwrap());
            let want: BTreeSet<&String> = last
                .iter()
                .filter(|(_, &v)| v > known)
                .map(|(f, _)| f)
                .collect();
            match kind.as_deref() {
                None => assert!(want.is_empty(), "case {case}, from {known}: same"),
                Some("whole") => wholes += 1,
                Some("delta") => {
                    deltas += 1;
                    let got: Vec<(String, String)> =
                        redis::from_redis_value(reply[2].clone()).unwrap();
                    let got: BTreeSet<&String> = got.iter().map(|(f, _)| f).collect();
                    assert_eq!(got, want, "case {case}, from {known}");
                }
                Some(other) => panic!("case {case}: {other}"),
            }
        }
    }
    assert!(wholes > 0 && deltas > 0, "{wholes} whole, {deltas} deltas");
}

/// `write.lua`'s conditions, call by call on a real Redis: a name claimed once (taken over
/// when the key that claimed it holds no key any more: a deletion by a replica of a version
/// without claims), a digest claimed once, a key's part expected as read, a claim let go by
/// its own key alone, and nothing written by a write a condition refuses.
#[test]
fn the_writes_conditions_refuse_a_second_claim_and_a_stale_change() {
    let redis = RedisServer::start();
    let mut con = redis.client();
    let write = sent_after_kept(include_str!("../../src/keys/write.lua"));
    let keys = ["c:set", "c:v", "c:log", "c:lv"];
    let (f1, f2) = ("1".repeat(32) + ":k", "2".repeat(32) + ":k");
    let (d1, d2) = ("a".repeat(64), "b".repeat(64));
    let live = |d: &str| format!(r#"{{"key":"x","issued":{{"id":"{d}","digest":"{d}"}}}}"#);
    // One write: `conditions` (kind, claim key or field, word), then `parts` (field, JSON).
    let mut call = |conditions: &[(&str, &str, &str)], parts: &[(&str, String)]| {
        let mut inv = write.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        let mut claim = keys.len();
        let mut args: Vec<(String, String, String)> = Vec::new();
        for &(kind, a, b) in conditions {
            if kind == "k" || kind == "u" {
                args.push((kind.into(), a.into(), b.into()));
            } else {
                inv.key(a);
                claim += 1;
                args.push((kind.into(), claim.to_string(), b.into()));
            }
        }
        inv.arg(60_000)
            .arg("e")
            .arg(100)
            .arg(30_000)
            .arg(conditions.len());
        for (kind, a, b) in &args {
            inv.arg(kind).arg(a).arg(b);
        }
        for (f, json) in parts {
            inv.arg(*f).arg("0000000000000001").arg(json);
        }
        let reply: Vec<String> = inv.invoke(&mut con).unwrap();
        reply
    };
    let clash = |r: &[String]| {
        (r.first().map(String::as_str) == Some("~clash")).then(|| (r[1].clone(), r[2].clone()))
    };

    // A new key: its name, its part and its digest.
    let created = call(
        &[
            ("n", "c:claim:name:x", &f1),
            ("k", &f1, ""),
            ("d", "c:claim:digest:1", &f1),
        ],
        &[(&f1, live(&d1))],
    );
    assert_eq!(clash(&created), None, "{created:?}");
    // The name again, for another key: refused, nothing written.
    let r = call(&[("n", "c:claim:name:x", &f2)], &[(&f2, live(&d2))]);
    assert_eq!(clash(&r), Some(("0".into(), "name".into())));
    // The digest again: refused; the part of a key that exists, as a new key: refused.
    let r = call(&[("d", "c:claim:digest:1", &f2)], &[(&f2, live(&d2))]);
    assert_eq!(clash(&r), Some(("0".into(), "sha256".into())));
    let r = call(&[("k", &f1, "")], &[(&f1, live(&d2))]);
    assert_eq!(clash(&r), Some(("0".into(), "sha256".into())));
    // A change of a key read with another digest than it has: refused.
    let r = call(&[("k", &f1, &d2)], &[(&f1, live(&d2))]);
    assert_eq!(clash(&r), Some(("0".into(), "changed".into())));
    let mut con2 = redis.client();
    let text: Option<String> = redis::cmd("HGET")
        .arg(keys[0])
        .arg(&f2)
        .query(&mut con2)
        .unwrap();
    assert_eq!(text, None, "a refused write wrote");
    // Read as it is: taken.
    let r = call(&[("k", &f1, &d1)], &[(&f1, live(&d1))]);
    assert_eq!(clash(&r), None, "{r:?}");
    // A key not revoked (no revocation part, or one taken out): taken; revoked: refused.
    let r1 = "1".repeat(32) + ":r";
    let r = call(&[("u", &r1, "")], &[]);
    assert_eq!(clash(&r), None, "{r:?}");
    let revoked = r#"{"key":"x","revoked":{"since_ms":1,"by":"admin"}}"#.to_string();
    call(&[], &[(&r1, revoked)]);
    let r = call(&[("k", &f1, &d1), ("u", &r1, "")], &[(&f1, live(&d1))]);
    assert_eq!(clash(&r), Some(("1".into(), "changed".into())));
    // The key taken out (a tombstone) by a write that let go of nothing: its name is free.
    let r = call(&[], &[(&f1, r#"{"key":"x"}"#.to_string())]);
    assert_eq!(clash(&r), None);
    let r = call(&[("n", "c:claim:name:x", &f2)], &[(&f2, live(&d2))]);
    assert_eq!(clash(&r), None, "{r:?}");
    // A claim is let go by its own key alone, and expires.
    call(&[("f", "c:claim:name:x", &f1)], &[]);
    let owner: Option<String> = redis::cmd("GET")
        .arg("c:claim:name:x")
        .query(&mut con2)
        .unwrap();
    assert_eq!(owner.as_deref(), Some(f2.as_str()));
    let ttl: i64 = redis::cmd("PTTL")
        .arg("c:claim:name:x")
        .query(&mut con2)
        .unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "PTTL {ttl}");
    call(&[("f", "c:claim:name:x", &f2)], &[]);
    let owner: Option<String> = redis::cmd("GET")
        .arg("c:claim:name:x")
        .query(&mut con2)
        .unwrap();
    assert_eq!(owner, None);
}

/// The admissions of `n` requests of `key` to the gateway at `listen` (each 200 or 429).
fn admitted_of(listen: SocketAddr, key: &str, n: usize) -> usize {
    (0..n)
        .filter(|_| {
            let r = call(listen, key);
            assert!(matches!(r.status, 200 | 429), "status {}", r.status);
            r.status == 200
        })
        .count()
}

/// The case of the issue that found it: a key with 3 a month, spent on replica a; 30
/// requests to b; both replicas restarted, 30 requests to each; again; then Redis restarted
/// empty, 30 more to each. The fleet admits at most the quota plus one request per replica
/// (5), `quota.used` is what was charged, and Redis holds it again after its restart.
fn a_small_quota_over_restarts(with_state_path: bool, outage: bool) {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = |tag: &str| {
        let c = config_for(&up)
            .cluster(&redis.url(), &format!("q{}", redis.port), 100)
            .plan_quota("basic", 3, "month")
            .ledger(30);
        if with_state_path {
            let path = dir.path().join(format!("{tag}-state.db"));
            c.state_path(path.to_str().unwrap())
        } else {
            c
        }
    };
    let (a, b) = (config("a"), config("b"));
    let (mut pa, la, admin_a) = Process::run(dir.path(), "a", &a);
    let (mut pb, lb, _) = Process::run(dir.path(), "b", &b);
    let mut admitted = admitted_of(la, "basic-key-1", 3);
    assert_eq!(admitted, 3, "the quota, on a");
    std::thread::sleep(Duration::from_secs(2));
    admitted += admitted_of(lb, "basic-key-1", 30);
    for round in 0..2 {
        pa.stop();
        pb.stop();
        let (qa, la, _) = Process::run(dir.path(), &format!("a{round}"), &a);
        let (qb, lb, _) = Process::run(dir.path(), &format!("b{round}"), &b);
        admitted += admitted_of(la, "basic-key-1", 30);
        admitted += admitted_of(lb, "basic-key-1", 30);
        (pa, pb) = (qa, qb);
    }
    eprintln!("{admitted} admitted on a quota of 3 over two replicas and two restarts");
    assert!(
        (3..=5).contains(&admitted),
        "{admitted} admitted on a quota of 3 over two replicas"
    );
    let admin_a = a.file.admin_listen.parse().unwrap_or(admin_a);
    let used = |a: SocketAddr| state(a, "basic-1")["quota"]["used"].as_u64();
    eventually("quota.used is what was charged", || {
        used(admin_a) == Some(admitted as u64)
    });
    let ledger = admin(admin_a, "GET", "/api/ledger?key=basic-1").json();
    let forwarded: u64 = ledger["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["forwarded"].as_u64().unwrap())
        .sum();
    assert_eq!(forwarded, admitted as u64, "the ledger: {ledger}");

    // Redis restarted empty: the replicas put the count back, and admit nothing more.
    let port = redis.kill();
    let la: SocketAddr = a.file.listen.parse().unwrap();
    let lb: SocketAddr = b.file.listen.parse().unwrap();
    let mut after = 0;
    if outage {
        // Away until both replicas have found it so, and asked meanwhile.
        for p in [&a, &b] {
            let at: SocketAddr = p.file.admin_listen.parse().unwrap();
            eventually("the replica finds the store down", || {
                metric(&metrics_page(at), "tollgate_cluster_store_up") == Some(0.0)
            });
        }
        after += admitted_of(la, "basic-key-1", 3);
        after += admitted_of(lb, "basic-key-1", 3);
    }
    let redis = RedisServer::start_on(port);
    for _ in 0..10 {
        after += admitted_of(la, "basic-key-1", 3);
        after += admitted_of(lb, "basic-key-1", 3);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(after, 0, "admitted after Redis lost the count");
    let hash = format!("q{port}:{{meters}}:q:{}", month_id());
    let mut con = redis.client();
    eventually("the count is back in Redis", || {
        let n: Option<u64> = redis::cmd("HGET")
            .arg(&hash)
            .arg("basic-1")
            .query(&mut con)
            .unwrap_or(None);
        n == Some(admitted as u64)
    });
    drop((pa, pb));
}

/// The id of this month's quota period, as the gateway names its hash.
fn month_id() -> u32 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tollgate::metering::PeriodAt::of(tollgate::config::Period::Month, ms).id
}

#[test]
fn a_quota_of_three_over_two_replicas_and_two_restarts_admits_at_most_five() {
    a_small_quota_over_restarts(false, false);
}

#[test]
fn a_quota_of_three_over_restarts_with_state_path_admits_at_most_five() {
    a_small_quota_over_restarts(true, false);
}

/// Redis away long enough for both replicas to find it so (and asked meanwhile) before it
/// comes back empty: the count comes back all the same.
#[test]
fn a_quota_spent_before_an_outage_of_redis_stays_spent_when_it_returns_empty() {
    a_small_quota_over_restarts(false, true);
}

/// A rolling reload: replica a's YAML has a key that b's does not have yet, and a suspends
/// it. The store is flushed, so b reads the whole set back while its YAML still lacks the
/// key: the suspension stays in force on a (b cannot match it to a key, and leaves it be).
/// The reload that brings b the key makes b read the set whole again, and puts the
/// suspension in force there too (before, b's set never held it: a delta had gone by and the
/// reload dropped nothing, so nothing read it again).
#[test]
fn a_replica_behind_in_a_rolling_reload_undoes_no_change_of_a_key_it_lacks() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("rr{}", redis.port);
    let late = |c: TestConfig| c.add_key("late", "late-key", "basic");
    let ahead = late(config_for(&up).cluster(&redis.url(), &prefix, 100));
    let behind = config_for(&up).cluster(&redis.url(), &prefix, 100);
    let (_pa, la, admin_a) = Process::run(dir.path(), "a", &ahead);
    let (pb, lb, admin_b) = Process::run(dir.path(), "b", &behind);
    assert_eq!(admin(admin_a, "POST", "/api/keys/late/suspend").status, 200);
    assert_eq!(call(la, "late-key").status, 401);
    assert_eq!(
        admin(admin_b, "GET", "/api/keys/late").status,
        404,
        "b lacks it"
    );

    let whole_reads = |p: &Process| {
        p.output()
            .lines()
            .filter(|l| l.contains("overrides read whole"))
            .count()
    };
    let before = whole_reads(&pb);
    let mut con = redis.client();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    eventually("b reads the set put back whole", || {
        whole_reads(&pb) > before
    });
    // b's rounds after its whole read: one every 100 ms, each of which would carry a drop.
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        assert_eq!(
            call(la, "late-key").status,
            401,
            "the suspension undone on a"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    late(behind).write(&dir.path().join("b.yaml"));
    pb.signal("HUP");
    eventually("the suspension in force on b after its reload", || {
        let r = admin(admin_b, "GET", "/api/keys/late");
        r.status == 200 && r.json()["state"] == "suspended"
    });
    assert_eq!(call(lb, "late-key").status, 401);
    assert_eq!(call(la, "late-key").status, 401);
}

/// An issued key with a quota of its own, spent, then Redis away until both replicas find it
/// so and back empty: the count comes back, and nothing more is admitted (the set of issued
/// keys is put back and read whole meanwhile, which must not start the key's count again).
#[test]
fn an_issued_keys_own_quota_stays_spent_when_redis_returns_empty_after_an_outage() {
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = |tag: &str| {
        let path = dir.path().join(format!("{tag}-state.db"));
        config_for(&up)
            .cluster(&redis.url(), &format!("iq{}", redis.port), 100)
            .state_path(path.to_str().unwrap())
    };
    let (pa, la, admin_a) = Process::run(dir.path(), "a", &config("a"));
    let (pb, lb, admin_b) = Process::run(dir.path(), "b", &config("b"));
    let r = crate::harness::admin_json(
        admin_a,
        "POST",
        "/api/keys",
        r#"{"name":"metered-1","plan":"pro","quota":{"requests":3,"per":"day"}}"#,
    );
    assert_eq!(r.status, 201);
    let secret = r.json()["key"].as_str().unwrap().to_string();
    eventually("b serves the new key", || call(lb, &secret).status == 200);
    let mut admitted = 1 + admitted_of(la, &secret, 5);
    admitted += admitted_of(lb, &secret, 5);
    assert!((3..=5).contains(&admitted), "{admitted}");
    let port = redis.kill();
    for at in [admin_a, admin_b] {
        eventually("the replica finds the store down", || {
            metric(&metrics_page(at), "tollgate_cluster_store_up") == Some(0.0)
        });
    }
    let mut after = admitted_of(la, &secret, 3) + admitted_of(lb, &secret, 3);
    let _redis = RedisServer::start_on(port);
    for at in [admin_a, admin_b] {
        eventually("the replica finds the store back", || {
            metric(&metrics_page(at), "tollgate_cluster_store_up") == Some(1.0)
        });
    }
    for _ in 0..10 {
        after += admitted_of(la, &secret, 3) + admitted_of(lb, &secret, 3);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(after, 0, "admitted after Redis lost the count");
    for at in [admin_a, admin_b] {
        let used = state(at, "metered-1")["quota"]["used"].as_u64();
        assert!(used >= Some(admitted as u64), "{used:?} of {admitted}");
    }
    drop((pa, pb));
}
