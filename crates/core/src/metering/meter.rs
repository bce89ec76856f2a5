//! A key's counts: the quota word (a period id and the requests charged in it) and the
//! ledger's columns by day, each changed with one atomic operation on the request path.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use super::calendar::{PeriodAt, MONTH_BIT};
use super::column::{Column, COLUMNS};
use super::{fleet, FleetQuotas, Ticket};
use crate::config::keyname::KeyName;

/// The count's bits in the quota word; the period id is above them.
const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

fn pack(id: u32, n: u64) -> u64 {
    (u64::from(id) << COUNT_BITS) | (n & COUNT_MASK)
}

fn unpack(word: u64) -> (u32, u64) {
    ((word >> COUNT_BITS) as u32, word & COUNT_MASK)
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
    /// last visited them ([`Metering::touched`](super::Metering::touched)).
    pub(super) queued: AtomicBool,
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
    pub(super) want: AtomicU32,
    /// The quota they were decided on (what the store reserves within).
    pub(super) want_quota: AtomicU64,
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
    pub(super) fn new(name: KeyName) -> Self {
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
    /// ([`Metering::park`](super::Metering::park)); a ticket of a request the window then refuses is handed back
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

    /// Requests charged in `period`, as [`Meter::charge`] counts them: 0 if the count is of
    /// an earlier period of the same `per`; a count kept under the other `per` (the quota's
    /// period changed live) goes on in this one, and is shown so.
    pub fn used(&self, period: &PeriodAt) -> u64 {
        let (id, n) = unpack(self.used.load(Ordering::Acquire));
        if same_per(id, period.id) && id < period.id {
            0
        } else {
            n
        }
    }

    /// The period of the count when it is a later one than `period`, of the same `per`: the
    /// wall clock stepped back since it was charged, and the count refuses until that
    /// period ends, not this one.
    pub fn later_period(&self, period: &PeriodAt) -> Option<PeriodAt> {
        let (id, _) = unpack(self.used.load(Ordering::Acquire));
        (same_per(id, period.id) && id > period.id).then(|| PeriodAt::of_id(id))
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

    /// Mark the key as refused for its quota in `period` when its count there has reached
    /// `limit` already (a count restored at a start, before any request of the key): the
    /// gauge of keys over their quota counts it from then, as the next request would.
    /// Whether it had.
    pub fn mark_if_spent(&self, limit: u64, period: &PeriodAt) -> bool {
        let spent = self.used(period) >= limit;
        if spent {
            self.exhausted.store(period.id + 1, Ordering::Relaxed);
        }
        spent
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

    /// Who the key was when last counted ([`who`](super::who)).
    pub fn who(&self) -> u64 {
        self.who.load(Ordering::Relaxed)
    }

    /// Take the ledger counts added since the last take: for `today` and the day before,
    /// each with its counts by column (empty when there were none). Each cell is read, and
    /// swapped to 0 only when it holds a count: a request counts in one cell or two, and a
    /// swap is a locked instruction where a read is not. A count added after its cell was
    /// read is left for the next take (its meter is queued again: [`Metering::touched`](super::Metering::touched)).
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
