//! Traces: the one room that speaks to the OpenTelemetry collector (the `tracing` block).
//!
//! A request's trace is decided once, when its head is in ([`Tracer::begin`]): a valid
//! `traceparent` is continued and its sampled flag decides; otherwise a new trace is recorded
//! at `sample_ratio`, decided from its random id. The upstream always gets a `traceparent` of
//! the gateway's ([`Trace::propagate`]): this trace, and as parent the gateway's `CLIENT` span
//! (the span of the upstream call, as OpenTelemetry's HTTP conventions make it; a fresh id when
//! the request is not recorded); `tracestate` goes on only with a valid parent. Only a recorded
//! request has a [`Recording`]; at its end it becomes one [`span::Finished`], handed to the
//! exporter's queue without waiting ([`Tracer::finish`]): past the queue's bound it is
//! dropped and counted. The exporter's own thread batches, encodes ([`otlp`]) and posts
//! ([`export`]); a collector that is down, slow or failing slows no request.
//!
//! | module | what |
//! |---|---|
//! | [`w3c`] | the strict `traceparent` reader, and the field the upstream gets |
//! | [`span`] | what a recorded request leaves: ids, times, and what the attributes are read from |
//! | [`otlp`] | spans as OTLP (`opentelemetry-proto` types), in protobuf or JSON |
//! | [`export`] | the bounded queue, the exporter's thread, `tollgate_spans_*_total` |

pub(crate) mod export;
pub(crate) mod otlp;
pub(crate) mod span;
pub(crate) mod w3c;

use std::cell::Cell;
use std::time::Instant;

use http::HeaderMap;
use pingora::http::RequestHeader;

pub(crate) use export::Tracer;
use w3c::{SpanId, TraceId};

/// A request's trace: what the upstream's `traceparent` says, and, when it is recorded, its
/// spans so far. Small and inline; only a recorded request allocates ([`Recording`]).
#[derive(Debug)]
pub(crate) struct Trace {
    pub(crate) trace_id: TraceId,
    /// The parent the upstream is told of: the `CLIENT` span's id.
    pub(crate) upstream_parent: SpanId,
    /// Whether the client's `traceparent` was valid (its `tracestate` then goes on).
    pub(crate) continued: bool,
    /// Whether the request carried a `traceparent` that must not be forwarded.
    pub(crate) replace: bool,
    /// `Some` when this request is recorded.
    pub(crate) recording: Option<Box<Recording>>,
}

/// A recorded request's spans as they happen.
#[derive(Debug)]
pub(crate) struct Recording {
    /// The `SERVER` span's id.
    pub(crate) span_id: SpanId,
    /// The client's span, when a valid `traceparent` named one.
    pub(crate) parent: Option<SpanId>,
    /// The wait on the fleet store (`fleet_wait`), when the request waited.
    pub(crate) fleet_wait: Option<(Instant, Instant)>,
}

impl Trace {
    /// Whether the request is recorded.
    pub(crate) fn sampled(&self) -> bool {
        self.recording.is_some()
    }

    /// The trace id as 32 lower-case hex digits, for the access line.
    pub(crate) fn id_hex(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        w3c::hex_out(&self.trace_id, &mut out);
        out
    }

    /// The upstream request's trace fields: the client's `traceparent` replaced by the
    /// gateway's, its `tracestate` kept only under a valid parent.
    pub(crate) fn propagate(&self, up: &mut RequestHeader) -> pingora::Result<()> {
        if self.replace {
            up.remove_header(w3c::TRACEPARENT);
        }
        if !self.continued {
            up.remove_header(w3c::TRACESTATE);
        }
        up.insert_header(
            w3c::TRACEPARENT,
            w3c::header(&self.trace_id, &self.upstream_parent, self.sampled()),
        )
    }
}

impl Tracer {
    /// The trace of a request with these headers (see the module docs).
    pub(crate) fn begin(&self, headers: &HeaderMap) -> Trace {
        let parent = w3c::incoming(headers);
        let replace = w3c::present(headers);
        let (trace_id, sampled) = match parent {
            Some(p) => (p.trace_id, p.sampled),
            None => {
                let id = trace_id();
                let low = u64::from_be_bytes(id[8..].try_into().unwrap_or_default());
                (id, self.threshold == u64::MAX || low < self.threshold)
            }
        };
        let upstream_parent = span_id();
        let recording = sampled.then(|| {
            Box::new(Recording {
                span_id: span_id(),
                parent: parent.map(|p| p.span_id),
                fleet_wait: None,
            })
        });
        Trace {
            trace_id,
            upstream_parent,
            continued: parent.is_some(),
            replace,
            recording,
        }
    }
}

thread_local! {
    /// This thread's id generator (wyrand), seeded from the operating system once.
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    })
}

/// 64 random bits, never 0 (ids may not be all zero).
fn random() -> u64 {
    RNG.with(|s| {
        let x = s.get().wrapping_add(0xa076_1d64_78bd_642f);
        s.set(x);
        let t = u128::from(x) * u128::from(x ^ 0xe703_7ed1_a0b4_28db);
        ((t as u64) ^ ((t >> 64) as u64)).max(1)
    })
}

/// A new span id.
pub(crate) fn span_id() -> SpanId {
    random().to_be_bytes()
}

/// A new trace id.
fn trace_id() -> TraceId {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&random().to_be_bytes());
    id[8..].copy_from_slice(&random().to_be_bytes());
    id
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn tracer(ratio: f64) -> Tracer {
        Tracer::for_tests(ratio)
    }

    fn with(values: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in values {
            h.append(*n, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_valid_parent_is_continued_and_its_flag_decides() {
        let t = tracer(0.0).begin(&with(&[("traceparent", PARENT)]));
        assert!(t.sampled() && t.continued && t.replace);
        assert_eq!(hex::encode(t.trace_id), "0af7651916cd43dd8448eb211c80319c");
        let rec = t.recording.as_ref().unwrap();
        assert_eq!(hex::encode(rec.parent.unwrap()), "b7ad6b7169203331");
        assert_ne!(rec.span_id, t.upstream_parent);
        let unsampled = PARENT.replace("-01", "-00");
        let t = tracer(1.0).begin(&with(&[("traceparent", &unsampled)]));
        assert!(!t.sampled() && t.continued);
    }

    #[test]
    fn without_a_valid_parent_the_ratio_decides_a_new_trace() {
        let h = with(&[("traceparent", "00-zz")]);
        let t = tracer(1.0).begin(&h);
        assert!(t.sampled() && !t.continued && t.replace);
        assert!(t.recording.unwrap().parent.is_none());
        assert!(!tracer(0.0).begin(&HeaderMap::new()).sampled());
        let half = tracer(0.5);
        let n = (0..4000)
            .filter(|_| half.begin(&HeaderMap::new()).sampled())
            .count();
        assert!((1600..2400).contains(&n), "{n} of 4000 at 0.5");
    }

    #[test]
    fn the_upstream_gets_the_gateways_traceparent_and_tracestate_only_under_a_valid_one() {
        let mut up = RequestHeader::build("POST", b"/v2/sendMessage/", None).unwrap();
        up.append_header("traceparent", "junk").unwrap();
        up.append_header("tracestate", "vendor=1").unwrap();
        let h = up.headers.clone();
        let t = tracer(1.0).begin(&h);
        t.propagate(&mut up).unwrap();
        let sent: Vec<_> = up.headers.get_all("traceparent").iter().collect();
        assert_eq!(sent.len(), 1);
        let p = w3c::parse(sent[0].as_bytes()).unwrap();
        assert_eq!(
            (p.trace_id, p.span_id, p.sampled),
            (t.trace_id, t.upstream_parent, true)
        );
        assert!(up.headers.get("tracestate").is_none());

        let mut up = RequestHeader::build("GET", b"/", None).unwrap();
        up.append_header("traceparent", PARENT).unwrap();
        up.append_header("tracestate", "vendor=1").unwrap();
        let t = tracer(0.0).begin(&up.headers.clone());
        t.propagate(&mut up).unwrap();
        assert_eq!(up.headers.get_all("traceparent").iter().count(), 1);
        let v = up.headers.get("traceparent").unwrap().to_str().unwrap();
        assert!(v.starts_with("00-0af7651916cd43dd8448eb211c80319c-"), "{v}");
        assert!(
            !v.contains("b7ad6b7169203331"),
            "the parent is the gateway's span: {v}"
        );
        assert_eq!(up.headers.get("tracestate").unwrap(), "vendor=1");
    }

    #[test]
    fn ids_are_random_and_never_zero() {
        let a: Vec<SpanId> = (0..1000).map(|_| span_id()).collect();
        let mut b = a.clone();
        b.sort();
        b.dedup();
        assert_eq!(b.len(), 1000);
        assert!(a.iter().all(|s| *s != [0; 8]));
        assert_ne!(trace_id(), trace_id());
    }
}
