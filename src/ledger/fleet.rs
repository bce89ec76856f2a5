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
//! A tick's counts go as calls of one script (`meters.lua`, up to [`OPS`] operations each)
//! rather than a command per count: with thousands of keys active a tick, a command each was
//! three commands a key for redis-rs to encode and parse and for Redis to run
//! (docs/benchmarks.md, tuning step 25). Each operation runs by itself in the script, as in a
//! pipeline.
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
    /// What each script call carries, in command order.
    calls: Vec<Sent>,
}

/// What one script call of the exchange carries.
#[derive(Default)]
struct Sent {
    /// The quota counts, in the order of their answers.
    quotas: Vec<Quota>,
    /// The ledger counts, to put back if the call fails.
    deltas: Vec<Delta>,
}

/// A quota count sent: the keeper's meter `at`, for period `id`, as it stood (`count`).
#[derive(Clone, Copy)]
struct Quota {
    at: usize,
    id: u32,
    count: u64,
}

/// The script the rider calls ([`OPS`] operations at most a call).
const SCRIPT: &str = include_str!("meters.lua");

/// Operations per script call: Redis runs a script alone, and 512 (about 170 keys' counts)
/// keep one well under a millisecond.
const OPS: usize = 512;

/// A hash the rider writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hash {
    /// The quota counts of a period (by its id).
    Quota(u32),
    /// The ledger of a day.
    Ledger(u32),
}

/// A tick's script calls, being laid out.
#[derive(Default)]
struct Calls {
    done: Vec<redis::Cmd>,
    sent: Vec<Sent>,
    /// The call being laid out: its keys, its operations' `ARGV` (in a command used as a
    /// buffer: the keys go first in the call), how many, and what it carries.
    keys: Vec<(Hash, String)>,
    argv: redis::Cmd,
    ops: usize,
    now: Sent,
    /// A field's name, reused.
    field: String,
}

impl Calls {
    /// Add one operation: `op` on `hash`'s field `<name>:<column>` (`name` alone when
    /// `column` is empty), with `value`.
    fn op(
        &mut self,
        fleet: &Fleet,
        op: &str,
        hash: Hash,
        (name, column): (&str, &str),
        value: impl redis::ToRedisArgs,
    ) {
        let at = match self.keys.iter().position(|(h, _)| *h == hash) {
            Some(i) => i,
            None => {
                let key = match hash {
                    Hash::Quota(id) => fleet.quota_key(id),
                    Hash::Ledger(day) => fleet.ledger_key(day),
                };
                self.keys.push((hash, key));
                self.keys.len() - 1
            }
        };
        self.field.clear();
        self.field.push_str(name);
        if !column.is_empty() {
            self.field.push(':');
            self.field.push_str(column);
        }
        self.argv.arg(op).arg(at + 1).arg(&self.field).arg(value);
        self.ops += 1;
    }

    /// Close the call being laid out once it holds [`OPS`] operations (`force`: any). Called
    /// between keys only, so that a call carries whole counts (put back whole if it fails).
    fn close(&mut self, force: bool) {
        if self.ops == 0 || (!force && self.ops < OPS) {
            return;
        }
        let mut c = redis::cmd("EVAL");
        c.arg(SCRIPT).arg(self.keys.len());
        for (_, k) in self.keys.drain(..) {
            c.arg(k);
        }
        for a in self.argv.args_iter() {
            if let redis::Arg::Simple(b) = a {
                c.arg(b);
            }
        }
        self.argv = redis::Cmd::new();
        self.ops = 0;
        self.done.push(c);
        self.sent.push(std::mem::take(&mut self.now));
    }
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
        let mut calls = Calls::default();
        // What an earlier exchange did not take goes first, as it was.
        let mut days = BTreeSet::new();
        for d in std::mem::take(&mut kept.unsent) {
            days.insert(d.day);
            ledger_ops(fleet, d, &mut calls);
            calls.close(false);
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
                calls.op(fleet, "q", Hash::Quota(id), (name, ""), delta);
                calls.now.quotas.push(Quota { at, id, count });
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
                days.insert(day);
                ledger_ops(fleet, d, &mut calls);
            }
            calls.close(false);
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
            calls.op(fleet, "x", Hash::Quota(id), ("", ""), end + DAY_MS);
        }
        let retention = snap
            .policy
            .config
            .ledger
            .map_or(400, |l| u64::from(l.retention_days));
        for day in days {
            let at = (u64::from(day) + retention + 1) * DAY_MS;
            calls.op(fleet, "x", Hash::Ledger(day), ("", ""), at);
        }
        calls.close(true);
        *fleet.in_flight.lock().unwrap_or_else(|e| e.into_inner()) = InFlight { calls: calls.sent };
        calls.done
    }

    fn answered(&self, answers: Result<Vec<redis::RedisResult<Value>>, StoreError>) {
        let Some(fleet) = &self.fleet else {
            return;
        };
        let flight =
            std::mem::take(&mut *fleet.in_flight.lock().unwrap_or_else(|e| e.into_inner()));
        let mut kept = self.lock();
        // Nothing of a call that failed is taken as applied: its ledger counts are sent again
        // next tick; so are its quota counts (their total here has not moved: their meters are
        // visited again, changed or not).
        let answers = match answers {
            Ok(a) if a.len() == flight.calls.len() => a.into_iter().map(Some).collect(),
            _ => vec![None; flight.calls.len()],
        };
        for (call, answer) in flight.calls.into_iter().zip(answers) {
            let totals = match answer {
                Some(Ok(Value::Array(v))) if v.len() == call.quotas.len() => v,
                _ => {
                    stash(&mut kept.unsent, call.deltas);
                    kept.watch.extend(call.quotas.iter().map(|q| q.at));
                    continue;
                }
            };
            for (q, total) in call.quotas.iter().zip(totals) {
                let Value::Int(total) = total else {
                    // Not applied: sent again next tick.
                    kept.watch.insert(q.at);
                    continue;
                };
                let total = u64::try_from(total).unwrap_or(0);
                if let Some((state, last)) = kept.meters.get_mut(q.at) {
                    if let Some(m) = state.meter.get() {
                        m.rebase(q.id, q.count, total);
                        *last = (q.id, total);
                    }
                }
            }
        }
    }
}

/// The operations that add `d` to its day's hash (and `d` to what the call carries).
fn ledger_ops(fleet: &Fleet, d: Delta, calls: &mut Calls) {
    let day = Hash::Ledger(d.day);
    for &(col, n) in &d.counts {
        calls.op(fleet, "l", day, (&d.key, col), n);
    }
    calls.op(fleet, "s", day, (&d.key, "plan"), d.plan.as_str());
    let partner = d.partner.as_deref().unwrap_or("");
    calls.op(fleet, "s", day, (&d.key, "partner"), partner);
    calls.now.deltas.push(d);
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

    fn fleet() -> Fleet {
        Fleet::new(Cluster {
            redis_url: "redis://127.0.0.1:1".into(),
            key_prefix: "tg".into(),
            sync_interval: std::time::Duration::from_millis(100),
            timeout: std::time::Duration::from_millis(200),
        })
    }

    fn delta(key: &str, day: u32) -> Delta {
        Delta {
            day,
            key: key.into(),
            plan: "pro".into(),
            partner: None,
            counts: vec![("upstream_2xx", 3), ("quota_exhausted", 1)],
        }
    }

    fn args(c: &redis::Cmd) -> Vec<String> {
        c.args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_tick_is_laid_out_as_script_calls_of_whole_counts() {
        let fleet = fleet();
        let mut calls = Calls::default();
        // 4 operations a key (two counts, plan, partner) and a quota: 5 a key; a call closes
        // at the first key boundary at or past OPS.
        let keys = OPS; // enough for several calls
        for i in 0..keys {
            calls.op(&fleet, "q", Hash::Quota(7), (&format!("k{i}"), ""), 1);
            calls.now.quotas.push(Quota {
                at: i,
                id: 7,
                count: 1,
            });
            ledger_ops(&fleet, delta(&format!("k{i}"), 20_000), &mut calls);
            calls.close(false);
        }
        calls.op(&fleet, "x", Hash::Ledger(20_000), ("", ""), 99);
        calls.close(true);
        assert_eq!(calls.done.len(), calls.sent.len());
        assert!(calls.done.len() > 1, "{}", calls.done.len());
        let mut quotas = 0;
        let mut deltas = 0;
        for (c, s) in calls.done.iter().zip(&calls.sent) {
            let a = args(c);
            assert_eq!(a[0], "EVAL");
            assert_eq!(a[1], SCRIPT);
            let nkeys: usize = a[2].parse().unwrap();
            let keys = &a[3..3 + nkeys];
            let argv = &a[3 + nkeys..];
            assert_eq!(argv.len() % 4, 0);
            // Whole keys only: 5 operations each, the expiry only in the last call.
            assert!(argv.len() / 4 <= OPS + 4, "{}", argv.len() / 4);
            for op in argv.chunks(4) {
                let k = &keys[op[1].parse::<usize>().unwrap() - 1];
                match op[0].as_str() {
                    "q" => assert_eq!(k, "tg:{meters}:q:7"),
                    "l" | "s" | "x" => assert_eq!(k, "tg:{meters}:l:20000"),
                    o => panic!("{o}"),
                }
                if op[0] == "l" {
                    assert!(
                        op[2].ends_with(":upstream_2xx") || op[2].ends_with(":quota_exhausted")
                    );
                }
            }
            let q = argv.chunks(4).filter(|op| op[0] == "q").count();
            assert_eq!(q, s.quotas.len());
            assert_eq!(
                argv.chunks(4).filter(|op| op[0] == "s").count(),
                2 * s.deltas.len()
            );
            quotas += q;
            deltas += s.deltas.len();
        }
        assert_eq!((quotas, deltas), (keys, keys));
        let last = args(calls.done.last().unwrap());
        let op = &last[last.len() - 4..];
        assert_eq!(
            (op[0].as_str(), op[2].as_str(), op[3].as_str()),
            ("x", "", "99")
        );
    }

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
