//! The gateway on the wire: a real Pingora service on a loopback port in front of a recording
//! upstream on another, real HTTP/1.1 between them.

use std::time::Duration;

use crate::harness::{Gateway, Mode, Upstream, EVENT};

// ---------------------------------------------------------------- the status table

#[test]
fn a_valid_call_is_forwarded_with_rate_limit_headers() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let r = gw.call(
        "basic-key-1",
        "POST",
        "/v2/sendMessage/",
        r#"{"chatId":"1","message":"hi"}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"{}");
    assert_eq!(r.header("x-upstream"), Some("yes"));
    assert_eq!(r.header("ratelimit-policy"), Some("\"basic\";q=40;w=10"));
    assert_eq!(r.header("ratelimit"), Some("\"basic\";r=39;t=1"));
    assert_eq!(up.count(), 1);
}

#[test]
fn unauthorized_is_one_answer_for_every_way_of_failing() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let cases: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("Authorization", "Bearer not-a-key")],
        vec![("Authorization", "Basic YWxhZGRpbjpvcGVuc2VzYW1l")],
        vec![("Authorization", "Bearer")],
        vec![
            ("Authorization", "Bearer basic-key-1"),
            ("Authorization", "Bearer basic-key-1"),
        ],
    ];
    let mut bodies = Vec::new();
    for h in cases {
        let r = gw.request("POST", "/v2/sendMessage/", &h, b"");
        assert_eq!(r.status, 401);
        assert_eq!(r.code(), "unauthorized");
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer realm=\"tollgate\"")
        );
        assert!(r.header("ratelimit").is_none());
        bodies.push(r.json()["detail"].clone());
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(up.count(), 0);
}

#[test]
fn forbidden_answers() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let hook = r#"{"url":"https://hooks.example.com/x"}"#;
    let r = gw.call("basic-key-1", "POST", "/v2/settings/webhook/set", hook);
    assert_eq!((r.status, r.code().as_str()), (403, "plan_restricted"));
    assert_eq!(
        r.remaining(),
        40,
        "a refusal before the limit spends nothing"
    );
    let r = gw.call(
        "basic-key-1",
        "POST",
        "/v2/service/upgrade",
        r#"{"apiKey":"k","planID":2}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (403, "wrong_credential"));
    let r = gw.call("acme-partner-key", "POST", "/v2/sendMessage/", "{}");
    assert_eq!((r.status, r.code().as_str()), (403, "wrong_credential"));
    assert_eq!(r.header("ratelimit-policy"), Some("\"partner\";q=150;w=10"));
    let r = gw.call(
        "acme-partner-key",
        "POST",
        "/v2/service/upgrade",
        r#"{"apiKey":"globex-customer-key","planID":2}"#,
    );
    assert_eq!((r.status, r.code().as_str()), (403, "not_your_customer"));
    assert_eq!(up.count(), 0);
    let r = gw.call(
        "acme-partner-key",
        "POST",
        "/v2/service/upgrade",
        r#"{"apiKey":"acme-customer-key","planID":2}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(up.count(), 1);
}

#[test]
fn not_found_and_invalid_path() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let r = gw.call("pro-key-1", "GET", "/v1/sendMessage/", "");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_route"));
    let r = gw.call("acme-partner-key", "POST", "/v2/service/teleport", "");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_route"));
    let r = gw.call("pro-key-1", "GET", "/v2/client//getChats", "");
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_path"));
    assert_eq!(up.count(), 0);
    // An uncatalogued /v2/ path is forwarded for a plan with `allow: all`.
    let r = gw.call("pro-key-1", "GET", "/v2/brandNew/op?x=1", "");
    assert_eq!(r.status, 200);
    assert_eq!(up.seen()[0].path(), "/v2/brandNew/op?x=1");
}

/// What the upstream receives as the request target, in every form a client can send it.
/// (Whether the target is rewritten or sent as it came is decided by
/// `proxy::head::upstream_target`, whose unit tests check that it is left alone when nothing
/// changes; here, that the bytes on the wire are right either way.)
#[test]
fn the_upstream_receives_the_decided_target_in_every_form() {
    // As it came: origin form, already canonical, no base path (the query kept).
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    assert_eq!(
        gw.call("pro-key-1", "GET", "/v2/client/getChats?a=1&b=%20", "")
            .status,
        200
    );
    // The absolute form becomes the origin form.
    let raw = "GET http://gateway.test/v2/client/getChats?q=2 HTTP/1.1\r\nHost: gateway.test\r\n\
               Authorization: Bearer pro-key-1\r\nConnection: close\r\n\r\n";
    assert_eq!(gw.send(raw.as_bytes()).status, 200);
    // A case variant is sent in the catalogue's spelling.
    assert_eq!(
        gw.call("pro-key-1", "GET", "/V2/Client/getChats?c=3", "")
            .status,
        200
    );
    let paths: Vec<String> = up.seen().iter().map(|s| s.path().to_string()).collect();
    assert_eq!(
        paths,
        [
            "/v2/client/getChats?a=1&b=%20",
            "/v2/client/getChats?q=2",
            "/v2/client/getChats?c=3"
        ]
    );

    // An upstream base path goes in front of every forwarded path.
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&crate::harness::test_config(&format!(
        "http://{}/provider",
        up.addr
    )));
    assert_eq!(
        gw.call("pro-key-1", "GET", "/v2/client/getChats?a=1", "")
            .status,
        200
    );
    assert_eq!(up.seen()[0].path(), "/provider/v2/client/getChats?a=1");
}

#[test]
fn rate_limit_counts_down_then_429_with_retry_after() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    for i in 0..40 {
        let r = gw.call("basic-key-1", "GET", "/v2/client/getState", "");
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(r.remaining(), 39 - i);
    }
    let r = gw.call("basic-key-1", "GET", "/v2/client/getState", "");
    assert_eq!((r.status, r.code().as_str()), (429, "rate_limited"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.remaining(), 0);
    assert_eq!(up.count(), 40);
    // Another key is untouched; time (the injected clock) refills.
    assert_eq!(
        gw.call("standard-key-1", "GET", "/v2/client/getState", "")
            .remaining(),
        69
    );
    gw.clock.advance(Duration::from_millis(250));
    assert_eq!(
        gw.call("basic-key-1", "GET", "/v2/client/getState", "")
            .status,
        200
    );
    assert_eq!(
        gw.call("basic-key-1", "GET", "/v2/client/getState", "")
            .status,
        429
    );
    gw.clock.advance(Duration::from_secs(10));
    assert_eq!(
        gw.call("basic-key-1", "GET", "/v2/client/getState", "")
            .remaining(),
        39
    );
}

// ---------------------------------------------------------------- bodies

#[test]
fn body_rules_on_the_wire() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let r = gw.call("basic-key-1", "POST", "/v2/sendGroup", EVENT);
    assert_eq!(r.status, 200);
    let bad = EVENT.replace("2026-11-21T10:00:00.000Z", "2026-11-21 10:00");
    let r = gw.call("basic-key-1", "POST", "/v2/sendGroup", &bad);
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_body"));
    assert_eq!(r.json()["errors"][0]["pointer"], "/startTime");
    let r = gw.call("basic-key-1", "POST", "/v2/sendGroup", "{not json");
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_json"));
    // Refused bodies were read and checked before any upstream connection: the one valid
    // event above is the only connection so far.
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    let r = gw.request(
        "POST",
        "/v2/sendGroup",
        &[
            ("Authorization", "Bearer basic-key-1"),
            ("Content-Type", "text/plain"),
        ],
        EVENT.as_bytes(),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (415, "unsupported_media_type")
    );
    // Webhook set (Standard): each rule.
    for (body, status) in [
        (r#"{"url":"https://h.example/in","signing":"on"}"#, 200),
        (
            r#"{"url":"https://h.example/in","signing":"on","webhookKey":"0123456789abcdef"}"#,
            200,
        ),
        (r#"{"url":"h.example/in"}"#, 400),
        (r#"{"url":"https://h.example/in","signing":"maybe"}"#, 400),
        (
            r#"{"url":"https://h.example/in","webhookKey":"short"}"#,
            400,
        ),
    ] {
        assert_eq!(
            gw.call("standard-key-1", "POST", "/v2/settings/webhook/set", body)
                .status,
            status,
            "{body}"
        );
    }
    // Service upgrade (partner).
    assert_eq!(
        gw.call(
            "acme-partner-key",
            "POST",
            "/v2/service/upgrade",
            r#"{"apiKey":"x","planID":"2"}"#
        )
        .status,
        400
    );
    // Only the three valid bodies reached the upstream, byte for byte.
    let seen = up.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].body, EVENT.as_bytes());
    assert_eq!(seen[0].path(), "/v2/sendGroup");
}

#[test]
fn the_upstream_receives_exactly_the_checked_bytes_at_the_matched_path() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let body = EVENT.replace(r#""name""#, r#""extra":{"nested":[1,2,3]},"name""#);
    // A chunked body, a case variant of the path, and a query string.
    let chunked = format!(
        "POST /V2/SendGroup?trace=1 HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer pro-key-1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{}\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        10,
        &body[..10],
        body.len() - 10,
        &body[10..]
    );
    let r = gw.send(chunked.as_bytes());
    assert_eq!(r.status, 200);
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path(), "/v2/sendGroup?trace=1");
    assert_eq!(seen[0].body, body.as_bytes());
    assert_eq!(
        seen[0].header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(seen[0].header("authorization"), Some("Bearer pro-key-1"));
    assert!(seen[0].header("transfer-encoding").is_none());

    // A declared length goes upstream as the plain decimal length, however it was spelt.
    for declared in [body.len().to_string(), format!("00{}", body.len())] {
        let raw = format!(
            "POST /v2/sendGroup HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer pro-key-1\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\nConnection: close\r\n\r\n{body}"
        );
        assert_eq!(gw.send(raw.as_bytes()).status, 200, "{declared}");
        let seen = up.seen();
        let last = seen.last().unwrap();
        assert_eq!(last.body, body.as_bytes(), "{declared}");
        assert_eq!(
            last.headers_named("content-length"),
            [body.len().to_string().as_str()],
            "{declared}"
        );
    }
}

#[test]
fn oversize_bodies_are_413_and_never_reach_the_upstream() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::start(&crate::harness::config_for(&up).body_limits(4096, 1024));
    // Declared too large: refused before reading.
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(2000));
    let r = gw.call("pro-key-1", "POST", "/v2/sendGroup", &big);
    assert_eq!((r.status, r.code().as_str()), (413, "body_too_large"));
    // Chunked: refused as soon as the count passes the cap.
    let mut raw = b"POST /v2/sendGroup HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer pro-key-1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        raw.extend_from_slice(format!("400\r\n{}\r\n", "y".repeat(0x400)).as_bytes());
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let r = gw.send(&raw);
    assert_eq!((r.status, r.code().as_str()), (413, "body_too_large"));
    // Unchecked routes: max_body_bytes, declared.
    let r = gw.call("pro-key-1", "POST", "/v2/sendMessage/", &"z".repeat(5000));
    assert_eq!((r.status, r.code().as_str()), (413, "body_too_large"));
    assert_eq!(up.count(), 0);
    // Not even partly: no upstream connection was opened.
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    // Under the caps everything passes.
    assert_eq!(
        gw.call("pro-key-1", "POST", "/v2/sendMessage/", &"z".repeat(4000))
            .status,
        200
    );
    assert_eq!(up.seen()[0].body.len(), 4000);
}

// ---------------------------------------------------------------- path tricks

#[test]
fn no_path_trick_takes_a_basic_key_to_the_webhook_operation() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let hook = r#"{"url":"https://hooks.example.com/x"}"#;
    let tricks = [
        "/v2/sendMessage/../settings/webhook/set",
        "/v2/sendMessage/%2e%2e/settings/webhook/set",
        "/v2/sendMessage/%2E%2E/settings/webhook/set",
        "/v2/sendMessage/.%2e/settings/webhook/set",
        "/v2/client/..%2fsettings/webhook/set",
        "/v2/client/%2e%2e%2fsettings%2fwebhook%2fset",
        "/v2/settings%2fwebhook%2fset",
        "/v2/settings%2Fwebhook/set",
        "/v2//settings/webhook/set",
        "//v2/settings/webhook/set",
        "/v2/settings/webhook/set/",
        "/V2/SETTINGS/WEBHOOK/SET",
        "/v2/Settings/Webhook/Set",
        "/v2/settings/webhook/set;jsessionid=1",
        "/v2/sendMessage/;/../settings/webhook/set",
        "/v2/settings/webhook/%73et",
        "/v2/client/./../settings/webhook/set",
        "/v2/client\\..\\settings\\webhook\\set",
        "/v2/settings/webhook/set%00",
        "/v2/settings/webhook/set%23",
    ];
    for t in tricks {
        let raw = format!(
            "POST {t} HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer basic-key-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{hook}",
            hook.len()
        );
        let r = gw.send(raw.as_bytes());
        assert!(matches!(r.status, 400 | 403 | 404), "{t}: {}", r.status);
    }
    // The absolute form, too.
    let raw = format!(
        "POST http://g/v2/sendMessage/../settings/webhook/set HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer basic-key-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{hook}",
        hook.len()
    );
    assert!(matches!(gw.send(raw.as_bytes()).status, 400 | 403 | 404));
    let raw = format!(
        "POST http://g/V2/settings/WEBHOOK/set HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer basic-key-1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{hook}",
        hook.len()
    );
    assert_eq!(gw.send(raw.as_bytes()).status, 403);
    assert_eq!(up.count(), 0, "{:?}", up.seen());
}

#[test]
fn case_variants_are_forwarded_in_the_catalogue_spelling_and_checked() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    // A Standard key may set a webhook; a case variant is still checked and canonicalized.
    let r = gw.call(
        "standard-key-1",
        "POST",
        "/V2/settings/Webhook/SET",
        r#"{"url":"nope"}"#,
    );
    assert_eq!(r.status, 400);
    let r = gw.call(
        "standard-key-1",
        "POST",
        "/V2/settings/Webhook/SET",
        r#"{"url":"https://h.example/"}"#,
    );
    assert_eq!(r.status, 200);
    assert_eq!(up.seen()[0].path(), "/v2/settings/webhook/set");
}

// ---------------------------------------------------------------- headers towards the upstream

#[test]
fn forwarded_headers() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let raw = "GET /v2/client/getChats HTTP/1.1\r\nHost: gateway.test\r\nAuthorization: Bearer pro-key-1\r\n\
               X-Forwarded-For: 203.0.113.9\r\nX-Request-Id: abc-123\r\nConnection: close, X-Drop-Me\r\n\
               X-Forwarded-For: 198.51.100.7, 192.0.2.1\r\n\
               X-Drop-Me: secret\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nUpgrade: h2c\r\nProxy-Authorization: x\r\nX-Keep: 1\r\n\r\n";
    let r = gw.send(raw.as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("abc-123"));
    let s = &up.seen()[0];
    assert_eq!(s.header("authorization"), Some("Bearer pro-key-1"));
    assert_eq!(s.header("x-request-id"), Some("abc-123"));
    // Every line that came, in order, then the client.
    assert_eq!(
        s.header("x-forwarded-for"),
        Some("203.0.113.9, 198.51.100.7, 192.0.2.1, 127.0.0.1")
    );
    assert_eq!(s.headers_named("x-forwarded-for").len(), 1);
    assert_eq!(s.header("host"), Some(up.addr.to_string().as_str()));
    assert_eq!(s.header("x-keep"), Some("1"));
    for gone in [
        "x-drop-me",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-authorization",
    ] {
        assert!(s.header(gone).is_none(), "{gone} was forwarded: {s:?}");
    }
    // A malformed incoming id is replaced.
    let r = gw.request(
        "GET",
        "/v2/client/getChats",
        &[
            ("Authorization", "Bearer pro-key-1"),
            ("X-Request-Id", "bad id <script>"),
        ],
        b"",
    );
    let id = r.header("x-request-id").unwrap().to_string();
    assert_eq!(id.len(), 32);
    assert_eq!(up.seen()[1].header("x-request-id"), Some(id.as_str()));
}

#[test]
fn ambiguous_framing_and_missing_host_are_refused() {
    let up = Upstream::start(Mode::Ok);
    let gw = Gateway::with(&up);
    let r = gw.send(b"GET /v2/client/getChats HTTP/1.1\r\nAuthorization: Bearer pro-key-1\r\nConnection: close\r\n\r\n");
    assert_eq!((r.status, r.code().as_str()), (400, "bad_request"));
    let r = gw.send(b"POST /v2/sendMessage/ HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer pro-key-1\r\nContent-Length: 2\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{}x");
    assert_eq!(r.status, 400);
    let r = gw.send(b"POST /v2/sendMessage/ HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer pro-key-1\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}");
    assert_eq!(r.status, 400);
    assert_eq!(up.count(), 0);
    // Transfer-Encoding with Content-Length: RFC 9112 section 6.3 — the chunked framing wins,
    // the length is dropped, and the connection is not reused (Pingora does this before any
    // filter runs). The upstream sees exactly the chunked body, nothing smuggled after it.
    let r = gw.send(b"POST /v2/sendMessage/ HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer pro-key-1\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET /v2/smuggled HTTP/1.1\r\nHost: g\r\n\r\n");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, b"{}");
}

// ---------------------------------------------------------------- upstream failures

#[test]
fn an_upstream_that_is_down_is_502() {
    let port = crate::harness::closed_port();
    let gw = Gateway::start(&crate::harness::test_config(&format!(
        "http://127.0.0.1:{port}"
    )));
    let r = gw.call("basic-key-1", "POST", "/v2/sendMessage/", "{}");
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"));
    assert_eq!(r.remaining(), 39);
}

#[test]
fn an_upstream_that_hangs_past_the_read_timeout_is_504() {
    let up = Upstream::start(Mode::Hang);
    let gw = Gateway::start(&crate::harness::config_for(&up).read_timeout_ms(300));
    let t = std::time::Instant::now();
    let r = gw.call("basic-key-1", "POST", "/v2/sendMessage/", "{}");
    assert_eq!((r.status, r.code().as_str()), (504, "upstream_timeout"));
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(up.count(), 1, "a POST is never retried");
}

#[test]
fn an_upstream_that_resets_mid_response_is_502_and_a_post_is_not_retried() {
    let up = Upstream::start(Mode::Reset);
    let gw = Gateway::with(&up);
    let r = gw.call("basic-key-1", "POST", "/v2/sendMessage/", "{}");
    assert_eq!((r.status, r.code().as_str()), (502, "upstream_unavailable"));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(up.count(), 1);
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}
