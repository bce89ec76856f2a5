//! A model of the store's two scripts, in Rust, for the simulation (`sim.rs`) and for the
//! runtime's test that runs the real scripts on a real Redis side by side with it: the same
//! arithmetic, the same expiries, a clock passed in.

use std::collections::HashMap;

use super::{Call, Reply};
use crate::digest::Digest;

/// One budget entry: the fleet's TAT (µs of the store's clock) and when it expires (ms).
#[derive(Debug, Default, Clone, Copy)]
struct Entry {
    tat: u64,
    expires_ms: u64,
}

/// The store, as the scripts see it.
#[derive(Debug, Default)]
pub struct Model {
    budgets: HashMap<Digest, Entry>,
    /// Replica → its last heartbeat (ms).
    fleet: HashMap<u64, u64>,
    fleet_expires_ms: u64,
}

impl Model {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The budget script: `tat = max(tat, now, now + floor) + debt × T`; `tat = max(now, tat −
    /// give × T)`; grant `g = min(want, ⌊(now + early + L·T − tat) / T⌋)` and `tat += g × T`; the
    /// entry expires `horizon_ms` after its TAT.
    pub fn budget(&mut self, now_us: u64, call: &Call, horizon_ms: u64) -> Reply {
        let now_ms = now_us / 1000;
        let e = self.budgets.entry(call.id).or_default();
        if e.expires_ms != 0 && now_ms >= e.expires_ms {
            *e = Entry::default();
        }
        let t = call.interval_us.max(1);
        let mut tat = e.tat.max(now_us).max(now_us + call.floor_us);
        tat += call.debt * t;
        tat = tat.saturating_sub(call.give * t).max(now_us);
        let room = (now_us + call.early_us + call.limit * t).saturating_sub(tat) / t;
        let granted = call.want.min(room);
        tat += granted * t;
        e.tat = tat;
        let ahead = tat - now_us;
        e.expires_ms = now_ms + ahead.div_ceil(1000) + horizon_ms;
        Reply {
            granted,
            ahead_us: ahead,
        }
    }

    /// The heartbeat script: note the replica, forget those not seen within `horizon_ms`, and
    /// count the rest.
    pub fn heartbeat(&mut self, now_us: u64, replica: u64, horizon_ms: u64) -> u32 {
        let now_ms = now_us / 1000;
        if self.fleet_expires_ms != 0 && now_ms >= self.fleet_expires_ms {
            self.fleet.clear();
        }
        self.fleet.insert(replica, now_ms);
        self.fleet.retain(|_, at| *at + horizon_ms >= now_ms);
        self.fleet_expires_ms = now_ms + 2 * horizon_ms;
        self.fleet.len() as u32
    }

    /// The store's TAT for a key, ahead of `now_us` (0 when idle or absent).
    pub fn ahead(&self, id: &Digest, now_us: u64) -> u64 {
        self.budgets
            .get(id)
            .filter(|e| now_us / 1000 < e.expires_ms)
            .map_or(0, |e| e.tat.saturating_sub(now_us))
    }
}
