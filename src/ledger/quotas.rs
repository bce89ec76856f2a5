//! Quota counts shared by the fleet: the commands each round sends for them, what their
//! answers do to the meters, and the fleet's counts read at start. The decision's side (when a
//! replica charges on its own view, when a request waits for a reservation) is the core's
//! `metering::fleet`; this is how the store's word reaches the meters.
//!
//! Per key with something to say, in the period of its count:
//!
//! | the key | command | its answer |
//! |---|---|---|
//! | charged or given back here since the last report, or over its quota | `report.lua`: the field takes the charges (up to 500 keys a call) | the fleet's count: the view |
//! | requests wait for the fleet's word | `reserve.lua`: the charges (the field at least this replica's view of it), then what the quota has room for of the requests waiting, in one step | the count, and the requests reserved for this replica (*grants*) |
//! | the period's hash was found missing (and at start) | `restore.lua`: each field the larger of its count and this replica's | the counts |
//!
//! **A store that lost the counts.** Each replica keeps a mark of its own in every period's
//! hash it reports in (`~<replica id>`, set with `HSETNX` at the end of each round, for the
//! periods it reported in and those it holds counts of, whether it reported this round or
//! not). A mark of its own found missing where it had set one says the hash was lost
//! (restarted empty, flushed, failed over to a replica without it, evicted): the round's
//! counts are not taken as the fleet's (they may be what is left of it), the next tick puts
//! back every count this replica holds for the period (the larger count wins) and logs at
//! `warn` when that raised any. A reservation is granted only where the replica's mark was
//! there before it (`reserve.lua` looks): none from a hash just lost or just made. Every
//! replica finds its own mark missing, so every replica puts back what it holds, within a
//! tick. The period's expiry is set once per process (and again after a loss), so that a
//! round costs the commands it did before marks: a mark per period in place of an expiry per
//! period.
//!
//! Grants not used within a whole interval go back with the next report.
//!
//! Counts sent again add nothing: see [`super::resend`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use redis::Cmd;

use super::resend::{Laid, Resend, Sent};
use super::{Keeper, DAY_MS};
use crate::config::{Cluster, Period};
use crate::metering::{PeriodAt, MONTH_BIT};

/// Fields per `restore.lua` call.
pub(super) const RESTORE_BATCH: usize = 500;

/// Keys per `report.lua` call (Redis runs a script alone: a few hundred keep it short).
pub(super) const REPORT_BATCH: usize = 500;

/// What the quota rounds remember from one round to the next.
pub(super) struct Rounds {
    /// This process's mark in a period's hash (no key's name starts with `~`).
    mark: String,
    /// The field of a hash holding the highest call number of this process applied there.
    applied: String,
    /// The number of the last call that adds counts.
    number: u64,
    /// Periods whose hash holds this process's mark (it set it, and found it since).
    pub(super) marked: BTreeSet<u32>,
    /// Periods whose hash this process has set to expire (again after a missing mark).
    pub(super) expiring: HashSet<u32>,
    /// Periods whose counts go back at the next tick (the larger count wins): at start, and
    /// after a mark was found missing.
    pub(super) restore: BTreeSet<u32>,
    /// Meters (places in the keeper's list) granted reservations in this interval, and in
    /// the one before: what the latter did not use goes back at this tick.
    pub(super) granted: [Vec<usize>; 2],
    /// The calls that add counts and wait to be confirmed.
    pub(super) resend: Resend,
}

/// A call that adds counts: the field of this process and the call's number.
pub(super) struct Numbered<'a> {
    pub(super) field: &'a str,
    pub(super) number: u64,
}

/// One `report.lua` call, with the meters and the counts it carries, and its number.
pub(super) type ReportCall = (Cmd, Vec<(usize, u64)>, u64);

/// The quota commands of one round, before they are laid out in order.
#[derive(Default)]
pub(super) struct Round {
    /// This process's mark (what a reservation looks for).
    pub(super) mark: String,
    /// Its field of call numbers, and the number of the last call made.
    pub(super) applied: String,
    pub(super) number: u64,
    /// Periods reported (each gets a mark first, and an expiry when due).
    pub(super) periods: BTreeSet<u32>,
    /// Per period, its `report.lua` calls, each with the meters and counts it carries.
    pub(super) reports: BTreeMap<u32, Vec<ReportCall>>,
    /// Reservations, each with the call sent again in its place when unconfirmed (the same
    /// number, no request wanted: a master that lost it gets the charges, not a second
    /// grant), and its number.
    pub(super) counts: Vec<(Cmd, Sent, Cmd, u64)>,
    pub(super) restores: Vec<(Cmd, Sent)>,
}

impl Round {
    /// The next call that adds counts.
    pub(super) fn numbered(&mut self) -> Numbered<'_> {
        self.number += 1;
        Numbered {
            field: &self.applied,
            number: self.number,
        }
    }
}

/// The name of period `id`'s hash.
pub(super) fn quota_key(cfg: &Cluster, id: u32) -> String {
    format!("{}:{{meters}}:q:{id}", cfg.key_prefix)
}

impl Rounds {
    /// The rounds of a process whose mark is `~<replica>`.
    pub(super) fn new(replica: &str) -> Self {
        Self {
            mark: format!("~{replica}"),
            applied: format!("~{replica}#"),
            number: 0,
            marked: BTreeSet::new(),
            expiring: HashSet::new(),
            restore: BTreeSet::new(),
            granted: [Vec::new(), Vec::new()],
            resend: Resend::default(),
        }
    }

    /// Period `id`'s counts go back at the next tick: at start (what this replica holds,
    /// from `state.path`, may be more than the store has), and when a restore failed.
    pub(super) fn restore(&mut self, id: u32) {
        self.restore.insert(id);
    }

    /// A round of this process.
    pub(super) fn round(&self) -> Round {
        Round {
            mark: self.mark.clone(),
            applied: self.applied.clone(),
            number: self.number,
            ..Round::default()
        }
    }

    /// A new interval: the meters whose grants were not used for a whole interval.
    pub(super) fn unused_grants(&mut self) -> Vec<usize> {
        let old = std::mem::take(&mut self.granted[1]);
        self.granted[1] = std::mem::take(&mut self.granted[0]);
        old
    }

    /// The counts, the restores, then the marks (of the periods reported or put back, and at a
    /// tick of those this process holds counts of, while they are `current`), and the
    /// expiries due, in the order their answers are read. Nothing when there is nothing to
    /// report (an urgent round then carries no quota command at all).
    pub(super) fn lay_out(
        &mut self,
        cfg: &Cluster,
        round: Round,
        current: Option<[u32; 2]>,
        now_ms: u64,
        laid: &mut Laid,
    ) {
        self.number = round.number;
        let mut periods = round.periods;
        periods.extend(round.restores.iter().filter_map(|(_, s)| match s {
            Sent::Restore { id, .. } => Some(*id),
            _ => None,
        }));
        if let Some(current) = current {
            periods.extend(self.marked.iter().filter(|id| current.contains(id)));
            self.marked
                .retain(|id| current.contains(id) || periods.contains(id));
        }
        // In the order of their numbers: a hash applies a call only above the last it took.
        let mut adding: Vec<(u64, Cmd, Sent, Cmd)> = round
            .reports
            .into_iter()
            .flat_map(|(id, calls)| {
                calls
                    .into_iter()
                    .map(move |(c, entries, n)| (n, c.clone(), Sent::Report { id, entries }, c))
            })
            .chain(
                round
                    .counts
                    .into_iter()
                    .map(|(c, s, twin, n)| (n, c, s, twin)),
            )
            .collect();
        adding.sort_unstable_by_key(|a| a.0);
        for (_, c, s, twin) in adding {
            laid.adding(c, s, twin);
        }
        for (c, s) in round.restores {
            laid.push(c, s);
        }
        for &id in &periods {
            let mut c = redis::cmd("HSETNX");
            c.arg(quota_key(cfg, id)).arg(&self.mark).arg("1");
            laid.push(c, Sent::Mark { id });
        }
        for id in periods {
            if self.expiring.contains(&id) {
                continue;
            }
            // A day after the period's end (any period id names its own end).
            let per = if id & MONTH_BIT != 0 {
                Period::Month
            } else {
                Period::Day
            };
            let end = period_end(per, id).unwrap_or(now_ms + 62 * DAY_MS);
            let mut c = redis::cmd("PEXPIREAT");
            c.arg(quota_key(cfg, id)).arg(end + DAY_MS);
            laid.push(c, Sent::Expire { id });
        }
    }
}

impl Keeper {
    /// Read the fleet's counts of the periods of now (at start, before serving), and put them
    /// on the keys' meters (the larger of them and what this replica kept wins); with them,
    /// every key's view is known. Bounded by the timeout (at least 500 ms); a store that does
    /// not answer leaves the views to the first exchanges.
    pub(super) fn load_fleet_counts(&self, cfg: &Cluster) {
        let snap = self.live.load();
        let now_ms = snap.policy.metering.calendar.now_ms();
        let ids = [
            PeriodAt::of(Period::Day, now_ms).id,
            PeriodAt::of(Period::Month, now_ms).id,
        ];
        let keys: Vec<String> = ids.iter().map(|&id| quota_key(cfg, id)).collect();
        let cfg2 = cfg.clone();
        let read = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let client = crate::fleet_store::connect(&cfg2).await.ok()?;
                let mut pipe = redis::pipe();
                for k in &keys {
                    pipe.cmd("HGETALL").arg(k);
                }
                let deadline = tokio::time::Instant::now()
                    + cfg2.timeout.max(std::time::Duration::from_millis(500));
                let read: Vec<HashMap<String, u64>> =
                    crate::fleet_store::within(deadline, &cfg2.redis_url, client.pipeline(&pipe))
                        .await
                        .ok()?;
                Some(read)
            })
        });
        let Some(periods) = read.join().ok().flatten() else {
            tracing::warn!(target: "tollgate::ledger", "the fleet's quota counts were not read at start (the store did not answer): the first exchanges bring them");
            return;
        };
        let policy = &snap.policy;
        let by_name: HashMap<&str, u32> = if periods.iter().any(|p| !p.is_empty()) {
            policy
                .keys
                .iter()
                .map(|(k, e)| (e.name.as_str(), k))
                .collect()
        } else {
            HashMap::new()
        };
        let mut kept = self.lock();
        for (&id, counts) in ids.iter().zip(&periods) {
            for (name, &n) in counts {
                let Some(&k) = by_name.get(name.as_str()) else {
                    continue;
                };
                let e = policy.keys.get(k);
                let m = policy.metering.meter(&e.rate, &e.name);
                m.restore(id, n);
                kept.hold(
                    std::sync::Arc::clone(&e.rate) as crate::metering::Held,
                    m.quota_word(),
                );
            }
        }
        policy.metering.fleet.loaded(now_ms);
    }
}

/// The end (ms since the Unix epoch) of the period whose id is `id`.
pub(super) fn period_end(per: Period, id: u32) -> Option<u64> {
    let n = u64::from(id & (MONTH_BIT - 1));
    match per {
        Period::Day => Some((n + 1) * DAY_MS),
        Period::Month => {
            let (y, m) = (1970 + n / 12, (n % 12) as u32 + 1);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            let days = crate::metering::days_from_civil(ny as i64, nm, 1);
            u64::try_from(days).ok().map(|d| d * DAY_MS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_id_names_its_end() {
        for ms in [
            0u64,
            1_796_083_199_999,
            1_796_083_200_000,
            1_769_817_600_000,
        ] {
            for per in [Period::Day, Period::Month] {
                let p = PeriodAt::of(per, ms);
                assert_eq!(period_end(per, p.id), Some(p.end_ms), "{per:?} {ms}");
            }
        }
    }

    fn cfg() -> Cluster {
        Cluster {
            redis_url: "redis://127.0.0.1:1/0".into(),
            key_prefix: "t".into(),
            sync_interval: std::time::Duration::from_millis(20),
            timeout: std::time::Duration::from_millis(100),
        }
    }

    /// A command's arguments, as text.
    fn args(c: &Cmd) -> Vec<String> {
        c.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<other>".into(),
            })
            .collect()
    }

    #[test]
    fn calls_that_add_counts_go_in_the_order_of_their_numbers_and_rounds_go_on_counting() {
        let mut rounds = Rounds::new("r1");
        let mut round = rounds.round();
        // A reservation numbered before a report of the same period: sent first.
        let first = round.numbered().number;
        let reserve = (
            redis::cmd("EVAL"),
            Sent::Reserve {
                at: 0,
                id: 7,
                count: 3,
            },
            redis::cmd("TWIN"),
            first,
        );
        round.counts.push(reserve);
        let second = round.numbered().number;
        let mut report = redis::cmd("EVAL");
        report.arg("report").arg(1).arg("k").arg("~r1#").arg(second);
        round
            .reports
            .entry(7)
            .or_default()
            .push((report, vec![(1, 5)], second));
        round.periods.insert(7);
        let mut laid = Laid::default();
        rounds.lay_out(&cfg(), round, None, 0, &mut laid);
        let Laid { cmds, sent, again } = laid;
        assert!(matches!(sent[0], Sent::Reserve { at: 0, .. }));
        assert!(matches!(sent[1], Sent::Report { .. }));
        assert!(matches!(sent[2], Sent::Mark { id: 7 }));
        // What is sent again: the reservation's twin (no request wanted), then the report.
        assert_eq!(args(&again[0].0), ["TWIN"]);
        assert_eq!(args(&again[1].0), args(&cmds[1]));
        assert_eq!(again.len(), 2);
        // The next round's numbers go on from the last.
        let mut next = rounds.round();
        assert_eq!(next.numbered().number, second + 1);
        assert_eq!((first, second), (1, 2));
    }
}
