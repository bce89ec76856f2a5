//! The `cluster:` block itself: `check` shows it without its password, and a Redis Cluster
//! serves as one Redis does.

use super::*;

#[test]
fn check_shows_the_cluster_without_its_password_and_refuses_a_bad_block() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::harness::test_config("http://127.0.0.1:9").cluster(
        "rediss://:s3cret@cache:6380/2",
        "tg",
        100,
    );
    let path = dir.path().join("gw.yaml");
    config.write(&path);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("cluster       budgets shared through rediss://:***@cache:6380/2"),
        "{text}"
    );
    assert!(!text.contains("s3cret"));

    let bad = config.cluster_with(|c| c.sync_interval_ms = 1);
    bad.write(&path);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("cluster.sync_interval_ms"), "{err}");
    assert!(err.contains("gw.yaml:"), "the line is named: {err}");
}

#[test]
fn a_redis_cluster_works_too() {
    let _timed = one_at_a_time();
    let up = Upstream::start(Mode::Ok);
    let cluster = RedisCluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("redis://127.0.0.1:{}/0", cluster.nodes[0].port);
    let replicas = fleet_on(dir.path(), 2, &up, &url, |c| {
        c.plan_limit("basic", 40)
            .cluster_with(|k| k.timeout_ms = PATIENT_MS)
    });
    for r in &replicas {
        eventually("both replicas connected to the cluster", || {
            let page = metrics_page(r.admin);
            metric(&page, "tollgate_cluster_store_up") == Some(1.0)
                && metric(&page, "tollgate_cluster_replicas") == Some(2.0)
        });
    }
    // Twice the limit for three windows, spread over the two: the fleet admits what one
    // process would on the same requests, within 10 % of the limit in every window and over
    // the run; unshared, it would admit twice as much.
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.listen).collect();
    let trace = drive(
        &addrs,
        "basic-key-1",
        40.0,
        3 * WINDOW,
        Instant::now(),
        |i| (i % 2) as usize,
    );
    let (fleet, single) = (admitted(&trace), one_process(&trace, 40));
    let excess = worst_excess(&fleet, &single, WINDOW.as_nanos() as u64, 100_000_000);
    assert!(
        excess <= 4,
        "a window held {excess} more than one process: {} vs {}",
        fleet.len(),
        single.len()
    );
    let off = fleet.len().abs_diff(single.len());
    assert!(off <= 8, "over the run {} vs {}", fleet.len(), single.len());
    for r in &replicas {
        eventually("both replicas seen, store up", || {
            let page = metrics_page(r.admin);
            metric(&page, "tollgate_cluster_store_up") == Some(1.0)
                && metric(&page, "tollgate_cluster_replicas") == Some(2.0)
        });
    }
    let names = cluster.names();
    assert!(names.contains(&"tgtest:fleet".to_string()), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| is_budget_name(n)).count(),
        1,
        "{names:?}"
    );
}
