//! A stand-in OpenTelemetry collector: an OTLP/HTTP receiver on a loopback port that keeps
//! every span posted to `/v1/traces`, decoded from protobuf (`opentelemetry-proto`'s types) or
//! read from OTLP/JSON field by field (so the JSON mapping is checked by hand, not by the same
//! crate that wrote it).

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message;
use serde_json::Value;

use super::http::{header, read_body, read_head};

/// How the receiver answers a post.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `200 {}`, the spans kept.
    Ok,
    /// Read the post, never answer (until the test ends).
    Hang,
}

/// One span as received.
#[derive(Clone, Debug)]
pub(crate) struct Got {
    pub(crate) trace_id: String,
    pub(crate) span_id: String,
    /// Hex, `""` for a root span.
    pub(crate) parent: String,
    pub(crate) name: String,
    /// 1 internal, 2 server, 3 client.
    pub(crate) kind: i64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Attribute values as text (integers in decimal).
    pub(crate) attrs: BTreeMap<String, String>,
    /// 0 unset, 2 error.
    pub(crate) status: i64,
    /// The resource's `service.name`.
    pub(crate) service: String,
    /// The post's `Content-Type`.
    pub(crate) content_type: String,
}

impl Got {
    pub(crate) fn attr(&self, k: &str) -> Option<&str> {
        self.attrs.get(k).map(String::as_str)
    }
}

pub(crate) struct Collector {
    pub(crate) addr: SocketAddr,
    spans: Arc<Mutex<Vec<Got>>>,
    /// Connections accepted.
    pub(crate) connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Collector {
    pub(crate) fn start(answer: Answer) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, c, st) = (
            Arc::clone(&spans),
            Arc::clone(&connections),
            Arc::clone(&stop),
        );
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while !st.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        c.fetch_add(1, Ordering::SeqCst);
                        let (s, st) = (Arc::clone(&s), Arc::clone(&st));
                        std::thread::spawn(move || serve(stream, answer, s, st));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Self {
            addr,
            spans,
            connections,
            stop,
        }
    }

    /// The base URL for `tracing.otlp_endpoint`.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    /// The spans of trace `trace_id` (hex), once (bounded wait) there are at least `n`.
    pub(crate) fn trace(&self, trace_id: &str, n: usize) -> Vec<Got> {
        let got = super::settled(
            || {
                self.spans()
                    .into_iter()
                    .filter(|s| s.trace_id == trace_id)
                    .collect::<Vec<_>>()
            },
            |v| v.len() >= n,
        );
        assert!(
            got.len() >= n,
            "trace {trace_id}: {} of {n} spans: {got:#?}",
            got.len()
        );
        got
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(stream: TcpStream, answer: Answer, spans: Arc<Mutex<Vec<Got>>>, stop: Arc<AtomicBool>) {
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    while let Some((line, headers)) = read_head(&mut r) {
        let Some(body) = read_body(&mut r, &headers, false) else {
            return;
        };
        if answer == Answer::Hang {
            let end = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(10));
            }
            return;
        }
        let ct = header(&headers, "content-type").unwrap_or("").to_string();
        assert!(line.starts_with("POST /v1/traces "), "{line}");
        let got = if ct == "application/json" {
            from_json(&body, &ct)
        } else {
            assert_eq!(ct, "application/x-protobuf");
            from_proto(&body, &ct)
        };
        spans.lock().unwrap().extend(got);
        let ok = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}";
        if w.write_all(ok.as_bytes()).is_err() {
            return;
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_proto(body: &[u8], ct: &str) -> Vec<Got> {
    let req = ExportTraceServiceRequest::decode(body).expect("an ExportTraceServiceRequest");
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(any_text)
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Got {
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    name: s.name,
                    kind: i64::from(s.kind),
                    start: s.start_time_unix_nano,
                    end: s.end_time_unix_nano,
                    attrs: s
                        .attributes
                        .iter()
                        .filter_map(|kv| {
                            Some((kv.key.clone(), any_text(kv.value.as_ref()?.value.as_ref()?)))
                        })
                        .collect(),
                    status: s.status.map_or(0, |st| i64::from(st.code)),
                    service: service.clone(),
                    content_type: ct.to_string(),
                });
            }
        }
    }
    out
}

fn any_text(v: &Any) -> String {
    match v {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        other => format!("{other:?}"),
    }
}

/// OTLP/JSON read by hand: lowerCamelCase names, hex ids, 64-bit integers as strings.
fn from_json(body: &[u8], ct: &str) -> Vec<Got> {
    let v: Value = serde_json::from_slice(body).expect("JSON");
    let text = |v: &Value| -> String {
        if let Some(s) = v["stringValue"].as_str() {
            return s.to_string();
        }
        // OTLP/JSON: an int64 is a decimal string.
        v["intValue"]
            .as_str()
            .expect("intValue as a string")
            .to_string()
    };
    let id = |v: &Value, name: &str| -> String {
        let s = v[name].as_str().unwrap_or("").to_string();
        assert!(
            s.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name} not hex: {s}"
        );
        s
    };
    let mut out = Vec::new();
    for rs in v["resourceSpans"].as_array().expect("resourceSpans") {
        let service = rs["resource"]["attributes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|kv| kv["key"] == "service.name")
            .map(|kv| text(&kv["value"]))
            .unwrap_or_default();
        for ss in rs["scopeSpans"].as_array().expect("scopeSpans") {
            for s in ss["spans"].as_array().expect("spans") {
                let nanos = |name: &str| -> u64 {
                    s[name]
                        .as_str()
                        .expect("a u64 as a string")
                        .parse()
                        .unwrap()
                };
                out.push(Got {
                    trace_id: id(s, "traceId"),
                    span_id: id(s, "spanId"),
                    parent: id(s, "parentSpanId"),
                    name: s["name"].as_str().unwrap().to_string(),
                    kind: s["kind"].as_i64().expect("kind as a number"),
                    start: nanos("startTimeUnixNano"),
                    end: nanos("endTimeUnixNano"),
                    attrs: s["attributes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|kv| (kv["key"].as_str().unwrap().to_string(), text(&kv["value"])))
                        .collect(),
                    status: s["status"]["code"].as_i64().unwrap_or(0),
                    service: service.clone(),
                    content_type: ct.to_string(),
                });
            }
        }
    }
    out
}
