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

pub mod book;
mod fleet;
mod quotas;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::config::Period;
use crate::metering::{self, day_of, Column, Held, PeriodAt, COLUMNS, DAY_MS, UPSTREAM_COLUMNS};
use crate::policy::Code;
use crate::runtime::live::{LivePolicy, Snapshot};
use crate::state::StateFile;
use book::{Book, BookError, Delta, Row};

/// The ledger's columns after the upstream ones: the refusal codes it shows.
pub fn code_columns() -> impl Iterator<Item = Code> {
    Code::ALL.iter().copied().filter(|&c| Column::shown(c))
}

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

/// What the keeper remembers between passes.
#[derive(Default)]
struct Kept {
    /// Every meter allocated, with the quota word last kept.
    meters: Vec<(Held, (u32, u64))>,
    /// Where each meter is in `meters`, by the address of its rate state.
    at: HashMap<usize, usize>,
    /// Meters (places in `meters`) visited by the next pass whether changed or not: those
    /// over their quota (a give-back elsewhere must be seen, and the gauge counts them), and
    /// those whose quota count was not kept (it is sent again).
    watch: BTreeSet<usize>,
    /// Ledger counts taken from the meters that the store did not take (it failed): sent
    /// again with the next pass, one entry per day and key however long the store fails.
    unsent: Vec<Delta>,
    /// The last day whose old rows were dropped.
    pruned: u32,
    /// Passes since meters no policy holds were last looked for (a look reads every meter:
    /// once a minute, not every pass).
    since_drop: u32,
    /// With `cluster` and `state.path`: meters whose count the fleet answered since the last
    /// pass, to keep at `state.path` (what a restart decides on while Redis is down).
    to_disk: BTreeSet<usize>,
}

/// Passes (seconds) between two looks for meters no policy holds any more.
const DROP_EVERY: u32 = 60;

/// Keeps the meters' counts in the book (see the module's docs).
pub struct Keeper {
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
    /// A keeper writing to `file` (`state.path`), or to memory; the quota counts it holds are
    /// put back on the keys of the config in force. With `cluster`, the counts go to Redis,
    /// the quota counts are kept at `state.path` too (this replica's own, for a restart while
    /// Redis is down), and the fleet's counts are read before the gateway serves: a replica
    /// that starts decides on the fleet's count or its own, never from zero.
    pub fn open(file: Option<Arc<StateFile>>, live: Arc<LivePolicy>) -> Result<Self, BookError> {
        let snap = live.load();
        let cluster = snap.policy.config.process.cluster.clone();
        let window_ms = u64::from(snap.policy.config.limits.window.get()) * 1000;
        let book = match &file {
            Some(file) => Book::Disk(Arc::clone(file)),
            None => Book::Memory(Mutex::default()),
        };
        let keeper = Self {
            live,
            book,
            fleet: cluster.clone().map(fleet::Fleet::new),
            kept: Mutex::default(),
            file,
        };
        keeper.restore()?;
        if let (Some(c), Some(fleet)) = (&cluster, &keeper.fleet) {
            let metering = &snap.policy.metering;
            metering.fleet.enable(
                window_ms,
                c.sync_interval.as_millis() as u64,
                c.timeout.as_millis() as u64,
            );
            keeper.load_fleet_counts(c);
            let Today {
                day_id, month_id, ..
            } = Today::of(&snap);
            let mut rounds = fleet.rounds();
            rounds.restore(day_id);
            rounds.restore(month_id);
        }
        Ok(keeper)
    }

    fn restore(&self) -> Result<(), BookError> {
        let rows = self.book.quotas()?;
        if rows.is_empty() {
            return Ok(());
        }
        let snap = self.live.load();
        let policy = &snap.policy;
        let by_name: HashMap<&str, u32> = policy
            .keys
            .iter()
            .map(|(k, e)| (e.name.as_str(), k))
            .collect();
        let mut kept = self.lock();
        for (name, id, n) in rows {
            if let Some(&k) = by_name.get(name.as_str()) {
                let e = policy.keys.get(k);
                let m = policy.metering.meter(&e.rate, &e.name);
                m.restore(id, n);
                // What was restored is what is kept: not written again until it changes.
                kept.hold(Arc::clone(&e.rate) as Held, m.quota_word());
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
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
    pub fn keep(&self) -> Result<(), BookError> {
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
    pub async fn rows(
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
    pub fn today(&self) -> u32 {
        day_of(self.live.load().policy.metering.calendar.now_ms())
    }
}

impl Kept {
    /// Hold the meter of `state` (with the quota word `word` kept, if it is new: nothing for
    /// a meter first seen changed, the book's for one restored): its place in `meters`.
    fn hold(&mut self, state: Held, word: (u32, u64)) -> usize {
        let key = Arc::as_ptr(&state) as *const () as usize;
        *self.at.entry(key).or_insert_with(|| {
            self.meters.push((state, word));
            self.meters.len() - 1
        })
    }

    /// Drop the meters no policy holds any more (keys gone from the config), their counts
    /// kept: the places of the others move, `at` and `watch` with them.
    fn drop_unheld(&mut self) {
        // Read once: a reload may let go of a rate state meanwhile.
        let held: Vec<bool> = self
            .meters
            .iter()
            .map(|(s, _)| Arc::strong_count(s) > 1)
            .collect();
        if held.iter().all(|&h| h) {
            return;
        }
        let mut moved = Vec::with_capacity(held.len());
        let mut n = 0;
        for &h in &held {
            moved.push(h.then(|| {
                n += 1;
                n - 1
            }));
        }
        let mut i = 0;
        self.meters.retain(|_| {
            i += 1;
            held[i - 1]
        });
        self.watch = self.watch.iter().filter_map(|&at| moved[at]).collect();
        self.at = self
            .meters
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (Arc::as_ptr(s) as *const () as usize, i))
            .collect();
    }
}

/// Keep `deltas` for the next pass, merged by day and key (so a long failure holds one entry
/// per day and active key, not one per pass).
fn stash(unsent: &mut Vec<Delta>, deltas: Vec<Delta>) {
    let mut at: HashMap<(u32, String), usize> = unsent
        .iter()
        .enumerate()
        .map(|(i, d)| ((d.day, d.key.clone()), i))
        .collect();
    for d in deltas {
        match at.get(&(d.day, d.key.clone())) {
            Some(&i) => {
                let into = &mut unsent[i];
                into.plan = d.plan;
                into.partner = d.partner;
                for (col, n) in d.counts {
                    match into.counts.iter_mut().find(|(c, _)| *c == col) {
                        Some((_, m)) => *m += n,
                        None => into.counts.push((col, n)),
                    }
                }
            }
            None => {
                at.insert((d.day, d.key.clone()), unsent.len());
                unsent.push(d);
            }
        }
    }
}

/// The counts that are not zero, by column name.
fn named(counts: &[u32; COLUMNS]) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    for (i, &n) in counts.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let name = match i {
            0..=3 => UPSTREAM_COLUMNS[i],
            _ => Code::ALL[i - 4].as_str(),
        };
        out.push((name, u64::from(n)));
    }
    out
}

/// The plan and partner names of a meter's key, as it was counted ([`metering::who`]).
fn who(snap: &Snapshot, w: u64, name: &str) -> (String, Option<String>) {
    let p = &snap.policy;
    let (generation, plan, partner, partner_key) = metering::who_parts(w);
    if u64::from(generation) == snap.generation & 0xFFFF_FFFF {
        let plan = match (partner_key, plan) {
            (true, _) => "partner".to_string(),
            (false, Some(i)) => p
                .config
                .plans
                .get(i)
                .map_or("none", |x| &x.name)
                .to_string(),
            (false, None) => "none".to_string(),
        };
        let partner = partner.and_then(|i| p.config.partners.get(i).map(|x| x.name.clone()));
        return (plan, partner);
    }
    // Counted under an earlier config (a reload since): as the config in force has the key.
    match p.keys.find_by_name(name) {
        Some(k) => {
            let e = p.keys.get(k);
            match e.credential() {
                crate::policy::keys::Credential::Customer { plan, partner, .. } => (
                    p.config.plans[plan].name.clone(),
                    partner.map(|i| p.config.partners[i].name.clone()),
                ),
                crate::policy::keys::Credential::Partner { partner } => (
                    "partner".to_string(),
                    Some(p.config.partners[partner].name.clone()),
                ),
            }
        }
        None => ("none".to_string(), None),
    }
}

/// The keeper's tick: the calendar every 100 ms while anything is metered (every second
/// otherwise: a quota set live on a config without any is a second late at most), a pass
/// every second, a last pass at shutdown.
pub struct KeeperTick(pub Arc<Keeper>);

#[async_trait]
impl BackgroundService for KeeperTick {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut last_pass = std::time::Instant::now();
        loop {
            let live = &self.0.live;
            let snap = live.load();
            snap.policy.metering.calendar.set(crate::clock::wall_ms());
            if last_pass.elapsed() >= Duration::from_secs(1) {
                last_pass = std::time::Instant::now();
                self.pass();
            }
            let metered = snap.policy.meters()
                || live.with_overrides(|set| set.values().any(|o| o.quota.is_some()));
            let step = Duration::from_millis(if metered { 100 } else { 1000 });
            drop(snap);
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = shutdown.changed() => break,
            }
        }
        self.pass();
    }
}

impl KeeperTick {
    fn pass(&self) {
        if let Some(file) = &self.0.file {
            file.probe();
        }
        if let Err(e) = self.0.keep() {
            tracing::warn!(
                target: "tollgate::ledger",
                error = %e,
                "quota and ledger counts not kept; trying again in 1 s"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::metering::Column;
    use tollgate_core::testing::TestConfig;

    #[test]
    fn meters_no_policy_holds_are_dropped_and_the_places_move_with_them() {
        let mut states: Vec<Arc<crate::limit::RateState>> =
            (0..3).map(|_| Arc::default()).collect();
        let mut kept = Kept::default();
        for s in &states {
            kept.hold(Arc::clone(s) as Held, (0, 0));
        }
        kept.watch.extend([0, 2]);
        kept.drop_unheld();
        assert_eq!(kept.meters.len(), 3, "every one still held");
        let gone = Arc::as_ptr(&states[0]) as usize;
        let last = Arc::as_ptr(&states[2]) as usize;
        drop(states.remove(0));
        kept.drop_unheld();
        assert_eq!(kept.meters.len(), 2);
        assert!(!kept.at.contains_key(&gone));
        assert_eq!(kept.at[&last], 1);
        assert_eq!(kept.watch, BTreeSet::from([1]));
    }

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
        let keys = p.keys.iter().len();
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

    fn delta(day: u32, key: &str, counts: &[(&'static str, u64)]) -> Delta {
        Delta {
            day,
            key: key.into(),
            plan: "basic".into(),
            partner: None,
            counts: counts.to_vec(),
        }
    }

    #[test]
    fn counts_not_kept_wait_merged_by_day_and_key() {
        let mut unsent = Vec::new();
        for _ in 0..100 {
            stash(
                &mut unsent,
                vec![
                    delta(7, "a", &[("upstream_2xx", 2)]),
                    delta(7, "b", &[("rate_limited", 1)]),
                ],
            );
        }
        stash(&mut unsent, vec![delta(8, "a", &[("upstream_5xx", 1)])]);
        stash(&mut unsent, vec![delta(7, "a", &[("quota_exhausted", 3)])]);
        assert_eq!(unsent.len(), 3, "one entry per day and key");
        assert_eq!(
            unsent[0].counts,
            vec![("upstream_2xx", 200), ("quota_exhausted", 3)]
        );
        assert_eq!(unsent[1].counts, vec![("rate_limited", 100)]);
        assert_eq!((unsent[2].day, unsent[2].key.as_str()), (8, "a"));
    }

    #[test]
    fn every_count_has_a_column_name_the_ledger_shows_or_one_it_never_counts() {
        let mut counts = [0u32; COLUMNS];
        counts
            .iter_mut()
            .enumerate()
            .for_each(|(i, c)| *c = i as u32 + 1);
        let names = named(&counts);
        assert_eq!(names.len(), COLUMNS);
        let shown = crate::admin::ledger::header();
        for (name, _) in &names {
            let is_shown = shown.contains(name);
            let never_a_keys = matches!(
                *name,
                "unauthorized" | "upstream_unavailable" | "upstream_timeout"
            );
            assert!(is_shown != never_a_keys, "{name}");
        }
    }
}
