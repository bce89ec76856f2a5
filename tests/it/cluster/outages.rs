//! Redis down, killed or stopped: no request costs more than the timeout, and sharing comes
//! back by itself.

use super::*;

#[test]
fn redis_stopped_or_killed_under_load_costs_no_request_and_sharing_resumes_by_itself() {
    let _timed = one_at_a_time();
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // A one-second Redis timeout: a request whose key has no lease waits for the store at most
    // that long (then decides on limit / N); none may wait longer.
    let replicas = fleet(dir.path(), 3, &up, &redis, |c| {
        c.plan_limit("basic", 60)
            .cluster_with(|k| k.timeout_ms = 1000)
    });
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.listen).collect();
    let drive_for = |length: Duration| {
        drive(&addrs, "basic-key-1", 90.0, length, Instant::now(), |i| {
            (i % 3) as usize
        })
    };
    let check = |trace: &Trace, phase: &str| {
        assert!(
            trace.iter().all(|e| e.2 == 200 || e.2 == 429),
            "{phase}: an answer other than 200 or 429"
        );
        let slowest = trace.iter().map(|e| e.3).max().unwrap();
        assert!(
            slowest < Duration::from_millis(1000 + 150),
            "{phase}: a request took {slowest:?} (Redis's timeout is 1 s)"
        );
    };
    check(&drive_for(WINDOW), "Redis up");

    // Stopped: requests go on; each replica enforces limit / N = 20 per window.
    redis.signal("STOP");
    let stopped = drive_for(3 * WINDOW);
    check(&stopped, "Redis stopped");
    for r in &replicas {
        eventually("store_up says 0", || {
            metric(&metrics_page(r.admin), "tollgate_cluster_store_up") == Some(0.0)
        });
        let ready = admin(r.admin, "GET", "/readyz");
        assert_eq!(ready.status, 200);
        assert_eq!(String::from_utf8_lossy(&ready.body), "degraded\n");
    }
    // The last two windows of the stop: every replica on its own share (the first window
    // still spends what the views held when Redis stopped).
    let late: Trace = stopped.iter().filter(|e| e.0 >= WINDOW).cloned().collect();
    for r in 0..3 {
        let mine = late.iter().filter(|e| e.1 == r && e.2 == 200).count();
        assert!(
            mine <= 2 * 20 + 20,
            "replica {r} admitted {mine} in two windows alone (limit / N = 20 per window)"
        );
        assert!(
            mine >= 2 * 20 - 10,
            "replica {r} admitted only {mine}: not its share"
        );
    }

    // Continued: sharing resumes without a restart.
    redis.signal("CONT");
    for r in &replicas {
        eventually("store_up says 1 again", || {
            metric(&metrics_page(r.admin), "tollgate_cluster_store_up") == Some(1.0)
        });
        assert_eq!(
            String::from_utf8_lossy(&admin(r.admin, "GET", "/readyz").body),
            "ready\n"
        );
    }
    check(&drive_for(WINDOW), "Redis back");

    // Killed, then a new one on the same port: the same, through reconnection.
    let port = redis.kill();
    check(&drive_for(WINDOW), "Redis killed");
    for r in &replicas {
        eventually("store_up says 0", || {
            metric(&metrics_page(r.admin), "tollgate_cluster_store_up") == Some(0.0)
        });
    }
    let redis = RedisServer::start_on(port);
    for r in &replicas {
        eventually("store_up says 1 with the new Redis", || {
            metric(&metrics_page(r.admin), "tollgate_cluster_store_up") == Some(1.0)
        });
    }
    let mut con = redis.client();
    let fleet: u32 = redis::cmd("ZCARD")
        .arg("tgtest:fleet")
        .query(&mut con)
        .unwrap();
    assert_eq!(fleet, 3, "every replica heartbeats to the new Redis");
    // The new Redis has no script: the budget calls (one pipeline) are answered NOSCRIPT, the
    // script is loaded, and those calls sent again: the key's budget is there.
    check(&drive_for(Duration::from_secs(1)), "a new Redis");
    eventually("the key's budget in the new Redis", || {
        let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
        names.iter().any(|n| is_budget_name(n))
    });

    // One line per transition, per replica: down, up, down, up.
    for mut r in replicas {
        r.process.stop();
        let out = r.process.output();
        let down = out.matches("cluster store unreachable").count();
        let back = out.matches("cluster store reachable").count();
        assert_eq!((down, back), (2, 2), "{out}");
    }
}

#[test]
fn a_gateway_starts_and_serves_with_redis_down_from_the_start() {
    let up = Upstream::start(Mode::Ok);
    let dir = tempfile::tempdir().unwrap();
    let port = crate::harness::closed_port();
    let config = config_for(&up).cluster(&format!("redis://:s3cret@127.0.0.1:{port}/0"), "tg", 20);
    let path = dir.path().join("gw.yaml");
    config.write(&path);
    let listen: SocketAddr = config.file.listen.parse().unwrap();
    let admin_addr: SocketAddr = config.file.admin_listen.parse().unwrap();
    let mut p = Process::spawn(
        dir.path(),
        "gw",
        &["run", "--config", path.to_str().unwrap()],
        &[("TOLLGATE_LOG", "info")],
    );
    wait_ready(admin_addr, 200);
    assert_eq!(call(listen, "basic-key-1").0, 200);
    eventually("store_up says 0", || {
        metric(&metrics_page(admin_addr), "tollgate_cluster_store_up") == Some(0.0)
    });
    assert_eq!(
        String::from_utf8_lossy(&admin(admin_addr, "GET", "/readyz").body),
        "degraded\n"
    );
    // Alone and down: the limit over N = 1, all of it.
    let codes: BTreeSet<u16> = (0..5).map(|_| call(listen, "basic-key-1").0).collect();
    assert_eq!(codes, BTreeSet::from([200]));
    p.stop();
    let out = p.output();
    assert_eq!(out.matches("cluster store unreachable").count(), 1, "{out}");
    assert!(!out.contains("s3cret"), "the password reached the log");
    assert!(out.contains("redis://:***@127.0.0.1"), "{out}");
}

#[test]
fn redis_stopped_under_a_cold_burst_costs_no_request_more_than_the_timeout() {
    let _timed = one_at_a_time();
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // The product's default timeout, 100 ms.
    let replicas = fleet(dir.path(), 3, &up, &redis, |c| {
        c.plan_limit("basic", 60)
            .add_key("cold", "cold-burst-key", "basic")
            .cluster_with(|k| k.timeout_ms = 100)
    });
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.listen).collect();
    for r in &replicas {
        eventually("every replica counts three", || {
            metric(&metrics_page(r.admin), "tollgate_cluster_replicas") == Some(3.0)
        });
    }
    // Stopped, and before any replica has noticed, a burst on a key none has seen.
    redis.signal("STOP");
    let cold = burst(&addrs, "cold-burst-key", 90, |i| (i % 3) as usize);
    assert!(
        cold.iter().all(|e| e.2 == 200 || e.2 == 429),
        "an answer other than 200 or 429: {cold:?}"
    );
    let slowest = cold.iter().map(|e| e.3).max().unwrap();
    // The wait is at most the timeout; the rest is the request's own way through.
    assert!(
        slowest < Duration::from_millis(100 + 100),
        "a request took {slowest:?} (the timeout is 100 ms)"
    );
    // Decided on limit / N = 20 per replica: together what one process admits, within 10 %.
    let (ok, single) = (admitted(&cold).len(), one_process(&cold, 60).len());
    assert!(
        ok <= single + 6,
        "{ok} admitted with the store stopped, one process {single}"
    );
    assert!(ok >= 20, "only {ok} admitted: not even one replica's share");
    redis.signal("CONT");
    for r in &replicas {
        eventually("store_up says 1 again", || {
            metric(&metrics_page(r.admin), "tollgate_cluster_store_up") == Some(1.0)
        });
    }
}
