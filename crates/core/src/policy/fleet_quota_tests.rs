//! Quotas shared by a fleet (`metering::fleet`), on a model of the fleet: N replicas, each its
//! own `Policy` deciding with `wait` as the proxy does, and a store that does what the keeper's
//! commands do (a report adds the charges and answers the count; a reservation first puts the
//! field at least at the replica's view, then grants what the quota has room for). Random
//! traffic, exchanges (answered or not), clock steps, restarts (with `state.path`) and a store
//! that loses its counts: the fleet never admits more than the quota plus one request per
//! replica, and a quiet key never waits while its quota is far.

use proptest::prelude::*;

use super::authenticate::AuthHeader;
use super::*;
use crate::testing::TestConfig;

/// 2026-12-01T00:00:00Z.
const DEC_1: u64 = 1_796_083_200_000;
const MS: u64 = 1_000_000;

/// One replica: its policy, and what its keeper last reported (the base of the next report).
struct Replica {
    policy: Policy,
    base: u64,
    /// Requests parked, waiting for this replica's next exchange.
    parked: u32,
    /// The store lost its counts since this replica's last exchange: its next one finds the
    /// mark missing and puts back its count (the larger count wins).
    lost: bool,
}

/// The fleet and its store.
struct Fleet {
    replicas: Vec<Replica>,
    store: u64,
    quota: u64,
    now_ms: u64,
    admitted: u64,
    /// Admissions in the last window (ms of each), fleet-wide: the window's shared limit.
    window: std::collections::VecDeque<u64>,
    /// After the store lost its counts: the replicas that have not put theirs back yet.
    restoring: Vec<bool>,
    /// What was admitted while one had not: the store could grant it on a count that lacked
    /// theirs (docs/cluster.md's bound after a loss).
    slack: u64,
}

fn replica(quota: u64, wall_ms: u64, store: Option<u64>) -> Replica {
    let cfg = TestConfig::new()
        .plan_limit("basic", 40)
        .plan_quota("basic", quota, "day")
        .parse();
    let policy = Policy::new(cfg, None);
    policy.metering.calendar.set(wall_ms);
    policy.metering.fleet.enable(10_000, 100, 100);
    let mut base = 0;
    if let Some(count) = store {
        // Read at start, before serving.
        let k = policy
            .keys
            .lookup(&crate::testing::digest("basic-key-1"))
            .unwrap();
        let e = policy.keys.get(k);
        let m = policy.metering.meter(&e.rate, &e.name);
        let id = crate::metering::PeriodAt::of(crate::config::Period::Day, wall_ms).id;
        m.restore(id, count);
        policy.metering.fleet.loaded(wall_ms);
        base = count;
    }
    Replica {
        policy,
        base,
        parked: 0,
        // The first exchange puts back what the replica holds (the keeper's restore at start).
        lost: true,
    }
}

impl Fleet {
    fn meter(r: &Replica) -> &crate::metering::Meter {
        let k = r
            .policy
            .keys
            .lookup(&crate::testing::digest("basic-key-1"))
            .unwrap();
        let e = r.policy.keys.get(k);
        r.policy.metering.meter(&e.rate, &e.name)
    }

    /// A request to replica `i`, as the proxy decides it: `wait` first; parked, it waits for
    /// the replica's next exchange. Whether it waited (parked).
    fn request(&mut self, i: usize) -> bool {
        // The fleet's window limit (shared through the store, within 10 %): the driver sends
        // no more than that in any window.
        while self
            .window
            .front()
            .is_some_and(|&t| t + 10_000 <= self.now_ms)
        {
            self.window.pop_front();
        }
        if self.window.len() >= 44 {
            return false;
        }
        let r = &mut self.replicas[i];
        let now = self.now_ms * MS;
        let head = RequestHead {
            method: "POST",
            path: "/v2/sendMessage/",
            authorization: AuthHeader::One(b"Bearer basic-key-1"),
        };
        let d = r.policy.decide_waiting(&head, None, now, true);
        if d.unsettled {
            r.parked += 1;
            return true;
        }
        if d.verdict.is_ok() {
            self.admitted(1);
        }
        false
    }

    /// `n` replicas of a key with a quota of `quota` a day, at the start of a day.
    fn new(n: usize, quota: u64) -> Self {
        Fleet {
            replicas: (0..n).map(|_| replica(quota, DEC_1, Some(0))).collect(),
            store: 0,
            quota,
            now_ms: DEC_1,
            admitted: 0,
            window: Default::default(),
            restoring: Vec::new(),
            slack: 0,
        }
    }

    /// One step of the property's traffic.
    fn step(&mut self, o: Op) {
        let n = self.replicas.len();
        match o {
            Op::Request(i) => {
                self.request(i % n);
            }
            Op::Tick(i) => self.exchange(i % n, true, true),
            Op::Urgent(i) => self.exchange(i % n, false, true),
            Op::Wait(ms) => {
                self.now_ms += ms;
                for r in &self.replicas {
                    r.policy.metering.calendar.set(self.now_ms);
                }
            }
            Op::Restart(i) => {
                // With `state.path`: the replica's own count kept, and the fleet's read at
                // start; the larger wins.
                let i = i % n;
                let own = Self::meter(&self.replicas[i]).quota_word().1;
                self.replicas[i] = replica(self.quota, self.now_ms, Some(self.store.max(own)));
            }
            Op::StoreLost => self.store_lost(),
        }
    }

    /// Whether the fleet is within the bound: the quota, plus one request per replica, plus
    /// what the store's losses allow.
    fn within_bound(&self) -> bool {
        self.admitted <= self.quota + self.replicas.len() as u64 + self.slack
    }

    /// The store loses its counts. Each replica puts back its view (the fleet's count as the
    /// store last answered it, plus what the replica charged since), and the largest wins: what
    /// the others charged that the largest view had not seen is lost with the store, and may be
    /// admitted again (docs/cluster.md, "the bound").
    fn store_lost(&mut self) {
        let largest = self
            .replicas
            .iter()
            .map(|r| Self::meter(r).quota_word().1)
            .max()
            .unwrap_or(0);
        self.slack += self.admitted.saturating_sub(largest);
        self.store = 0;
        for r in &mut self.replicas {
            r.lost = true;
        }
        self.restoring = vec![true; self.replicas.len()];
    }

    fn admitted(&mut self, n: u64) {
        self.admitted += n;
        self.window.push_back(self.now_ms);
        if self.restoring.iter().any(|&r| r) {
            self.slack += n;
        }
    }

    /// Replica `i`'s exchange (a tick, or urgent): the report and the reservation, then the
    /// parked requests decided again (with time left: `wait`; the last time, on the view).
    fn exchange(&mut self, i: usize, tick: bool, answered: bool) {
        let r = &mut self.replicas[i];
        let lost = std::mem::take(&mut r.lost);
        let m = Self::meter(r);
        if tick {
            m.take_unused_grants();
        }
        let (id, count) = m.quota_word();
        let (want, _) = m.take_want();
        if answered && id != 0 {
            let delta = count as i64 - r.base as i64;
            let mut t = (self.store as i64 + delta).max(0) as u64;
            if lost {
                t = t.max(count);
            }
            let mut g = 0;
            // Granted only where the replica's mark was in the hash before this round.
            if want > 0 && !lost {
                t = t.max(count);
                g = u64::from(want).min(self.quota.saturating_sub(t));
                t += g;
            }
            self.store = t;
            m.rebase(id, count, t);
            m.known(self.now_ms);
            if g > 0 {
                m.granted(id, g);
            }
            r.base = t;
            if let Some(p) = self.restoring.get_mut(i) {
                *p = false;
            }
        } else if lost {
            r.lost = true;
        }
        let parked = std::mem::take(&mut r.parked);
        let head = RequestHead {
            method: "POST",
            path: "/v2/sendMessage/",
            authorization: AuthHeader::One(b"Bearer basic-key-1"),
        };
        let mut admitted = 0;
        for _ in 0..parked {
            let d = r
                .policy
                .decide_waiting(&head, None, self.now_ms * MS, answered);
            if d.unsettled {
                // Parked again: waits for the next exchange (or decides on the view then).
                r.parked += 1;
            } else if d.verdict.is_ok() {
                admitted += 1;
            }
        }
        for _ in 0..admitted {
            self.admitted(1);
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Request(usize),
    Tick(usize),
    Urgent(usize),
    Wait(u64),
    Restart(usize),
    StoreLost,
}

fn op(n: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..n).prop_map(Op::Request),
        2 => (0..n).prop_map(Op::Tick),
        2 => (0..n).prop_map(Op::Urgent),
        3 => (1u64..1_500).prop_map(Op::Wait),
        1 => (0..n).prop_map(Op::Restart),
        1 => Just(Op::StoreLost),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever the traffic, the exchanges' timing, restarts and a store that forgets: at most
    /// the quota plus one request per replica (and, after the store lost its counts, what was
    /// admitted before every replica had put its own back).
    #[test]
    fn the_fleet_admits_at_most_the_quota_plus_one_per_replica(
        n in 1usize..4,
        quota in prop_oneof![Just(3u64), Just(10), Just(60), Just(400)],
        ops in (1usize..4).prop_flat_map(|n| proptest::collection::vec(op(n), 1..400)),
    ) {
        let mut f = Fleet::new(n, quota);
        for o in ops {
            f.step(o);
            prop_assert!(
                f.within_bound(),
                "{} admitted on a quota of {} over {} replicas ({} while the store was restored)",
                f.admitted, quota, n, f.slack
            );
        }
    }
}

/// A quiet key far from its quota (one request every half second, spread over three
/// replicas, each exchanging every 100 ms) never waits.
#[test]
fn a_quiet_key_far_from_its_quota_never_waits() {
    let mut f = Fleet::new(3, 100_000);
    for step in 0..600u64 {
        // Every 100 ms each replica ticks; every 500 ms a request, round robin.
        for i in 0..3 {
            f.exchange(i, true, true);
        }
        if step % 5 == 0 {
            let waited = f.request((step / 5 % 3) as usize);
            assert!(!waited, "a quiet request waited at step {step}");
        }
        f.now_ms += 100;
        for r in &f.replicas {
            r.policy.metering.calendar.set(f.now_ms);
        }
    }
    assert_eq!(f.admitted, 120);
}

/// A replica that starts while the key is spent elsewhere refuses it at once, without a wait
/// and without a request past the quota.
#[test]
fn a_replica_that_starts_decides_on_the_fleets_count() {
    let r = replica(3, DEC_1, Some(3));
    let head = RequestHead {
        method: "POST",
        path: "/v2/sendMessage/",
        authorization: AuthHeader::One(b"Bearer basic-key-1"),
    };
    let d = r.policy.decide_waiting(&head, None, 0, true);
    assert!(!d.unsettled);
    assert_eq!(d.verdict.unwrap_err().code, Code::QuotaExhausted);
    assert_eq!(d.quota_state.unwrap().used, 3);
}

/// A stale view far from the quota charges one request blind, no more: the rest of a burst
/// waits for the store's word, which here says the fleet spent the quota meanwhile.
#[test]
fn a_stale_view_charges_one_request_blind_and_the_rest_wait() {
    let r = replica(100, DEC_1, Some(0));
    let head = RequestHead {
        method: "POST",
        path: "/v2/sendMessage/",
        authorization: AuthHeader::One(b"Bearer basic-key-1"),
    };
    // Ten minutes later, the view (0 of 100) is stale.
    let later = DEC_1 + 600_000;
    r.policy.metering.calendar.set(later);
    let decide = || r.policy.decide_waiting(&head, None, later * MS, true);
    let first = decide();
    assert!(!first.unsettled && first.verdict.is_ok(), "blind, at once");
    for _ in 0..9 {
        assert!(decide().unsettled, "the rest wait for the store");
    }
    // The store: the fleet spent 100 meanwhile; this replica's one makes 101, nothing granted.
    let m = Fleet::meter(&r);
    let (id, count) = m.quota_word();
    assert_eq!((m.take_want(), count), ((9, 100), 1));
    m.rebase(id, count, 101);
    m.known(later);
    let d = r.policy.decide_waiting(&head, None, later * MS, true);
    assert_eq!(d.verdict.unwrap_err().code, Code::QuotaExhausted);
    assert_eq!(d.quota_state.unwrap().used, 101);
}

/// A case the property above found (two replicas, a quota of 60, the store lost twice in a
/// few ticks), replayed: the second loss takes four requests the largest view had not seen,
/// and the fleet admits them again: 64, within the bound that counts them.
#[test]
fn two_losses_in_a_row_lose_only_what_the_largest_view_had_not_seen() {
    let (n, quota) = (2usize, 60u64);
    // The property's ops, one word each: r<i> a request to replica i, t<i> its tick, u<i> an
    // urgent round, w<ms> a wait, lost the store losing its counts.
    let ops = "
        r1 r1 r1 r1 r1 r0 r0 r0 r0 w1 w1181 w1 r1 r1 t1 r1 r0 r1 r0 r0 u0 lost r0 r0 r0 lost
        r1 t1 r0 r0 r0 r0 r0 r0 r0 t0 r0 r0 r0 r0 r0 r0 r0 r0 r0 r0 r0 r0 r0 u0 r0 r0 w407
        r0 r0 w987 r0 r0 r0 r0 r0 r0 r0 r0 r0 r0 w1309 r0 r0 r0 w899 r0 w862 w431 w960 w1358
        w282 w488 w336 r0 r0 r0 r0 r0 w602 r0 r0 r0 r0 r0 r0 r0 r0 r0 r1 r1 r0 r1 u1 r0 r0
        r0 t0
    ";
    let ops = ops.split_whitespace().map(|w| {
        let (kind, n) = w.split_at(1);
        let n = n.parse().unwrap_or(0);
        match kind {
            "r" => Op::Request(n as usize),
            "t" => Op::Tick(n as usize),
            "u" => Op::Urgent(n as usize),
            "w" => Op::Wait(n),
            _ => Op::StoreLost,
        }
    });
    let mut f = Fleet::new(n, quota);
    for (step, o) in ops.enumerate() {
        f.step(o);
        assert!(
            f.within_bound(),
            "step {step}: {} admitted, slack {}",
            f.admitted,
            f.slack
        );
    }
    assert_eq!(f.admitted, 64, "the case as it was found");
    assert!(f.slack >= 4, "the loss counted: {}", f.slack);
}
