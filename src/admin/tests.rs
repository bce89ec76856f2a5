//! The admin listener's answers, end to end without a socket: methods and paths, readiness,
//! reload, the usage view's round trip through its JSON, and the other answers' bytes.

use std::sync::Arc;

use super::router::AdminRequest;
use super::{usage, view, Admin};
use crate::config::Config;
use crate::keys::{Keeping, KeyChanges};
use crate::runtime::live::LivePolicy;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{Method, Response};
use tollgate_core::testing::TestConfig;

fn admin(dir: &tempfile::TempDir) -> (Admin, std::path::PathBuf) {
    let path = dir.path().join("gw.yaml");
    TestConfig::new().write(&path);
    let live = Arc::new(LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap());
    let ledger = Arc::new(crate::ledger::Keeper::open(None, Arc::clone(&live)).unwrap());
    let changes = KeyChanges::new(Keeping::memory(), Arc::clone(&live), Default::default());
    (
        Admin {
            live,
            health: Arc::default(),
            cluster: None,
            clock: Arc::new(crate::clock::ManualClock::new()),
            failures: Arc::default(),
            changes,
            ledger,
            names: Default::default(),
        },
        path,
    )
}

/// The answer to `method path?query` without a body, past the guards.
fn answer(a: &Admin, method: &Method, path: &str, query: Option<&str>) -> Response<Vec<u8>> {
    sent(a, method, path, query, b"")
}

/// The answer to `method path?query` with `body`, past the guards.
fn sent(
    a: &Admin,
    method: &Method,
    path: &str,
    query: Option<&str>,
    body: &[u8],
) -> Response<Vec<u8>> {
    let req = AdminRequest {
        method,
        path,
        query,
        body,
        too_large: false,
        csv: false,
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(a.answer(&req))
}

fn body(r: &Response<Vec<u8>>) -> String {
    String::from_utf8(r.body().clone()).unwrap()
}

#[test]
fn endpoints_methods_and_paths() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = admin(&dir);
    assert_eq!(answer(&a, &Method::GET, "/healthz", None).status(), 200);
    let m = answer(&a, &Method::GET, "/metrics", None);
    assert_eq!(m.status(), 200);
    assert!(body(&m).contains("tollgate_keys{state=\"active\"} 7"));
    assert_eq!(answer(&a, &Method::GET, "/readyz", None).status(), 503);
    let r = answer(&a, &Method::POST, "/metrics", None);
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()[ALLOW], "GET, HEAD");
    assert_eq!(answer(&a, &Method::GET, "/reload", None).status(), 405);
    assert_eq!(answer(&a, &Method::GET, "/", None).status(), 200);
    assert_eq!(answer(&a, &Method::GET, "/nothing", None).status(), 404);
    assert_eq!(answer(&a, &Method::GET, "/metrics/", None).status(), 404);
}

#[test]
fn the_usage_view_round_trips_through_its_json() {
    // What the admin listener serves is what `tollgate top` reads back, field for field.
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = admin(&dir);
    let snap = a.live.load();
    let key = snap.policy.keys.find_by_name("basic-1");
    let now = a.live.usage().ms_at(std::time::Instant::now());
    a.live.usage().record(
        snap.generation,
        now,
        key,
        None,
        crate::policy::Outcome::RateLimited,
        Some(crate::policy::Code::RateLimited as u8),
    );
    let served = answer(&a, &Method::GET, "/api/usage", Some("key=basic"));
    assert_eq!(served.status(), 200);
    let read: view::UsageView = serde_json::from_slice(served.body()).unwrap();
    let built = usage::usage_view(&a.changes, a.clock.as_ref(), None, Some("basic"), vec![]);
    assert_eq!(read.keys, built.keys);
    assert_eq!(read.config, built.config);
    assert_eq!(read.refusals, built.refusals);
    assert_eq!(read.search.as_deref(), Some("basic"));
    assert_eq!(read.keys[0].key, "basic-1");
    assert_eq!(read.keys[0].refusals.rate_limited, 1);
    assert_eq!(read.refusals[0].code.as_deref(), Some("rate_limited"));
    // And back to the same JSON.
    let again = serde_json::to_value(&read).unwrap();
    let first: serde_json::Value = serde_json::from_slice(served.body()).unwrap();
    assert_eq!(again, first);
}

#[test]
fn readiness_follows_health() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = admin(&dir);
    a.health.set_upgrading();
    assert_eq!(answer(&a, &Method::GET, "/readyz", None).status(), 200);
    a.health.set_draining();
    let r = answer(&a, &Method::GET, "/readyz", None);
    assert_eq!(
        (r.status().as_u16(), body(&r).as_str()),
        (503, "draining\n")
    );
}

#[test]
fn reload_answers_200_or_422_with_the_place_of_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let (a, path) = admin(&dir);
    let ok = answer(&a, &Method::POST, "/reload", None);
    assert_eq!(ok.status(), 200, "{}", body(&ok));
    let v: serde_json::Value = serde_json::from_slice(ok.body()).unwrap();
    assert_eq!(v["keys"], 7);
    assert_eq!(v["restart_required"], serde_json::json!([]));

    // A plain key that is not a usable token: refused, and the value is not echoed.
    TestConfig::new()
        .key_value("pro-1", "pro key secret")
        .write(&path);
    let r = answer(&a, &Method::POST, "/reload", None);
    assert_eq!(r.status(), 422);
    assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
    let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
    assert_eq!(v["field"], "keys[2].key", "{v}");
    assert!(v["line"].as_u64().is_some(), "{v}");
    assert!(!body(&r).contains("secret"), "{}", body(&r));
}

#[test]
fn answers_that_were_json_maps_keep_their_members_in_name_order() {
    // These answers were `serde_json::Value` maps (sorted by name) before they had views, and
    // the README shows one: their bytes are those of the same JSON written through a Value.
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = admin(&dir);
    let address = crate::policy::client::ClientKey::parse("192.0.2.7").unwrap();
    for _ in 0..10 {
        a.failures
            .failed(address, a.clock.now(), &super::guard::TOKEN_FAILURES);
    }
    let (get, post, put) = (&Method::GET, &Method::POST, &Method::PUT);
    let quota = br#"{"requests":100,"per":"day"}"#;
    for (method, path, body) in [
        (post, "/reload", &b""[..]),
        (put, "/api/keys/basic-1/quota", quota),
        (post, "/api/keys/basic-1/suspend", br#"{"reason":"late"}"#),
        (get, "/api/keys/basic-1", b""),
        (get, "/api/blocks", b""),
        (get, "/api/overrides", b""),
        (get, "/api/ledger", b""),
        (post, "/api/keys/revoke", br#"{"key":"basic-key-1"}"#),
    ] {
        let r = sent(&a, method, path, None, body);
        assert_eq!(r.status(), 200, "{method} {path}: {}", self::body(&r));
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        let mut sorted = serde_json::to_vec(&v).unwrap();
        sorted.push(b'\n');
        assert_eq!(self::body(&r), String::from_utf8(sorted).unwrap(), "{path}");
        if path == "/api/keys/basic-1" {
            assert_eq!(v["overrides"].as_array().map(Vec::len), Some(2), "{v}");
            assert_eq!(v["quota"]["own"], true, "{v}");
        }
        if path == "/api/blocks" {
            assert_eq!(v["blocks"][0]["listener"], "admin", "{v}");
        }
    }
}
