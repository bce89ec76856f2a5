//! Quotas and the usage ledger's counts: what each key was charged in its calendar period,
//! and what each of its requests came to, counted on the request path without a lock.
//!
//! **Where the counts live.** A key's [`Meter`] hangs off its rate state
//! ([`crate::limit::RateState::meter`]), which a reload carries over for the keys that remain: allocated on
//! the key's first metered request, and queued for the background task that keeps and shares
//! the counts whenever they change ([`Metering::touched`], [`Metering::take_changed`]).
//! So memory grows with the keys that were active, not with the keys configured.
//!
//! **The quota's count** is one word: the period's id (24 bits: `per` and the day or month
//! number) and the requests charged in it (40 bits). A charge is one compare-and-swap: a word
//! of an earlier period counts from 0, and never the other way: a wall clock stepped back
//! does not go back to an earlier period, so no period is charged twice.
//!
//! **The ledger's counts** are per column (upstream 2xx, 4xx, 5xx, failed, and each refusal
//! code) in two sets, by the parity of the UTC day they are for: the task that takes them
//! knows each set's day, so a request just before midnight is never counted in the next day.
//!
//! **Time.** Calendar periods are of the wall clock, read from a [`Calendar`] that a
//! background tick sets (the decision stays pure: no clock is read here).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use once_cell::race::OnceBox;

pub mod fleet;
pub use fleet::{FleetQuotas, Ticket};

use crate::config::keyname::KeyName;
use crate::config::{Period, QuotaSpec};
use crate::refusal::Code;
use crate::sync::Locked;

/// A UTC day, in ms.
pub const DAY_MS: u64 = 86_400_000;

/// The UTC day number (days since 1970-01-01) of `ms` since the Unix epoch.
#[inline]
pub fn day_of(ms: u64) -> u32 {
    (ms / DAY_MS) as u32
}
/// The count's bits in the quota word; the period id is above them.
const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
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

fn pack(id: u32, n: u64) -> u64 {
    (u64::from(id) << COUNT_BITS) | (n & COUNT_MASK)
}

fn unpack(word: u64) -> (u32, u64) {
    ((word >> COUNT_BITS) as u32, word & COUNT_MASK)
}

/// A ledger column: where a request of a key is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    /// Forwarded; the upstream answered 1xx, 2xx or 3xx.
    Upstream2xx,
    /// Forwarded; the upstream answered 4xx.
    Upstream4xx,
    /// Forwarded; the upstream answered 5xx.
    Upstream5xx,
    /// Forwarded (or admitted to be) and no answer came: 502, 504, or the client left.
    UpstreamFailed,
    /// Refused with this code.
    Refused(Code),
}

/// The upstream columns; `forwarded` is their sum.
pub const UPSTREAM_COLUMNS: [&str; 4] = [
    "upstream_2xx",
    "upstream_4xx",
    "upstream_5xx",
    "upstream_failed",
];
/// Counts per day: the four upstream columns, then one per code ([`Code::ALL`]'s order).
pub const COLUMNS: usize = 4 + Code::ALL.len();

impl Column {
    /// The column of a forwarded request the upstream answered with `status` (0: none).
    pub fn upstream(status: u16) -> Self {
        match status {
            100..=399 => Column::Upstream2xx,
            400..=499 => Column::Upstream4xx,
            500..=599 => Column::Upstream5xx,
            _ => Column::UpstreamFailed,
        }
    }

    fn index(self) -> usize {
        match self {
            Column::Upstream2xx => 0,
            Column::Upstream4xx => 1,
            Column::Upstream5xx => 2,
            Column::UpstreamFailed => 3,
            Column::Refused(c) => 4 + c as usize,
        }
    }

    /// Whether the ledger shows a column for `code`: every refusal code but `unauthorized`
    /// (never a key's), and not `upstream_unavailable` and `upstream_timeout`, which are
    /// forwarded requests that failed (`upstream_failed`).
    pub fn shown(code: Code) -> bool {
        !matches!(
            code,
            Code::Unauthorized | Code::UpstreamUnavailable | Code::UpstreamTimeout
        )
    }
}

/// A key's counts (see the module's docs).
pub struct Meter {
    /// The key's name, as the ledger and the quota store name it.
    pub name: KeyName,
    /// The quota's count: period id and requests charged in it.
    used: AtomicU64,
    /// The id + 1 of the period in which the key was last refused for its quota; 0 once a
    /// request is charged again.
    exhausted: AtomicU32,
    /// Whether the meter waits in [`Metering`]'s queue of meters changed since the keeper
    /// last visited them ([`Metering::touched`]).
    queued: AtomicBool,
    /// Who the key was when last counted: the policy generation (high 32 bits) and the
    /// credential's plan index + 1, or partner index + 1 with bit 31.
    who: AtomicU64,
    /// Ledger counts, by the parity of their UTC day, then by column.
    cells: [[AtomicU32; COLUMNS]; 2],
    /// With a fleet ([`fleet`]): when the store last answered for this key's count, ms since
    /// the Unix epoch (0: never).
    known_ms: AtomicU64,
    /// Requests the store reserved for this replica and not used yet, packed as the quota
    /// word is (their period's id and how many).
    grant: AtomicU64,
    /// Requests waiting for a reservation, not yet sent to the store.
    want: AtomicU32,
    /// The quota they were decided on (what the store reserves within).
    want_quota: AtomicU64,
    /// A charge made on a stale view since the store last answered.
    blind: AtomicBool,
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("name", &self.name)
            .field("used", &unpack(self.used.load(Ordering::Relaxed)))
            .finish_non_exhaustive()
    }
}

impl Meter {
    fn new(name: KeyName) -> Self {
        Self {
            name,
            used: AtomicU64::new(0),
            exhausted: AtomicU32::new(0),
            queued: AtomicBool::new(false),
            who: AtomicU64::new(0),
            cells: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU32::new(0))),
            known_ms: AtomicU64::new(0),
            grant: AtomicU64::new(0),
            want: AtomicU32::new(0),
            want_quota: AtomicU64::new(0),
            blind: AtomicBool::new(false),
        }
    }

    /// How the next request is charged to `quota` in `period`, with the fleet `fleet`; the
    /// key's window limit is `limit`, the wall clock `now_ms`; `wait`: the request may still
    /// wait for the store ([`fleet`]'s table). A [`Ticket::Park`] is the caller's to count
    /// ([`Metering::park`]); a ticket of a request the window then refuses is handed back
    /// ([`Meter::undo`]).
    #[inline]
    pub fn ticket(
        &self,
        quota: u64,
        period: &PeriodAt,
        fleet: &FleetQuotas,
        limit: u32,
        now_ms: u64,
        wait: bool,
    ) -> Ticket {
        if !fleet.enabled() {
            return Ticket::Local;
        }
        if self.take_grant(period.id) {
            return Ticket::Grant;
        }
        let used = self.used(period);
        if used >= quota || !wait || !fleet.is_up() {
            return Ticket::Local;
        }
        let known = self.known_ms.load(Ordering::Relaxed).max(fleet.loaded_ms());
        let fresh = known != 0 && now_ms.saturating_sub(known) <= fleet::STALE_AFTER_MS;
        let far = quota - used > fleet.margin(limit);
        if far && fresh {
            return Ticket::Local;
        }
        if far && known != 0 && !self.blind.swap(true, Ordering::AcqRel) {
            return Ticket::Blind;
        }
        // The count is of this period from now on (the keeper reserves in the word's period).
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let (id, n) = unpack(cur);
                if !same_per(id, period.id) {
                    Some(pack(period.id, n))
                } else if id < period.id {
                    Some(pack(period.id, 0))
                } else {
                    None
                }
            });
        Ticket::Park
    }

    /// Take one of the requests reserved for this replica in the period `id`.
    fn take_grant(&self, id: u32) -> bool {
        let mut cur = self.grant.load(Ordering::Acquire);
        loop {
            let (gid, n) = unpack(cur);
            if n == 0 || gid != id {
                return false;
            }
            match self.grant.compare_exchange_weak(
                cur,
                pack(gid, n - 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// The window refused the request `ticket` was for: hand it back.
    pub fn undo(&self, ticket: Ticket, id: u32) {
        match ticket {
            Ticket::Grant => self.granted(id, 1),
            Ticket::Blind => self.blind.store(false, Ordering::Release),
            Ticket::Local | Ticket::Park => {}
        }
    }

    /// Charge one request with `ticket` to `limit` requests in `period` ([`Meter::charge`]; a
    /// grant is counted already: the count it leaves).
    #[inline]
    pub fn charge_with(
        &self,
        ticket: Ticket,
        limit: u64,
        period: &PeriodAt,
    ) -> Result<(u32, u64), u64> {
        if ticket == Ticket::Grant {
            if self.exhausted.load(Ordering::Relaxed) != 0 {
                self.exhausted.store(0, Ordering::Relaxed);
            }
            return Ok((period.id, self.used(period)));
        }
        self.charge(limit, period)
    }

    /// The requests waiting for a reservation, taken to be sent, and the quota they were
    /// decided on.
    pub fn take_want(&self) -> (u32, u64) {
        let quota = self.want_quota.load(Ordering::Acquire);
        (self.want.swap(0, Ordering::AcqRel), quota)
    }

    /// The store reserved `n` requests for this replica in the period `id` (they are in the
    /// count already: the total it answered).
    pub fn granted(&self, id: u32, n: u64) {
        let _ = self
            .grant
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let (gid, m) = unpack(cur);
                Some(pack(id, if gid == id { m + n } else { n }))
            });
    }

    /// The reservations not used: taken back, and off the count (the next report gives them
    /// back to the fleet). How many, and their period.
    pub fn take_unused_grants(&self) -> Option<(u32, u64)> {
        let (id, n) = unpack(self.grant.swap(0, Ordering::AcqRel));
        if n == 0 {
            return None;
        }
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let (cid, c) = unpack(cur);
                (cid == id).then(|| pack(cid, c.saturating_sub(n)))
            });
        Some((id, n))
    }

    /// The store answered for this key's count at `wall_ms`: the view is fresh, and a blind
    /// charge is reported.
    pub fn known(&self, wall_ms: u64) {
        self.known_ms.store(wall_ms, Ordering::Relaxed);
        self.blind.store(false, Ordering::Release);
    }

    /// Requests charged in `period` (0 if the count is of an earlier one).
    pub fn used(&self, period: &PeriodAt) -> u64 {
        let (id, n) = unpack(self.used.load(Ordering::Acquire));
        if id >= period.id && same_per(id, period.id) {
            n
        } else {
            0
        }
    }

    /// The quota word as it stands: (period id, count), for keeping it.
    pub fn quota_word(&self) -> (u32, u64) {
        unpack(self.used.load(Ordering::Acquire))
    }

    /// Put a kept count back (at start): it replaces a count of an earlier period, or adds to
    /// what this process already charged in the same one.
    pub fn restore(&self, id: u32, n: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let (cid, cn) = unpack(cur);
                match cid.cmp(&id) {
                    std::cmp::Ordering::Less => Some(pack(id, n)),
                    std::cmp::Ordering::Equal => Some(pack(id, cn.max(n))),
                    std::cmp::Ordering::Greater => None,
                }
            });
    }

    /// The fleet's total for the period `id` came back from the shared store: `total` counts
    /// this process's charges as they stood when sent (`sent`); what was charged (or given
    /// back) here since goes on top.
    pub fn rebase(&self, id: u32, sent: u64, total: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let (cid, c) = unpack(cur);
                (cid == id).then(|| pack(id, (total + c).saturating_sub(sent)))
            });
    }

    /// Charge one request to `limit` requests in `period`: the count after it, or the count
    /// that refuses it. A count of a later period (the wall clock stepped back) is charged
    /// as it is; a count of an earlier one starts from 0; a count kept under the other
    /// `per` (the quota changed from a month to a day, or back) goes on in the new period.
    #[inline]
    pub fn charge(&self, limit: u64, period: &PeriodAt) -> Result<(u32, u64), u64> {
        let mut cur = self.used.load(Ordering::Acquire);
        loop {
            let (id, n) = unpack(cur);
            let (id, n) = if !same_per(id, period.id) {
                (period.id, n)
            } else if id < period.id {
                (period.id, 0)
            } else {
                (id, n)
            };
            if n >= limit {
                let mark = id + 1;
                if self.exhausted.load(Ordering::Relaxed) != mark {
                    self.exhausted.store(mark, Ordering::Relaxed);
                }
                return Err(n);
            }
            match self.used.compare_exchange_weak(
                cur,
                pack(id, n + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    if self.exhausted.load(Ordering::Relaxed) != 0 {
                        self.exhausted.store(0, Ordering::Relaxed);
                    }
                    return Ok((id, n + 1));
                }
                Err(actual) => cur = actual,
            }
        }
    }

    /// Give back a request charged in the period `id` (refused after the charge, or not
    /// served by the upstream); nothing if the count has moved on to another period.
    pub fn give_back(&self, id: u32) {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                let (cid, n) = unpack(cur);
                (cid == id && n > 0).then(|| pack(cid, n - 1))
            });
    }

    /// Whether the key is refused for its quota in the period `id` or `other` (a day's and a
    /// month's: the gauge's question, "over its quota now").
    pub fn exhausted_in(&self, day: u32, month: u32) -> bool {
        let e = self.exhausted.load(Ordering::Relaxed);
        e != 0 && (e - 1 == day || e - 1 == month)
    }

    /// Count one request in `column`, for the UTC day `day`, by the key as `who` (see
    /// [`Meter::who`]).
    #[inline]
    pub fn count(&self, day: u32, column: Column, who: u64) {
        self.cells[(day & 1) as usize][column.index()].fetch_add(1, Ordering::Relaxed);
        if self.who.load(Ordering::Relaxed) != who {
            self.who.store(who, Ordering::Relaxed);
        }
    }

    /// Who the key was when last counted ([`who`]).
    pub fn who(&self) -> u64 {
        self.who.load(Ordering::Relaxed)
    }

    /// Take the ledger counts added since the last take: for `today` and the day before,
    /// each with its counts by column (empty when there were none). Each cell is read, and
    /// swapped to 0 only when it holds a count: a request counts in one cell or two, and a
    /// swap is a locked instruction where a read is not. A count added after its cell was
    /// read is left for the next take (its meter is queued again: [`Metering::touched`]).
    pub fn take(&self, today: u32) -> [(u32, Option<[u32; COLUMNS]>); 2] {
        let mut out = [(today, None), (today.wrapping_sub(1), None)];
        for (day, counts) in &mut out {
            let cells = &self.cells[(*day & 1) as usize];
            let mut taken = [0u32; COLUMNS];
            let mut any = false;
            for (t, c) in taken.iter_mut().zip(cells) {
                if c.load(Ordering::Relaxed) != 0 {
                    *t = c.swap(0, Ordering::AcqRel);
                    any |= *t != 0;
                }
            }
            if any {
                *counts = Some(taken);
            }
        }
        out
    }
}

fn same_per(a: u32, b: u32) -> bool {
    (a ^ b) & MONTH_BIT == 0
}

/// The [`Meter::who`] word of a key counted under the policy `generation`: its plan (a
/// customer key) and partner (a partner key's own, or the partner managing a customer key).
pub fn who(generation: u32, plan: Option<usize>, partner: Option<usize>, partner_key: bool) -> u64 {
    let plan = plan.map_or(0, |p| (p as u64 + 1) & 0xFFFF);
    let partner = partner.map_or(0, |p| (p as u64 + 1) & 0x7FFF);
    (u64::from(generation) << 32) | (u64::from(partner_key) << 31) | (partner << 16) | plan
}

/// What a [`who`] word says: (generation, plan, partner, a partner key).
pub fn who_parts(w: u64) -> (u32, Option<usize>, Option<usize>, bool) {
    let plan = (w & 0xFFFF) as usize;
    let partner = ((w >> 16) & 0x7FFF) as usize;
    (
        (w >> 32) as u32,
        plan.checked_sub(1),
        partner.checked_sub(1),
        w & (1 << 31) != 0,
    )
}

/// The process's metering: the calendar, and the queue of meters changed since the keeper
/// last visited them (shared by every policy; a reload keeps it).
#[derive(Debug)]
pub struct Metering {
    /// The wall clock that calendar periods are read from.
    pub calendar: Calendar,
    /// Meters changed (charged, given back, counted) since the keeper last visited them: the
    /// keeper visits these, not every meter, so that its work follows the keys in use. A new
    /// meter comes to the keeper this way too, with its first change.
    changed_tx: Mutex<mpsc::Sender<Held>>,
    changed_rx: Mutex<mpsc::Receiver<Held>>,
    /// With `cluster`: the fleet's side of quota decisions.
    pub fleet: FleetQuotas,
    /// Meters with requests parked for a reservation ([`Metering::park`]), for the keeper's
    /// next exchange (at once: the request waits for it).
    parked_tx: Mutex<mpsc::Sender<Held>>,
    parked_rx: Mutex<mpsc::Receiver<Held>>,
    /// Whether one was queued since the keeper last took them.
    parked_any: AtomicBool,
}

impl Default for Metering {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Metering {
    /// Metering with the calendar at `wall_ms`.
    pub fn new(wall_ms: u64) -> Self {
        let (changed_tx, changed_rx) = mpsc::channel();
        let (parked_tx, parked_rx) = mpsc::channel();
        Self {
            calendar: Calendar::new(wall_ms),
            changed_tx: Mutex::new(changed_tx),
            changed_rx: Mutex::new(changed_rx),
            fleet: FleetQuotas::default(),
            parked_tx: Mutex::new(parked_tx),
            parked_rx: Mutex::new(parked_rx),
            parked_any: AtomicBool::new(false),
        }
    }

    /// A request of the key whose rate state is `state` waits for the store to reserve it
    /// within `quota` ([`Ticket::Park`]): counted, and the meter queued for the keeper's next
    /// exchange.
    pub fn park<H: MeterHolder + 'static>(&self, state: &Arc<H>, quota: u64) {
        if let Some(m) = state.meter_cell().get() {
            m.want_quota.store(quota, Ordering::Release);
            if m.want.fetch_add(1, Ordering::AcqRel) == 0 {
                let tx = self.parked_tx.locked();
                let _ = tx.send(Arc::clone(state) as Held);
                self.parked_any.store(true, Ordering::Release);
            }
        }
    }

    /// Whether a request waits for a reservation (queued since the last
    /// [`Metering::take_parked`]; at worst a moment late to say no).
    pub fn has_parked(&self) -> bool {
        self.parked_any.load(Ordering::Acquire)
    }

    /// The meters with requests parked since the last call, each once.
    pub fn take_parked(&self) -> Vec<Held> {
        self.parked_any.store(false, Ordering::Release);
        let rx = self.parked_rx.locked();
        rx.try_iter().collect()
    }

    /// The meter of `state` was just changed (charged, given back, counted): queue it for the
    /// keeper's next visit, unless it is queued already. Call it after the change. The flag
    /// is swapped (a read-modify-write), not only read: a change made after the keeper took
    /// the meter off the queue (and cleared the flag) either finds the flag clear and queues
    /// the meter again, or is seen by the keeper's visit (which clears the flag with a
    /// read-modify-write too, before it reads the counts).
    #[inline]
    pub fn touched<H: MeterHolder + 'static>(&self, state: &Arc<H>) {
        if let Some(m) = state.meter_cell().get() {
            if !m.queued.swap(true, Ordering::AcqRel) {
                self.queue(state);
            }
        }
    }

    #[cold]
    fn queue<H: MeterHolder + 'static>(&self, state: &Arc<H>) {
        let tx = self.changed_tx.locked();
        let _ = tx.send(Arc::clone(state) as Held);
    }

    /// The meters changed since the last call, each once, their flags cleared: the keeper
    /// reads their counts after this returns.
    pub fn take_changed(&self) -> Vec<Held> {
        let rx = self.changed_rx.locked();
        rx.try_iter()
            .inspect(|state| {
                if let Some(m) = state.meter_cell().get() {
                    Self::visit(m);
                }
            })
            .collect()
    }

    /// The keeper is about to read `m`: later changes queue it again.
    fn visit(m: &Meter) {
        m.queued.swap(false, Ordering::AcqRel);
    }

    /// The meter of the key whose rate state is `state`, allocated on first use (it reaches
    /// the keeper with its first change: [`Metering::touched`]).
    #[inline]
    pub fn meter<'s, H: MeterHolder>(&self, state: &'s Arc<H>, name: &KeyName) -> &'s Meter {
        if let Some(m) = state.meter_cell().get() {
            return m;
        }
        self.allocate(state.meter_cell(), name)
    }

    #[cold]
    fn allocate<'s>(&self, cell: &'s MeterCell, name: &KeyName) -> &'s Meter {
        let _ = cell.set(Box::new(Meter::new(name.clone())));
        cell.get().expect("set above, or by another thread")
    }
}

/// A quota in force, as a decision read it: for the answer's headers, and the charge to give
/// back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaState {
    /// The quota.
    pub spec: QuotaSpec,
    /// The key's own (named by the key), not its plan's (or the partners').
    pub own: bool,
    /// Requests charged in the period (the fleet's, as this replica knows it): it may pass the
    /// quota by a few requests ([`fleet`]), and is never capped at it.
    pub used: u64,
    /// Requests left in the period.
    pub remaining: u64,
    /// Seconds to the period's end.
    pub reset_secs: u64,
    /// The period's length in seconds.
    pub period_secs: u64,
    /// The period charged, when this request was (to give it back).
    pub charged: Option<u32>,
}

/// Which quota is in force for a key's meter word, packed: `requests << 2 | per` (1 a day,
/// 2 a month), 0 for none.
pub fn pack_quota(q: Option<QuotaSpec>) -> u64 {
    q.map_or(0, |q| {
        // The config and the admin API keep a quota within `MAX_QUOTA_REQUESTS`.
        (q.requests.min(crate::config::MAX_QUOTA_REQUESTS) << 2)
            | match q.per {
                Period::Day => 1,
                Period::Month => 2,
            }
    })
}

/// What [`pack_quota`] packed.
pub fn unpack_quota(w: u64) -> Option<QuotaSpec> {
    let per = match w & 3 {
        1 => Period::Day,
        2 => Period::Month,
        _ => return None,
    };
    Some(QuotaSpec {
        requests: w >> 2,
        per,
    })
}

/// The holder of a meter in the rate state: allocated once, never replaced.
pub type MeterCell = OnceBox<Meter>;

/// What holds a key's meter: the key's rate state (`limit::RateState`, whose `meter` is the
/// cell), so that the request path finds a key's meter without a lookup. A trait, so that
/// metering needs nothing of the rate arithmetic's room (the rate state names the meter; the
/// meter does not name the rate state).
pub trait MeterHolder: Send + Sync + fmt::Debug {
    /// The cell the key's meter sits in.
    fn meter_cell(&self) -> &MeterCell;
}

/// A key's meter holder as the keeper gets it (queued when changed or parked).
pub type Held = Arc<dyn MeterHolder>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::RateState;

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
}
