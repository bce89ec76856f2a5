//! Recorded requests as OTLP: one `ExportTraceServiceRequest` a batch, in the
//! `opentelemetry-proto` types, encoded as protobuf (prost) or as OTLP's JSON (the crate's
//! serde mapping: hex ids, lowerCamelCase names, 64-bit integers as strings).
//!
//! | span | kind | name | attributes |
//! |---|---|---|---|
//! | the request | `SERVER` | `{method} {route path}`, or `{method}` when no catalogued route matched | `http.request.method`, `url.path`, `url.scheme`, `http.route`, `http.response.status_code`, `client.address`, `network.protocol.version`, `tollgate.route`, `tollgate.outcome`, `tollgate.plan`, `tollgate.key` (a name, never a secret or digest), `tollgate.code`; status `ERROR` for a 5xx only |
//! | the upstream call | `CLIENT` | `{method}` | `http.request.method`, `server.address`, `server.port`, `http.response.status_code`, `error.type` when no answer came; status `ERROR` for a 4xx, a 5xx or no answer |
//! | the wait on the fleet store | `INTERNAL` | `fleet_wait` | — |

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;

use crate::config::routes::{PathMatch, UNKNOWN_ROUTE_ID};
use crate::config::OtlpProtocol;

use super::span::Finished;

/// The scope every span is made under.
const SCOPE: &str = "tollgate";

/// A batch, encoded in `protocol`, with its `Content-Type`.
pub(crate) fn encode(
    batch: &[Box<Finished>],
    service: &str,
    protocol: OtlpProtocol,
) -> (Vec<u8>, &'static str) {
    let req = request(batch, service);
    match protocol {
        OtlpProtocol::Protobuf => (req.encode_to_vec(), "application/x-protobuf"),
        // Serializing these types cannot fail: no map has non-string keys.
        OtlpProtocol::Json => (
            serde_json::to_vec(&req).unwrap_or_default(),
            "application/json",
        ),
    }
}

/// The request for a batch: one resource (`service.name`, `service.version`), one scope.
pub(crate) fn request(batch: &[Box<Finished>], service: &str) -> ExportTraceServiceRequest {
    let spans = batch.iter().flat_map(|f| spans(f)).collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", service),
                    text("service.version", env!("CARGO_PKG_VERSION")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: SCOPE.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// The spans of one recorded request: `SERVER`, then its children.
fn spans(f: &Finished) -> Vec<Span> {
    let method = method_word(&f.method);
    let policy = f.snap.as_ref().map(|s| &s.policy);
    let route = match (policy, f.route) {
        (Some(p), Some(r)) => Some(p.config.catalogue.get(r)),
        _ => None,
    };
    // The catalogue's path of the route; none for an uncatalogued path (`unknown`), which is
    // named by its method alone, as a request that matched no route.
    let template = route
        .filter(|r| r.id != UNKNOWN_ROUTE_ID)
        .map(|r| match &r.path {
            PathMatch::Exact(p) | PathMatch::Prefix(p) => p.as_str(),
        });
    let name = match template {
        Some(t) if method != "_OTHER" => format!("{method} {t}"),
        _ if method == "_OTHER" => "HTTP".to_string(),
        _ => method.to_string(),
    };
    let mut attrs = vec![
        text("http.request.method", method),
        text("url.path", &f.path),
        text("url.scheme", if f.tls { "https" } else { "http" }),
        text("network.protocol.version", f.version),
    ];
    if let Some(t) = template {
        attrs.push(text("http.route", t));
    }
    if f.status != 0 {
        attrs.push(int("http.response.status_code", i64::from(f.status)));
    }
    if let Some(ip) = f.client {
        attrs.push(text("client.address", &ip.to_string()));
    }
    if let Some(r) = route {
        attrs.push(text("tollgate.route", &r.id));
    }
    attrs.push(text("tollgate.outcome", f.outcome.as_str()));
    if let (Some(p), Some(c)) = (policy, f.credential) {
        attrs.push(text("tollgate.plan", p.policy_name_of(c)));
    }
    if let (Some(p), Some(k)) = (policy, f.key) {
        attrs.push(text("tollgate.key", &p.keys.get(k).name));
    }
    if let Some(code) = f.code {
        attrs.push(text("tollgate.code", code.as_str()));
    }
    let mut out = vec![Span {
        trace_id: f.trace_id.to_vec(),
        span_id: f.span_id.to_vec(),
        parent_span_id: f.parent.map_or(Vec::new(), |p| p.to_vec()),
        flags: SAMPLED | if f.parent.is_some() { REMOTE } else { LOCAL },
        name,
        kind: SpanKind::Server as i32,
        start_time_unix_nano: f.start_ns,
        end_time_unix_nano: f.end_ns,
        attributes: attrs,
        status: (f.status >= 500).then(|| error("")),
        ..Default::default()
    }];
    if let Some(up) = &f.upstream {
        let mut attrs = vec![text("http.request.method", method)];
        if let Some(p) = policy {
            attrs.push(text("server.address", &p.config.upstream.host));
            attrs.push(int("server.port", i64::from(p.config.upstream.port)));
        }
        let failed = up.status == 0 || up.status >= 400;
        if up.status != 0 {
            attrs.push(int("http.response.status_code", i64::from(up.status)));
        } else {
            let why = f.code.map_or("no_answer", |c| c.as_str());
            attrs.push(text("error.type", why));
        }
        out.push(Span {
            trace_id: f.trace_id.to_vec(),
            span_id: up.span_id.to_vec(),
            parent_span_id: f.span_id.to_vec(),
            flags: SAMPLED | LOCAL,
            name: method.to_string(),
            kind: SpanKind::Client as i32,
            start_time_unix_nano: up.start_ns,
            end_time_unix_nano: up.end_ns,
            attributes: attrs,
            status: failed.then(|| error("")),
            ..Default::default()
        });
    }
    if let Some((start, end)) = f.fleet_wait {
        out.push(Span {
            trace_id: f.trace_id.to_vec(),
            span_id: super::span_id().to_vec(),
            parent_span_id: f.span_id.to_vec(),
            flags: SAMPLED | LOCAL,
            name: "fleet_wait".into(),
            kind: SpanKind::Internal as i32,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            ..Default::default()
        });
    }
    out
}

/// Span flags: W3C's sampled bit, and whether the parent is known to be remote or local
/// (`SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`, `..._IS_REMOTE_MASK`).
const SAMPLED: u32 = 0x01;
const LOCAL: u32 = 0x100;
const REMOTE: u32 = 0x300;

/// The method as OpenTelemetry's conventions name it: a known method, or `_OTHER`.
fn method_word(m: &http::Method) -> &str {
    match m.as_str() {
        w @ ("GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS" | "CONNECT"
        | "TRACE") => w,
        _ => "_OTHER",
    }
}

fn error(message: &str) -> Status {
    Status {
        message: message.into(),
        code: StatusCode::Error as i32,
    }
}

fn text(key: &str, v: &str) -> KeyValue {
    value(key, any_value::Value::StringValue(v.into()))
}

fn int(key: &str, v: i64) -> KeyValue {
    value(key, any_value::Value::IntValue(v))
}

fn value(key: &str, v: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(v) }),
        ..Default::default()
    }
}
