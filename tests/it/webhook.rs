//! The webhook URL guard on the wire: a `webhook_set` whose `url` points into a private network
//! is `400 invalid_body` at `/url` and never reaches the upstream; the `webhook_guard` block
//! (`allow_hosts`, `allow_http`, `enabled`) is honoured as configured.

use crate::harness::{config_for, Gateway, Mode, Upstream};

const PATH: &str = "/v2/settings/webhook/set";
const KEY: &str = "standard-key-1";

fn body(url: &str) -> String {
    serde_json::json!({ "url": url, "signing": "off" }).to_string()
}

/// Post `url` as the webhook and expect the guard's refusal at `/url`, showing `shows`.
#[track_caller]
fn assert_refused(gw: &Gateway, url: &str, shows: &str) {
    let r = gw.call(KEY, "POST", PATH, &body(url));
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_body"),
        "{url}"
    );
    let v = r.json();
    let errors = v["errors"].as_array().expect("field errors");
    assert_eq!(errors.len(), 1, "{url}: {v}");
    assert_eq!(errors[0]["pointer"], "/url", "{url}: {v}");
    let detail = errors[0]["detail"].as_str().unwrap();
    assert!(detail.contains(shows), "{url}: {detail}");
}

#[track_caller]
fn assert_forwarded(gw: &Gateway, url: &str) {
    let r = gw.call(KEY, "POST", PATH, &body(url));
    assert_eq!(
        r.status,
        200,
        "{url}: {:?}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.header("x-upstream"), Some("yes"), "{url}");
}

#[test]
fn private_network_urls_are_refused_before_the_upstream_and_public_ones_forwarded() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&config_for(&up));
    for (url, shows) in [
        (
            "http://169.254.169.254/latest/meta-data",
            "169.254.169.254 is in 169.254.0.0/16, link-local",
        ),
        ("http://0x7f.1/", "127.0.0.1 is in 127.0.0.0/8, loopback"),
        ("http://2130706433/", "127.0.0.1 is in 127.0.0.0/8"),
        ("http://0177.0.0.1:8080/x", "127.0.0.1 is in 127.0.0.0/8"),
        (
            "https://10.1.2.3/hook",
            "10.1.2.3 is in 10.0.0.0/8, private",
        ),
        ("http://[::ffff:192.168.0.1]/", "embeds 192.168.0.1"),
        ("http://[64:ff9b::a9fe:a9fe]/", "embeds 169.254.169.254"),
        ("http://[fd00::1]/", "fd00::1 is in fc00::/7, unique local"),
        ("http://LOCALHOST./", "`localhost` is under `localhost`"),
        (
            "http://metadata.google.internal/computeMetadata/v1/",
            "is under `internal`",
        ),
        ("http://user:pw@example.com/", "user info"),
    ] {
        assert_refused(&gw, url, shows);
    }
    assert_eq!(up.count(), 0, "a refused webhook reached the upstream");
    // Every violation is still listed, the guard's among them.
    let r = gw.call(
        KEY,
        "POST",
        PATH,
        r#"{"url":"http://127.1/","signing":"maybe"}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_body"));
    let v = r.json();
    let pointers: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pointer"].as_str().unwrap())
        .collect();
    assert_eq!(pointers, ["/url", "/signing"], "{v}");
    assert_eq!(up.count(), 0);
    // Public hosts and addresses go through.
    for url in [
        "https://hooks.example.com/x",
        "http://93.184.216.34/",
        "http://[2606:4700::1111]/",
    ] {
        assert_forwarded(&gw, url);
    }
    assert_eq!(up.count(), 3);
}

#[test]
fn allow_hosts_and_https_only_are_honoured() {
    let up = Upstream::start(Mode::Ok);
    let config = config_for(&up).webhook_guard(|g| {
        g.allow_http = false;
        g.allow_hosts = vec!["relay.internal".into()];
    });
    let gw = Gateway::start(&config);
    assert_refused(&gw, "http://hooks.example.com/x", "must be an https:// URL");
    assert_refused(&gw, "http://relay.internal/x", "must be an https:// URL");
    assert_refused(&gw, "https://x.relay.internal/x", "is under `internal`");
    assert_refused(&gw, "https://127.0.0.1/x", "loopback");
    assert_eq!(up.count(), 0);
    assert_forwarded(&gw, "https://relay.internal/x");
    assert_forwarded(&gw, "https://Relay.Internal./in");
    assert_forwarded(&gw, "https://hooks.example.com/x");
    assert_eq!(up.count(), 3);
}

#[test]
fn a_disabled_guard_leaves_only_the_http_url_check() {
    let up = Upstream::start(Mode::Ok);
    let config = config_for(&up).webhook_guard(|g| {
        g.enabled = false;
        g.allow_http = false;
    });
    let gw = Gateway::start(&config);
    assert_forwarded(&gw, "http://127.0.0.1/x");
    assert_forwarded(&gw, "http://metadata.google.internal/");
    assert_refused(
        &gw,
        "ftp://127.0.0.1/x",
        "must be an absolute http:// or https:// URL with a host",
    );
    assert_eq!(up.count(), 2);
}
