//! Benchmarks of the request path's hot steps.
//!
//! | benchmark | what | target (median) |
//! |---|---|---|
//! | `decide/one_thread` | `Policy::decide` (authenticate + classify + authorize + limit), Pro key, `POST /v2/sendMessage/` | ≤ 150 ns |
//! | `decide/two_threads_one_key` | the same, while a second thread decides on the same key | ≤ 500 ns |
//! | `limit/acquire` | `RateState::acquire` alone | ≤ 50 ns |
//! | `digest/of_40B` | `Digest::of`, a 40-byte key (the SHA-256 every request makes) | — |
//! | `check_body/group_event_200B` | `check_body(GroupEvent, ~200-byte valid body, 65536, default webhook guard)` | ≤ 1 µs |
//!
//! The bench config gives the Pro plan the largest allowed limit (1 000 000 per 10 s, one
//! request per 10 µs of the limiter's clock), and every decision takes its `now` from a virtual
//! clock that moves on by that emission interval per decision, so the clock keeps pace with the
//! budget spent and the limiter admits every decision, whatever the scheduling: every decision
//! measured is the admit path. With two threads, the clock is one shared atomic that each
//! decision advances (`fetch_add`): a thread that was descheduled cannot come back with a stale
//! `now` that the other has run far past. That `fetch_add` is in the measured time. Should a
//! decision be refused anyway, the benchmark panics at once, and the other thread stops too.
//!
//! Run: `cargo bench -p tollgate-core --bench policy -- --warm-up-time 1 --measurement-time 3`.

// `criterion_main!` writes an undocumented `pub fn main`; the benches time with the system's
// clock by design (the core's clippy.toml keeps it out of the library).
#![allow(missing_docs, clippy::disallowed_methods)]

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

use tollgate_core::clock::Nanos;
use tollgate_core::config::routes::BodyRule;
use tollgate_core::config::WebhookGuard;
use tollgate_core::digest::Digest;
use tollgate_core::limit::{LocalStore, Rate, RateState, Store};
use tollgate_core::policy::authenticate::AuthHeader;
use tollgate_core::policy::body::{check_body, Checked};
use tollgate_core::policy::{Policy, RequestHead};
use tollgate_core::testing::TestConfig;

const LIMIT: u32 = 1_000_000;
const WINDOW_SECS: u32 = 10;
/// The emission interval for `LIMIT` per `WINDOW_SECS`: 10 µs.
const INTERVAL: Nanos = WINDOW_SECS as u64 * 1_000_000_000 / LIMIT as u64;

const AUTH: &[u8] = b"Bearer pro-key-1";

/// A valid group event of about 200 bytes.
const EVENT: &str = r#"{"name":"Weekly planning","type":"event","groupId":"120363043968066561@g.us","startTime":"2026-11-21T10:00:00.000Z","eventOptions":{"callType":"voice","description":"Planning for the week ahead"}}"#;

fn policy() -> Policy {
    Policy::new(TestConfig::new().plan_limit("pro", LIMIT).parse(), None)
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

    // Two threads on one key, their `now` from one shared virtual clock (see the module
    // comment). A fresh policy, so the first benchmark's clock does not matter.
    let p = policy();
    let clock = AtomicU64::new(0);
    let tick = || clock.fetch_add(INTERVAL, Ordering::Relaxed) + INTERVAL;
    g.bench_function("two_threads_one_key", |b| {
        b.iter_custom(|iters| {
            let stop = AtomicBool::new(false);
            let started = Barrier::new(2);
            thread::scope(|s| {
                s.spawn(|| {
                    // Stops the measured thread too if this one panics.
                    let _stop = StopOnDrop(&stop);
                    started.wait();
                    while !stop.load(Ordering::Relaxed) {
                        decide_admitted(&p, &req, tick());
                    }
                });
                // Stops the other thread however this one ends, so a panic here cannot leave
                // the scope waiting for it.
                let _stop = StopOnDrop(&stop);
                started.wait();
                let t = Instant::now();
                for _ in 0..iters {
                    if stop.load(Ordering::Relaxed) {
                        panic!("the other thread stopped: a decision was refused");
                    }
                    decide_admitted(&p, &req, tick());
                }
                t.elapsed()
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
    let state = Arc::new(RateState::default());
    let id = Digest::of(b"bench");
    let mut now: Nanos = 0;
    c.bench_function("limit/acquire", |b| {
        b.iter(|| {
            now += INTERVAL;
            let q = LocalStore.acquire(&id, &state, black_box(&rate), black_box(now));
            assert!(q.is_ok(), "refused: {q:?}");
            black_box(q)
        })
    });
}

fn bench_digest(c: &mut Criterion) {
    let key = b"tg_live_4f9c2a7e1b8d3f6a0c5e9b2d7f1a4c8e";
    assert_eq!(key.len(), 40);
    c.bench_function("digest/of_40B", |b| b.iter(|| Digest::of(black_box(key))));
}

fn bench_check_body(c: &mut Criterion) {
    let body = EVENT.as_bytes();
    let guard = WebhookGuard::default();
    assert!((190..=210).contains(&body.len()), "{} bytes", body.len());
    assert_eq!(
        check_body(BodyRule::GroupEvent, body, 65536, &guard),
        Ok(Checked::GroupEvent)
    );
    c.bench_function("check_body/group_event_200B", |b| {
        b.iter(|| {
            check_body(
                black_box(BodyRule::GroupEvent),
                black_box(body),
                black_box(65536),
                black_box(&guard),
            )
        })
    });
}

/// Sets the flag when dropped: on the way out of a scope, panicking or not.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_decide, bench_limit, bench_digest, bench_check_body
}
criterion_main!(benches);
