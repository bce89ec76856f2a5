//! One replica's side of a shared budget, call by call: the store's names, the packed words, a
//! request that parks and the answer that decides it, leases and their targets, a quiet key's
//! credit, and the store slow or down. The fleet as a whole is `sim`'s.

use super::*;

use std::num::NonZeroU32;

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

fn timing() -> Timing {
    Timing {
        sync_interval: Duration::from_millis(100),
        timeout: Duration::from_millis(100),
        window: Duration::from_secs(10),
    }
}

fn rate(limit: u32) -> Rate {
    Rate::new(
        NonZeroU32::new(limit).unwrap(),
        NonZeroU32::new(10).unwrap(),
    )
}

fn id(n: u8) -> Digest {
    Digest([n; 32])
}

fn reply(granted: u64, ahead_us: u64) -> Option<Reply> {
    Some(Reply { granted, ahead_us })
}

fn lease_of(s: &RateState) -> u64 {
    lease(s.aux().load(Ordering::Relaxed))
}

#[test]
fn store_names_hold_neither_the_key_nor_its_digest() {
    let key = "sk_live_secret";
    let d = Digest::of(key.as_bytes());
    let name = store_key("tollgate", &d);
    assert!(name.starts_with("tollgate:b:{") && name.ends_with('}'));
    assert_eq!(name.len(), "tollgate:b:{}".len() + 32);
    assert!(!name.contains(key));
    assert!(!name.contains(&hex::encode(d.0)[..16]));
    assert_eq!(name, store_key("tollgate", &d), "stable across replicas");
    assert_ne!(name, store_key("tollgate", &Digest::of(b"other")));
}

#[test]
fn the_packed_words_hold_a_view_a_count_and_a_lease() {
    let w = pack(123_456_789, 42);
    assert_eq!(unpack(w), (123_456_789, 42));
    assert_eq!(
        unpack(pack((1 << 48) - 1, HIT_MAX)),
        ((1 << 48) - 1, HIT_MAX)
    );
    let aux = 7 | (3 << WANT_SHIFT) | (FIELD_MAX << DEBT_SHIFT);
    assert_eq!((lease(aux), want(aux), debt(aux)), (7, 3, FIELD_MAX));
    assert_eq!(lease(LEASE_MAX | WANT_MASK | DEBT_MASK), LEASE_MAX);
}

#[test]
fn a_key_without_a_lease_parks_and_the_answer_decides_it() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(5);
    let r = rate(40); // T = 250 ms; 40 / 10N = 0: a limit too small for credit
    let s = Arc::<RateState>::default();
    // Three requests, no lease: each waits for the store, none is admitted on a guess.
    for _ in 0..3 {
        let d = store.acquire(&id(1), &s, &r, SEC).unwrap_err();
        assert!(d.unsettled);
    }
    let batch = syncer.begin(SEC, false);
    assert_eq!((batch.calls.len(), batch.parked()), (1, 3));
    assert_eq!(
        (
            batch.calls[0].want,
            batch.calls[0].limit,
            batch.calls[0].interval_us
        ),
        (3, 40, 250_000)
    );
    // Granted: the three take the lease, a fourth parks again.
    let settled = syncer.finish(batch, &[reply(3, 750_000)], SEC);
    assert_eq!((settled.keys, settled.granted), (1, 3));
    for left in (0..3).rev() {
        let q = store.acquire(&id(1), &s, &r, SEC).unwrap();
        assert_eq!(q.remaining, 37 + left);
    }
    assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
    // The store had no room: refused, and until the view says there is room again, no
    // request parks (a spent key costs the store nothing).
    let batch = syncer.begin(SEC, false);
    assert_eq!(batch.calls[0].want, 1);
    syncer.finish(batch, &[reply(0, 10_000_000)], SEC);
    let d = store.acquire(&id(1), &s, &r, SEC).unwrap_err();
    assert!(!d.unsettled);
    assert_eq!(d.retry_after_secs, 1);
    let d = store.acquire(&id(1), &s, &r, SEC + 200 * MS).unwrap_err();
    assert!(!d.unsettled, "still within the view's spent budget");
    assert!(
        store
            .acquire(&id(1), &s, &r, SEC + 250 * MS)
            .unwrap_err()
            .unsettled
    );
}

#[test]
fn a_grant_to_a_parked_request_outlives_a_tick_that_comes_before_the_request_wakes() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(3);
    let r = rate(9); // no credit: 9 / 30 = 0
    let s = Arc::<RateState>::default();
    assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
    let batch = syncer.begin(SEC, false);
    assert_eq!(batch.parked(), 1);
    syncer.finish(batch, &[reply(1, 0)], SEC);
    // A tick before the parked request woke: its target is 0, but the grant stays.
    let batch = syncer.begin(SEC + 100 * MS, true);
    assert!(batch.calls.iter().all(|c| c.give == 0), "{batch:?}");
    syncer.finish(batch, &[], SEC + 100 * MS);
    assert_eq!(lease_of(&s), 1);
    store.acquire(&id(1), &s, &r, SEC + 100 * MS).unwrap();
    // Kept for that one tick only: a grant its request never took goes back at the next
    // (near the end of the budget, as the store says here: no target to keep it).
    assert!(
        store
            .acquire(&id(1), &s, &r, SEC + 100 * MS)
            .unwrap_err()
            .unsettled
    );
    let batch = syncer.begin(SEC + 150 * MS, false);
    syncer.finish(batch, &[reply(1, 4_000_000)], SEC + 150 * MS);
    let batch = syncer.begin(SEC + 200 * MS, true);
    syncer.finish(batch, &[], SEC + 200 * MS);
    assert_eq!(lease_of(&s), 1, "fresh at this tick");
    let batch = syncer.begin(SEC + 300 * MS, true);
    let gave: u64 = batch.calls.iter().map(|c| c.give).sum();
    assert_eq!(gave, 1, "{batch:?}");
}

#[test]
fn a_calm_key_lives_on_credit_and_a_key_with_a_pace_keeps_a_lease_until_idle() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(1);
    let r = rate(1000); // T = 10 ms; the target's cap is L / 20N = 50
    let s = Arc::<RateState>::default();
    // The first request: far from the limit, admitted at once on credit, and owed with
    // the next exchange (here an urgent one, for another key's parked request).
    store.acquire(&id(1), &s, &r, SEC).unwrap();
    let batch = syncer.begin(SEC, false);
    assert_eq!(batch.parked(), 0);
    assert_eq!((batch.calls[0].want, batch.calls[0].debt), (0, 1));
    syncer.finish(batch, &[reply(0, 10_000)], SEC);
    // A tick: one admission in the interval, and the key calm: its credit carries it, no
    // lease is asked for (it would go back unused two ticks later, a call for nothing).
    let batch = syncer.begin(SEC + 100 * MS, true);
    assert!(batch.is_empty(), "{batch:?}");
    syncer.finish(batch, &[], SEC + 100 * MS);
    // Twice in the next interval: the first on credit, the second asks the store.
    store.acquire(&id(1), &s, &r, SEC + 120 * MS).unwrap();
    assert!(
        store
            .acquire(&id(1), &s, &r, SEC + 130 * MS)
            .unwrap_err()
            .unsettled
    );
    // The tick: busy now (two requests), so a lease at the pace's target (2) on top of
    // what was parked.
    let batch = syncer.begin(SEC + 200 * MS, true);
    assert_eq!(
        (
            batch.calls[0].want,
            batch.calls[0].give,
            batch.calls[0].debt
        ),
        (3, 0, 1)
    );
    syncer.finish(batch, &[reply(3, 30_000)], SEC + 200 * MS);
    assert_eq!(
        lease_of(&s),
        3,
        "the parked request's grant, fresh, and the lease"
    );
    store.acquire_now(&id(1), &s, &r, SEC + 200 * MS).unwrap();
    assert_eq!(lease_of(&s), 2);
    // Two more in the interval: taken from the lease, no wait.
    for _ in 0..2 {
        store.acquire(&id(1), &s, &r, SEC + 250 * MS).unwrap();
    }
    let batch = syncer.begin(SEC + 300 * MS, true);
    assert_eq!(batch.calls[0].want, 5, "the pace is now 3: a target of 5");
    syncer.finish(batch, &[reply(5, 50_000)], SEC + 300 * MS);
    // Quiet: the target follows the last two intervals' pace (3, then 0: 5), then keeps
    // one for a second request in an interval while the key was busy lately (the last
    // ten intervals), then none.
    let batch = syncer.begin(SEC + 400 * MS, true);
    assert!(batch.is_empty(), "{batch:?}");
    syncer.finish(batch, &[], SEC + 400 * MS);
    let batch = syncer.begin(SEC + 500 * MS, true);
    assert_eq!((batch.calls[0].want, batch.calls[0].give), (0, 4));
    syncer.finish(batch, &[reply(0, 0)], SEC + 500 * MS);
    assert_eq!(lease_of(&s), 1);
    for k in 6..13 {
        let batch = syncer.begin(SEC + k * 100 * MS, true);
        assert!(batch.is_empty(), "{k}: {batch:?}");
        syncer.finish(batch, &[], SEC + k * 100 * MS);
    }
    let batch = syncer.begin(SEC + 1300 * MS, true);
    assert_eq!((batch.calls[0].want, batch.calls[0].give), (0, 1));
    syncer.finish(batch, &[reply(0, 0)], SEC + 1300 * MS);
    assert_eq!(lease_of(&s), 0);
    // Nothing left to say: the key is dropped.
    let batch = syncer.begin(SEC + 1400 * MS, true);
    assert!(batch.is_empty());
    assert_eq!(syncer.pending(), 0);
}

#[test]
fn a_lease_target_is_capped_at_a_twentieth_of_the_limit_per_replica() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(2);
    let r = rate(1000); // cap: 1000 / 40 = 25
    let s = Arc::<RateState>::default();
    store.acquire(&id(1), &s, &r, SEC).unwrap();
    let batch = syncer.begin(SEC, false);
    assert_eq!(
        (batch.calls[0].want, batch.calls[0].debt),
        (0, 1),
        "an urgent exchange sends what is parked and what is owed"
    );
    syncer.finish(batch, &[reply(0, 10_000)], SEC);
    assert!(syncer.begin(SEC, false).is_empty(), "said once");
    // 100 parked at once (the credit is a quiet key's: the first request since the tick):
    // all asked for, and the target on top at the tick.
    for _ in 0..100 {
        assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
    }
    let batch = syncer.begin(SEC + 100 * MS, true);
    assert_eq!(batch.calls[0].want, 100 + 2);
    syncer.finish(batch, &[reply(102, 0)], SEC + 100 * MS);
    // Decided again, each from the lease its exchange brought.
    for _ in 0..100 {
        store.acquire_now(&id(1), &s, &r, SEC + 100 * MS).unwrap();
    }
    let batch = syncer.begin(SEC + 200 * MS, true);
    assert_eq!(
        batch.calls[0].want,
        25 - 2,
        "topped up to the cap, not to 150"
    );
}

#[test]
fn a_key_whose_plan_changes_asks_with_its_new_limit() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(1);
    let (basic, standard) = (rate(40), rate(70));
    let s = Arc::<RateState>::default();
    store.acquire(&id(1), &s, &basic, SEC).unwrap();
    let batch = syncer.begin(SEC + 100 * MS, true);
    assert_eq!(
        (
            batch.calls[0].want,
            batch.calls[0].debt,
            batch.calls[0].limit
        ),
        (0, 1, 40),
        "a calm key: its credit owed, no lease"
    );
    syncer.finish(batch, &[reply(0, 250_000)], SEC + 100 * MS);
    // Upgraded (an override, or a reload): the interval's first admission hands the key
    // over with its new limit, and the next tick asks with it.
    store
        .acquire(&id(1), &s, &standard, SEC + 150 * MS)
        .unwrap();
    let batch = syncer.begin(SEC + 200 * MS, true);
    assert_eq!(
        (batch.calls[0].limit, batch.calls[0].interval_us),
        (70, standard.micros().interval)
    );
}

#[test]
fn an_interval_s_first_request_goes_on_credit_and_the_lease_keeps_for_the_next() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(1);
    let r = rate(1000); // credit 100, cap 50
    let s = Arc::<RateState>::default();
    // Busy: three in an interval (the first on credit, two parked), then a lease.
    store.acquire(&id(1), &s, &r, SEC).unwrap();
    assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
    assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
    let batch = syncer.begin(SEC, false);
    syncer.finish(batch, &[reply(2, 30_000)], SEC);
    for _ in 0..2 {
        store.acquire_now(&id(1), &s, &r, SEC).unwrap();
    }
    let batch = syncer.begin(SEC + 100 * MS, true);
    assert_eq!(batch.calls[0].want, 5, "a pace of 3: a target of 5");
    syncer.finish(batch, &[reply(5, 80_000)], SEC + 100 * MS);
    // The next interval's first request goes on credit: the lease is kept whole for the
    // requests that follow it, and the credit is owed at the next exchange.
    store.acquire(&id(1), &s, &r, SEC + 110 * MS).unwrap();
    assert_eq!(lease_of(&s), 5);
    store.acquire(&id(1), &s, &r, SEC + 120 * MS).unwrap();
    assert_eq!(lease_of(&s), 4);
    let batch = syncer.begin(SEC + 200 * MS, true);
    assert_eq!(
        (batch.calls[0].debt, batch.calls[0].want),
        (1, 1),
        "the credit owed; the lease topped up to its target, 5"
    );
}

#[test]
fn a_key_refused_here_reserves_what_refills_next_and_spends_it_at_that_pace() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(2);
    let r = rate(100); // T = 100 ms, L·T = 10 s; the lease's cap L / 20N = 2
    let s = Arc::<RateState>::default();
    // A first request on credit; the tick reports it, and the store says the budget is
    // spent (its TAT a whole window ahead: other replicas took it).
    store.acquire(&id(1), &s, &r, SEC).unwrap();
    let batch = syncer.begin(SEC + 100 * MS, true);
    assert_eq!((batch.calls[0].debt, batch.calls[0].early_us), (1, 0));
    syncer.finish(batch, &[reply(0, 10_000_000)], SEC + 100 * MS);
    // Refused here without a call: no wait.
    let e = store.acquire(&id(1), &s, &r, SEC + 150 * MS).unwrap_err();
    assert!(!e.unsettled);
    // The tick asks for the pace's target ahead: what refills within an interval and a
    // half.
    let batch = syncer.begin(SEC + 200 * MS, true);
    let c = batch.calls[0];
    assert_eq!((c.want, c.early_us), (2, 150_000), "{c:?}");
    // One refills within it: granted, the store's TAT 100 ms further.
    syncer.finish(batch, &[reply(1, 10_100_000)], SEC + 200 * MS);
    assert_eq!(lease_of(&s), 1);
    // Not due yet: refused, the lease kept, no wait.
    let e = store.acquire(&id(1), &s, &r, SEC + 250 * MS).unwrap_err();
    assert!(!e.unsettled);
    assert_eq!(lease_of(&s), 1);
    // Due when one process's budget would have refilled it: admitted from the lease.
    store.acquire(&id(1), &s, &r, SEC + 300 * MS).unwrap();
    assert_eq!(lease_of(&s), 0);
    let e = store.acquire(&id(1), &s, &r, SEC + 310 * MS).unwrap_err();
    assert!(!e.unsettled, "refused here again: the view has no room");
    // A lease granted from room is usable at once, all of it, though the grant took the
    // store's TAT to the end of the window (T = 10 ms: the last 30 ms of it).
    let t = Arc::<RateState>::default();
    assert!(store.acquire(&id(2), &t, &rate(1000), SEC).is_ok());
    let batch = syncer.begin(SEC + 400 * MS, true);
    let i = batch.calls.iter().position(|c| c.id == id(2)).unwrap();
    let mut replies = vec![reply(0, 10_000_000); batch.calls.len()];
    replies[i] = reply(3, 9_970_000);
    syncer.finish(batch, &replies, SEC + 400 * MS);
    assert_eq!(lease_of(&t), 3);
    for _ in 0..3 {
        store
            .acquire(&id(2), &t, &rate(1000), SEC + 401 * MS)
            .unwrap();
    }
}

#[test]
fn no_answer_in_time_decides_on_limit_over_n_and_owes_it_to_the_store() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(20);
    let r = rate(100); // T = 100 ms; L / N = 5; 100 / 10N = 0: no credit
    let s = Arc::<RateState>::default();
    assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
    // The wait ran out: decided now, at N × T.
    let admitted = (0..100)
        .filter(|_| store.acquire_now(&id(1), &s, &r, SEC).is_ok())
        .count();
    assert_eq!(admitted, 5);
    // The next exchange carries the debt (and the request still parked).
    let batch = syncer.begin(SEC, false);
    assert_eq!((batch.calls[0].want, batch.calls[0].debt), (1, 5));
    // Lost: the debt is kept for the next tick; the grant, unknown, is not assumed. The
    // view is a whole window ahead (5 admissions at N × T): no room, so no lease is asked
    // for on top (the pace's target, 2, is for a budget with room); but 95 were refused
    // here, so what the budget refills in one and a half intervals (2 of T = 100 ms) is
    // asked for ahead.
    assert_eq!(syncer.finish(batch, &[None], SEC).failed, 1);
    assert!(
        syncer.begin(SEC, false).is_empty(),
        "urgent: nothing parked"
    );
    let batch = syncer.begin(SEC + 100 * MS, true);
    let c = batch.calls[0];
    assert_eq!((c.want, c.debt, c.early_us), (2, 5, 150_000));
}

#[test]
fn with_the_store_down_each_replica_enforces_its_share_and_sends_a_floor_after() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(20);
    let r = rate(100); // no credit (see above)
    let s = Arc::<RateState>::default();
    assert!(store.acquire(&id(1), &s, &r, SEC).unwrap_err().unsettled);
    let batch = syncer.begin(SEC, false);
    assert_eq!(syncer.finish(batch, &[], SEC).failed, 1);
    assert_eq!(syncer.set_up(false), Some(false));
    // Degraded: L / N = 5 here, no waiting.
    let down = (0..100)
        .filter(|_| store.acquire(&id(1), &s, &r, SEC).is_ok())
        .count();
    assert_eq!(down, 5);
    // Back: the view (a full window ahead: 5 admissions at cost 20) is the floor, and the
    // debt is not sent as well.
    let batch = syncer.begin(SEC, true);
    assert_eq!(batch.calls.len(), 1);
    assert_eq!(
        (batch.calls[0].floor_us, batch.calls[0].debt),
        (10 * 1_000_000, 0)
    );
    syncer.finish(batch, &[reply(0, 10_000_000)], SEC);
    assert_eq!(syncer.set_up(true), Some(true));
    // Recovered: later admissions park again, and exchanges send no floor.
    let later = 11 * SEC;
    assert!(store.acquire(&id(1), &s, &r, later).unwrap_err().unsettled);
    let batch = syncer.begin(later, false);
    assert_eq!((batch.calls[0].want, batch.calls[0].floor_us), (1, 0));
}

#[test]
fn a_quiet_key_gets_credit_once_until_the_store_has_been_told() {
    let (store, mut syncer) = SharedStore::new(timing());
    let r = rate(300); // T = 33.3 ms
    let (a, b) = (Arc::<RateState>::default(), Arc::<RateState>::default());
    // Before the fleet's size is known, no credit: the request asks the store.
    assert!(store.acquire(&id(1), &a, &r, SEC).unwrap_err().unsettled);
    exchange(&mut syncer, SEC, false, |_| reply(0, 0));
    store.set_fleet(30);
    assert_eq!(credit_for(300, 30), 1);
    // Quiet and far from the limit: admitted at once; the next request of the same
    // interval is not quiet, and asks.
    let q = store.acquire(&id(2), &b, &r, SEC).unwrap();
    assert_eq!(q.remaining, 299);
    assert!(store.acquire(&id(2), &b, &r, SEC).unwrap_err().unsettled);
    // The exchange carrying the debt is lost: the debt stays owed, and until the store
    // has it, the key's next quiet request gets no credit.
    let batch = syncer.begin(SEC, false);
    let call = batch.calls.iter().find(|c| c.id == id(2)).unwrap();
    assert_eq!((call.want, call.debt), (1, 1));
    syncer.finish(batch, &[], SEC);
    exchange(&mut syncer, SEC + 100 * MS, true, |_| None);
    assert!(
        store
            .acquire(&id(2), &b, &r, SEC + 150 * MS)
            .unwrap_err()
            .unsettled
    );
    // Told (with the parked request's grant): credit again after the next tick.
    let batch = syncer.begin(SEC + 150 * MS, false);
    let call = batch.calls.iter().find(|c| c.id == id(2)).unwrap();
    assert_eq!((call.want, call.debt), (1, 1));
    let replies: Vec<_> = batch.calls.iter().map(|_| reply(1, 66_666)).collect();
    syncer.finish(batch, &replies, SEC + 150 * MS);
    store.acquire_now(&id(2), &b, &r, SEC + 150 * MS).unwrap();
    exchange(&mut syncer, SEC + 200 * MS, true, |_| reply(0, 66_666));
    assert_eq!(lease_of(&b), 0, "the store granted no lease");
    store.acquire(&id(2), &b, &r, SEC + 250 * MS).unwrap();
    let batch = syncer.begin(SEC + 250 * MS, false);
    let call = batch.calls.iter().find(|c| c.id == id(2)).unwrap();
    assert_eq!((call.want, call.debt), (0, 1), "on credit again");
}

#[test]
fn a_key_the_store_says_is_near_its_limit_gets_no_credit() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(3);
    let r = rate(300); // T = 33.3 ms; credit 10; near: room ≤ 2 × 3 × (5 + 10) = 90
    assert_eq!(near_limit(300, 3), 90);
    let (near, far) = (Arc::<RateState>::default(), Arc::<RateState>::default());
    store.acquire(&id(1), &near, &r, SEC).unwrap();
    store.acquire(&id(2), &far, &r, SEC).unwrap();
    // The store counts the fleet's requests: 8 s of the 10 s window spent for one key
    // (room 60), 1 s for the other (room 270).
    exchange(&mut syncer, SEC, false, |c| {
        reply(0, if c.id == id(1) { 8 * SEC } else { SEC } / 1000)
    });
    exchange(&mut syncer, SEC + 100 * MS, true, |_| None);
    let later = SEC + 150 * MS;
    assert!(
        store
            .acquire(&id(1), &near, &r, later)
            .unwrap_err()
            .unsettled
    );
    store.acquire(&id(2), &far, &r, later).unwrap();
}

/// One exchange at `now`, each call answered by `answer`.
fn exchange(
    syncer: &mut Syncer,
    now: Nanos,
    tick: bool,
    answer: impl Fn(&Call) -> Option<Reply>,
) -> Settled {
    let batch = syncer.begin(now, tick);
    let replies: Vec<_> = batch.calls.iter().map(answer).collect();
    syncer.finish(batch, &replies, now)
}

#[test]
fn drained_keys_are_dropped_while_the_store_is_down() {
    let (store, mut syncer) = SharedStore::new(timing());
    store.set_fleet(1);
    let r = rate(100);
    let (a, b) = (Arc::<RateState>::default(), Arc::<RateState>::default());
    syncer.set_up(false);
    for _ in 0..5 {
        store.acquire(&id(1), &a, &r, SEC).unwrap();
    }
    store.acquire(&id(2), &b, &r, SEC).unwrap();
    assert_eq!(syncer.pending(), 2);
    // a's view is 500 ms ahead, b's 100 ms: at 1.2 s only a still has something to say.
    syncer.hold(SEC + 200 * MS);
    assert_eq!(syncer.pending(), 1);
    syncer.hold(3 * SEC);
    assert_eq!(syncer.pending(), 0);
    // Its count went with it, so its next admission hands it over again.
    store.acquire(&id(1), &a, &r, 3 * SEC).unwrap();
    assert_eq!(syncer.pending(), 1);
}
