//! Traces: the one room that speaks to the OpenTelemetry collector (the `tracing` block).
//!
//! A request's trace is decided once, when its head is in ([`Tracer::begin`]): a valid
//! `traceparent` is continued and its sampled flag decides; otherwise a new trace is recorded
//! at `sample_ratio`, decided from its random id. What the upstream gets
//! ([`Trace::propagate`]):
//!
//! | the request's `traceparent` | recorded | the upstream's `traceparent` | `tracestate` |
//! |---|---|---|---|
//! | valid | yes | this trace, parent the gateway's `CLIENT` span, flags `01` | passed on |
//! | valid | no | the client's, as it came (the gateway records nothing, so the chain stays the client's) | passed on |
//! | invalid, or two | either | replaced: the new trace, flags `01` or `00` | removed |
//! | none | yes | the new trace, parent the `CLIENT` span, flags `01` | removed |
//! | none | no | none: the request goes as it came | removed |
//!
//! The parent the upstream is told of is the `CLIENT` span, the span of the upstream call, as
//! OpenTelemetry's HTTP conventions make it. A request that is not recorded and brings a valid
//! `traceparent` or none costs one lookup and, without one, a random number: no [`Trace`] at
//! all. Only a recorded request has a [`Recording`]; at its end it becomes one
//! [`span::Finished`], handed to the exporter's queue without waiting ([`Tracer::finish`]):
//! past the queue's bound it is dropped and counted. The exporter's own thread batches,
//! encodes ([`otlp`]) and posts ([`export`]); a collector that is down, slow or failing slows
//! no request.
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

/// A request's trace, when there is something to do for it: what the upstream's trace fields
/// become and, when it is recorded, its spans so far. Small and inline; only a recorded
/// request allocates ([`Recording`]).
#[derive(Debug)]
pub(crate) struct Trace {
    pub(crate) trace_id: TraceId,
    /// The parent the upstream is told of: the `CLIENT` span's id (a fresh id for a replaced
    /// field that is not recorded).
    pub(crate) upstream_parent: SpanId,
    /// What the upstream's fields become.
    pub(crate) upstream: Upstream,
    /// `Some` when this request is recorded.
    pub(crate) recording: Option<Box<Recording>>,
}

/// What the upstream's `traceparent` and `tracestate` become (the module docs' table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Upstream {
    /// The gateway's `traceparent`: the client's field removed first when it had one
    /// (`replace`), its `tracestate` kept only under a valid parent (`keep_state`).
    Ours { replace: bool, keep_state: bool },
    /// No `traceparent` came and none goes; a `tracestate` alone is removed.
    DropState,
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

    /// The upstream request's trace fields, as [`Upstream`] says.
    pub(crate) fn propagate(&self, up: &mut RequestHeader) -> pingora::Result<()> {
        let (replace, keep_state) = match self.upstream {
            Upstream::DropState => {
                up.remove_header(&w3c::TRACESTATE_NAME);
                return Ok(());
            }
            Upstream::Ours {
                replace,
                keep_state,
            } => (replace, keep_state),
        };
        if replace {
            up.remove_header(&w3c::TRACEPARENT_NAME);
        }
        if !keep_state {
            up.remove_header(&w3c::TRACESTATE_NAME);
        }
        up.insert_header(
            w3c::TRACEPARENT,
            w3c::header(&self.trace_id, &self.upstream_parent, self.sampled()),
        )
    }
}

impl Tracer {
    /// The trace of a request with these headers (the module docs' table); `None` when there
    /// is nothing to do: not recorded, and a valid `traceparent` or none (with no
    /// `tracestate`) that goes upstream as it came.
    pub(crate) fn begin(&self, headers: &HeaderMap) -> Option<Trace> {
        let (trace_id, parent, upstream) = match w3c::incoming(headers) {
            w3c::Incoming::Valid(p) if !p.sampled => return None,
            w3c::Incoming::Valid(p) => {
                let ours = Upstream::Ours {
                    replace: true,
                    keep_state: true,
                };
                (p.trace_id, Some(p), ours)
            }
            incoming => {
                // A new trace, recorded when its id's low half is under the threshold.
                let low = random();
                let sampled = self.threshold == u64::MAX || low < self.threshold;
                let replace = incoming == w3c::Incoming::Invalid;
                let upstream = match (sampled, replace) {
                    (false, false) if !headers.contains_key(&w3c::TRACESTATE_NAME) => return None,
                    (false, false) => Upstream::DropState,
                    _ => Upstream::Ours {
                        replace,
                        keep_state: false,
                    },
                };
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&random().to_be_bytes());
                id[8..].copy_from_slice(&low.to_be_bytes());
                let recorded = sampled.then_some(None);
                return Some(self.trace(id, recorded, upstream));
            }
        };
        Some(self.trace(trace_id, Some(parent), upstream))
    }

    /// A trace of `trace_id`, recorded when `recorded` is `Some` (with the client's span as
    /// the parent, when it named one).
    fn trace(
        &self,
        trace_id: TraceId,
        recorded: Option<Option<w3c::Parent>>,
        upstream: Upstream,
    ) -> Trace {
        Trace {
            trace_id,
            upstream_parent: span_id(),
            upstream,
            recording: recorded.map(|parent| {
                Box::new(Recording {
                    span_id: span_id(),
                    parent: parent.map(|p| p.span_id),
                    fleet_wait: None,
                })
            }),
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
#[cfg(test)]
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
        let t = tracer(0.0)
            .begin(&with(&[("traceparent", PARENT)]))
            .unwrap();
        assert!(t.sampled());
        let ours = Upstream::Ours {
            replace: true,
            keep_state: true,
        };
        assert_eq!(t.upstream, ours);
        assert_eq!(hex::encode(t.trace_id), "0af7651916cd43dd8448eb211c80319c");
        let rec = t.recording.as_ref().unwrap();
        assert_eq!(hex::encode(rec.parent.unwrap()), "b7ad6b7169203331");
        assert_ne!(rec.span_id, t.upstream_parent);
        // Not recorded: nothing to do, whatever the ratio; the field goes on as it came.
        let unsampled = PARENT.replace("-01", "-00");
        assert!(tracer(1.0)
            .begin(&with(&[("traceparent", &unsampled), ("tracestate", "a=1")]))
            .is_none());
    }

    #[test]
    fn without_a_valid_parent_the_ratio_decides_a_new_trace() {
        let h = with(&[("traceparent", "00-zz")]);
        let t = tracer(1.0).begin(&h).unwrap();
        assert!(t.sampled());
        assert_eq!(
            t.upstream,
            Upstream::Ours {
                replace: true,
                keep_state: false
            }
        );
        assert!(t.recording.unwrap().parent.is_none());
        // Not recorded: an invalid field is still replaced; none, nothing to do.
        let t = tracer(0.0).begin(&h).unwrap();
        assert!(!t.sampled() && matches!(t.upstream, Upstream::Ours { replace: true, .. }));
        assert!(tracer(0.0).begin(&HeaderMap::new()).is_none());
        let state = tracer(0.0).begin(&with(&[("tracestate", "a=1")])).unwrap();
        assert_eq!(state.upstream, Upstream::DropState);
        let half = tracer(0.5);
        let n = (0..4000)
            .filter(|_| half.begin(&HeaderMap::new()).is_some_and(|t| t.sampled()))
            .count();
        assert!((1600..2400).contains(&n), "{n} of 4000 at 0.5");
    }

    /// The upstream's fields after `propagate` of a request with `fields`, at `ratio`.
    fn sent(ratio: f64, fields: &[(&'static str, &str)]) -> (Option<Trace>, RequestHeader) {
        let mut up = RequestHeader::build("POST", b"/v2/sendMessage/", None).unwrap();
        for (n, v) in fields {
            up.append_header(*n, *v).unwrap();
        }
        let t = tracer(ratio).begin(&up.headers.clone());
        if let Some(t) = &t {
            t.propagate(&mut up).unwrap();
        }
        (t, up)
    }

    #[test]
    fn the_upstream_gets_the_gateways_traceparent_and_tracestate_only_under_a_valid_one() {
        let fields = [("traceparent", "junk"), ("tracestate", "vendor=1")];
        for ratio in [1.0, 0.0] {
            let (t, up) = sent(ratio, &fields);
            let t = t.unwrap();
            let tps: Vec<_> = up.headers.get_all("traceparent").iter().collect();
            assert_eq!(tps.len(), 1);
            let p = w3c::parse(tps[0].as_bytes()).unwrap();
            assert_eq!((p.trace_id, p.span_id), (t.trace_id, t.upstream_parent));
            assert_eq!(p.sampled, ratio == 1.0);
            assert!(up.headers.get("tracestate").is_none());
        }
        // A recorded parent: the gateway's span in its place, the tracestate kept.
        let (_, up) = sent(0.0, &[("traceparent", PARENT), ("tracestate", "vendor=1")]);
        assert_eq!(up.headers.get_all("traceparent").iter().count(), 1);
        let v = up.headers.get("traceparent").unwrap().to_str().unwrap();
        assert!(v.starts_with("00-0af7651916cd43dd8448eb211c80319c-"), "{v}");
        assert!(
            !v.contains("b7ad6b7169203331"),
            "the parent is the gateway's span: {v}"
        );
        assert_eq!(up.headers.get("tracestate").unwrap(), "vendor=1");
        // None, recorded: ours, and a tracestate alone removed.
        let (t, up) = sent(1.0, &[("tracestate", "vendor=1")]);
        assert!(t.unwrap().sampled());
        assert_eq!(up.headers.get_all("traceparent").iter().count(), 1);
        assert!(up.headers.get("tracestate").is_none());
        // None, not recorded: no traceparent added; a tracestate alone removed.
        let (_, up) = sent(0.0, &[("tracestate", "vendor=1")]);
        assert!(up.headers.get("traceparent").is_none());
        assert!(up.headers.get("tracestate").is_none());
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
