//! The wall clock as metering reads it: UTC days, calendar periods (a day, a month) and
//! their ids, and the civil-date arithmetic behind them.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Period;

/// A UTC day, in ms.
pub const DAY_MS: u64 = 86_400_000;

/// The UTC day number (days since 1970-01-01) of `ms` since the Unix epoch.
#[inline]
pub fn day_of(ms: u64) -> u32 {
    (ms / DAY_MS) as u32
}
/// The `per` bit of a period id (set: a month).
pub const MONTH_BIT: u32 = 1 << 23;

/// The wall clock as metering reads it, ms since the Unix epoch: set by the runtime's tick
/// (and by tests), read by every metered request.
#[derive(Debug, Default)]
pub struct Calendar {
    ms: AtomicU64,
    /// The month last computed, packed in one word so that a reader never sees half of two:
    /// the month's number (16 bits), its first and its next month's first day (24 bits each).
    month: AtomicU64,
}

impl Calendar {
    /// A calendar at `ms`.
    pub fn new(ms: u64) -> Self {
        Self {
            ms: AtomicU64::new(ms),
            month: AtomicU64::new(0),
        }
    }

    /// The period of `per` that holds `ms`: a day by arithmetic; a month from the one last
    /// computed when `ms` is in it (the civil-calendar arithmetic once a month, not per
    /// request).
    #[inline]
    pub fn period(&self, per: Period, ms: u64) -> PeriodAt {
        if per == Period::Day {
            return PeriodAt::of(per, ms);
        }
        let w = self.month.load(Ordering::Relaxed);
        let (index, first, next) = (w >> 48, (w >> 24) & 0xFF_FFFF, w & 0xFF_FFFF);
        let day = ms / DAY_MS;
        if w != 0 && first <= day && day < next {
            return PeriodAt {
                id: MONTH_BIT | index as u32,
                start_ms: first * DAY_MS,
                end_ms: next * DAY_MS,
            };
        }
        let p = PeriodAt::of(per, ms);
        let packed = (u64::from(p.id & 0xFFFF) << 48)
            | ((p.start_ms / DAY_MS) & 0xFF_FFFF) << 24
            | ((p.end_ms / DAY_MS) & 0xFF_FFFF);
        if p.id & (MONTH_BIT - 1) <= 0xFFFF && p.end_ms / DAY_MS <= 0xFF_FFFF {
            self.month.store(packed, Ordering::Relaxed);
        }
        p
    }

    /// ms since the Unix epoch, as last set.
    #[inline]
    pub fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::Relaxed)
    }

    /// Move the calendar to `ms` (the tick, or a test).
    pub fn set(&self, ms: u64) {
        self.ms.store(ms, Ordering::Relaxed);
    }
}

/// One calendar period: its id (what the quota word holds), where it starts and ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeriodAt {
    /// `per` (bit 23) and the day or month number since the Unix epoch.
    pub id: u32,
    /// Its first instant, ms since the Unix epoch.
    pub start_ms: u64,
    /// The first instant after it.
    pub end_ms: u64,
}

impl PeriodAt {
    /// The period of `per` that holds `ms`.
    pub fn of(per: Period, ms: u64) -> Self {
        let day = ms / DAY_MS;
        match per {
            Period::Day => Self {
                id: (day as u32) & (MONTH_BIT - 1),
                start_ms: day * DAY_MS,
                end_ms: (day + 1) * DAY_MS,
            },
            Period::Month => {
                let (y, m, _) = civil_from_days(day as i64);
                let months = (y - 1970) * 12 + i64::from(m) - 1;
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                Self {
                    id: MONTH_BIT | (months as u32 & (MONTH_BIT - 1)),
                    start_ms: days_from_civil(y, m, 1) as u64 * DAY_MS,
                    end_ms: days_from_civil(ny, nm, 1) as u64 * DAY_MS,
                }
            }
        }
    }

    /// The period whose id is `id` (a day's or a month's: [`PeriodAt::of`] of an instant in
    /// it gives the same).
    pub fn of_id(id: u32) -> Self {
        let n = u64::from(id & (MONTH_BIT - 1));
        if id & MONTH_BIT == 0 {
            return Self::of(Period::Day, n * DAY_MS);
        }
        let y = 1970 + (n / 12) as i64;
        let m = (n % 12) as u32 + 1;
        Self::of(Period::Month, days_from_civil(y, m, 1) as u64 * DAY_MS)
    }

    /// The period's length in seconds (86400 for a day; the month's own length).
    pub fn secs(&self) -> u64 {
        (self.end_ms - self.start_ms) / 1000
    }

    /// Whole seconds from `ms` to the period's end, rounded up (at least 1).
    pub fn secs_left(&self, ms: u64) -> u64 {
        self.end_ms.saturating_sub(ms).div_ceil(1000).max(1)
    }
}

/// The UTC day number (days since 1970-01-01) of a civil date (Howard Hinnant's
/// `days_from_civil`).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (i64::from(m) + 9) % 12;
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date (year, month 1–12, day 1–31) of a UTC day number.
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `YYYY-MM-DD` of a UTC day number.
pub fn day_str(day: u32) -> String {
    let (y, m, d) = civil_from_days(i64::from(day));
    format!("{y:04}-{m:02}-{d:02}")
}

/// The UTC day number of `YYYY-MM-DD`, if it is one.
pub fn parse_day(s: &str) -> Option<u32> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let t = &s[r];
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())
            .flatten()
    };
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || d == 0 {
        return None;
    }
    let days = days_from_civil(i64::from(y), m, d);
    // The day must be of its month (not `2026-02-30`).
    (civil_from_days(days) == (i64::from(y), m, d)).then_some(days as u32)
}
