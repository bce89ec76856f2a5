//! The exporter: a bounded queue the request path hands recorded requests to without waiting
//! (`try_send`: a full queue drops the record and counts its spans), and one thread of its own
//! that batches them, encodes each batch ([`super::otlp`]) and posts it to
//! `{otlp_endpoint}/v1/traces` with a small blocking client. The thread is a plain thread,
//! never a runtime's worker: a collector that is down, slow or failing holds only it.
//!
//! | metric | what |
//! |---|---|
//! | `tollgate_spans_exported_total` | spans the collector accepted (a 2xx answer) |
//! | `tollgate_spans_dropped_total` | spans lost: past the queue's bound, or in a batch the collector refused or never answered |
//!
//! A failed batch is not sent again (OTLP allows retrying 429 and 503; a gateway under load
//! would only queue more behind it): it is counted dropped, and the next batch goes on.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, Instant};

use prometheus::IntCounter;

use crate::config::{OtlpProtocol, Tracing};
use crate::runtime::metrics::Metrics;

use super::span::Finished;

/// Recorded requests waiting for the exporter, at most (OpenTelemetry's default queue).
pub(crate) const QUEUE: usize = 2048;
/// Recorded requests in one batch, at most.
pub(crate) const BATCH: usize = 512;
/// How long a batch waits for more after its first record.
pub(crate) const BATCH_WAIT: Duration = Duration::from_secs(1);
/// How often the exporter's thread wakes to take what the queue holds. It never waits *on*
/// the queue: a receiver parked in `recv` makes every sender's `try_send` a wake-up (a futex
/// call and a context switch a recorded request: 16 µs of system time each at 20,000 a
/// second, measured); a sleeping one costs a sender nothing. 50 ms at the queue's 2,048 is
/// room for 40,000 recorded requests a second.
pub(crate) const DRAIN_EVERY: Duration = Duration::from_millis(50);
/// The longest one post may take, connecting included.
pub(crate) const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// The request path's handle on the exporter (the proxy holds one).
pub(crate) struct Tracer {
    queue: SyncSender<Box<Finished>>,
    /// New traces whose id's low half is below this are recorded ([`crate::config::SampleRatio`]).
    pub(super) threshold: u64,
    counts: Counts,
}

/// The two counters, registered with the process's metrics.
#[derive(Clone)]
struct Counts {
    exported: IntCounter,
    dropped: IntCounter,
}

impl Counts {
    fn new(metrics: Option<&Metrics>) -> Self {
        let exported = IntCounter::new(
            "tollgate_spans_exported_total",
            "Spans the OpenTelemetry collector accepted.",
        )
        .expect("valid metric");
        let dropped = IntCounter::new(
            "tollgate_spans_dropped_total",
            "Spans lost: past the exporter's queue, or in a batch the collector refused or never answered.",
        )
        .expect("valid metric");
        if let Some(m) = metrics {
            m.register(Box::new(exported.clone()));
            m.register(Box::new(dropped.clone()));
        }
        Self { exported, dropped }
    }
}

impl Tracer {
    /// The exporter for `cfg`: its counters registered in `metrics`, its thread started.
    pub(crate) fn start(cfg: &Tracing, metrics: &Metrics) -> std::io::Result<Self> {
        let counts = Counts::new(Some(metrics));
        let (queue, rx) = sync_channel(QUEUE);
        let exporter = Exporter::new(cfg, counts.clone());
        std::thread::Builder::new()
            .name("tollgate-traces".into())
            .spawn(move || exporter.run(rx))?;
        Ok(Self {
            queue,
            threshold: cfg.sample_ratio.threshold(),
            counts,
        })
    }

    /// Hand a recorded request to the exporter, never waiting: past the queue's bound it is
    /// dropped and its spans counted.
    pub(crate) fn finish(&self, f: Box<Finished>) {
        let spans = f.spans();
        match self.queue.try_send(f) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.dropped.inc_by(spans);
            }
        }
    }

    /// A tracer at `ratio` whose records go nowhere, for unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(ratio: f64) -> Self {
        let (queue, _) = sync_channel(1);
        let threshold = if ratio >= 1.0 {
            u64::MAX
        } else {
            (ratio * 18_446_744_073_709_551_616.0) as u64
        };
        Self {
            queue,
            threshold,
            counts: Counts::new(None),
        }
    }
}

/// The exporter's thread: what it posts, where, and its client.
struct Exporter {
    url: String,
    service: String,
    protocol: OtlpProtocol,
    agent: ureq::Agent,
    counts: Counts,
    /// Whether the last batch failed: a failure is logged when it starts, not every batch.
    failing: std::cell::Cell<bool>,
}

impl Exporter {
    fn new(cfg: &Tracing, counts: Counts) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(POST_TIMEOUT))
            .build()
            .into();
        Self {
            url: cfg.traces_url.clone(),
            service: cfg.service_name.clone(),
            protocol: cfg.protocol,
            agent,
            counts,
            failing: std::cell::Cell::new(false),
        }
    }

    /// Every [`DRAIN_EVERY`], take what the queue holds; post a batch when it is full or its
    /// first record has waited [`BATCH_WAIT`]; once every sender is gone, post what is left.
    fn run(self, rx: Receiver<Box<Finished>>) {
        let mut batch = Vec::with_capacity(BATCH);
        let mut since: Option<Instant> = None;
        loop {
            std::thread::sleep(DRAIN_EVERY);
            let open = loop {
                match rx.try_recv() {
                    Ok(f) => {
                        batch.push(f);
                        since.get_or_insert_with(Instant::now);
                        if batch.len() == BATCH {
                            self.post(&batch);
                            batch.clear();
                            since = None;
                        }
                    }
                    Err(TryRecvError::Empty) => break true,
                    Err(TryRecvError::Disconnected) => break false,
                }
            };
            let due = since.is_some_and(|t| t.elapsed() >= BATCH_WAIT);
            if !batch.is_empty() && (due || !open) {
                self.post(&batch);
                batch.clear();
                since = None;
            }
            if !open {
                return;
            }
        }
    }

    /// Post one batch; count its spans exported (a 2xx) or dropped (anything else).
    fn post(&self, batch: &[Box<Finished>]) {
        let spans: u64 = batch.iter().map(|f| f.spans()).sum();
        let (body, content_type) = super::otlp::encode(batch, &self.service, self.protocol);
        let sent = http::Request::post(&self.url)
            .header("content-type", content_type)
            .body(body)
            .map_err(|e| e.to_string())
            .and_then(|r| self.agent.run(r).map_err(|e| e.to_string()));
        let failure = match sent {
            Ok(resp) if resp.status().is_success() => None,
            Ok(resp) => Some(format!("the collector answered {}", resp.status().as_u16())),
            Err(e) => Some(format!("the collector did not answer: {e}")),
        };
        match failure {
            None => {
                self.counts.exported.inc_by(spans);
                if self.failing.replace(false) {
                    tracing::info!(target: "tollgate::traces", url = %self.url, "spans are exported again");
                }
            }
            Some(why) => {
                self.counts.dropped.inc_by(spans);
                if !self.failing.replace(true) {
                    tracing::warn!(
                        target: "tollgate::traces",
                        url = %self.url,
                        spans,
                        "spans not exported ({why}); counted in tollgate_spans_dropped_total until the collector takes them"
                    );
                }
            }
        }
    }
}
