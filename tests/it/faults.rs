//! Faults on purpose, on the wire: a disk under `state.path` that fills up, a process out of
//! file descriptors. Each test fails if a request is lost, if a change acknowledged before the
//! fault is gone after it, or if the gateway stops serving.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{
    admin, config_for, eventually, metric, metrics_page, send_raw, settled, Mode, Process,
    Response, Upstream,
};

/// A small tmpfs the test mounts (the machine's tests run as root, as CI does), unmounted when
/// dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mounting a {size} tmpfs for the disk-fault test needs root (CI runs as root)"
        );
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Fill what is left of the disk with one file.
    fn fill(&self) {
        let mut f = std::fs::File::create(self.path("filler")).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        loop {
            if let Err(e) = f.write_all(&chunk) {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                break;
            }
        }
        // The last partial chunk's bytes too: nothing is left.
        while f.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
    }

    fn free(&self) {
        std::fs::remove_file(self.path("filler")).unwrap();
    }

    /// Give `bytes` of the filled disk back: room for a start, not for a database.
    fn leave(&self, bytes: u64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path("filler"))
            .unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len.saturating_sub(bytes)).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn call(addr: SocketAddr, key: &str) -> Response {
    let raw = format!(
        "GET /v2/client/getStatus HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    );
    send_raw(addr, raw.as_bytes())
}

fn readyz(a: SocketAddr) -> (u16, String) {
    let r = admin(a, "GET", "/readyz");
    (
        r.status,
        String::from_utf8_lossy(&r.body).trim().to_string(),
    )
}

fn key_state(a: SocketAddr, name: &str) -> String {
    let r = admin(a, "GET", &format!("/api/keys/{name}"));
    assert_eq!(r.status, 200);
    r.json()["state"].as_str().unwrap().to_string()
}

/// `state.path` on a disk that fills up: no request fails, an admin change answers 503 and is
/// not applied, `/readyz` says `degraded`; once space returns, writes resume without a
/// restart (redb latches an I/O error: the file is opened again), and after a `SIGKILL`
/// everything acknowledged is there and nothing refused is.
#[test]
fn a_full_disk_refuses_admin_changes_and_fails_no_request() {
    let up = Upstream::start(Mode::Ok);
    let disk = SmallDisk::mount("1m");
    let state = disk.path("state.db");
    let config = config_for(&up)
        .state_path(state.to_str().unwrap())
        .plan_quota("standard", 1_000, "month")
        .ledger(30);
    let dir = tempfile::tempdir().unwrap();
    let (mut p, listen, a) = Process::run(dir.path(), "gw", &config);
    assert_eq!(
        admin(a, "POST", "/api/keys/basic-1/suspend").status,
        200,
        "kept before the fault"
    );
    assert_eq!(readyz(a), (200, "ready".into()));

    disk.fill();
    let r = admin(a, "POST", "/api/keys/standard-1/suspend");
    assert_eq!(
        (r.status, r.code().as_str()),
        (503, "change_not_kept"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(key_state(a, "standard-1"), "active", "refused: not applied");
    // No request fails: the quota and ledger counts wait in memory.
    for _ in 0..20 {
        assert_eq!(call(listen, "standard-key-1").status, 200);
        assert_eq!(call(listen, "basic-key-1").status, 401);
    }
    eventually("/readyz says degraded", || {
        readyz(a) == (200, "degraded".into())
    });
    assert_eq!(
        metric(
            &metrics_page(a),
            r#"tollgate_admin_changes_total{action="suspend",result="refused"}"#
        ),
        Some(1.0)
    );

    // Space again: writes resume by themselves.
    disk.free();
    eventually("/readyz says ready again", || {
        readyz(a) == (200, "ready".into())
    });
    assert_eq!(admin(a, "POST", "/api/keys/pro-1/suspend").status, 200);
    // The counts that waited are written too: the ledger holds every request.
    let ledger = admin(a, "GET", "/api/ledger?key=standard-1");
    assert_eq!(ledger.status, 200);
    assert_eq!(ledger.json()["rows"][0]["upstream_2xx"], 20);

    p.signal("KILL");
    let _ = p.wait_exit(Duration::from_secs(10));
    let (_p, listen, a) = Process::run(dir.path(), "gw", &config);
    assert_eq!(key_state(a, "basic-1"), "suspended");
    assert_eq!(key_state(a, "pro-1"), "suspended");
    assert_eq!(key_state(a, "standard-1"), "active");
    assert_eq!(call(listen, "standard-key-1").status, 200);
    let k = admin(a, "GET", "/api/keys/standard-1").json();
    assert_eq!(k["quota"]["used"], 21, "{k}");
}

/// With `cluster`, a change Redis kept while the disk under `state.path` was full is held in
/// memory (the copy is otherwise read from the file): a Redis that forgets meanwhile gets it
/// back from this replica with those the file holds, and the first write that holds once the
/// disk has room takes every field held, so that a restart while Redis is down still has it.
#[test]
fn a_fleet_change_the_full_disk_missed_is_put_back_and_written_once_it_has_room() {
    let up = Upstream::start(Mode::Ok);
    let redis = crate::harness::RedisServer::start();
    let disk = SmallDisk::mount("1m");
    let state = disk.path("state.db");
    let prefix = format!("fd{}", redis.port);
    let config = config_for(&up)
        .cluster(&redis.url(), &prefix, 100)
        .state_path(state.to_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let (mut p, _, a) = Process::run(dir.path(), "gw", &config);
    assert_eq!(admin(a, "POST", "/api/keys/basic-1/suspend").status, 200);
    disk.fill();
    let r = admin(a, "POST", "/api/keys/standard-1/suspend");
    assert_eq!(
        r.status,
        200,
        "kept in Redis: {}",
        String::from_utf8_lossy(&r.body)
    );

    let mut con = redis.client();
    let set = format!("{{{prefix}:ov}}:set");
    let parts = |con: &mut redis::Connection| -> usize {
        let fields: Vec<String> = redis::cmd("HKEYS").arg(&set).query(con).unwrap();
        fields.iter().filter(|f| !f.starts_with('~')).count()
    };
    assert_eq!(parts(&mut con), 2);
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    eventually(
        "both suspensions put back, the one on disk and the one held",
        || parts(&mut con) == 2,
    );
    let both = settled(
        || (key_state(a, "basic-1"), key_state(a, "standard-1")),
        |s| s == &("suspended".into(), "suspended".into()),
    );
    assert_eq!(both, ("suspended".into(), "suspended".into()));

    // Room again: the next change's write takes what was held.
    disk.free();
    eventually("/readyz says ready again", || {
        readyz(a) == (200, "ready".into())
    });
    assert_eq!(admin(a, "POST", "/api/keys/pro-1/suspend").status, 200);
    p.signal("KILL");
    let _ = p.wait_exit(Duration::from_secs(10));
    drop(redis);
    let (_p, _, a) = Process::run(dir.path(), "gw", &config);
    for name in ["basic-1", "standard-1", "pro-1"] {
        assert_eq!(
            key_state(a, name),
            "suspended",
            "{name}, from state.path alone"
        );
    }
}

/// `SIGKILL` while admin changes are being written and the disk fills under them: the file
/// opens again, every change acknowledged is in force, none refused is, and the one in flight
/// when the process died is either (it may have been kept without its answer getting out).
#[test]
fn a_kill_while_the_disk_fills_under_writes_leaves_the_file_whole() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    const KEYS: u32 = 3_000;
    let up = Upstream::start(Mode::Ok);
    let disk = SmallDisk::mount("1m");
    let state = disk.path("state.db");
    let mut config = config_for(&up).state_path(state.to_str().unwrap());
    for i in 0..KEYS {
        config = config.add_key(&format!("c-{i}"), &format!("customer-key-{i}"), "basic");
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut p, _, a) = Process::run(dir.path(), "gw", &config);
    let (acked, refused, stop) = (
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicU32::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    // Suspends c-0, c-1, ...: each a new record, so the file must grow.
    let writer = {
        let (acked, refused, stop) = (acked.clone(), refused.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut answered = Vec::new();
            for i in 0..KEYS {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let raw = format!(
                    "POST /api/keys/c-{i}/suspend HTTP/1.1\r\nHost: {a}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                match crate::harness::try_send_raw(a, raw.as_bytes()) {
                    Some(r) => {
                        assert!(r.status == 200 || r.status == 503, "{}", r.status);
                        let n = if r.status == 200 { &acked } else { &refused };
                        n.fetch_add(1, Ordering::Relaxed);
                        answered.push(r.status == 200);
                    }
                    // Killed: this change was in flight.
                    None => break,
                }
            }
            answered
        })
    };
    eventually("changes acknowledged", || {
        acked.load(Ordering::Relaxed) >= 20
    });
    disk.fill();
    eventually("changes refused on the full disk", || {
        refused.load(Ordering::Relaxed) >= 3
    });
    disk.free();
    let before = acked.load(Ordering::Relaxed);
    eventually("changes acknowledged again", || {
        acked.load(Ordering::Relaxed) >= before + 20
    });
    // Killed while writing.
    p.signal("KILL");
    let _ = p.wait_exit(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let answered = writer.join().unwrap();
    let (_p, _, a) = Process::run(dir.path(), "gw", &config);
    for (i, &ok) in answered.iter().enumerate() {
        let want = if ok { "suspended" } else { "active" };
        assert_eq!(key_state(a, &format!("c-{i}")), want, "c-{i}");
    }
    // The change in flight, and the next: either state, then nothing.
    let n = answered.len();
    assert_eq!(key_state(a, &format!("c-{}", n + 1)), "active");
}

/// A `state.path` that cannot be written at start is a setup error naming the path.
#[test]
fn an_unwritable_state_path_at_start_is_a_setup_error_naming_it() {
    let up = Upstream::start(Mode::Ok);
    let disk = SmallDisk::mount("64k");
    disk.fill();
    let state = disk.path("state.db");
    let config = config_for(&up).state_path(state.to_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.yaml");
    config.write(&path);
    let mut p = Process::spawn(
        dir.path(),
        "gw",
        &["run", "--config", path.to_str().unwrap()],
        &[],
    );
    let status = p.wait_exit(Duration::from_secs(20)).expect("run exits");
    assert!(!status.success());
    let out = p.output();
    assert!(out.contains(state.to_str().unwrap()), "{out}");
    assert!(!state.exists(), "a failed start leaves no state.path");

    // Room for part of what a start writes (redb's first write is 73,728 bytes): the start
    // fails again, and leaves nothing that is not a database (a database whole, or none).
    disk.leave(40 * 1024);
    let mut p = Process::spawn(
        dir.path(),
        "gw-partial",
        &["run", "--config", path.to_str().unwrap()],
        &[],
    );
    let status = p.wait_exit(Duration::from_secs(20)).expect("run exits");
    assert!(!status.success(), "{}", p.output());
    let mut left: Vec<_> = std::fs::read_dir(state.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert!(
        left == ["filler"] || left == ["filler", "state.db"],
        "nothing of the attempt is left but a whole database: {left:?}"
    );

    // Once the disk has room, the next start creates it and serves.
    disk.free();
    let (mut p, listen, _) = Process::run(dir.path(), "gw-after", &config);
    assert_eq!(call(listen, "standard-key-1").status, 200);
    p.stop();
    assert!(state.exists());
}

/// Out of descriptors: under a 300-descriptor limit, 400 clients connect and hold their
/// connections. The gateway refuses what it cannot hold
/// (`tollgate_connections_refused_total{reason="no_descriptors"}`, one log line for the
/// episode), the admin listener answers `/healthz` throughout (its descriptors are kept in
/// reserve), and once the clients leave the gateway serves again.
#[test]
fn out_of_descriptors_the_gateway_refuses_and_the_admin_listener_answers() {
    let up = Upstream::start(Mode::Ok);
    let config = config_for(&up);
    let dir = tempfile::tempdir().unwrap();
    let (p, listen, a) = Process::run_limited(dir.path(), "gw", &config, Some(300));
    assert_eq!(call(listen, "standard-key-1").status, 200);

    let mut clients = Vec::new();
    for _ in 0..400 {
        match TcpStream::connect(listen) {
            Ok(s) => clients.push(s),
            Err(e) => panic!("the listener stops accepting: {e}"),
        }
    }
    let refused = r#"tollgate_connections_refused_total{reason="no_descriptors"}"#;
    eventually("connections refused for want of descriptors", || {
        metric(&metrics_page(a), refused).is_some_and(|n| n >= 100.0)
    });
    // The admin listener answers while the gateway is out of descriptors.
    for _ in 0..5 {
        assert_eq!(admin(a, "GET", "/healthz").status, 200);
    }
    // The clients leave: the gateway serves again.
    drop(clients);
    eventually("the gateway serves again", || {
        crate::harness::try_send_raw(
            listen,
            b"GET /v2/client/getStatus HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer standard-key-1\r\nConnection: close\r\n\r\n",
        )
        .is_some_and(|r| r.status == 200)
    });
    // The episode ends with an admission a second after the last refusal.
    eventually("the episode's end is logged", || {
        assert_eq!(call(listen, "standard-key-1").status, 200);
        p.output().contains("file descriptors free again")
    });
    let out = p.output();
    assert_eq!(
        out.matches("out of file descriptors").count(),
        1,
        "one line per episode"
    );
}

/// Redis behind Sentinel fails over under load ([`failover_under_load`]).
#[test]
fn a_sentinel_failover_under_load_fails_no_request_and_loses_no_change() {
    let _one = crate::harness::one_fleet();
    let mut sentinel = crate::harness::RedisSentinel::start();
    let url = sentinel.url();
    failover_under_load(&url, "tgfail", || sentinel.fail_over());
}

/// Behind Sentinel, the replica stops (SIGSTOP): `WAIT` confirms nothing, so every round's
/// quota and ledger counts wait to be confirmed and are sent again, as they were, round after
/// round, until the replica is back. The master applies each once: its count never runs
/// ahead of the requests sent, new counts wait on their meters after three unconfirmed
/// rounds, and once the replica confirms again the fleet's count and the ledger are exactly
/// the requests sent.
#[test]
fn counts_no_replica_confirms_are_sent_again_and_added_once() {
    let _one = crate::harness::one_fleet();
    let sentinel = crate::harness::RedisSentinel::start();
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let config = config_for(&up)
        .cluster(&sentinel.url(), "tgwait", 20)
        .cluster_with(|c| c.timeout_ms = 200)
        .all_limits(100_000)
        .plan_quota("standard", 1_000_000, "month")
        .ledger(30);
    let (_gw, listen, admin_addr) = Process::run(dir.path(), "gw", &config);
    let mut master = sentinel.primary.as_ref().expect("a primary").client();
    // The fleet's count of the key, and the highest call number the gateway had applied.
    let mut in_redis = || -> (u64, u64) {
        let hashes: Vec<String> = redis::cmd("KEYS")
            .arg("tgwait:{meters}:q:*")
            .query(&mut master)
            .unwrap();
        let (mut count, mut number) = (0, 0);
        for h in hashes {
            let fields: Vec<(String, u64)> =
                redis::cmd("HGETALL").arg(&h).query(&mut master).unwrap();
            for (f, v) in fields {
                match f.as_str() {
                    "standard-1" => count += v,
                    f if f.starts_with('~') && f.ends_with('#') => number = number.max(v),
                    _ => {}
                }
            }
        }
        (count, number)
    };
    let mut sent = 0u64;
    for _ in 0..10 {
        assert_eq!(call(listen, "standard-key-1").status, 200);
        sent += 1;
    }
    eventually("the fleet counts 10", || in_redis().0 == 10);

    sentinel.replica.signal("STOP");
    // Requests flow until three rounds that laid new counts went unconfirmed (the call
    // numbers stop rising: new counts wait) and the master has seen counts sent again: at
    // every step its count is at most the requests sent.
    // Rounds are counted by how far the number rose, not by the numbers seen: a loaded
    // machine may run two rounds between two looks.
    let (mut numbers, mut last) = (BTreeSet::new(), in_redis().1);
    let stopped_at = last;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while last < stopped_at + 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "rounds went on: {numbers:?}"
        );
        assert_eq!(call(listen, "standard-key-1").status, 200);
        sent += 1;
        let (count, number) = in_redis();
        assert!(count <= sent, "{count} counted for {sent} requests");
        if number > last {
            numbers.insert(number);
            last = number;
        }
    }
    for _ in 0..20 {
        assert_eq!(call(listen, "standard-key-1").status, 200);
        sent += 1;
        let (count, _) = in_redis();
        assert!(count <= sent, "{count} counted for {sent} requests");
    }
    sentinel.replica.signal("CONT");
    let used = || admin(admin_addr, "GET", "/api/keys/standard-1").json()["quota"]["used"].as_u64();
    let counted = settled(|| (in_redis().0, used()), |c| *c == (sent, Some(sent)));
    assert_eq!(counted, (sent, Some(sent)), "every request counted once");
    let forwarded = || {
        let r = admin(admin_addr, "GET", "/api/ledger?key=standard-1");
        r.json()["rows"][0]["forwarded"].as_u64()
    };
    assert_eq!(settled(forwarded, |f| *f == Some(sent)), Some(sent));
}

/// A Redis Cluster with a replica per master fails over under load: the master holding the
/// overrides' slot, the very node the gateways were configured with, is killed and its
/// replica takes over ([`failover_under_load`]).
#[test]
fn a_redis_cluster_failover_under_load_fails_no_request_and_loses_no_change() {
    let _one = crate::harness::one_fleet();
    let mut cluster = crate::harness::RedisCluster::start_with(3, 1);
    let port = cluster.master_port_of("{tgcfail:ov}:set");
    let url = format!("redis://127.0.0.1:{port}/0");
    failover_under_load(&url, "tgcfail", || {
        cluster.kill_master_of("{tgcfail:ov}:set");
    });
}

/// Two gateways on the store at `url`, requests flowing through both while `fail_over` kills
/// the master and a replica takes over. No request fails; the suspension and the quota counts
/// acknowledged before are in force after (behind Sentinel a change is acknowledged only once
/// a replica holds it: `WAIT`), a change made after reaches both gateways, and the quota
/// counts add up exactly.
fn failover_under_load(url: &str, prefix: &str, fail_over: impl FnOnce()) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    const LIMIT: u32 = 20;

    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let gateways: Vec<(Process, SocketAddr, SocketAddr)> = (0..2)
        .map(|i| {
            let mut config = config_for(&up)
                .cluster(url, prefix, 20)
                .cluster_with(|c| c.timeout_ms = 500)
                .all_limits(100_000)
                .plan_limit("basic", LIMIT)
                .plan_quota("standard", 1_000_000, "month");
            // An hour's window: the budget checked after the failover is one window's.
            config.file.limits.window_seconds = 3_600;
            Process::run(dir.path(), &format!("gw{i}"), &config)
        })
        .collect();
    let (g0, g1) = (
        (gateways[0].1, gateways[0].2),
        (gateways[1].1, gateways[1].2),
    );

    // Acknowledged before the failover: a suspension, and quota counts.
    assert_eq!(admin(g0.1, "POST", "/api/keys/basic-1/suspend").status, 200);
    let sent = Arc::new(AtomicU64::new(0));
    for i in 0..30 {
        let g = if i % 2 == 0 { g0 } else { g1 };
        assert_eq!(call(g.0, "standard-key-1").status, 200);
        sent.fetch_add(1, Ordering::Relaxed);
    }
    let used =
        |a: SocketAddr| admin(a, "GET", "/api/keys/standard-1").json()["quota"]["used"].as_u64();
    // A gateway learns the fleet's count when it sends its own: the one that sent last
    // knows the whole of it.
    let fleet_used = || used(g0.1).max(used(g1.1));
    eventually("the fleet counts 30", || fleet_used() == Some(30));

    // Load through both gateways while the primary dies.
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = [g0.0, g1.0]
        .into_iter()
        .map(|listen| {
            let (stop, sent) = (stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let mut failed = Vec::new();
                for _ in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let r = call(listen, "standard-key-1");
                    sent.fetch_add(1, Ordering::Relaxed);
                    if r.status != 200 {
                        failed.push(r.status);
                    }
                    assert_eq!(call(listen, "basic-key-1").status, 401, "still suspended");
                }
                failed
            })
        })
        .collect();
    let before = sent.load(Ordering::Relaxed);
    eventually("load flows", || sent.load(Ordering::Relaxed) >= before + 50);
    fail_over();
    // The gateways find the new master: a change made now reaches both. When it does not,
    // the last answer says why (and the gateways' logs, printed as they drop).
    let r = crate::harness::settled(
        || admin(g1.1, "POST", "/api/keys/pro-1/suspend"),
        |r| r.status == 200,
    );
    assert_eq!(
        r.status,
        200,
        "a change after the failover is kept: {}",
        String::from_utf8_lossy(&r.body)
    );
    eventually("the change reaches the other gateway", || {
        call(g0.0, "pro-key-1").status == 401
    });
    let after = sent.load(Ordering::Relaxed);
    eventually("load flows after the failover", || {
        sent.load(Ordering::Relaxed) >= after + 50
    });
    stop.store(true, Ordering::Relaxed);
    for t in load {
        let failed = t.join().unwrap();
        assert!(failed.is_empty(), "failed requests: {failed:?}");
    }
    // Acknowledged before, in force after; every count kept, once. A tick whose counts no
    // replica confirmed in time sends them again, and the master applies each call once
    // (docs/cluster.md): a late confirmation counts nothing twice.
    assert_eq!(call(g1.0, "basic-key-1").status, 401);
    let total = sent.load(Ordering::Relaxed);
    let counted = settled(fleet_used, |seen| *seen == Some(total));
    assert_eq!(counted, Some(total), "counted for {total} requests");
    let ready = |a| admin(a, "GET", "/readyz").status;
    assert_eq!((ready(g0.1), ready(g1.1)), (200, 200));
    // Budgets keep their bound after the failover: a key on a 20-per-window plan, asked 100
    // times through both gateways, is admitted its limit and at most a window's limit more
    // per replica (the contract's bound).
    let admitted = (0..100)
        .filter(|i| {
            let g = if i % 2 == 0 { g0 } else { g1 };
            let r = call(g.0, "acme-customer-key");
            assert!(r.status == 200 || r.status == 429, "{}", r.status);
            r.status == 200
        })
        .count();
    assert!(
        (LIMIT as usize..=3 * LIMIT as usize).contains(&admitted),
        "admitted {admitted} of a limit of {LIMIT}"
    );
}

/// libfaketime's library, preloaded into a gateway so the test can step its wall clock
/// (installed by `.ci/run`: apt-get install faketime).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// The wall clock of a gateway the test steps: the offset from the real clock, in a file
/// libfaketime reads on every call (the monotonic clock is left alone).
struct SteppedClock {
    file: PathBuf,
}

impl SteppedClock {
    /// Put the gateway's wall clock at `at` (it runs on from there).
    fn set(&self, at: time::OffsetDateTime) {
        let offset = (at - time::OffsetDateTime::now_utc()).whole_seconds();
        std::fs::write(&self.file, format!("{offset:+}\n")).unwrap();
    }
}

/// `/api/ledger`'s default `to`: the gateway's today, by its calendar.
fn gateway_today(a: SocketAddr) -> String {
    admin(a, "GET", "/api/ledger").json()["to"]
        .as_str()
        .unwrap()
        .to_string()
}

fn day(at: time::OffsetDateTime) -> String {
    let d = at.date();
    format!("{:04}-{:02}-{:02}", d.year(), d.month() as u8, d.day())
}

/// The wall clock steps back across midnight, forward across the month's end, and back again
/// (NTP): no window budget moves (windows run on the monotonic clock), the monthly quota
/// charges no period twice and skips none (a count never goes back to an earlier period), and
/// the ledger holds every request once, its rows in day order.
#[test]
fn a_wall_clock_step_moves_no_budget_and_charges_no_period_twice() {
    use time::{Duration as Span, OffsetDateTime, Time};

    assert!(
        Path::new(FAKETIME).exists(),
        "libfaketime is installed (.ci/run installs it: apt-get install faketime)"
    );
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let clock = SteppedClock {
        file: dir.path().join("faketime"),
    };
    // The first instant of next month, by the real clock.
    let now = OffsetDateTime::now_utc();
    let first = now.date().replace_day(1).unwrap();
    let next_month = (first + Span::days(32))
        .replace_day(1)
        .unwrap()
        .with_time(Time::MIDNIGHT);
    let next_month = next_month.assume_utc();
    let before_end = next_month - Span::seconds(30);
    clock.set(before_end);

    let mut config = config_for(&up).plan_quota("basic", 4, "month").ledger(30);
    // A day-long window: none of it passes during the test, so the budget can only fall.
    config.file.limits.window_seconds = 86_400;
    let path = dir.path().join("gw.yaml");
    config.write(&path);
    let p = Process::spawn(
        dir.path(),
        "gw",
        &["run", "--config", path.to_str().unwrap()],
        &[
            ("TOLLGATE_LOG", "info"),
            ("LD_PRELOAD", FAKETIME),
            ("FAKETIME_TIMESTAMP_FILE", clock.file.to_str().unwrap()),
            ("FAKETIME_NO_CACHE", "1"),
            ("DONT_FAKE_MONOTONIC", "1"),
        ],
    );
    let (listen, a): (SocketAddr, SocketAddr) = (
        config.file.listen.parse().unwrap(),
        config.file.admin_listen.parse().unwrap(),
    );
    crate::harness::wait_ready(a, 200);
    let _p = p;
    assert_eq!(
        gateway_today(a),
        day(before_end),
        "the gateway runs on the stepped clock"
    );

    let used = || admin(a, "GET", "/api/keys/basic-1").json()["quota"]["used"].as_u64();
    let mut window = Vec::new();
    let mut send = || {
        let r = call(listen, "basic-key-1");
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        window.push(r.remaining());
    };
    send();
    send();
    assert_eq!(used(), Some(2));

    // Back across midnight: the window runs on, the month's count stays.
    let yesterday = before_end - Span::hours(25);
    clock.set(yesterday);
    eventually("the gateway's calendar steps back", || {
        gateway_today(a) == day(yesterday)
    });
    send();
    assert_eq!(used(), Some(3), "no reset, and nothing charged twice");

    // Forward past the month's end: a new period, counted from 0.
    let new_month = next_month + Span::seconds(30);
    clock.set(new_month);
    eventually("the gateway's calendar reaches the new month", || {
        gateway_today(a) == day(new_month)
    });
    send();
    assert_eq!(used(), Some(1), "the new month's first request");

    // Back into the old month: the count stays in the new one (the old month is not
    // charged again, and the new one is not skipped).
    clock.set(yesterday);
    eventually("the gateway's calendar steps back again", || {
        gateway_today(a) == day(yesterday)
    });
    send();
    assert_eq!(used(), Some(2));

    // The window's budget fell by one per request, whatever the wall clock did.
    let first_left = window[0];
    let expected: Vec<u32> = (0..5).map(|i| first_left - i).collect();
    assert_eq!(window, expected);
    // Every request once in the ledger, rows in day order.
    let from = day(yesterday);
    let to = day(new_month);
    let rows = admin(
        a,
        "GET",
        &format!("/api/ledger?key=basic-1&from={from}&to={to}"),
    )
    .json()["rows"]
        .clone();
    let rows = rows.as_array().unwrap();
    let days: Vec<&str> = rows.iter().map(|r| r["day"].as_str().unwrap()).collect();
    let mut sorted = days.clone();
    sorted.sort_unstable();
    assert_eq!(days, sorted, "rows in day order");
    let total: u64 = rows
        .iter()
        .map(|r| r["upstream_2xx"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 5, "{rows:?}");
}

/// A reload while Redis hangs (`SIGSTOP`): it applies at once on the replica asked, requests
/// flow on both replicas throughout, the suspension acknowledged before is in force during and
/// after, and once Redis answers again a change made then reaches both.
#[test]
fn a_reload_while_redis_hangs_applies_and_loses_nothing() {
    let _one = crate::harness::one_fleet();
    let up = Upstream::start(Mode::Ok);
    let redis = crate::harness::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let configs: Vec<_> = (0..2)
        .map(|_| {
            config_for(&up)
                .cluster(&redis.url(), "tgreload", 20)
                .cluster_with(|c| c.timeout_ms = 200)
        })
        .collect();
    let gateways: Vec<(Process, SocketAddr, SocketAddr)> = configs
        .iter()
        .enumerate()
        .map(|(i, c)| Process::run(dir.path(), &format!("gw{i}"), c))
        .collect();
    let (g0, g1) = (
        (gateways[0].1, gateways[0].2),
        (gateways[1].1, gateways[1].2),
    );
    assert_eq!(admin(g0.1, "POST", "/api/keys/basic-1/suspend").status, 200);
    eventually("the suspension reaches the other replica", || {
        call(g1.0, "basic-key-1").status == 401
    });

    redis.signal("STOP");
    // The reload: pro's limit changes.
    configs[0]
        .clone()
        .plan_limit("pro", 77)
        .write(&dir.path().join("gw0.yaml"));
    let r = admin(g0.1, "POST", "/reload");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    for g in [g0, g1] {
        for _ in 0..10 {
            assert_eq!(call(g.0, "pro-key-1").status, 200);
            assert_eq!(call(g.0, "basic-key-1").status, 401, "still suspended");
        }
    }
    let r = call(g0.0, "pro-key-1");
    assert!(
        r.header("ratelimit-policy").unwrap().contains("q=77"),
        "{:?}",
        r.header("ratelimit-policy")
    );

    redis.signal("CONT");
    eventually("a change after Redis is back is kept", || {
        admin(g1.1, "POST", "/api/keys/standard-1/suspend").status == 200
    });
    eventually("and reaches the reloaded replica", || {
        call(g0.0, "standard-key-1").status == 401
    });
    assert_eq!(call(g0.0, "basic-key-1").status, 401);
    assert_eq!(call(g1.0, "basic-key-1").status, 401);
}

/// `SIGKILL` at once after `SIGHUP`, the new config dropping a suspended key: whatever
/// moment of the reload the kill met, the process starts again on the new file, the store
/// opens, and the change kept for the key that stays is in force.
#[test]
fn a_kill_during_a_reload_keeps_what_was_kept() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.db");
    let config = config_for(&up).state_path(state.to_str().unwrap());
    for round in 0..3 {
        let (mut p, _, a) = Process::run(dir.path(), "gw", &config);
        assert_eq!(admin(a, "POST", "/api/keys/basic-1/suspend").status, 200);
        assert_eq!(admin(a, "POST", "/api/keys/standard-1/suspend").status, 200);
        let dropped = config.clone().without_key("standard-1");
        dropped.write(&dir.path().join("gw.yaml"));
        p.signal("HUP");
        p.signal("KILL");
        let _ = p.wait_exit(Duration::from_secs(10));
        let (_p, listen, a) = Process::run(dir.path(), "gw", &dropped);
        assert_eq!(key_state(a, "basic-1"), "suspended", "round {round}");
        assert_eq!(call(listen, "basic-key-1").status, 401);
        assert_eq!(admin(a, "GET", "/api/keys/standard-1").status, 404);
        assert_eq!(call(listen, "pro-key-1").status, 200);
    }
}
