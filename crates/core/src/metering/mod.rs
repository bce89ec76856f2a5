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
//!
//! | module | what |
//! |---|---|
//! | `calendar` | [`Calendar`], [`PeriodAt`]: UTC days, periods and their ids |
//! | `column` | [`Column`]: the ledger's columns, one list |
//! | `meter` | [`Meter`]: a key's quota word and ledger counts |
//! | `queue` | [`Metering`]: the calendar and the queues of meters for the keeper |
//! | `who` | [`who`]: the plan and partner a meter's key was counted under, in one word |
//! | [`fleet`] | [`FleetQuotas`]: the fleet's side of a quota decision |

use std::fmt;
use std::sync::Arc;

use once_cell::race::OnceBox;

pub mod fleet;
pub use fleet::{FleetQuotas, Ticket};

use crate::config::{Period, QuotaSpec};

mod calendar;
mod column;
mod meter;
mod queue;
#[cfg(test)]
mod tests;
mod who;

pub use calendar::{
    civil_from_days, day_of, day_str, days_from_civil, parse_day, Calendar, PeriodAt, DAY_MS,
    MONTH_BIT,
};
pub use column::{Column, COLUMNS};
pub use meter::Meter;
pub use queue::Metering;
pub use who::{who, who_parts};

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
