//! Keeping quota counts and the usage ledger: the background half of
//! [`crate::metering`].
//!
//! The request path counts into each key's meter without a lock, and queues a meter it
//! changed for the keeper ([`crate::metering::Metering::touched`]); the [`Keeper`] reads the
//! queued meters (and those over their quota) once a second (and before answering
//! `/api/ledger`): every quota count that changed, and every ledger count added, go to the
//! [`book::Book`] in one transaction — the `state.path`
//! file when there is one (durable when the transaction returns), else memory. A process
//! killed outright loses at most the last second of counts: admissions uncounted, which only
//! ever favours the customer. At start, the quota counts kept are put back on the keys'
//! meters.
//!
//! The same tick keeps the calendar ([`crate::metering::Calendar`]) at the wall clock, every
//! 100 ms, and sets `tollgate_quota_exhausted_keys`.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`Keeper`]: a pass, the copy at `state.path`, the rows read |
//! | `start.rs` | the keeper opened: the book, the quota counts kept put back, the fleet's read |
//! | `kept.rs` | what the keeper remembers between passes |
//! | `columns.rs` | the ledger's columns, a meter's counts by name, a row's plan and partner |
//! | `book.rs` | the book: rows by day and key, in redb or memory |
//! | `fleet.rs`, `quotas.rs`, `quota_round.rs` | with `cluster`: the counts that ride each tick to Redis (the ledger's, the quotas' protocol, each round's quota commands and answers) |
//! | `resend.rs` | with `cluster`: a round's commands and what each answer is for, and the calls that add counts, sent again until a replica confirms them, applied once |
//! | `tick.rs` | the background service |

pub(crate) mod book;
mod columns;
mod fleet;
mod kept;
mod quota_round;
mod quotas;
mod resend;
mod start;
mod tick;

pub(crate) use columns::shown_columns;
use columns::{named, who};
use kept::{stash, Kept, DROP_EVERY};
pub(crate) use tick::KeeperTick;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::Period;
use crate::metering::{day_of, PeriodAt, DAY_MS};
use crate::runtime::live::{LivePolicy, Snapshot};
use crate::state::StateFile;
use crate::sync::Locked;
use book::{Book, BookError, Delta, Row};

/// The calendar as a pass reads it: today's UTC day number, and the ids of the day's and
/// the month's periods.
struct Today {
    today: u32,
    day_id: u32,
    month_id: u32,
}

impl Today {
    fn of(snap: &Snapshot) -> Self {
        let now_ms = snap.policy.metering.calendar.now_ms();
        Self {
            today: day_of(now_ms),
            day_id: PeriodAt::of(Period::Day, now_ms).id,
            month_id: PeriodAt::of(Period::Month, now_ms).id,
        }
    }
}

/// Keeps the meters' counts in the book (see the module's docs).
pub(crate) struct Keeper {
    live: Arc<LivePolicy>,
    book: Book,
    /// With `cluster`: the counts go to Redis with each tick's heartbeat, and the ledger is
    /// read from there.
    fleet: Option<fleet::Fleet>,
    kept: Mutex<Kept>,
    /// The `state.path` file (the book's, or the overrides' copy with `cluster`): probed each
    /// pass while its disk fails.
    file: Option<Arc<StateFile>>,
}

impl Keeper {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.locked()
    }

    /// The meters (places in `kept.meters`) this pass visits, in order: every meter changed
    /// since the last pass ([`crate::metering::Metering::touched`]), and the watched ones.
    /// A pass's work so follows the keys in use, not every key ever metered.
    fn visits(&self, kept: &mut Kept) -> Vec<usize> {
        let snap = self.live.load();
        let mut visit = std::mem::take(&mut kept.watch);
        for state in snap.policy.metering.take_changed() {
            let at = kept.hold(state, (0, 0));
            visit.insert(at);
        }
        visit.into_iter().collect()
    }

    /// One pass: keep what changed since the last. Serialized (the tick and `/api/ledger`).
    pub(crate) fn keep(&self) -> Result<(), BookError> {
        let mut kept = self.lock();
        let snap = self.live.load();
        let Today {
            today,
            day_id,
            month_id,
        } = Today::of(&snap);
        if self.fleet.is_some() {
            // The counts ride on the budgets' exchange ([`fleet`]), which watches the meters
            // over their quota; here the gauge, and this replica's copy of the counts.
            let n = kept
                .watch
                .iter()
                .filter_map(|&at| kept.meters[at].0.meter_cell().get())
                .filter(|m| m.exhausted_in(day_id, month_id))
                .count();
            self.live.metrics().set_quota_exhausted_keys(n);
            return self.keep_copy(&mut kept);
        }
        let visit = self.visits(&mut kept);
        let mut quotas = Vec::new();
        let mut deltas = std::mem::take(&mut kept.unsent);
        let mut over = Vec::new();
        for &at in &visit {
            let (state, last) = &kept.meters[at];
            let Some(m) = state.meter_cell().get() else {
                continue;
            };
            let word = m.quota_word();
            if word != *last {
                quotas.push((m.name.as_str().to_string(), word.0, word.1));
            }
            if m.exhausted_in(day_id, month_id) {
                over.push(at);
            }
            for (day, counts) in m.take(today) {
                if let Some(counts) = counts {
                    let (plan, partner) = who(&snap, m.who(), m.name.as_str());
                    deltas.push(Delta {
                        day,
                        key: m.name.as_str().to_string(),
                        plan,
                        partner,
                        counts: named(&counts),
                    });
                }
            }
        }
        let retention = snap.policy.config.ledger.map(|l| l.retention_days);
        let keep_from = retention
            .filter(|_| kept.pruned != today)
            .map(|days| today.saturating_sub(days - 1));
        let exhausted = over.len();
        kept.watch.extend(over);
        if quotas.is_empty() && deltas.is_empty() && keep_from.is_none() {
            self.live.metrics().set_quota_exhausted_keys(exhausted);
            return Ok(());
        }
        match self.book.write(&quotas, &deltas, keep_from) {
            Ok(()) => {
                let changed: HashMap<&str, (u32, u64)> = quotas
                    .iter()
                    .map(|(k, id, n)| (k.as_str(), (*id, *n)))
                    .collect();
                for &at in &visit {
                    let (state, last) = &mut kept.meters[at];
                    if let Some(w) = state
                        .meter_cell()
                        .get()
                        .and_then(|m| changed.get(m.name.as_str()))
                    {
                        *last = *w;
                    }
                }
                if keep_from.is_some() {
                    kept.pruned = today;
                }
                // Meters no policy holds any more (keys gone from the config) are dropped
                // once kept; looked for once a minute.
                kept.since_drop += 1;
                if kept.since_drop >= DROP_EVERY {
                    kept.since_drop = 0;
                    kept.drop_unheld();
                }
                self.live.metrics().set_quota_exhausted_keys(exhausted);
                Ok(())
            }
            Err(e) => {
                // Not kept: the ledger counts wait for the next pass, and the quota counts
                // are sent again by it (their meters are visited whether changed or not).
                stash(&mut kept.unsent, deltas);
                kept.watch.extend(visit);
                Err(e)
            }
        }
    }

    /// With `cluster` and `state.path`: keep the counts the fleet answered since the last pass
    /// (a replica restarted while Redis is down decides on them).
    fn keep_copy(&self, kept: &mut Kept) -> Result<(), BookError> {
        if matches!(self.book, Book::Memory(_)) || kept.to_disk.is_empty() {
            return Ok(());
        }
        let ats = std::mem::take(&mut kept.to_disk);
        let quotas: Vec<(String, u32, u64)> = ats
            .iter()
            .filter_map(|&at| {
                let m = kept.meters.get(at)?.0.meter_cell().get()?;
                let (id, n) = m.quota_word();
                Some((m.name.as_str().to_string(), id, n))
            })
            .collect();
        let written = self.book.write(&quotas, &[], None);
        if written.is_err() {
            kept.to_disk.extend(ats);
        }
        written
    }

    /// The rows of days `from..=to` (of the key `key`): with every count made here until
    /// now, or (with `cluster`) every count the fleet has sent, each replica's within its
    /// sync interval.
    pub(crate) async fn rows(
        &self,
        from: u32,
        to: u32,
        key: Option<&str>,
    ) -> Result<Vec<(u32, String, Row)>, BookError> {
        if let Some(f) = &self.fleet {
            return f.rows(from, to, key).await;
        }
        self.keep()?;
        self.book.rows(from, to, key)
    }

    /// Today, as the metering's calendar has it (a UTC day number).
    pub(crate) fn today(&self) -> u32 {
        day_of(self.live.load().policy.metering.calendar.now_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::metering::Column;
    use tollgate_core::testing::TestConfig;

    /// A keeper's pass visits the meters changed since the last pass, each once however
    /// often it changed, and the meters over their quota; not every meter ever used.
    #[test]
    fn a_pass_visits_what_changed_and_what_is_over_its_quota() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.yaml");
        TestConfig::new().write(&path);
        let live = Arc::new(LivePolicy::new(Config::load(&path).unwrap(), Arc::default()).unwrap());
        let keeper = Keeper::open(None, Arc::clone(&live)).unwrap();
        let snap = live.load();
        let p = &snap.policy;
        let now_ms = p.metering.calendar.now_ms();
        let day = day_of(now_ms);
        let count = |i: usize| {
            let (_, e) = p.keys.iter().nth(i).unwrap();
            p.metering
                .meter(&e.rate, &e.name)
                .count(day, Column::Upstream2xx, 1);
            p.metering.touched(&e.rate);
        };
        let keys = p.keys.iter().count();
        assert!(keys >= 3);
        for i in 0..keys {
            count(i);
        }
        let visits = |k: &Keeper| k.visits(&mut k.lock());
        assert_eq!(visits(&keeper).len(), keys, "every meter changed");
        assert!(visits(&keeper).is_empty(), "nothing changed since");
        count(1);
        count(1);
        count(2);
        assert_eq!(visits(&keeper), vec![1, 2], "each changed meter once");

        // A key refused for its quota is visited by every pass until it is not over it.
        let (_, e) = p.keys.iter().next().unwrap();
        let m = p.metering.meter(&e.rate, &e.name);
        let period = p.metering.calendar.period(Period::Day, now_ms);
        assert!(m.charge(1, &period).is_ok());
        assert!(m.charge(1, &period).is_err());
        p.metering.touched(&e.rate);
        keeper.keep().unwrap();
        assert!(keeper.lock().watch.contains(&0));
        keeper.keep().unwrap();
        assert!(
            keeper.lock().watch.contains(&0),
            "still over: still watched"
        );
        // Every count reaches the book once: the visits above only listed the meters (a
        // pass takes the counts of what it visits); counted again, every meter is visited
        // and gives all it holds.
        for i in 0..keys {
            count(i);
        }
        keeper.keep().unwrap();
        let rows = keeper.book.rows(day, day, None).unwrap();
        let total: u64 = rows.iter().map(|(_, _, r)| r.counts["upstream_2xx"]).sum();
        assert_eq!(total, 2 * keys as u64 + 3);
    }
}
