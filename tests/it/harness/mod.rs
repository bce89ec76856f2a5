//! The wire tests' harness, by concern: a recording upstream ([`upstream`]), the gateway in
//! this process ([`gateway`]) or as its own process ([`process`]), a raw HTTP/1.1 client and
//! the admin listener's helpers ([`http`]), TLS material ([`pki`]), `redis-server`s
//! ([`redis`]) and a stand-in OpenTelemetry collector ([`otlp`]). The tests import what they use from here.

use std::net::TcpListener;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) mod delay;
pub(crate) mod gateway;
pub(crate) mod http;
pub(crate) mod otlp;
pub(crate) mod pki;
pub(crate) mod process;
pub(crate) mod redis;
pub(crate) mod upstream;

pub(crate) use delay::DelayProxy;
pub(crate) use gateway::{config_for, test_config, wait_listening, Gateway};
pub(crate) use http::*;
pub(crate) use otlp::{Answer, Collector, Got};
pub(crate) use pki::{pki, Pki};
pub(crate) use process::Process;
pub(crate) use redis::{RedisCluster, RedisSentinel, RedisServer};
pub(crate) use tollgate_core::testing::TestConfig;
pub(crate) use upstream::{Mode, Upstream};

/// Write `text` to `dir/name`; the path as a string.
pub(crate) fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().expect("UTF-8 temp path").to_string()
}

/// A port nothing listens on (bound, then released), never one handed out before in this
/// test binary: tests run in parallel, and a port handed out twice would be bound twice.
///
/// Drawn from 20000–32767, below Linux's ephemeral range (32768–60999): a port the kernel
/// offers for binding to port 0 is one it also gives outgoing connections as their source
/// port, so between this function's release and the server's bind, one of the suite's own
/// client connections could take it (seen once in `scripts/fleet-demo.sh`, which picked its
/// ports the same way). `scripts/fleet-demo.sh`, which the suite runs beside its own servers,
/// draws from 16000–19999: neither takes a port the other found free.
pub(crate) fn closed_port() -> u16 {
    closed_port_with(0)
}

/// A free port `p` whose `p + offset` is free too, both given out (a Redis Cluster node's
/// bus listens on its port + 10000).
pub(crate) fn closed_port_with(offset: u16) -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    // A different sequence in each test binary run: the standard library's random hasher
    // seeds and the process id.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let mut x = h.finish();
    for _ in 0..100_000 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let port = 20_000 + ((x >> 33) % 12_768) as u16;
        let other = port + offset;
        if given.contains(&port) || given.contains(&other) {
            continue;
        }
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && (offset == 0 || free(other)) {
            given.push(port);
            given.push(other);
            return port;
        }
    }
    panic!("no free loopback port in 20000-32767")
}

/// One fleet of replicas at a time across the wire tests (`cluster/`, `fleet_demo.rs`): on
/// two cores, two fleets at once starve each other's exchanges with Redis and turn accuracy
/// tests into outage tests.
pub(crate) fn one_fleet() -> std::sync::MutexGuard<'static, ()> {
    static FLEET: Mutex<()> = Mutex::new(());
    FLEET
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether curl is missing, saying so for `test` (the suite skips what needs curl when it is
/// missing; `.ci/run`'s machines have it).
pub(crate) fn curl_missing(test: &str) -> bool {
    let missing = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_err();
    if missing {
        eprintln!("SKIPPED {test}: curl is not installed");
    }
    missing
}

/// Poll (bounded) until `f` holds.
pub(crate) fn eventually(what: &str, f: impl FnMut() -> bool) {
    assert!(settled(f, |&done| done), "timed out waiting: {what}");
}

/// Poll `f` (bounded: 20 s) until `done` holds of its value, and return the last value, done
/// or not: the caller asserts on it, with a message that says what was seen.
pub(crate) fn settled<T>(f: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    settled_within(Duration::from_secs(20), f, done)
}

/// [`settled`] with its own bound, for what takes longer on a loaded machine.
pub(crate) fn settled_within<T>(
    limit: Duration,
    mut f: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let end = Instant::now() + limit;
    loop {
        let v = f();
        if done(&v) || Instant::now() >= end {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
