//! The shared budgets' metrics, registered only when the `cluster` block is configured.
//! (Their names keep the `cluster` word: they are the operators'.)

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge};

use crate::runtime::metrics::Metrics;

/// The cluster metrics (registered only when `cluster` is configured).
pub(super) struct SharedMetrics {
    pub(super) up: IntGauge,
    pub(super) replicas: IntGauge,
    pub(super) sync_seconds: Histogram,
    pub(super) sync_keys: Histogram,
    pub(super) calls: IntCounter,
    pub(super) errors: IntCounter,
    pub(super) parked: IntCounter,
    pub(super) settle_seconds: Histogram,
}

impl SharedMetrics {
    pub(super) fn new(metrics: &Metrics) -> Self {
        let up = IntGauge::new(
            "tollgate_cluster_store_up",
            "1 when the last exchange with the shared store (Redis) succeeded; 0 while each replica enforces limit / N alone.",
        )
        .expect("valid metric");
        let replicas = IntGauge::new(
            "tollgate_cluster_replicas",
            "Replicas whose heartbeat the shared store saw lately (N).",
        )
        .expect("valid metric");
        let sync_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_cluster_sync_seconds",
                "Time of each exchange with the shared store (at each interval with the heartbeat, and at once for requests that wait), successful or not.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        )
        .expect("valid metric");
        let sync_keys = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_cluster_sync_keys",
                "Keys sent to the shared store per exchange (leases topped up or given back, requests parked).",
            )
            .buckets(vec![0.0, 1.0, 10.0, 100.0, 1000.0, 10_000.0, 100_000.0]),
        )
        .expect("valid metric");
        let calls = IntCounter::new(
            "tollgate_cluster_redis_calls_total",
            "Script calls sent to the shared store (one heartbeat per interval; one per key on a Redis Cluster, one per 128 keys of an exchange on a single Redis).",
        )
        .expect("valid metric");
        let errors = IntCounter::new(
            "tollgate_cluster_sync_errors_total",
            "Exchanges with the shared store that failed or timed out.",
        )
        .expect("valid metric");
        let parked = IntCounter::new(
            "tollgate_cluster_parked_total",
            "Requests that waited for an exchange with the shared store (no lease here for their key), counted when the exchange is sent.",
        )
        .expect("valid metric");
        let settle_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "tollgate_cluster_settle_wait_seconds",
                "How long each request that waited for an exchange with the shared store waited (at most cluster.timeout_ms).",
            )
            .buckets(vec![
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            ]),
        )
        .expect("valid metric");
        for c in [
            Box::new(up.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(replicas.clone()),
            Box::new(sync_seconds.clone()),
            Box::new(sync_keys.clone()),
            Box::new(calls.clone()),
            Box::new(errors.clone()),
            Box::new(parked.clone()),
            Box::new(settle_seconds.clone()),
        ] {
            metrics.register(c);
        }
        up.set(1);
        Self {
            up,
            replicas,
            sync_seconds,
            sync_keys,
            calls,
            errors,
            parked,
            settle_seconds,
        }
    }
}
