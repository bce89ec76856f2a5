//! Both bounds of a shared budget on the wire: three replicas admit what one process would,
//! within the contract's excess, and a burst from idle whole.

use super::*;

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn three_replicas_share_each_budget_within_the_contract_and_redis_holds_no_key() {
    let _timed = one_at_a_time();
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = [
        ("even", "cluster-even-key"),
        ("skewed", "cluster-skewed-key"),
        ("steady", "cluster-steady-key"),
    ];
    let replicas = fleet(dir.path(), 3, &up, &redis, |c| {
        keys.iter()
            .fold(c.plan_limit("basic", 100), |c, (name, key)| {
                c.add_key(name, key, "basic")
            })
            .cluster_with(|k| k.timeout_ms = PATIENT_MS)
    });
    let addrs: Arc<Vec<SocketAddr>> = Arc::new(replicas.iter().map(|r| r.listen).collect());
    let length = 8 * WINDOW;
    let start = Instant::now() + Duration::from_millis(200);
    let spawn = |key: &'static str, rate: f64, pick: fn(u64) -> usize| {
        let addrs = Arc::clone(&addrs);
        std::thread::spawn(move || drive(&addrs, key, rate, length, start, pick))
    };
    // 2× the limit (100 per 2 s) spread evenly; 2× with 80 % on one replica; 90 % evenly.
    let even = spawn(keys[0].1, 100.0, |i| (mix(i) % 3) as usize);
    let skewed = spawn(keys[1].1, 100.0, |i| {
        if mix(i) % 10 < 8 {
            0
        } else {
            1 + (mix(i) % 2) as usize
        }
    });
    let steady = spawn(keys[2].1, 45.0, |i| (i % 3) as usize);
    let (even, skewed, steady) = (
        even.join().unwrap(),
        skewed.join().unwrap(),
        steady.join().unwrap(),
    );

    for (name, trace) in [("even", &even), ("skewed", &skewed)] {
        assert!(trace.iter().all(|e| e.2 == 200 || e.2 == 429), "{name}");
        let (fleet, single) = (admitted(trace), one_process(trace, 100));
        let excess = worst_excess(&fleet, &single, WINDOW.as_nanos() as u64, 50_000_000);
        let short = worst_shortfall(&fleet, &single, WINDOW.as_nanos() as u64, 50_000_000);
        eprintln!(
            "{name}: {} requests, the fleet admitted {}, one process {}; worst window +{excess}, from idle {short} under",
            trace.len(),
            fleet.len(),
            single.len()
        );
        assert!(
            excess <= 10,
            "{name}: a window held {excess} more than one process (10 % of 100 allowed)"
        );
        assert!(
            short <= 10,
            "{name}: the first window held {short} fewer than one process (10 % of 100 allowed)"
        );
        let off = (fleet.len() as f64 - single.len() as f64).abs() / single.len() as f64;
        assert!(
            off <= 0.02,
            "{name}: over the run {} vs {}",
            fleet.len(),
            single.len()
        );
    }
    let refused = steady.iter().filter(|e| e.2 != 200).count();
    assert_eq!(
        refused, 0,
        "a client at 90 % of its limit, spread over replicas, was refused"
    );

    // Each replica reported, and counted the fleet.
    for r in &replicas {
        let page = metrics_page(r.admin);
        assert_eq!(metric(&page, "tollgate_cluster_store_up"), Some(1.0));
        assert_eq!(metric(&page, "tollgate_cluster_replicas"), Some(3.0));
        let calls = metric(&page, "tollgate_cluster_redis_calls_total").unwrap();
        assert!(calls > 0.0);
    }

    // What Redis holds: names from digests under the prefix, numbers, expiries; no key.
    let mut con = redis.client();
    let names: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    assert!(names.contains(&"tgtest:fleet".to_string()), "{names:?}");
    let budgets: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("tgtest:b:{"))
        .collect();
    assert_eq!(budgets.len(), 3, "one budget per key: {names:?}");
    let secrets: Vec<String> = keys
        .iter()
        .flat_map(|(_, k)| {
            let d = Digest::of(k.as_bytes());
            [k.to_string(), hex_of(&d.0), hex_of(&d.0)[..16].to_string()]
        })
        .collect();
    for name in &names {
        assert!(
            name == "tgtest:fleet" || is_budget_name(name),
            "an unexpected name in Redis: {name}"
        );
        let ttl: i64 = redis::cmd("PTTL").arg(name).query(&mut con).unwrap();
        assert!(ttl > 0, "{name} does not expire (PTTL {ttl})");
        let dump: Vec<String> = if name.ends_with(":fleet") {
            redis::cmd("ZRANGE")
                .arg(name)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(&mut con)
                .unwrap()
        } else {
            redis::cmd("HGETALL").arg(name).query(&mut con).unwrap()
        };
        for s in secrets.iter() {
            assert!(!name.contains(s.as_str()), "{name} holds a key or digest");
            assert!(
                dump.iter().all(|v| !v.contains(s.as_str())),
                "{name} holds a key or digest"
            );
        }
        if !name.ends_with(":fleet") {
            // Field names: `t` and `r<replica>`; values: numbers (`when:hits` for a replica).
            for pair in dump.chunks(2) {
                assert!(
                    pair[0] == "t" || pair[0].starts_with('r'),
                    "{name}: {pair:?}"
                );
                let numbers = pair[1].split(':').all(|n| n.parse::<u64>().is_ok());
                assert!(numbers, "{name}: {pair:?}");
            }
        }
    }
    for mut r in replicas {
        r.process.stop();
        assert!(!r.process.output().contains("cluster store unreachable"));
    }
}

#[test]
fn a_burst_from_idle_is_admitted_as_one_process_would_admit_it() {
    let _timed = one_at_a_time();
    let up = Upstream::start(Mode::Ok);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let keys = ["idle-one-key", "idle-spread-key", "idle-sixty-key"];
    let replicas = fleet(dir.path(), 3, &up, &redis, |c| {
        keys.iter()
            .enumerate()
            .fold(c.plan_limit("basic", 40), |c, (i, key)| {
                c.add_key(&format!("idle{i}"), key, "basic")
            })
            .cluster_with(|k| k.timeout_ms = PATIENT_MS)
    });
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.listen).collect();
    for r in &replicas {
        eventually("every replica counts three", || {
            metric(&metrics_page(r.admin), "tollgate_cluster_replicas") == Some(3.0)
        });
    }
    // The limit, all on one replica, from idle: all of it.
    let one = burst(&addrs, keys[0], 40, |_| 0);
    let ok = one.iter().filter(|e| e.2 == 200).count();
    assert_eq!(ok, 40, "a burst of the limit on one replica: {one:?}");
    // The limit, round robin over three: all of it.
    let spread = burst(&addrs, keys[1], 40, |i| (i % 3) as usize);
    let ok = spread.iter().filter(|e| e.2 == 200).count();
    assert_eq!(
        ok, 40,
        "a burst of the limit over three replicas: {spread:?}"
    );
    // One and a half times the limit, round robin: what one process admits, within 10 %
    // either way, and never a request slower than the store's timeout.
    let sixty = burst(&addrs, keys[2], 60, |i| (i % 3) as usize);
    let (fleet, single) = (admitted(&sixty), one_process(&sixty, 40));
    eprintln!(
        "60 from idle over three replicas: the fleet admitted {}, one process {}",
        fleet.len(),
        single.len()
    );
    assert!(
        fleet.len().abs_diff(single.len()) <= 4,
        "the fleet admitted {}, one process {}",
        fleet.len(),
        single.len()
    );
    for trace in [&one, &spread, &sixty] {
        assert!(trace.iter().all(|e| e.2 == 200 || e.2 == 429));
        let slowest = trace.iter().map(|e| e.3).max().unwrap();
        assert!(slowest < Duration::from_millis(PATIENT_MS), "{slowest:?}");
    }
    // The requests that waited for the store are counted, and their waits measured.
    let page = metrics_page(replicas[1].admin);
    let parked = metric(&page, "tollgate_cluster_parked_total").unwrap();
    let waits = metric(&page, "tollgate_cluster_settle_wait_seconds_count").unwrap();
    assert!(
        parked >= 1.0 && waits >= 1.0,
        "parked {parked}, waits {waits}"
    );
}
