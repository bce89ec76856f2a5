//! Per-key counts for the operator's view (`GET /`, `GET /api/usage`, `tollgate top`): the
//! busiest keys of the last minute and the latest refusals, counted without a lock and in a
//! fixed amount of memory, whatever the number of keys.
//!
//! **Busiest keys.** The last minute is six buckets of 10 s. A bucket is a table of
//! [`SLOTS`] slots; a request of key `k` goes to one of four slots next to a hash of `k`: the
//! one that holds `k`, else an empty one (claimed with a compare-and-swap), else the least
//! counted of the four loses one count and, at zero, is taken over (the *heavy keeper* rule:
//! a key that keeps coming displaces keys that came once, while a busy key is never evicted by
//! light ones). So with millions of keys the table holds the heavy ones, and a light key may
//! be missing: the view is of the busiest, not a census. Counts are atomic adds on the slot;
//! a background tick ([`Usage::rotate`], every second) clears the bucket the next 10 s will
//! use before they start.
//!
//! **Latest refusals.** A ring of [`RECENT`] entries written with one `fetch_add` for the
//! position and two atomic stores; a reader takes an entry only if its stamp is the same before
//! and after it read it.
//!
//! Keys are counted by their index in the config in force: a reload starts the counts again
//! (a request decided on the previous config is not counted in the new one).
//!
//! **Timeline.** Every request of the last 10 minutes, by outcome, per 10 s: a ring of 62
//! points (60 shown, the next one prepared by the tick, one to spare), one atomic add per
//! request; kept across reloads ([`Usage::timeline`]).
//!
//! Memory: 6 × 4096 slots × 96 bytes (a key, a weight, and a count for admitted, shadowed and
//! each of the 19 refusal codes), 64 × 16 bytes and 62 × 14 × 4 bytes: about 2.4 MB, always.
//!
//! **Time.** The counts' clock is the process's monotonic clock, read as ms since the Unix
//! epoch from where the wall clock stood when the counts were made ([`Usage::now_ms`],
//! [`Usage::ms_at`]): the request path counts a request at the instant it already read for its
//! duration, with no reading of the wall clock of its own. A step of the wall clock after start
//! does not move the buckets (the view's times stay as many ms apart as the requests were).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use crate::clock::Anchor;
use crate::config::routes::RouteIdx;
use crate::outcome::Outcome;
use crate::policy::keys::KeyIdx;
use crate::refusal::Code;

/// Slots per 10-second bucket.
pub const SLOTS: usize = 4096;
const BUCKETS: usize = 6;
const BUCKET_SECS: u64 = 10;
const PROBES: usize = 4;
/// Latest refusals kept.
pub const RECENT: usize = 64;
/// Points of the timeline: one per 10 s, the last 10 minutes.
pub const TIMELINE: usize = 60;
/// The timeline's ring: its points, the one the next 10 s will use, and one to spare.
const RING: usize = TIMELINE + 2;

/// What a request of a known key counted as: an index into a slot's counts. Admitted, shadowed,
/// refused without a code (none in practice), then one per refusal code ([`Code::ALL`]'s
/// order), so that the view tells `plan_restricted` from `wrong_credential`.
const ADMITTED: usize = 0;
const SHADOWED: usize = 1;
const UNCODED: usize = 2;
const CODE0: usize = 3;
/// Refusal codes: the length of [`KeyCounts::codes`].
pub const CODES: usize = Code::ALL.len();
const KINDS: usize = CODE0 + CODES;

fn kind(o: Outcome, code: Option<u8>) -> usize {
    match o {
        Outcome::Forwarded | Outcome::UpstreamError => ADMITTED,
        Outcome::ShadowRateLimited | Outcome::ShadowForbidden | Outcome::ShadowQuotaExhausted => {
            SHADOWED
        }
        _ => code.map_or(UNCODED, |c| CODE0 + usize::from(c).min(CODES - 1)),
    }
}

#[derive(Default)]
struct Slot {
    /// The key's index + 1; 0: free.
    key: AtomicU32,
    /// Requests counted here (the heavy keeper's weight).
    weight: AtomicU32,
    /// By [`Kind`].
    kinds: [AtomicU32; KINDS],
}

struct Bucket {
    /// The 10-second period this bucket counts (`now / 10`), or `u64::MAX` while cleared for
    /// no period.
    period: AtomicU64,
    slots: Box<[Slot]>,
}

impl Bucket {
    fn new() -> Self {
        Self {
            period: AtomicU64::new(u64::MAX),
            slots: (0..SLOTS).map(|_| Slot::default()).collect(),
        }
    }

    fn clear(&self) {
        for s in self.slots.iter() {
            s.key.store(0, Ordering::Relaxed);
            s.weight.store(0, Ordering::Relaxed);
            for k in &s.kinds {
                k.store(0, Ordering::Relaxed);
            }
        }
    }
}

#[derive(Default)]
struct Refused {
    /// `seq << 32 | unix seconds low bits` is not needed: the stamp is the write's sequence.
    stamp: AtomicU64,
    /// ms since the Unix epoch.
    at_ms: AtomicU64,
    /// key + 1 (0: none) << 32 | route + 1 << 16 | code index.
    what: AtomicU64,
}

/// One 10-second point of the timeline: requests by outcome.
struct Tick {
    /// The 10-second period it counts, or `u64::MAX` while cleared for none.
    period: AtomicU64,
    /// By outcome, in [`Outcome::ALL`]'s order.
    counts: Box<[AtomicU32]>,
}

impl Tick {
    fn new() -> Self {
        Self {
            period: AtomicU64::new(u64::MAX),
            counts: Outcome::ALL.iter().map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

/// The counts (see the module's docs).
pub struct Usage {
    buckets: [Bucket; BUCKETS],
    recent: [Refused; RECENT],
    next: AtomicU64,
    /// The config the counts are for (its generation).
    generation: AtomicU64,
    /// Requests without a known key in the last minute, by bucket.
    anonymous: [AtomicU64; BUCKETS],
    /// Every request of the last 10 minutes by outcome, per 10 s (kept across reloads).
    timeline: Box<[Tick]>,
    /// The counts' clock: an instant, and the wall clock's ms since the epoch at it.
    clock: Anchor,
}

/// One key's counts over the last minute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyCounts {
    /// Every request counted: admitted, shadowed and refused.
    pub requests: u64,
    /// Forwarded, including those the upstream then failed (`upstream_error`).
    pub admitted: u64,
    /// Refused `429 rate_limited`.
    pub rate_limited: u64,
    /// Refused `429 quota_exhausted` (an outcome of its own, as in the metrics).
    pub quota_exhausted: u64,
    /// Refused with a 403 (`plan_restricted`, `wrong_credential`, `not_your_customer`).
    pub forbidden: u64,
    /// Refused otherwise (path, route, method, body, timeout, block).
    pub invalid: u64,
    /// Forwarded in shadow mode, though the plan would have refused them.
    pub shadowed: u64,
    /// Refusals by code, in [`Code::ALL`]'s order.
    pub codes: [u64; CODES],
}

/// One of the latest refusals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// When, in ms since the Unix epoch (the counts' clock).
    pub at_ms: u64,
    /// The caller's key; `None` when it was not authenticated.
    pub key: Option<KeyIdx>,
    /// The route; `None` when the request was refused before it was classified.
    pub route: Option<RouteIdx>,
    /// Index into [`crate::refusal::Code::ALL`].
    pub code: u8,
}

impl Default for Usage {
    fn default() -> Self {
        Self::new()
    }
}

impl Usage {
    /// Counts whose clock starts now ([`Anchor::now`]).
    pub fn new() -> Self {
        Self::with_clock(Anchor::now())
    }

    /// Counts read against `clock`.
    pub fn with_clock(clock: Anchor) -> Self {
        Self {
            buckets: std::array::from_fn(|_| Bucket::new()),
            recent: std::array::from_fn(|_| Refused::default()),
            next: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            anonymous: std::array::from_fn(|_| AtomicU64::new(0)),
            timeline: (0..RING).map(|_| Tick::new()).collect(),
            clock,
        }
    }

    /// The counts' time now, in ms since the Unix epoch (see the module's docs).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The counts' time at `at`, in ms since the Unix epoch.
    pub fn ms_at(&self, at: Instant) -> u64 {
        self.clock.ms_at(at)
    }

    /// A new config is in force: counts start again for it.
    pub fn reset(&self, generation: u64) {
        self.generation.store(generation, Ordering::Release);
        for b in &self.buckets {
            b.period.store(u64::MAX, Ordering::Release);
            b.clear();
        }
        for a in &self.anonymous {
            a.store(0, Ordering::Relaxed);
        }
        for r in &self.recent {
            r.stamp.store(0, Ordering::Release);
        }
    }

    /// Prepare the bucket of the coming 10 seconds (called every second): clear it and give
    /// it its period, so the request path never clears anything.
    pub fn rotate(&self, now_secs: u64) {
        let period = now_secs / BUCKET_SECS;
        for p in [period, period + 1] {
            let b = &self.buckets[(p % BUCKETS as u64) as usize];
            if b.period.load(Ordering::Acquire) != p {
                b.period.store(u64::MAX, Ordering::Release);
                b.clear();
                self.anonymous[(p % BUCKETS as u64) as usize].store(0, Ordering::Relaxed);
                b.period.store(p, Ordering::Release);
            }
            let t = &self.timeline[(p % RING as u64) as usize];
            if t.period.load(Ordering::Acquire) != p {
                t.period.store(u64::MAX, Ordering::Release);
                for c in t.counts.iter() {
                    c.store(0, Ordering::Relaxed);
                }
                t.period.store(p, Ordering::Release);
            }
        }
    }

    /// The last [`TIMELINE`] 10-second periods up to the one holding `now_ms`, oldest first:
    /// each period's start (ms since the Unix epoch) and its requests by outcome
    /// ([`Outcome::ALL`]'s order); zeros where nothing was counted.
    pub fn timeline(&self, now_ms: u64) -> Vec<(u64, Vec<u64>)> {
        let period = now_ms / 1000 / BUCKET_SECS;
        (0..TIMELINE as u64)
            .rev()
            .filter_map(|back| period.checked_sub(back))
            .map(|q| {
                let t = &self.timeline[(q % RING as u64) as usize];
                let counts = if t.period.load(Ordering::Acquire) == q {
                    t.counts
                        .iter()
                        .map(|c| u64::from(c.load(Ordering::Relaxed)))
                        .collect()
                } else {
                    vec![0; Outcome::ALL.len()]
                };
                (q * BUCKET_SECS * 1000, counts)
            })
            .collect()
    }

    /// Count one finished request (the request path: atomics only).
    pub fn record(
        &self,
        generation: u64,
        now_ms: u64,
        key: Option<KeyIdx>,
        route: Option<RouteIdx>,
        outcome: Outcome,
        code: Option<u8>,
    ) {
        let period = now_ms / 1000 / BUCKET_SECS;
        let t = &self.timeline[(period % RING as u64) as usize];
        if t.period.load(Ordering::Acquire) == period {
            t.counts[outcome as usize].fetch_add(1, Ordering::Relaxed);
        }
        // Keys and refusals are of the config in force: a request decided on another is
        // not counted in them.
        if generation != self.generation.load(Ordering::Relaxed) {
            return;
        }
        let at = (period % BUCKETS as u64) as usize;
        let b = &self.buckets[at];
        if b.period.load(Ordering::Acquire) == period {
            match key {
                Some(k) => self.count(b, k, kind(outcome, code)),
                None => {
                    self.anonymous[at].fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if let Some(code) = code {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let r = &self.recent[(i % RECENT as u64) as usize];
            let what = (u64::from(key.map_or(0, |k| k + 1)) << 32)
                | (u64::from(route.map_or(0, |r| r as u32 + 1) & 0xFFFF) << 16)
                | u64::from(code);
            r.stamp.store(0, Ordering::Release);
            r.at_ms.store(now_ms, Ordering::Relaxed);
            r.what.store(what, Ordering::Relaxed);
            r.stamp.store(i + 1, Ordering::Release);
        }
    }

    fn count(&self, b: &Bucket, k: KeyIdx, kind: usize) {
        let id = k + 1;
        let h = (k.wrapping_mul(0x9E37_79B1) as usize) % SLOTS;
        let mut lightest: Option<(&Slot, u32)> = None;
        for p in 0..PROBES {
            let s = &b.slots[(h + p) % SLOTS];
            let mut held = s.key.load(Ordering::Acquire);
            if held == 0 {
                held = match s
                    .key
                    .compare_exchange(0, id, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => id,
                    Err(other) => other,
                };
            }
            if held == id {
                s.weight.fetch_add(1, Ordering::Relaxed);
                s.kinds[kind].fetch_add(1, Ordering::Relaxed);
                return;
            }
            let w = s.weight.load(Ordering::Relaxed);
            if lightest.is_none_or(|(_, lw)| w < lw) {
                lightest = Some((s, w));
            }
        }
        // All four hold other keys: the lightest loses one; at zero this key takes it over.
        if let Some((s, _)) = lightest {
            let before = s
                .weight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    Some(w.saturating_sub(1))
                })
                .unwrap_or(0);
            if before <= 1 {
                let held = s.key.load(Ordering::Acquire);
                if held != id
                    && s.key
                        .compare_exchange(held, id, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    for c in &s.kinds {
                        c.store(0, Ordering::Relaxed);
                    }
                    s.weight.store(1, Ordering::Relaxed);
                    s.kinds[kind].store(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Every key counted in the last minute (as of `now_secs`), with its counts.
    pub fn keys(&self, now_secs: u64) -> Vec<(KeyIdx, KeyCounts)> {
        let period = now_secs / BUCKET_SECS;
        let mut by: std::collections::HashMap<KeyIdx, KeyCounts> = Default::default();
        for b in &self.buckets {
            let p = b.period.load(Ordering::Acquire);
            if p == u64::MAX || p > period || period - p >= BUCKETS as u64 {
                continue;
            }
            for s in b.slots.iter() {
                let id = s.key.load(Ordering::Acquire);
                if id == 0 {
                    continue;
                }
                let c = by.entry(id - 1).or_default();
                let n = |k: usize| u64::from(s.kinds[k].load(Ordering::Relaxed));
                c.admitted += n(ADMITTED);
                c.shadowed += n(SHADOWED);
                c.invalid += n(UNCODED);
                for (i, code) in c.codes.iter_mut().enumerate() {
                    *code += n(CODE0 + i);
                }
            }
        }
        let mut v: Vec<(KeyIdx, KeyCounts)> = by
            .into_iter()
            .map(|(k, mut c)| {
                for (&code, &n) in Code::ALL.iter().zip(&c.codes) {
                    match (code, code.status()) {
                        (Code::RateLimited, _) => c.rate_limited += n,
                        (Code::QuotaExhausted, _) => c.quota_exhausted += n,
                        (_, 403) => c.forbidden += n,
                        _ => c.invalid += n,
                    }
                }
                c.requests = c.admitted
                    + c.rate_limited
                    + c.quota_exhausted
                    + c.forbidden
                    + c.invalid
                    + c.shadowed;
                (k, c)
            })
            .collect();
        v.sort_by(|a, b| b.1.requests.cmp(&a.1.requests).then(a.0.cmp(&b.0)));
        v
    }

    /// Requests without a known key in the last minute.
    pub fn anonymous(&self, now_secs: u64) -> u64 {
        let period = now_secs / BUCKET_SECS;
        self.buckets
            .iter()
            .zip(&self.anonymous)
            .filter(|(b, _)| {
                let p = b.period.load(Ordering::Acquire);
                p != u64::MAX && p <= period && period - p < BUCKETS as u64
            })
            .map(|(_, a)| a.load(Ordering::Relaxed))
            .sum()
    }

    /// The latest refusals, newest first.
    pub fn refusals(&self) -> Vec<Refusal> {
        let mut v: Vec<(u64, Refusal)> = self
            .recent
            .iter()
            .filter_map(|r| {
                let s1 = r.stamp.load(Ordering::Acquire);
                if s1 == 0 {
                    return None;
                }
                let at_ms = r.at_ms.load(Ordering::Relaxed);
                let what = r.what.load(Ordering::Relaxed);
                (r.stamp.load(Ordering::Acquire) == s1).then(|| {
                    let key = (what >> 32) as u32;
                    let route = ((what >> 16) & 0xFFFF) as u32;
                    (
                        s1,
                        Refusal {
                            at_ms,
                            key: key.checked_sub(1),
                            route: route.checked_sub(1).map(|r| r as RouteIdx),
                            code: (what & 0xFF) as u8,
                        },
                    )
                })
            })
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.0));
        v.into_iter().map(|(_, r)| r).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timeline_has_sixty_points_by_outcome_kept_across_reloads() {
        let u = Usage::new();
        u.reset(1);
        // 12:00:00, then 10 minutes on: each period is prepared by the tick before its use.
        let t0: u64 = 43_200_000;
        for step in 0..=60u64 {
            let now = t0 + step * 10_000;
            u.rotate(now / 1000);
            for _ in 0..step % 3 {
                u.record(1, now, Some(0), None, Outcome::Forwarded, None);
            }
            if step == 59 {
                u.reset(2); // a reload: the timeline keeps counting
                u.record(1, now + 5, None, None, Outcome::Unauthorized, Some(0));
            }
        }
        let tl = u.timeline(t0 + 60 * 10_000 + 9_999);
        assert_eq!(tl.len(), TIMELINE);
        assert_eq!(tl[0].0, t0 + 10_000, "oldest first, 10 minutes back");
        assert_eq!(tl[59].0, t0 + 600_000);
        let fwd = Outcome::Forwarded as usize;
        let unauth = Outcome::Unauthorized as usize;
        for (i, (_, counts)) in tl.iter().enumerate() {
            let step = i as u64 + 1;
            assert_eq!(counts[fwd], step % 3, "point {i}");
        }
        assert_eq!(tl[58].1[unauth], 1);
        assert_eq!(
            tl.iter().map(|p| p.1.iter().sum::<u64>()).sum::<u64>(),
            60 + 1
        );
        // Nothing counted an hour later: sixty zeros.
        let later = u.timeline(t0 + 3_600_000);
        assert!(later.iter().all(|p| p.1.iter().all(|&c| c == 0)));
        assert_eq!(later.len(), TIMELINE);
    }

    const T0: u64 = 1_700_000_000_000;

    fn usage() -> Usage {
        let u = Usage::new();
        u.reset(1);
        u.rotate(T0 / 1000);
        u
    }

    #[test]
    fn counts_by_key_and_kind_over_the_last_minute() {
        let u = usage();
        for _ in 0..5 {
            u.record(1, T0, Some(7), Some(2), Outcome::Forwarded, None);
        }
        let code = |c: Code| Some(c as u8);
        u.record(
            1,
            T0,
            Some(7),
            Some(2),
            Outcome::RateLimited,
            code(Code::RateLimited),
        );
        u.record(
            1,
            T0,
            Some(9),
            Some(2),
            Outcome::Forbidden,
            code(Code::PlanRestricted),
        );
        u.record(
            1,
            T0,
            Some(9),
            Some(2),
            Outcome::Forbidden,
            code(Code::WrongCredential),
        );
        u.record(
            1,
            T0,
            None,
            None,
            Outcome::Unauthorized,
            code(Code::Unauthorized),
        );
        // A quota's refusal is an outcome of its own, not `invalid`.
        u.record(
            1,
            T0,
            Some(11),
            Some(2),
            Outcome::QuotaExhausted,
            code(Code::QuotaExhausted),
        );
        let keys = u.keys(T0 / 1000);
        assert_eq!(keys[0].0, 7);
        let quota = keys.iter().find(|k| k.0 == 11).unwrap();
        assert_eq!(
            (quota.1.requests, quota.1.quota_exhausted, quota.1.invalid),
            (1, 1, 0)
        );
        let mut codes = [0; CODES];
        codes[Code::RateLimited as usize] = 1;
        assert_eq!(
            keys[0].1,
            KeyCounts {
                requests: 6,
                admitted: 5,
                rate_limited: 1,
                codes,
                ..KeyCounts::default()
            }
        );
        // Both 403s, told apart by their codes.
        let mut codes = [0; CODES];
        codes[Code::PlanRestricted as usize] = 1;
        codes[Code::WrongCredential as usize] = 1;
        assert_eq!(
            keys[1],
            (
                9,
                KeyCounts {
                    requests: 2,
                    forbidden: 2,
                    codes,
                    ..KeyCounts::default()
                }
            )
        );
        assert_eq!(u.anonymous(T0 / 1000), 1);
        let r = u.refusals();
        assert_eq!(r.len(), 5);
        assert_eq!((r[1].key, r[1].code), (None, Code::Unauthorized as u8));
        assert_eq!(
            (r[4].key, r[4].route, r[4].code),
            (Some(7), Some(2), Code::RateLimited as u8)
        );
    }

    #[test]
    fn a_minute_later_the_counts_are_gone_and_a_new_config_starts_again() {
        let u = usage();
        u.record(1, T0, Some(7), None, Outcome::Forwarded, None);
        let later = T0 / 1000 + 70;
        for s in T0 / 1000..=later {
            u.rotate(s);
        }
        assert!(u.keys(later).is_empty());
        u.record(1, later * 1000, Some(7), None, Outcome::Forwarded, None);
        assert_eq!(u.keys(later).len(), 1);
        // A request decided on the previous config is not counted in the new one.
        u.reset(2);
        u.rotate(later);
        u.record(1, later * 1000, Some(7), None, Outcome::Forwarded, None);
        assert!(u.keys(later).is_empty());
    }

    #[test]
    fn a_busy_key_takes_its_place_from_many_light_ones_and_memory_is_fixed() {
        let u = usage();
        // A million light keys, once each, then one busy key.
        for k in 0..1_000_000u32 {
            u.record(1, T0, Some(k), None, Outcome::Forwarded, None);
        }
        for _ in 0..200 {
            u.record(1, T0, Some(4_000_000), None, Outcome::Forwarded, None);
        }
        let keys = u.keys(T0 / 1000);
        assert!(keys.len() <= SLOTS);
        assert_eq!(keys[0].0, 4_000_000);
        assert!(keys[0].1.requests >= 150, "{:?}", keys[0]);
    }

    #[test]
    fn many_threads_count_without_losing_a_known_keys_requests() {
        let u = std::sync::Arc::new(usage());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let u = std::sync::Arc::clone(&u);
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        u.record(1, T0, Some(42), None, Outcome::Forwarded, None);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(u.keys(T0 / 1000)[0].1.requests, 80_000);
    }
}
