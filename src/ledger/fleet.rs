//! Quota and ledger counts shared by the fleet (`cluster`): they ride on each tick's
//! heartbeat, in the same pipeline ([`crate::shared::Rider`]), so sharing them costs no round
//! trip of its own.
//!
//! - A key's quota count for a period is one field of `<prefix>:{meters}:q:<period id>` (a
//!   hash, field = the key's name): each replica adds what it charged since its last
//!   exchange (`HINCRBY`, negative after give-backs) and gets the fleet's total back, which
//!   becomes its count, plus what it charged while the answer was on its way. A replica so
//!   admits past the quota at most what it charged within one sync interval (at most its
//!   window limit). A key over its quota is asked about every tick (`HINCRBY … 0`), so that a
//!   give-back elsewhere is seen.
//! - A day's ledger is `<prefix>:{meters}:l:<day>` (a hash, fields `<key name>:<column>` and
//!   `<key name>:plan` / `:partner`): each replica adds its counts; `/api/ledger` reads the
//!   days asked.
//!
//! Both expire: a quota hash a day after its period, a ledger hash `retention_days` after its
//! day. The hash tag `{meters}` puts every one in one slot of a Redis Cluster. An exchange that
//! fails puts the ledger counts back on their meters, and the quota counts are sent again with
//! the next (their total here has not moved): nothing counted is lost.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use redis::Value;

use super::book::{BookError, Delta, Row};
use super::{named, stash, who, Keeper, Today, DAY_MS};
use crate::config::{Cluster, Period};
use crate::redis::{Client, StoreError};
use crate::shared::Rider;

/// The fleet half of the keeper.
pub(super) struct Fleet {
    cfg: Cluster,
    /// For `/api/ledger`'s reads (the exchange has its own connection).
    client: tokio::sync::Mutex<Option<Client>>,
    /// What the exchange in flight carries, in command order.
    in_flight: Mutex<InFlight>,
}

#[derive(Default)]
struct InFlight {
    sent: Vec<Sent>,
    /// The ledger counts sent, to put back if the exchange fails.
    deltas: Vec<Delta>,
}

/// What one command of the exchange was for.
enum Sent {
    /// The quota count of the keeper's meter `at`, for period `id`, as it stood (`count`).
    Quota { at: usize, id: u32, count: u64 },
    /// A ledger count, a ledger name, or an expiry.
    Other,
}

impl Fleet {
    pub(super) fn new(cfg: Cluster) -> Self {
        Self {
            cfg,
            client: tokio::sync::Mutex::new(None),
            in_flight: Mutex::default(),
        }
    }

    fn quota_key(&self, id: u32) -> String {
        format!("{}:{{meters}}:q:{id}", self.cfg.key_prefix)
    }

    fn ledger_key(&self, day: u32) -> String {
        format!("{}:{{meters}}:l:{day}", self.cfg.key_prefix)
    }

    /// The ledger's rows of days `from..=to` (of the key `key`), as the fleet sent them.
    pub(super) async fn rows(
        &self,
        from: u32,
        to: u32,
        key: Option<&str>,
    ) -> Result<Vec<(u32, String, Row)>, BookError> {
        let fail = |e: StoreError| BookError(format!("the cluster store: {e}"));
        let mut guard = self.client.lock().await;
        if guard.is_none() {
            *guard = Some(crate::redis::connect(&self.cfg).await.map_err(fail)?);
        }
        let client = guard.as_ref().expect("connected above");
        let mut pipe = redis::pipe();
        for day in from..=to {
            pipe.cmd("HGETALL").arg(self.ledger_key(day));
        }
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let url = &self.cfg.redis_url;
        let days: Vec<Vec<(String, String)>> =
            match crate::redis::within(deadline, url, client.pipeline(&pipe)).await {
                Ok(d) => d,
                Err(e) => {
                    *guard = None;
                    return Err(fail(e));
                }
            };
        let mut out = Vec::new();
        for (day, fields) in (from..=to).zip(days) {
            let mut rows: BTreeMap<String, Row> = BTreeMap::new();
            for (field, value) in fields {
                let Some((name, column)) = field.rsplit_once(':') else {
                    continue;
                };
                if key.is_some_and(|k| k != name) {
                    continue;
                }
                let row = rows.entry(name.to_string()).or_default();
                match column {
                    "plan" => row.plan = value,
                    "partner" => row.partner = (!value.is_empty()).then_some(value),
                    c => {
                        if let Ok(n) = value.parse::<u64>() {
                            row.counts.insert(c.to_string(), n);
                        }
                    }
                }
            }
            out.extend(rows.into_iter().map(|(k, r)| (day, k, r)));
        }
        Ok(out)
    }
}

impl Rider for Keeper {
    fn commands(&self) -> Vec<redis::Cmd> {
        let Some(fleet) = &self.fleet else {
            return Vec::new();
        };
        let mut kept = self.lock();
        let visit = self.visits(&mut kept);
        let snap = self.live.load();
        let now_ms = snap.policy.metering.calendar.now_ms();
        let Today {
            today,
            day_id,
            month_id,
        } = Today::of(&snap);
        let mut cmds = Vec::new();
        let mut sent = Vec::new();
        // What an earlier exchange did not take goes first, as it was.
        let mut deltas = std::mem::take(&mut kept.unsent);
        let mut days = BTreeSet::new();
        for d in &deltas {
            ledger_commands(fleet, d, &mut cmds, &mut sent);
            days.insert(d.day);
        }
        let mut periods = BTreeSet::new();
        let mut over = Vec::new();
        for &at in &visit {
            let (state, last) = &kept.meters[at];
            let Some(m) = state.meter.get() else {
                continue;
            };
            let name = m.name.as_str();
            let (id, count) = m.quota_word();
            let base = if last.0 == id { last.1 } else { 0 };
            let delta = count as i64 - base as i64;
            let exhausted = m.exhausted_in(day_id, month_id);
            if exhausted {
                // Asked about every tick while over its quota ([`super::Kept::watch`]).
                over.push(at);
            }
            if id != 0 && (delta != 0 || exhausted) {
                let mut c = redis::cmd("HINCRBY");
                c.arg(fleet.quota_key(id)).arg(name).arg(delta);
                cmds.push(c);
                sent.push(Sent::Quota { at, id, count });
                periods.insert(id);
            }
            for (day, counts) in m.take(today) {
                let Some(counts) = counts else {
                    continue;
                };
                let (plan, partner) = who(&snap, m.who(), name);
                let d = Delta {
                    day,
                    key: name.to_string(),
                    plan,
                    partner,
                    counts: named(&counts),
                };
                ledger_commands(fleet, &d, &mut cmds, &mut sent);
                days.insert(day);
                deltas.push(d);
            }
        }
        kept.watch.extend(over);
        for id in periods {
            // A day after the period's end (any period id names its own end).
            let per = if id & (1 << 23) != 0 {
                Period::Month
            } else {
                Period::Day
            };
            let end = period_end(per, id).unwrap_or(now_ms + 62 * DAY_MS);
            let mut c = redis::cmd("PEXPIREAT");
            c.arg(fleet.quota_key(id)).arg(end + DAY_MS);
            cmds.push(c);
            sent.push(Sent::Other);
        }
        let retention = snap
            .policy
            .config
            .ledger
            .map_or(400, |l| u64::from(l.retention_days));
        for day in days {
            let mut c = redis::cmd("PEXPIREAT");
            c.arg(fleet.ledger_key(day))
                .arg((u64::from(day) + retention + 1) * DAY_MS);
            cmds.push(c);
            sent.push(Sent::Other);
        }
        *fleet.in_flight.lock().unwrap_or_else(|e| e.into_inner()) = InFlight { sent, deltas };
        cmds
    }

    fn answered(&self, answers: Result<Vec<redis::RedisResult<Value>>, StoreError>) {
        let Some(fleet) = &self.fleet else {
            return;
        };
        let flight =
            std::mem::take(&mut *fleet.in_flight.lock().unwrap_or_else(|e| e.into_inner()));
        let answers = match answers {
            Ok(a) if a.len() == flight.sent.len() => a,
            _ => {
                // Nothing taken as applied: the ledger counts are sent again next tick; so
                // are the quota counts (their total here has not moved: their meters are
                // visited again, changed or not).
                let mut kept = self.lock();
                stash(&mut kept.unsent, flight.deltas);
                for s in &flight.sent {
                    if let Sent::Quota { at, .. } = *s {
                        kept.watch.insert(at);
                    }
                }
                return;
            }
        };
        let mut kept = self.lock();
        for (s, a) in flight.sent.iter().zip(answers) {
            let Sent::Quota { at, id, count } = *s else {
                continue;
            };
            let Ok(Value::Int(total)) = a else {
                // Not applied: sent again next tick.
                kept.watch.insert(at);
                continue;
            };
            let total = u64::try_from(total).unwrap_or(0);
            if let Some((state, last)) = kept.meters.get_mut(at) {
                if let Some(m) = state.meter.get() {
                    m.rebase(id, count, total);
                    *last = (id, total);
                }
            }
        }
    }
}

/// The commands that add `d` to its day's hash.
fn ledger_commands(fleet: &Fleet, d: &Delta, cmds: &mut Vec<redis::Cmd>, sent: &mut Vec<Sent>) {
    let key = fleet.ledger_key(d.day);
    let name = &d.key;
    for &(col, n) in &d.counts {
        let mut c = redis::cmd("HINCRBY");
        c.arg(&key).arg(format!("{name}:{col}")).arg(n);
        cmds.push(c);
        sent.push(Sent::Other);
    }
    let mut c = redis::cmd("HSET");
    c.arg(&key)
        .arg(format!("{name}:plan"))
        .arg(&d.plan)
        .arg(format!("{name}:partner"))
        .arg(d.partner.as_deref().unwrap_or(""));
    cmds.push(c);
    sent.push(Sent::Other);
}

/// The end (ms since the Unix epoch) of the period whose id is `id`.
fn period_end(per: Period, id: u32) -> Option<u64> {
    let n = u64::from(id & ((1 << 23) - 1));
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
    use crate::metering::PeriodAt;

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
}
