//! Budgets shared across replicas, on the wire: real gateway processes, one real
//! `redis-server` each test starts on its own port, real HTTP.
//!
//! Windows are 2 s and the replicas reconcile every 20 ms (1 % of the window, as 100 ms is of
//! the default 10 s), so that the tests stay under a minute. One file a subject: both bounds (`bounds`), the scripts
//! on a real Redis (`script`), Redis failing (`outages`), the block itself (`setup`), and
//! quiet keys with Redis far away (`quiet`); the fleets they share are here, and
//! the bounds are judged by the simulation's own measures (`limit::shared::measure`).

mod bounds;
mod outages;
mod quiet;
mod script;
mod setup;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::{
    admin, config_for, eventually, metric, metrics_page, wait_ready, DelayProxy, Mode, Process,
    RedisCluster, RedisServer, TestConfig, Upstream,
};
use tollgate::limit::shared::model::Model;
use tollgate::limit::shared::{Call, Reply};
use tollgate::limit::Rate;
use tollgate::shared::script::{pack_calls, unpack_answers, BUDGET_LUA, HEARTBEAT_LUA};
use tollgate_core::digest::Digest;
use tollgate_core::limit::shared::measure::{worst_excess, worst_shortfall};

const WINDOW_SECS: u32 = 2;
const WINDOW: Duration = Duration::from_secs(WINDOW_SECS as u64);
const SYNC_MS: u64 = 20;

/// The tests that judge timing (admissions per window, latency while Redis is stopped) run one
/// at a time: on a two-core machine, two fleets of debug-built gateways at once starve each
/// other's exchanges, and a late exchange is not what these tests are about.
use crate::harness::one_fleet as one_at_a_time;

/// Redis's timeout in the accuracy tests: an exchange that took longer than the product's
/// 100 ms default (a debug build on a loaded CI machine) would mark the store down and turn an
/// accuracy test into an outage test, which `redis_stopped_or_killed_…` is.
const PATIENT_MS: u64 = 1000;

struct Replica {
    process: Process,
    listen: SocketAddr,
    admin: SocketAddr,
}

/// `n` gateway processes in front of `up`, sharing budgets through `redis`; `edit` changes
/// their common config (plan limits, keys, cluster fields).
fn fleet(
    dir: &Path,
    n: usize,
    up: &Upstream,
    redis: &RedisServer,
    edit: impl Fn(TestConfig) -> TestConfig,
) -> Vec<Replica> {
    fleet_on(dir, n, up, &redis.url(), edit)
}

fn fleet_on(
    dir: &Path,
    n: usize,
    up: &Upstream,
    redis_url: &str,
    edit: impl Fn(TestConfig) -> TestConfig,
) -> Vec<Replica> {
    (0..n)
        .map(|i| {
            let mut config = edit(config_for(up).cluster(redis_url, "tgtest", SYNC_MS));
            config.file.limits.window_seconds = WINDOW_SECS;
            let path = dir.join(format!("gw{i}.yaml"));
            config.write(&path);
            let process = Process::spawn(
                dir,
                &format!("gw{i}"),
                &["run", "--config", path.to_str().unwrap()],
                &[("TOLLGATE_LOG", "info")],
            );
            let replica = Replica {
                process,
                listen: config.file.listen.parse().unwrap(),
                admin: config.file.admin_listen.parse().unwrap(),
            };
            wait_ready(replica.admin, 200);
            replica
        })
        .collect()
}

/// One keyed request on a connection of its own: the status, and how long the answer took.
fn call(addr: SocketAddr, key: &str) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /v2/client/getStatus HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    let status = std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    (status, started.elapsed())
}

/// What one client sent and got: (when, which replica, status, latency).
type Trace = Vec<(Duration, usize, u16, Duration)>;

/// Send `key` at `rate` requests per second for `length`, each to the replica `pick` chooses
/// (given the request's number), paced from `start`.
fn drive(
    replicas: &[SocketAddr],
    key: &str,
    rate: f64,
    length: Duration,
    start: Instant,
    pick: impl Fn(u64) -> usize,
) -> Trace {
    let gap = Duration::from_secs_f64(1.0 / rate);
    let mut trace = Vec::new();
    let mut i = 0u64;
    loop {
        let due = gap * i as u32;
        if due >= length {
            return trace;
        }
        if let Some(wait) = (start + due).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait); // pacing the load, not crossing a window
        }
        let r = pick(i);
        let sent = start.elapsed();
        let (status, took) = call(replicas[r], key);
        trace.push((sent, r, status, took));
        i += 1;
    }
}

/// A cheap deterministic spread of request numbers over replicas.
fn mix(i: u64) -> u64 {
    i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 33
}

/// The admissions one process would make on the same requests (one GCRA on the send times).
fn one_process(trace: &Trace, limit: u32) -> Vec<u64> {
    let rate = Rate::new(
        NonZeroU32::new(limit).unwrap(),
        NonZeroU32::new(WINDOW_SECS).unwrap(),
    );
    let mut tat = 0u64;
    trace
        .iter()
        .filter_map(|(t, ..)| {
            let now = t.as_nanos() as u64 + 1_000_000_000;
            rate.admit(tat, now).ok().map(|next| {
                tat = next;
                now
            })
        })
        .collect()
}

fn admitted(trace: &Trace) -> Vec<u64> {
    trace
        .iter()
        .filter(|e| e.2 == 200)
        .map(|(t, ..)| t.as_nanos() as u64 + 1_000_000_000)
        .collect()
}

fn is_budget_name(name: &str) -> bool {
    name.strip_prefix("tgtest:b:{")
        .and_then(|r| r.strip_suffix('}'))
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Send `n` requests for `key` one after the other, as fast as they are answered, to the
/// replicas `pick` chooses; the trace as [`drive`] gives it.
fn burst(replicas: &[SocketAddr], key: &str, n: u64, pick: impl Fn(u64) -> usize) -> Trace {
    let start = Instant::now();
    (0..n)
        .map(|i| {
            let r = pick(i);
            let sent = start.elapsed();
            let (status, took) = call(replicas[r], key);
            (sent, r, status, took)
        })
        .collect()
}

/// Every replica of three counts the other two, with the store up.
fn sharing(replicas: &[Replica]) {
    for r in replicas {
        eventually("every replica counts three, the store up", || {
            let page = metrics_page(r.admin);
            metric(&page, "tollgate_cluster_replicas") == Some(3.0)
                && metric(&page, "tollgate_cluster_store_up") == Some(1.0)
        });
    }
}
