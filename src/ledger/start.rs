//! The keeper opened: the book chosen (the `state.path` file, else memory), the quota counts
//! kept put back on the keys' meters, and with `cluster` the fleet's counts read before the
//! gateway serves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::book::{Book, BookError};
use super::{fleet, Keeper, Today};
use crate::metering::Held;
use crate::runtime::live::LivePolicy;
use crate::state::StateFile;

impl Keeper {
    /// A keeper writing to `file` (`state.path`), or to memory; the quota counts it holds are
    /// put back on the keys of the config in force. With `cluster`, the counts go to Redis,
    /// the quota counts are kept at `state.path` too (this replica's own, for a restart while
    /// Redis is down), and the fleet's counts are read before the gateway serves: a replica
    /// that starts decides on the fleet's count or its own, never from zero.
    pub(crate) fn open(
        file: Option<Arc<StateFile>>,
        live: Arc<LivePolicy>,
    ) -> Result<Self, BookError> {
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
        let now_ms = policy.metering.calendar.now_ms();
        let mut kept = self.lock();
        for (name, id, n) in rows {
            if let Some(&k) = by_name.get(name.as_str()) {
                let e = policy.keys.get(k);
                let m = policy.metering.meter(&e.rate, &e.name);
                m.restore(id, n);
                // What was restored is what is kept: not written again until it changes.
                let at = kept.hold(Arc::clone(&e.rate) as Held, m.quota_word());
                // Over its quota already: marked and watched, so that the gauge counts it
                // from the first pass, before any request of it.
                if let Some((spec, _)) = policy.quota_of(k, e.credential()) {
                    let period = policy.metering.calendar.period(spec.per, now_ms);
                    if m.mark_if_spent(spec.requests, &period) {
                        kept.watch.insert(at);
                    }
                }
            }
        }
        Ok(())
    }
}
