//! The wire tests' harness, by concern: a recording upstream ([`upstream`]), the gateway in
//! this process ([`gateway`]) or as its own process ([`process`]), a raw HTTP/1.1 client and
//! the admin listener's helpers ([`http`]), TLS material ([`pki`]) and `redis-server`s
//! ([`redis`]). The tests import what they use from here.

use std::net::TcpListener;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) mod gateway;
pub(crate) mod http;
pub(crate) mod pki;
pub(crate) mod process;
pub(crate) mod redis;
pub(crate) mod upstream;

pub(crate) use gateway::{config_for, test_config, wait_listening, Gateway};
pub(crate) use http::*;
pub(crate) use pki::{pki, Pki};
pub(crate) use process::Process;
pub(crate) use redis::{RedisCluster, RedisServer};
pub(crate) use tollgate_core::testing::TestConfig;
pub(crate) use upstream::{Mode, Upstream};

/// Write `text` to `dir/name`; the path as a string.
pub(crate) fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().expect("UTF-8 temp path").to_string()
}

/// A port nothing listens on (bound, then released), never one handed out before in this
/// test binary: tests run in parallel, and the kernel may offer a port another test was just
/// given and has not bound yet.
pub(crate) fn closed_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// One fleet of replicas at a time across the wire tests (`cluster.rs`, `fleet_demo.rs`): on
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
pub(crate) fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
