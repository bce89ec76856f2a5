//! The budget and heartbeat scripts on a real Redis, call by call, against the model
//! (`limit::shared::model`).

use super::*;

#[test]
fn the_scripts_do_what_the_model_says() {
    let redis = RedisServer::start();
    let mut con = redis.client();
    let budget = redis::Script::new(BUDGET_LUA);
    // ARGV: key horizon, and each key's want, give, debt, interval, limit, floor and early
    // packed.
    type Args = (u64, u64, u64, u64, u64, u64, u64);
    let calls = |args: &[Args]| -> Vec<Call> {
        args.iter()
            .map(
                |&(want, give, debt, interval_us, limit, floor_us, early_us)| Call {
                    id: Digest([0; 32]),
                    want,
                    give,
                    debt,
                    interval_us,
                    limit,
                    floor_us,
                    early_us,
                },
            )
            .collect()
    };
    let call_on = |con: &mut redis::Connection, key: &str, args: Args| {
        let v = budget
            .key(key)
            .arg(10_000)
            .arg(pack_calls(&calls(&[args])))
            .invoke::<Vec<u8>>(con)
            .unwrap();
        unpack_answers(&v, 1).expect("two values per key")[0]
    };
    let call = |con: &mut redis::Connection, args: Args| call_on(con, "t:b:{x}", args);
    let r = |granted, ahead_us| Reply { granted, ahead_us };
    // A new key, 10 per second (T = 100 ms): 3 asked, 3 granted, 3 × T ahead.
    const T: u64 = 100_000;
    assert_eq!(call(&mut con, (3, 0, 0, T, 10, 0, 0)), r(3, 3 * T));
    // 20 asked: only the room is granted (the TAT drains by Redis's clock meanwhile, far less
    // than a T between two calls).
    let g = call(&mut con, (20, 0, 0, T, 10, 0, 0));
    assert_eq!(g.granted, 7, "{g:?}");
    assert!((9 * T..=10 * T).contains(&g.ahead_us), "{g:?}");
    // A lease given back: the TAT moves back by it; nothing asked, nothing granted.
    let back = call(&mut con, (0, 4, 0, T, 10, 0, 0));
    assert_eq!(back.granted, 0);
    assert!((5 * T..=6 * T).contains(&back.ahead_us), "{back:?}");
    // A debt moves it forward whatever the room, and then nothing is granted.
    let owed = call(&mut con, (2, 0, 30, T, 10, 0, 0));
    assert_eq!(owed.granted, 0);
    assert!((35 * T..=36 * T).contains(&owed.ahead_us), "{owed:?}");
    let ttl: i64 = redis::cmd("PTTL").arg("t:b:{x}").query(&mut con).unwrap();
    assert!(
        (10_000 + 3_400..=10_000 + 3_600).contains(&ttl),
        "the entry expires a horizon after its TAT: {ttl}"
    );
    // What Redis holds: the TAT, nothing else.
    let fields: Vec<String> = redis::cmd("HKEYS").arg("t:b:{x}").query(&mut con).unwrap();
    assert_eq!(fields, ["t"]);
    // Reserved ahead: a budget spent to its last request grants nothing now, and what it
    // refills within `early` (2.5 T: two requests) when asked so.
    let fresh = |con: &mut redis::Connection, args: Args| call_on(con, "t:b:{w}", args);
    let spent = fresh(&mut con, (10, 0, 0, T, 10, 0, 0));
    assert_eq!(spent.granted, 10, "{spent:?}");
    assert_eq!(fresh(&mut con, (5, 0, 0, T, 10, 0, 0)).granted, 0);
    let ahead = fresh(&mut con, (5, 0, 0, T, 10, 0, 5 * T / 2));
    assert_eq!(ahead.granted, 2, "{ahead:?}");
    assert!((11 * T..=12 * T).contains(&ahead.ahead_us), "{ahead:?}");

    // A batch: each key answered in order, as if called alone, at one instant.
    // A new key; one from a floor (a TAT a floor ahead, plus the grant); one with a debt
    // that leaves room for two of the five asked.
    let args = [
        (4, 0, 0, T, 10, 0, 0),
        (1, 0, 0, 2 * T, 10, 7 * T, 0),
        (5, 0, 2, T, 4, 0, 0),
    ];
    let v = budget
        .key("t:b:{y}1")
        .key("t:b:{y}2")
        .key("t:b:{y}3")
        .arg(10_000)
        .arg(pack_calls(&calls(&args)))
        .invoke::<Vec<u8>>(&mut con)
        .unwrap();
    assert_eq!(
        unpack_answers(&v, 2),
        None,
        "three keys answer 3 × 2 values"
    );
    let v = unpack_answers(&v, 3).unwrap();
    // The model, at the same instant, says the same.
    let mut model = Model::new();
    let now = 1_700_000_000_000_000;
    for (i, c) in calls(&args).iter().enumerate() {
        let c = Call {
            id: Digest([i as u8; 32]),
            ..*c
        };
        assert_eq!(v[i], model.budget(now, &c, 10_000), "key {i}");
    }
    assert_eq!(v, [r(4, 4 * T), r(1, 9 * T), r(2, 4 * T)]);
    // Large values survive the packing both ways (a TAT a window of µs ahead).
    let far = budget
        .key("t:b:{z}")
        .arg(10_000)
        .arg(pack_calls(&calls(&[(0, 0, 0, 1000, 10, 3_600_000_000, 0)])))
        .invoke::<Vec<u8>>(&mut con)
        .unwrap();
    assert_eq!(unpack_answers(&far, 1).unwrap()[0], r(0, 3_600_000_000));

    let heartbeat = redis::Script::new(HEARTBEAT_LUA);
    let beat = |con: &mut redis::Connection, replica: &str| {
        heartbeat
            .key("t:fleet")
            .arg(replica)
            .arg(1000)
            .invoke::<u32>(con)
            .unwrap()
    };
    assert_eq!(beat(&mut con, "a"), 1);
    assert_eq!(beat(&mut con, "b"), 2);
    assert_eq!(beat(&mut con, "a"), 2);
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
    let long_ago = (secs * 1000 + micros / 1000) - 60_000;
    let _: () = redis::cmd("ZADD")
        .arg("t:fleet")
        .arg(long_ago)
        .arg("gone")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        beat(&mut con, "b"),
        2,
        "a replica silent past the horizon is not counted"
    );
}

/// The scripts that add quota and ledger counts, on a real Redis: a call sent again (its
/// answer lost, or no replica confirmed it) adds nothing, whichever script it is; a later
/// call adds; another replica's numbers are its own.
#[test]
fn a_count_sent_again_is_added_once() {
    let redis = RedisServer::start();
    let mut con = redis.client();
    let report = redis::Script::new(include_str!("../../../src/ledger/report.lua"));
    let reserve = redis::Script::new(include_str!("../../../src/ledger/reserve.lua"));
    let day = redis::Script::new(include_str!("../../../src/ledger/day.lua"));
    let q = "t:{meters}:q:1";
    let report_call = |con: &mut redis::Connection, replica: &str, n: u64, charges: i64| {
        report
            .key(q)
            .arg(format!("~{replica}#"))
            .arg(n)
            .arg("acme")
            .arg(charges)
            .arg("beta")
            .arg(1)
            .invoke::<Vec<i64>>(con)
            .unwrap()
    };
    assert_eq!(report_call(&mut con, "r1", 1, 5), [5, 1]);
    assert_eq!(
        report_call(&mut con, "r1", 1, 5),
        [5, 1],
        "sent again: added once"
    );
    assert_eq!(
        report_call(&mut con, "r2", 1, 2),
        [7, 2],
        "another replica's own numbers"
    );
    assert_eq!(
        report_call(&mut con, "r1", 2, -1),
        [6, 3],
        "a later call adds"
    );
    assert_eq!(report_call(&mut con, "r1", 2, -1), [6, 3]);
    // A reservation: charges 1 and reserves 2 of a quota of 10; sent again (as the twin that
    // wants nothing), it adds nothing and reserves nothing.
    redis::cmd("HSET")
        .arg(q)
        .arg("~r1")
        .arg(1)
        .exec(&mut con)
        .unwrap();
    let reserve_call = |con: &mut redis::Connection, n: u64, want: u64| {
        reserve
            .key(q)
            .arg("acme")
            .arg(1)
            .arg(want)
            .arg(10)
            .arg(7)
            .arg("~r1")
            .arg("~r1#")
            .arg(n)
            .invoke::<Vec<i64>>(con)
            .unwrap()
    };
    assert_eq!(reserve_call(&mut con, 3, 2), [9, 2]);
    assert_eq!(
        reserve_call(&mut con, 3, 0),
        [9, 0],
        "sent again: nothing more"
    );
    assert_eq!(
        reserve_call(&mut con, 4, 0),
        [10, 0],
        "a later call adds its charges"
    );
    // A day of the ledger: the same.
    let l = "t:{meters}:l:20000";
    let day_call = |con: &mut redis::Connection, n: u64| {
        day.key(l)
            .arg(4_102_444_800_000u64)
            .arg("~r1#")
            .arg(n)
            .arg("acme")
            .arg("basic")
            .arg("")
            .arg(1)
            .arg("upstream_2xx")
            .arg(3)
            .invoke::<u64>(con)
            .unwrap()
    };
    assert_eq!(day_call(&mut con, 1), 1);
    assert_eq!(day_call(&mut con, 1), 0, "sent again: no key taken");
    assert_eq!(day_call(&mut con, 2), 1);
    let count: u64 = redis::cmd("HGET")
        .arg(l)
        .arg("acme:upstream_2xx")
        .query(&mut con)
        .unwrap();
    assert_eq!(count, 6);
    let ttl: i64 = redis::cmd("PTTL").arg(l).query(&mut con).unwrap();
    assert!(
        ttl > 0,
        "the day expires, whether a call was applied or not"
    );
}
