//! What each round sends for the quota counts, and what their answers do to the meters
//! (the protocol is [`super::quotas`]'s).

use std::collections::HashSet;

use redis::Value;

use super::kept::PlaceMap;
use super::quotas::{quota_key, Round, Rounds, REPORT_BATCH, RESTORE_BATCH};
use super::resend::Sent;
use super::{Keeper, Kept};
use crate::config::Cluster;

impl Keeper {
    /// The command that reports the meter `at` (with a reservation for its requests waiting,
    /// when `reserve`), if it has anything to say.
    pub(super) fn quota_command(
        &self,
        kept: &Kept,
        at: usize,
        reserve: bool,
        exhausted: bool,
        round: &mut Round,
    ) {
        let (Some(fleet), (state, last)) = (&self.fleet, &kept.meters[at]) else {
            return;
        };
        let Some(m) = state.meter_cell().get() else {
            return;
        };
        let (id, count) = m.quota_word();
        let base = if last.0 == id { last.1 } else { 0 };
        let delta = count as i64 - base as i64;
        let (want, quota) = if reserve { m.take_want() } else { (0, 0) };
        if id == 0 {
            return;
        }
        match (want > 0).then_some(quota) {
            Some(q) => {
                let mark = round.mark.clone();
                let call = round.numbered();
                let reserve = |want: u32| {
                    let mut c = redis::cmd("EVAL");
                    c.arg(include_str!("reserve.lua"))
                        .arg(1)
                        .arg(quota_key(&fleet.cfg, id))
                        .arg(m.name.as_str())
                        .arg(delta)
                        .arg(want)
                        .arg(q)
                        .arg(count)
                        .arg(&mark)
                        .arg(call.field)
                        .arg(call.number);
                    c
                };
                let (c, twin, n) = (reserve(want), reserve(0), call.number);
                round
                    .counts
                    .push((c, Sent::Reserve { at, id, count }, twin, n));
            }
            None if delta != 0 || exhausted => {
                let full = round
                    .reports
                    .get(&id)
                    .and_then(|calls| calls.last())
                    .is_none_or(|(_, e, _)| e.len() >= REPORT_BATCH);
                if full {
                    let call = round.numbered();
                    let mut c = redis::cmd("EVAL");
                    c.arg(include_str!("report.lua"))
                        .arg(1)
                        .arg(quota_key(&fleet.cfg, id))
                        .arg(call.field)
                        .arg(call.number);
                    let n = call.number;
                    round
                        .reports
                        .entry(id)
                        .or_default()
                        .push((c, Vec::new(), n));
                }
                let calls = round.reports.get_mut(&id).expect("pushed above");
                let (c, entries, _) = calls.last_mut().expect("pushed above");
                c.arg(m.name.as_str()).arg(delta);
                entries.push((at, count));
            }
            None => return,
        }
        round.periods.insert(id);
    }

    /// The commands that put back every count this replica holds in the periods due.
    pub(super) fn restore_commands(
        &self,
        cfg: &Cluster,
        rounds: &mut Rounds,
        kept: &Kept,
        round: &mut Round,
    ) {
        for id in std::mem::take(&mut rounds.restore) {
            let entries: Vec<(usize, u64)> = kept
                .meters
                .iter()
                .enumerate()
                .filter_map(|(at, (state, _))| {
                    let (wid, n) = state.meter_cell().get()?.quota_word();
                    (wid == id && n > 0).then_some((at, n))
                })
                .collect();
            for chunk in entries.chunks(RESTORE_BATCH) {
                let mut c = redis::cmd("EVAL");
                c.arg(include_str!("restore.lua"))
                    .arg(1)
                    .arg(quota_key(cfg, id));
                for &(at, n) in chunk {
                    if let Some(m) = kept.meters[at].0.meter_cell().get() {
                        c.arg(m.name.as_str()).arg(n);
                    }
                }
                let sent = Sent::Restore {
                    id,
                    entries: chunk.to_vec(),
                };
                round.restores.push((c, sent));
            }
        }
    }

    /// What the answers of a round's quota commands do: the fleet's counts become the views
    /// (not where this process's mark was found missing: the hash was lost, and this
    /// replica's counts go back next tick), grants reach their meters, and every count this
    /// replica reported is known now (and kept at `state.path`, when set).
    pub(super) fn quota_answers(
        &self,
        rounds: &mut Rounds,
        kept: &mut Kept,
        sent: &[Sent],
        answers: &[redis::RedisResult<Value>],
        now_ms: u64,
    ) {
        // Periods whose hash lost this process's mark: the store lost them.
        let mut lost = HashSet::new();
        for (s, a) in sent.iter().zip(answers) {
            match (s, a) {
                // Set now where this process had set it before: lost.
                (Sent::Mark { id }, Ok(Value::Int(1))) if !rounds.marked.insert(*id) => {
                    lost.insert(*id);
                    rounds.restore.insert(*id);
                    rounds.expiring.remove(id);
                }
                (Sent::Mark { id }, Ok(_)) => {
                    rounds.marked.insert(*id);
                }
                _ => {}
            }
        }
        // A meter whose counts went back this round takes the restore's answer, the larger
        // count (its report's answer came from the same word, before).
        let restored: HashSet<usize> = sent
            .iter()
            .flat_map(|s| match s {
                Sent::Restore { entries, .. } => entries.iter().map(|&(at, _)| at).collect(),
                _ => Vec::new(),
            })
            .collect();
        // A meter sent more than once in a round (calls sent again, then its new count)
        // takes the last answer only: it counts every call before it.
        let mut last: PlaceMap = PlaceMap::default();
        for (i, s) in sent.iter().enumerate() {
            match s {
                Sent::Report { entries, .. } => last.extend(entries.iter().map(|&(at, _)| (at, i))),
                &Sent::Reserve { at, .. } => {
                    last.insert(at, i);
                }
                _ => {}
            }
        }
        let is_last = |at: usize, i: usize| last.get(&at) == Some(&i);
        let mut raised = 0;
        for (i, (s, a)) in sent.iter().zip(answers).enumerate() {
            match (s, a) {
                (Sent::Expire { id }, Ok(_)) if !lost.contains(id) => {
                    rounds.expiring.insert(*id);
                }
                (Sent::Report { id, entries }, Ok(Value::Array(v))) if v.len() == entries.len() => {
                    for (&(at, count), t) in entries.iter().zip(v) {
                        if restored.contains(&at) || !is_last(at, i) {
                            continue;
                        }
                        let total = match t {
                            _ if lost.contains(id) => count,
                            Value::Int(t) => u64::try_from(*t).unwrap_or(0),
                            _ => {
                                kept.watch.insert(at);
                                continue;
                            }
                        };
                        kept.rebased(at, *id, count, total, now_ms);
                    }
                }
                (Sent::Report { entries, .. }, _) => {
                    // Not applied: sent again next tick.
                    kept.watch.extend(entries.iter().map(|&(at, _)| at));
                }
                (&Sent::Reserve { at, id, count }, Ok(Value::Array(v))) => {
                    let (total, granted) = match v.as_slice() {
                        [Value::Int(t), Value::Int(g)] => (*t, *g),
                        _ => continue,
                    };
                    // Reserved on at least this replica's view (the script puts a lost count
                    // back first), and granted only where this replica's mark was there: the
                    // answer holds. A restore in the same round answers for the count.
                    let granted = u64::try_from(granted).unwrap_or(0);
                    if !restored.contains(&at) && is_last(at, i) {
                        kept.rebased(at, id, count, u64::try_from(total).unwrap_or(0), now_ms);
                    }
                    if granted > 0 {
                        if let Some(m) = kept.meters[at].0.meter_cell().get() {
                            m.granted(id, granted);
                        }
                        rounds.granted[0].push(at);
                    }
                }
                (Sent::Restore { id, entries }, Ok(Value::Array(v))) => {
                    for (&(at, count), t) in entries.iter().zip(v) {
                        if let Value::Int(t) = t {
                            kept.rebased(at, *id, count, u64::try_from(*t).unwrap_or(0), now_ms);
                        }
                    }
                    if let Some(Value::Int(n)) = v.last() {
                        raised += n;
                    }
                }
                (Sent::Reserve { at, .. }, _) => {
                    // Not applied: sent again next tick.
                    kept.watch.insert(*at);
                }
                (Sent::Restore { id, .. }, Err(_)) => {
                    rounds.restore.insert(*id);
                }
                _ => {}
            }
        }
        if raised > 0 {
            // One restore per loss (each period's counts in one round): one line.
            tracing::warn!(
                target: "tollgate::ledger",
                raised,
                "the cluster store's quota counts were found emptied; restored from this replica's counts (the larger count wins)"
            );
        }
    }
}

impl Kept {
    /// The fleet's `total` came back for the meter `at`'s count of period `id`, sent as
    /// `count`: the view, the next report's base, and known now.
    fn rebased(&mut self, at: usize, id: u32, count: u64, total: u64, now_ms: u64) {
        if let Some((state, last)) = self.meters.get_mut(at) {
            if let Some(m) = state.meter_cell().get() {
                m.rebase(id, count, total);
                m.known(now_ms);
                *last = (id, total);
                self.to_disk.insert(at);
            }
        }
    }
}
