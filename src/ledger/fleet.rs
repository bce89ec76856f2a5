//! Quota and ledger counts shared by the fleet (`cluster`): they ride on each tick's
//! heartbeat, in the same pipeline ([`crate::shared::Rider`]), so sharing them costs no round
//! trip of its own; a request that waits for the fleet's word on its quota rides an urgent
//! round at once.
//!
//! - A key's quota count for a period is one field of `<prefix>:{meters}:q:<period id>` (a
//!   hash, field = the key's name): [`super::quotas`] says what each round sends for it, and
//!   `tollgate_core::metering::fleet` when a request is charged on this replica's view and
//!   when it waits for a reservation.
//! - A day's ledger is `<prefix>:{meters}:l:<day>` (a hash, fields `<key name>:<column>` and
//!   `<key name>:plan` / `:partner`): each replica adds its counts, one `day.lua` call a day
//!   for up to 500 keys; `/api/ledger` reads the days asked.
//!
//! Both expire: a quota hash a day after its period, a ledger hash `retention_days` after its
//! day. The hash tag `{meters}` puts every one in one slot of a Redis Cluster. The calls of an
//! exchange that fails, or that no replica confirmed, are sent again as they were, and each is
//! applied once however often it is sent (`super::quotas`, "Counts sent again add nothing"):
//! nothing counted is lost, nothing is counted twice.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use redis::Value;

use super::book::{BookError, Row};
use super::kept::{Kept, PlaceMap};
use super::quotas::{Round, Rounds};
use super::resend::{Laid, Sent};
use super::{who, Keeper, Today, DAY_MS};
use crate::config::Cluster;
use crate::fleet_store::{Client, StoreError};
use crate::metering::{Column, COLUMNS};
use crate::shared::Rider;
use crate::sync::Locked;

/// The fleet half of the keeper.
pub(super) struct Fleet {
    pub(super) cfg: Cluster,
    /// For `/api/ledger`'s reads (the exchange has its own connection).
    client: tokio::sync::Mutex<Option<Client>>,
    /// What the exchange in flight carries, in command order.
    in_flight: Mutex<InFlight>,
    /// What the quota rounds remember.
    pub(super) rounds: Mutex<Rounds>,
    /// Per meter (its place in the keeper's list), the day, plan and partner (as
    /// `metering::who` packs them) its ledger row last named, and when: a row names its plan
    /// and partner again only when they change, on a new day, after a failed exchange, or a
    /// minute later (a Redis that lost the day's hash gets them back within that minute).
    named: Mutex<PlaceMap<(u32, u64, u64)>>,
}

/// How long a ledger row's plan and partner go unsent when unchanged.
const NAMES_REFRESH_MS: u64 = 60_000;

#[derive(Default)]
struct InFlight {
    sent: Vec<Sent>,
    /// The calls that add counts, in order, as they are sent again if unconfirmed.
    again: Vec<(redis::Cmd, Sent)>,
    /// Whether the round laid new counts (not only calls sent again).
    added: bool,
}

impl Fleet {
    pub(super) fn new(cfg: Cluster) -> Self {
        Self {
            cfg,
            client: tokio::sync::Mutex::new(None),
            in_flight: Mutex::default(),
            rounds: Mutex::new(Rounds::new(&crate::shared::replica_id())),
            named: Mutex::default(),
        }
    }

    pub(super) fn rounds(&self) -> std::sync::MutexGuard<'_, Rounds> {
        self.rounds.locked()
    }

    /// The round `laid` (its first `resent` calls sent again) is in flight: its commands.
    fn take_off(&self, laid: Laid, resent: usize) -> Vec<redis::Cmd> {
        let Laid { cmds, sent, again } = laid;
        let added = again.len() > resent;
        *self.in_flight.locked() = InFlight { sent, again, added };
        cmds
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
            *guard = Some(crate::fleet_store::connect(&self.cfg).await.map_err(fail)?);
        }
        let client = guard.as_ref().expect("connected above");
        let mut pipe = redis::pipe();
        for day in from..=to {
            pipe.cmd("HGETALL").arg(self.ledger_key(day));
        }
        let deadline = tokio::time::Instant::now() + self.cfg.timeout;
        let url = &self.cfg.redis_url;
        let days: Vec<Vec<(String, String)>> =
            match crate::fleet_store::within(deadline, url, client.pipeline(&pipe)).await {
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
    fn commands(&self, tick: bool) -> Vec<redis::Cmd> {
        let Some(fleet) = &self.fleet else {
            return Vec::new();
        };
        let mut kept = self.lock();
        let mut rounds = fleet.rounds();
        // What waits for a replica's confirmation goes first, as it was sent; while too many
        // rounds wait, it goes alone and new counts wait on their meters.
        let mut laid = Laid::resending(&rounds.resend.pending);
        let resent = laid.again.len();
        if rounds.resend.held_back() {
            return fleet.take_off(laid, resent);
        }
        let snap = self.live.load();
        let now_ms = snap.policy.metering.calendar.now_ms();
        let Today {
            today,
            day_id,
            month_id,
        } = Today::of(&snap);
        // The meters requests wait on: each reports with a reservation.
        let parked: BTreeSet<usize> = snap
            .policy
            .metering
            .take_parked()
            .into_iter()
            .map(|s| kept.hold(s, (0, 0)))
            .collect();
        let mut round = rounds.round();
        if !tick {
            for &at in &parked {
                self.quota_command(&kept, at, true, false, &mut round);
            }
            rounds.lay_out(&fleet.cfg, round, None, now_ms, &mut laid);
            sent_now(&mut kept, &laid.again[resent..]);
            return fleet.take_off(laid, resent);
        }
        let mut visit: BTreeSet<usize> = self.visits(&mut kept).into_iter().collect();
        visit.extend(&parked);
        for at in rounds.unused_grants() {
            let back = kept.meters.get(at).and_then(|(s, _)| s.meter_cell().get());
            if back.is_some_and(|m| m.take_unused_grants().is_some()) {
                visit.insert(at);
            }
        }
        let retention = snap
            .policy
            .config
            .ledger
            .map_or(400, |l| u64::from(l.retention_days));
        let mut days = Days::default();
        let mut last_named = fleet.named.locked();
        let mut over = Vec::new();
        for &at in &visit {
            let Some(m) = kept.meters[at].0.meter_cell().get() else {
                continue;
            };
            let exhausted = m.exhausted_in(day_id, month_id);
            if exhausted {
                // Asked about every tick while over its quota ([`super::Kept::watch`]).
                over.push(at);
            }
            let reserve = parked.contains(&at);
            self.quota_command(&kept, at, reserve, exhausted, &mut round);
            let name = m.name.as_str();
            for (day, counts) in m.take(today) {
                let Some(counts) = counts else {
                    continue;
                };
                let w = m.who();
                let named_now = (day, w, now_ms);
                let renamed = match last_named.entry(at) {
                    Entry::Occupied(mut e) => {
                        let (nd, nw, since) = *e.get();
                        let due = nd != day
                            || nw != w
                            || now_ms.saturating_sub(since) >= NAMES_REFRESH_MS;
                        if due {
                            e.insert(named_now);
                        }
                        due
                    }
                    Entry::Vacant(e) => {
                        e.insert(named_now);
                        true
                    }
                };
                // The plan's and partner's names are looked up only when they are sent.
                let names = renamed.then(|| who(&snap, w, name));
                let names = names
                    .as_ref()
                    .map(|(plan, partner)| (plan.as_str(), partner.as_deref().unwrap_or("")));
                days.add(fleet, retention, (day, name), names, &counts, &mut round);
            }
        }
        drop(last_named);
        kept.watch.extend(over);
        self.restore_commands(&fleet.cfg, &mut rounds, &kept, &mut round);
        let current = Some([day_id, month_id]);
        rounds.lay_out(&fleet.cfg, round, current, now_ms, &mut laid);
        sent_now(&mut kept, &laid.again[resent..]);
        for (c, _) in days.0.into_values().flatten() {
            laid.adding(c.clone(), Sent::Day, c);
        }
        fleet.take_off(laid, resent)
    }

    fn answered(
        &self,
        answers: Result<Vec<redis::RedisResult<Value>>, StoreError>,
        replicated: bool,
    ) {
        let Some(fleet) = &self.fleet else {
            return;
        };
        let flight = std::mem::take(&mut *fleet.in_flight.locked());
        let answers = match answers {
            Ok(a) if a.len() == flight.sent.len() => a,
            _ => {
                // Every row names its plan and partner again (the names may not have landed).
                fleet.named.locked().clear();
                // Nothing taken as applied: the calls that add counts are sent again as
                // they were (applied once whatever happened to this round), and the counts
                // to put back are put back again.
                let mut rounds = fleet.rounds();
                for s in &flight.sent {
                    if let Sent::Restore { id, .. } = *s {
                        rounds.restore(id);
                    }
                }
                rounds
                    .resend
                    .settle(flight.again, None, false, flight.added);
                return;
            }
        };
        if !replicated {
            fleet.named.locked().clear();
        }
        let now_ms = self.live.load().policy.metering.calendar.now_ms();
        let mut kept = self.lock();
        let mut rounds = fleet.rounds();
        self.quota_answers(&mut rounds, &mut kept, &flight.sent, &answers, now_ms);
        let answered = flight
            .sent
            .iter()
            .zip(&answers)
            .filter(|(s, _)| s.counts())
            .map(|(_, a)| a.is_ok())
            .collect();
        rounds
            .resend
            .settle(flight.again, Some(answered), replicated, flight.added);
    }

    fn waiting(&self) -> bool {
        self.fleet.is_some() && self.live.load().policy.metering.has_parked()
    }

    fn store_up(&self, up: bool) {
        self.live.load().policy.metering.fleet.set_up(up);
    }
}

/// Keys per `day.lua` call (Redis runs a script alone: a few hundred keep it short).
const DAY_BATCH: usize = 500;

/// A round's ledger counts: per day, its `day.lua` calls, each with how many keys it carries.
#[derive(Default)]
struct Days(BTreeMap<u32, Vec<(redis::Cmd, usize)>>);

impl Days {
    /// Add the key `name`'s counts of `day` (those not zero) to the day's call (a new one,
    /// numbered in `round`, when the last is full), which also sets the day's expiry
    /// (`retention` days after it); with its plan and partner when `names` are given.
    fn add(
        &mut self,
        fleet: &Fleet,
        retention: u64,
        (day, name): (u32, &str),
        names: Option<(&str, &str)>,
        counts: &[u32; COLUMNS],
        round: &mut Round,
    ) {
        let calls = self.0.entry(day).or_default();
        if calls.last().is_none_or(|(_, n)| *n >= DAY_BATCH) {
            let call = round.numbered();
            let mut c = redis::cmd("EVAL");
            c.arg(include_str!("day.lua"))
                .arg(1)
                .arg(fleet.ledger_key(day))
                .arg((u64::from(day) + retention + 1) * DAY_MS)
                .arg(call.field)
                .arg(call.number);
            calls.push((c, 0));
        }
        let (c, n) = calls.last_mut().expect("pushed above");
        // An empty plan (no plan is named so) says: the names are unchanged.
        let (plan, partner) = names.unwrap_or(("", ""));
        let columns = counts.iter().filter(|&&n| n != 0).count();
        c.arg(name).arg(plan).arg(partner).arg(columns);
        for (col, &count) in Column::ALL.iter().zip(counts) {
            if count != 0 {
                c.arg(col.name()).arg(count);
            }
        }
        *n += 1;
    }
}

/// The quota counts of the calls laid out are the meters' bases now: a call not applied is
/// sent again as it was, so the next report carries only what was charged after.
fn sent_now(kept: &mut Kept, laid: &[(redis::Cmd, Sent)]) {
    let mut base = |at: usize, id: u32, count: u64| {
        if let Some((_, last)) = kept.meters.get_mut(at) {
            *last = (id, count);
        }
    };
    for (_, s) in laid {
        match *s {
            Sent::Report { id, ref entries } => {
                for &(at, count) in entries {
                    base(at, id, count);
                }
            }
            Sent::Reserve { at, id, count } => base(at, id, count),
            _ => {}
        }
    }
}
