//! Benchmarks of the request path's hot steps.
//!
//! | benchmark | what | target (median) |
//! |---|---|---|
//! | `decide/one_thread` | `Policy::decide` (authenticate + classify + authorize + limit), Pro key, `POST /v2/sendMessage/` | ≤ 150 ns |
//! | `decide/two_threads_one_key` | the same, while a second thread decides on the same key | ≤ 500 ns |
//! | `limit/acquire` | `RateState::acquire` alone | ≤ 50 ns |
//! | `check_body/group_event_200B` | `check_body(GroupEvent, ~200-byte valid body, 65536)` | ≤ 1 µs |
//!
//! The bench config gives the Pro plan the largest allowed limit (1 000 000 per 10 s, one
//! request per 10 µs), and the limiter's clock is advanced by that emission interval on every
//! decision, so the limiter always admits and every decision measured is the admit path.
//!
//! Run: `cargo bench --bench policy -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

use tollgate::authenticate::AuthHeader;
use tollgate::check_body::{check_body, Checked};
use tollgate::clock::Nanos;
use tollgate::config::Config;
use tollgate::limit::{Rate, RateState};
use tollgate::policy::{Policy, RequestHead};
use tollgate::routes::BodyRule;
use tollgate::testing::NoEnv;

const LIMIT: u32 = 1_000_000;
const WINDOW_SECS: u32 = 10;
/// The emission interval for `LIMIT` per `WINDOW_SECS`: 10 µs.
const INTERVAL: Nanos = WINDOW_SECS as u64 * 1_000_000_000 / LIMIT as u64;

const BENCH_YAML: &str = r#"
listen: "127.0.0.1:0"
upstream: { base_url: "http://127.0.0.1:9" }
limits: { window_seconds: 10 }
plans:
  pro: { plan_id: 3, requests_per_window: 1000000, allow: all }
keys:
  - { name: pro-1, key: pro-key-1, plan: pro }
"#;

const AUTH: &[u8] = b"Bearer pro-key-1";

/// A valid group event of about 200 bytes.
const EVENT: &str = r#"{"name":"Weekly planning","type":"event","groupId":"120363043968066561@g.us","startTime":"2026-11-21T10:00:00.000Z","eventOptions":{"callType":"voice","description":"Planning for the week ahead"}}"#;

fn policy() -> Policy {
    let cfg = Config::parse(BENCH_YAML, Path::new("bench.yaml"), &NoEnv).expect("bench config");
    Policy::new(cfg, None)
}

fn head() -> RequestHead<'static> {
    RequestHead {
        method: "POST",
        path: "/v2/sendMessage/",
        authorization: AuthHeader::One(AUTH),
    }
}

/// One decision at `now`; panics unless admitted (a refusal would be a different path).
#[inline]
fn decide_admitted(p: &Policy, req: &RequestHead<'_>, now: Nanos) {
    let d = p.decide(black_box(req), black_box(now));
    assert!(d.verdict.is_ok(), "refused: {:?}", d.verdict);
    black_box(d);
}

fn bench_decide(c: &mut Criterion) {
    let p = policy();
    let req = head();
    let mut g = c.benchmark_group("decide");

    let mut now: Nanos = 0;
    g.bench_function("one_thread", |b| {
        b.iter(|| {
            now += INTERVAL;
            decide_admitted(&p, &req, now);
        })
    });

    // Two threads on one key share one clock: both derive `now` from the same real-time
    // origin, sped up so the key's budget refills far faster than two threads can spend it
    // (1 real ns = 1 virtual µs: 100 000 requests per real ms of budget). The real clock is
    // read once every 64 decisions; in between `now` moves on by the emission interval.
    // A fresh policy, so the first benchmark's clock does not matter.
    let p = policy();
    const SPEEDUP: u64 = 1_000;
    let origin = Instant::now();
    let clock = || origin.elapsed().as_nanos() as u64 * SPEEDUP;
    g.bench_function("two_threads_one_key", |b| {
        b.iter_custom(|iters| {
            let stop = AtomicBool::new(false);
            let started = Barrier::new(2);
            thread::scope(|s| {
                s.spawn(|| {
                    let mut now = clock();
                    let mut i = 0u64;
                    started.wait();
                    while !stop.load(Ordering::Relaxed) {
                        if i % 64 == 0 {
                            now = clock();
                        }
                        decide_admitted(&p, &req, now);
                        now += INTERVAL;
                        i += 1;
                    }
                });
                started.wait();
                let mut now = clock();
                let t = Instant::now();
                for i in 0..iters {
                    if i % 64 == 0 {
                        now = clock();
                    }
                    decide_admitted(&p, &req, now);
                    now += INTERVAL;
                }
                let elapsed = t.elapsed();
                stop.store(true, Ordering::Relaxed);
                elapsed
            })
        })
    });
    g.finish();
}

fn bench_limit(c: &mut Criterion) {
    let rate = Rate::new(
        NonZeroU32::new(LIMIT).unwrap(),
        NonZeroU32::new(WINDOW_SECS).unwrap(),
    );
    let state = RateState::new();
    let mut now: Nanos = 0;
    c.bench_function("limit/acquire", |b| {
        b.iter(|| {
            now += INTERVAL;
            let q = state.acquire(black_box(&rate), black_box(now));
            debug_assert!(q.is_ok());
            black_box(q)
        })
    });
}

fn bench_check_body(c: &mut Criterion) {
    let body = EVENT.as_bytes();
    assert!((190..=210).contains(&body.len()), "{} bytes", body.len());
    assert_eq!(
        check_body(BodyRule::GroupEvent, body, 65536),
        Ok(Checked::GroupEvent)
    );
    c.bench_function("check_body/group_event_200B", |b| {
        b.iter(|| {
            check_body(
                black_box(BodyRule::GroupEvent),
                black_box(body),
                black_box(65536),
            )
        })
    });
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_decide, bench_limit, bench_check_body
}
criterion_main!(benches);
