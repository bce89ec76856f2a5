//! Traces on the wire: a stand-in OTLP/HTTP collector ([`Collector`]) receives the spans of a
//! pass, a refusal, an upstream's 5xx and an upstream that cannot be reached, in protobuf and
//! in JSON; the upstream's `traceparent` names the gateway's `CLIENT` span, over HTTP/1.1 and
//! HTTP/2 from the client; an invalid or doubled `traceparent` is replaced and never
//! forwarded; a collector that is down or never answers slows no request; a wait on the fleet
//! store is a `fleet_wait` span.
//!
//! | module | what |
//! |---|---|
//! | this file | the spans of each kind of answer; propagation in and out, tracing off |
//! | [`wire`] | JSON over HTTP/1.1 and HTTP/2 with the access line; a collector down or hung; `fleet_wait` |

mod wire;

use tollgate::config::OtlpProtocol;

use crate::harness::{
    closed_port, config_for, metric, metrics_page, settled, Answer, Collector, Gateway, Got, Mode,
    Upstream,
};

const MESSAGE: &str = r#"{"chatId":"1234@c.us","message":"hi"}"#;
const SERVER: i64 = 2;
const CLIENT: i64 = 3;
const INTERNAL: i64 = 1;
const ERROR: i64 = 2;

/// A sampled W3C parent of trace `t` (one hex digit, repeated) and span `s`.
fn parent(t: char, s: char) -> (String, String, String) {
    let (trace, span) = (t.to_string().repeat(32), s.to_string().repeat(16));
    (format!("00-{trace}-{span}-01"), trace, span)
}

/// `(trace id, parent id, flags)` of a `traceparent` value.
fn fields(tp: &str) -> (String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!(p.len(), 4, "{tp}");
    assert_eq!((p[0], p[1].len(), p[2].len()), ("00", 32, 16), "{tp}");
    (p[1].into(), p[2].into(), p[3].into())
}

fn kind(spans: &[Got], k: i64) -> Vec<&Got> {
    spans.iter().filter(|s| s.kind == k).collect()
}

/// The upstream's last request's one `traceparent`, and its `tracestate`.
fn upstream_trace(up: &Upstream) -> (String, Option<String>) {
    let seen = up.seen();
    let last = seen.last().expect("the upstream saw a request");
    let tps = last.headers_named("traceparent");
    assert_eq!(tps.len(), 1, "one traceparent upstream: {tps:?}");
    (
        tps[0].to_string(),
        last.header("tracestate").map(str::to_string),
    )
}

#[test]
fn spans_of_a_pass_a_refusal_and_upstream_errors_reach_the_collector() {
    let col = Collector::start(Answer::Ok);
    // Ratio 0: only requests whose parent is sampled are recorded (the parent's flag decides).
    let with = |up: &Upstream| {
        Gateway::start(&config_for(up).tracing(&col.endpoint(), OtlpProtocol::Protobuf, 0.0))
    };
    let up = Upstream::start(Mode::Ok);
    let gw = with(&up);

    // A pass, continuing the client's trace.
    let (tp, trace, client_span) = parent('a', 'b');
    let r = gw.request(
        "POST",
        "/v2/sendMessage/",
        &[
            ("Authorization", "Bearer basic-key-1"),
            ("Content-Type", "application/json"),
            ("traceparent", tp.as_str()),
            ("tracestate", "vendor=a,other=b"),
        ],
        MESSAGE.as_bytes(),
    );
    assert_eq!(r.status, 200);
    let (sent, state) = upstream_trace(&up);
    let (sent_trace, sent_parent, flags) = fields(&sent);
    assert_eq!(
        (sent_trace.as_str(), flags.as_str()),
        (trace.as_str(), "01")
    );
    assert_ne!(
        sent_parent, client_span,
        "the upstream's parent is the gateway's span"
    );
    assert_eq!(state.as_deref(), Some("vendor=a,other=b"));
    let spans = col.trace(&trace, 2);
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let server = kind(&spans, SERVER)[0];
    let client = kind(&spans, CLIENT)[0];
    assert_eq!(server.parent, client_span);
    assert_eq!(server.name, "POST /v2/sendMessage/");
    for (k, v) in [
        ("http.request.method", "POST"),
        ("url.path", "/v2/sendMessage/"),
        ("url.scheme", "http"),
        ("http.route", "/v2/sendMessage/"),
        ("http.response.status_code", "200"),
        ("client.address", "127.0.0.1"),
        ("network.protocol.version", "1.1"),
        ("tollgate.route", "send_message"),
        ("tollgate.outcome", "forwarded"),
        ("tollgate.plan", "basic"),
        ("tollgate.key", "basic-1"),
    ] {
        assert_eq!(server.attr(k), Some(v), "{k} in {server:#?}");
    }
    assert_eq!(server.attr("tollgate.code"), None);
    assert_eq!(server.status, 0);
    assert_eq!(server.service, "tollgate-test");
    assert_eq!(server.content_type, "application/x-protobuf");
    // The CLIENT span is the parent the upstream was told of, inside the SERVER span.
    assert_eq!(client.span_id, sent_parent);
    assert_eq!(client.parent, server.span_id);
    assert_eq!(client.attr("http.response.status_code"), Some("200"));
    assert_eq!(client.attr("server.address"), Some("127.0.0.1"));
    assert_eq!(client.status, 0);
    assert!(
        server.start <= client.start && client.end <= server.end,
        "{spans:#?}"
    );
    assert!(server.start > 1_700_000_000_000_000_000 && server.end >= server.start);
    // Never the key itself.
    let all = format!("{spans:?}");
    assert!(!all.contains("basic-key-1"), "{all}");

    // A refusal: one SERVER span, its code; no route, so the method alone names it.
    let (tp, trace, _) = parent('c', 'd');
    let r = gw.request(
        "GET",
        "/v2/getSettings/",
        &[
            ("Authorization", "Bearer not-a-key"),
            ("traceparent", tp.as_str()),
        ],
        b"",
    );
    assert_eq!(r.status, 401);
    let spans = col.trace(&trace, 1);
    assert_eq!(spans.len(), 1, "{spans:#?}");
    let s = &spans[0];
    assert_eq!((s.kind, s.name.as_str(), s.status), (SERVER, "GET", 0));
    assert_eq!(s.attr("tollgate.code"), Some("unauthorized"));
    assert_eq!(s.attr("tollgate.outcome"), Some("unauthorized"));
    assert_eq!(s.attr("http.response.status_code"), Some("401"));
    assert_eq!(s.attr("tollgate.key"), None);

    // The upstream answers 503: the SERVER span is an error, and so is the CLIENT span.
    let failing = Upstream::start(Mode::Status(503));
    let gw503 = with(&failing);
    let (tp, trace, _) = parent('e', 'f');
    let r = gw503.request(
        "GET",
        "/v2/getSettings/",
        &[
            ("Authorization", "Bearer pro-key-1"),
            ("traceparent", tp.as_str()),
        ],
        b"",
    );
    assert_eq!(r.status, 503);
    let spans = col.trace(&trace, 2);
    let (server, client) = (kind(&spans, SERVER)[0], kind(&spans, CLIENT)[0]);
    assert_eq!(server.status, ERROR, "{server:#?}");
    assert_eq!(server.attr("http.response.status_code"), Some("503"));
    // An uncatalogued path (a plan with `allow: all`): the method alone, no template.
    assert_eq!(server.name, "GET");
    assert_eq!(server.attr("tollgate.route"), Some("unknown"));
    assert_eq!(server.attr("http.route"), None);
    assert_eq!(server.attr("tollgate.plan"), Some("pro"));
    assert_eq!(client.status, ERROR);
    assert_eq!(client.attr("http.response.status_code"), Some("503"));

    // No upstream at all: the gateway's 502, and a CLIENT span that says why.
    let gone = Gateway::start(
        &crate::harness::test_config(&format!("http://127.0.0.1:{}", closed_port())).tracing(
            &col.endpoint(),
            OtlpProtocol::Protobuf,
            0.0,
        ),
    );
    let (tp, trace, _) = parent('1', '2');
    let r = gone.request(
        "GET",
        "/v2/getSettings/",
        &[
            ("Authorization", "Bearer pro-key-1"),
            ("traceparent", tp.as_str()),
        ],
        b"",
    );
    assert_eq!(r.status, 502);
    let spans = col.trace(&trace, 2);
    let (server, client) = (kind(&spans, SERVER)[0], kind(&spans, CLIENT)[0]);
    assert_eq!(server.status, ERROR);
    assert_eq!(server.attr("tollgate.code"), Some("upstream_unavailable"));
    assert_eq!(client.status, ERROR);
    assert_eq!(client.attr("error.type"), Some("upstream_unavailable"));
    assert_eq!(client.attr("http.response.status_code"), None);

    // The pass's two spans and the refusal's one, on the first gateway.
    let admin = gw.config.process.admin_listen;
    let exported = settled(
        || metric(&metrics_page(admin), "tollgate_spans_exported_total"),
        |n| *n == Some(3.0),
    );
    assert_eq!(exported, Some(3.0));
    let page = metrics_page(admin);
    assert_eq!(metric(&page, "tollgate_spans_dropped_total"), Some(0.0));
}

#[test]
fn an_invalid_or_doubled_traceparent_is_replaced_and_tracing_off_passes_it_as_it_came() {
    let up = Upstream::start(Mode::Ok);
    let col = Collector::start(Answer::Ok);
    // Nothing recorded (ratio 0, no sampled parent): the upstream still gets the gateway's
    // traceparent, unsampled.
    let gw = Gateway::start(&config_for(&up).tracing(&col.endpoint(), OtlpProtocol::Json, 0.0));
    let get = |gw: &Gateway, headers: &[(&str, &str)]| {
        let mut h = vec![("Authorization", "Bearer pro-key-1")];
        h.extend_from_slice(headers);
        assert_eq!(gw.request("GET", "/v2/getSettings/", &h, b"").status, 200);
        upstream_trace(&up)
    };
    let zero = format!("00-{}-{}-01", "0".repeat(32), "b".repeat(16));
    let upper = format!("00-{}-{}-01", "A".repeat(32), "b".repeat(16));
    let (one, trace_one, _) = parent('a', 'b');
    let (two, trace_two, _) = parent('c', 'd');
    let suffixed = format!("{one}-what-the-future-will-be-like");
    for bad in [
        vec![zero.as_str()],
        vec![upper.as_str()],
        vec![suffixed.as_str()],
        vec![one.as_str(), two.as_str()],
    ] {
        let mut h: Vec<(&str, &str)> = bad.iter().map(|v| ("traceparent", *v)).collect();
        h.push(("tracestate", "vendor=a"));
        let (sent, state) = get(&gw, &h);
        let (trace, _, flags) = fields(&sent);
        assert!(!bad.contains(&sent.as_str()), "{sent} forwarded");
        assert!(trace != trace_one && trace != trace_two && trace != "0".repeat(32));
        assert_eq!(flags, "00");
        assert_eq!(state, None, "no tracestate without a valid traceparent");
    }
    // A valid unsampled parent: nothing is recorded, so both fields go on as they came (the
    // trace's chain stays the client's).
    let unsampled = one.replace("-01", "-00");
    let (sent, state) = get(
        &gw,
        &[
            ("traceparent", unsampled.as_str()),
            ("tracestate", "vendor=a"),
        ],
    );
    assert_eq!(sent, unsampled);
    assert_eq!(state.as_deref(), Some("vendor=a"));
    // None at all, not recorded at ratio 0: the request goes as it came, a tracestate alone
    // removed.
    let h = [
        ("Authorization", "Bearer pro-key-1"),
        ("tracestate", "vendor=a"),
    ];
    assert_eq!(gw.request("GET", "/v2/getSettings/", &h, b"").status, 200);
    let last = up.seen().pop().unwrap();
    assert!(last.header("traceparent").is_none() && last.header("tracestate").is_none());
    let page = metrics_page(gw.config.process.admin_listen);
    assert_eq!(metric(&page, "tollgate_spans_dropped_total"), Some(0.0));
    assert!(col.spans().is_empty());

    // Tracing off: both fields pass as they came, invalid or not.
    let off = Gateway::with(&up);
    let (sent, state) = get(&off, &[("traceparent", "junk"), ("tracestate", "vendor=a")]);
    assert_eq!(
        (sent.as_str(), state.as_deref()),
        ("junk", Some("vendor=a"))
    );
    assert!(metric(
        &metrics_page(off.config.process.admin_listen),
        "tollgate_spans_dropped_total"
    )
    .is_none());
}
