use super::*;
use crate::config::keyname::KeyName;
use crate::limit::RateState;
use crate::refusal::Code;

const JAN_31_2026: u64 = 1_769_817_600_000; // 2026-01-31T00:00:00Z

#[test]
fn calendar_arithmetic_matches_the_time_crate() {
    for day in [0i64, 1, 59, 365, 10_957, 20_454, 20_513, 24_000, 2_932_896] {
        let (y, m, d) = civil_from_days(day);
        let date = time::Date::from_julian_day(2_440_588 + day as i32).unwrap();
        assert_eq!(
            (y, m, d),
            (
                i64::from(date.year()),
                date.month() as u32,
                u32::from(date.day())
            )
        );
        assert_eq!(days_from_civil(y, m, d), day);
    }
    assert_eq!(day_str(20_418), "2025-11-26");
    assert_eq!(parse_day("2025-11-26"), Some(20_418));
    for bad in [
        "2026-02-30",
        "2026-13-01",
        "2026-1-01",
        "+026-01-01",
        "2026-01-00",
        "1969-12-31",
    ] {
        assert_eq!(parse_day(bad), None, "{bad}");
    }
}

#[test]
fn periods_are_utc_calendar_days_and_months() {
    let d = PeriodAt::of(Period::Day, JAN_31_2026 + 5_000);
    assert_eq!(
        (d.start_ms, d.end_ms, d.secs()),
        (JAN_31_2026, JAN_31_2026 + DAY_MS, 86_400)
    );
    assert_eq!(d.secs_left(JAN_31_2026 + DAY_MS - 1), 1);
    let jan = PeriodAt::of(Period::Month, JAN_31_2026 + 5_000);
    assert_eq!(jan.secs(), 31 * 86_400);
    assert_eq!(jan.end_ms, JAN_31_2026 + DAY_MS);
    let feb = PeriodAt::of(Period::Month, jan.end_ms);
    assert_eq!(feb.secs(), 28 * 86_400);
    assert_eq!(feb.id, jan.id + 1);
    assert_eq!(feb.end_ms, Period::Month.end_after(jan.end_ms));
    assert_eq!(d.end_ms, Period::Day.end_after(JAN_31_2026));
    assert_ne!(d.id, jan.id, "a day's id is never a month's");
}

#[test]
fn the_calendar_keeps_the_month_it_computed_and_agrees_with_the_arithmetic() {
    let c = Calendar::new(0);
    let mut ms = JAN_31_2026 - 3 * DAY_MS;
    // Every 7 hours for a year, and each month's edges.
    while ms < JAN_31_2026 + 365 * DAY_MS {
        for at in [ms, ms - ms % DAY_MS, ms - ms % DAY_MS + DAY_MS - 1] {
            assert_eq!(
                c.period(Period::Month, at),
                PeriodAt::of(Period::Month, at),
                "{at}"
            );
            assert_eq!(
                c.period(Period::Day, at),
                PeriodAt::of(Period::Day, at),
                "{at}"
            );
        }
        ms += 7 * 3_600_000;
    }
    // Back in time (a clock stepped back): computed again, not the cached month.
    assert_eq!(c.period(Period::Month, 0), PeriodAt::of(Period::Month, 0));
}

#[test]
fn a_quota_counts_to_its_limit_and_starts_again_next_period() {
    let m = Meter::new(KeyName::new("k"));
    let day1 = PeriodAt::of(Period::Day, JAN_31_2026);
    for i in 1..=3 {
        assert_eq!(m.charge(3, &day1), Ok((day1.id, i)));
    }
    assert_eq!(m.charge(3, &day1), Err(3));
    assert!(m.exhausted_in(day1.id, 0));
    m.give_back(day1.id);
    assert_eq!(m.used(&day1), 2);
    assert!(m.charge(3, &day1).is_ok());
    assert!(!m.exhausted_in(day1.id, 0), "charged again");
    let day2 = PeriodAt::of(Period::Day, day1.end_ms);
    assert_eq!(m.used(&day2), 0);
    assert_eq!(m.charge(3, &day2), Ok((day2.id, 1)));
    // A give-back of the earlier period does not touch the new one.
    m.give_back(day1.id);
    assert_eq!(m.used(&day2), 1);
}

#[test]
fn a_count_restored_at_its_limit_is_marked_spent_and_one_under_is_not() {
    let day1 = PeriodAt::of(Period::Day, JAN_31_2026);
    let day2 = PeriodAt::of(Period::Day, day1.end_ms);
    let m = Meter::new(KeyName::new("k"));
    m.restore(day1.id, 2);
    assert!(!m.mark_if_spent(3, &day1));
    assert!(!m.exhausted_in(day1.id, 0));
    m.restore(day1.id, 3);
    assert!(m.mark_if_spent(3, &day1));
    assert!(m.exhausted_in(day1.id, 0));
    // Yesterday's count is spent nothing today.
    let n = Meter::new(KeyName::new("n"));
    n.restore(day1.id, 3);
    assert!(!n.mark_if_spent(3, &day2));
    assert!(!n.exhausted_in(day2.id, 0));
}

#[test]
fn a_clock_stepped_back_does_not_charge_a_period_twice() {
    let m = Meter::new(KeyName::new("k"));
    let day1 = PeriodAt::of(Period::Day, JAN_31_2026);
    let day2 = PeriodAt::of(Period::Day, day1.end_ms);
    for _ in 0..2 {
        m.charge(2, &day1).unwrap();
    }
    m.charge(2, &day2).unwrap();
    // Back to day 1: the count is day 2's, and goes on there.
    assert_eq!(m.charge(2, &day1), Ok((day2.id, 2)));
    assert_eq!(m.charge(2, &day1), Err(2));
    assert_eq!(m.charge(2, &day2), Err(2));
}

#[test]
fn a_live_change_of_per_counts_what_was_charged() {
    let m = Meter::new(KeyName::new("k"));
    let day = PeriodAt::of(Period::Day, JAN_31_2026);
    let month = PeriodAt::of(Period::Month, JAN_31_2026);
    for _ in 0..5 {
        m.charge(100, &month).unwrap();
    }
    assert_eq!(m.charge(6, &day), Ok((day.id, 6)));
    assert_eq!(m.charge(6, &day), Err(6));
}

#[test]
fn restore_takes_the_later_period_or_the_larger_count() {
    let m = Meter::new(KeyName::new("k"));
    let day1 = PeriodAt::of(Period::Day, JAN_31_2026);
    let day2 = PeriodAt::of(Period::Day, day1.end_ms);
    m.charge(10, &day2).unwrap();
    m.restore(day1.id, 7);
    assert_eq!(m.quota_word(), (day2.id, 1));
    m.restore(day2.id, 4);
    assert_eq!(m.quota_word(), (day2.id, 4));
}

#[test]
fn a_fleet_total_takes_in_what_was_charged_since_it_was_sent() {
    let m = Meter::new(KeyName::new("k"));
    let day = PeriodAt::of(Period::Day, JAN_31_2026);
    for _ in 0..3 {
        m.charge(100, &day).unwrap();
    }
    let (id, sent) = m.quota_word();
    m.charge(100, &day).unwrap();
    // The fleet had 10 with these 3: 10, and the one charged since.
    m.rebase(id, sent, 10);
    assert_eq!(m.quota_word(), (id, 11));
    // A give-back since the send comes off the total.
    let (_, sent) = m.quota_word();
    m.give_back(id);
    m.rebase(id, sent, 20);
    assert_eq!(m.quota_word(), (id, 19));
    // An answer for a period that is over changes nothing.
    m.rebase(id + 1, 0, 50);
    assert_eq!(m.quota_word(), (id, 19));
}

#[test]
fn ledger_counts_are_taken_once_for_the_day_they_are_of() {
    let m = Meter::new(KeyName::new("k"));
    m.count(100, Column::Upstream2xx, 7);
    m.count(101, Column::Refused(Code::RateLimited), 7);
    m.count(101, Column::Refused(Code::RateLimited), 7);
    let [(today, t), (yesterday, y)] = m.take(101);
    assert_eq!((today, yesterday), (101, 100));
    let t = t.unwrap();
    assert_eq!(t[Column::Refused(Code::RateLimited).index()], 2);
    assert_eq!(t.iter().sum::<u32>(), 2);
    assert_eq!(y.unwrap()[0], 1);
    assert!(m.take(101).iter().all(|(_, c)| c.is_none()));
    assert_eq!(m.who(), 7);
}

#[test]
fn who_words_round_trip() {
    assert_eq!(
        who_parts(who(3, Some(2), Some(1), false)),
        (3, Some(2), Some(1), false)
    );
    assert_eq!(
        who_parts(who(9, None, Some(0), true)),
        (9, None, Some(0), true)
    );
    assert_eq!(who_parts(0), (0, None, None, false));
    assert_eq!(
        unpack_quota(pack_quota(Some(QuotaSpec {
            requests: 5,
            per: Period::Month
        }))),
        Some(QuotaSpec {
            requests: 5,
            per: Period::Month
        })
    );
    assert_eq!(unpack_quota(0), None);
}

#[test]
fn a_changed_meter_is_queued_once_until_the_keeper_takes_it() {
    let metering = Metering::new(JAN_31_2026);
    let a = Arc::new(RateState::default());
    let b = Arc::new(RateState::default());
    // No meter yet: nothing to keep.
    metering.touched(&a);
    assert!(metering.take_changed().is_empty());
    let ma = metering.meter(&a, &KeyName::new("a"));
    metering.meter(&b, &KeyName::new("b"));
    for _ in 0..3 {
        ma.count(1, Column::Upstream2xx, 1);
        metering.touched(&a);
    }
    metering.touched(&b);
    let taken = metering.take_changed();
    assert_eq!(taken.len(), 2, "each changed meter once");
    let same = |h: &Held, s: &Arc<RateState>| std::ptr::addr_eq(Arc::as_ptr(h), Arc::as_ptr(s));
    assert!(same(&taken[0], &a) && same(&taken[1], &b));
    assert!(metering.take_changed().is_empty(), "nothing changed since");
    // Changed again after it was taken: queued again.
    ma.count(1, Column::Upstream2xx, 1);
    metering.touched(&a);
    assert_eq!(metering.take_changed().len(), 1);
}

#[test]
fn a_count_carried_over_a_change_of_period_is_shown_as_it_is_charged() {
    let month = PeriodAt::of(Period::Month, JAN_31_2026);
    let day = PeriodAt::of(Period::Day, JAN_31_2026);
    let m = Meter::new(KeyName::new("k"));
    assert_eq!(m.charge(5, &month), Ok((month.id, 1)));
    assert_eq!(m.charge(5, &month), Ok((month.id, 2)));
    // The quota is now 3 a day: the count goes on, and is read as it goes on.
    assert_eq!(m.used(&day), 2);
    assert_eq!(m.charge(3, &day), Ok((day.id, 3)));
    assert_eq!(m.used(&day), 3);
    assert_eq!(m.charge(3, &day), Err(3));
}

#[test]
fn a_period_is_found_again_from_its_id() {
    // Every day from 1970 to 2100, at noon, and the first and last instants of a few.
    let mut ms = 12 * 3_600_000;
    while ms < 4_102_444_800_000 {
        for per in [Period::Day, Period::Month] {
            let p = PeriodAt::of(per, ms);
            assert_eq!(PeriodAt::of_id(p.id), p, "{per:?} at {ms}");
            assert_eq!(PeriodAt::of(per, p.start_ms), p);
            assert_eq!(PeriodAt::of(per, p.end_ms - 1), p);
        }
        ms += 86_400_000;
    }
}
