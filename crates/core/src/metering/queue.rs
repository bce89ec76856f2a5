//! The process's metering: the calendar, and the queues of meters changed or parked for the
//! keeper.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use super::{Calendar, FleetQuotas, Held, Meter, MeterCell, MeterHolder};
use crate::config::keyname::KeyName;
use crate::sync::Locked;

/// The process's metering: the calendar, and the queue of meters changed since the keeper
/// last visited them (shared by every policy; a reload keeps it).
#[derive(Debug)]
pub struct Metering {
    /// The wall clock that calendar periods are read from.
    pub calendar: Calendar,
    /// Meters changed (charged, given back, counted) since the keeper last visited them: the
    /// keeper visits these, not every meter, so that its work follows the keys in use. A new
    /// meter comes to the keeper this way too, with its first change.
    changed_tx: Mutex<mpsc::Sender<Held>>,
    changed_rx: Mutex<mpsc::Receiver<Held>>,
    /// With `cluster`: the fleet's side of quota decisions.
    pub fleet: FleetQuotas,
    /// Meters with requests parked for a reservation ([`Metering::park`]), for the keeper's
    /// next exchange (at once: the request waits for it).
    parked_tx: Mutex<mpsc::Sender<Held>>,
    parked_rx: Mutex<mpsc::Receiver<Held>>,
    /// Whether one was queued since the keeper last took them.
    parked_any: AtomicBool,
}

impl Default for Metering {
    fn default() -> Self {
        Self::new(0)
    }
}

impl Metering {
    /// Metering with the calendar at `wall_ms`.
    pub fn new(wall_ms: u64) -> Self {
        let (changed_tx, changed_rx) = mpsc::channel();
        let (parked_tx, parked_rx) = mpsc::channel();
        Self {
            calendar: Calendar::new(wall_ms),
            changed_tx: Mutex::new(changed_tx),
            changed_rx: Mutex::new(changed_rx),
            fleet: FleetQuotas::default(),
            parked_tx: Mutex::new(parked_tx),
            parked_rx: Mutex::new(parked_rx),
            parked_any: AtomicBool::new(false),
        }
    }

    /// A request of the key whose rate state is `state` waits for the store to reserve it
    /// within `quota` ([`Ticket::Park`](super::Ticket::Park)): counted, and the meter queued for the keeper's next
    /// exchange.
    pub fn park<H: MeterHolder + 'static>(&self, state: &Arc<H>, quota: u64) {
        if let Some(m) = state.meter_cell().get() {
            m.want_quota.store(quota, Ordering::Release);
            if m.want.fetch_add(1, Ordering::AcqRel) == 0 {
                let tx = self.parked_tx.locked();
                let _ = tx.send(Arc::clone(state) as Held);
                self.parked_any.store(true, Ordering::Release);
            }
        }
    }

    /// Whether a request waits for a reservation (queued since the last
    /// [`Metering::take_parked`]; at worst a moment late to say no).
    pub fn has_parked(&self) -> bool {
        self.parked_any.load(Ordering::Acquire)
    }

    /// The meters with requests parked since the last call, each once.
    pub fn take_parked(&self) -> Vec<Held> {
        self.parked_any.store(false, Ordering::Release);
        let rx = self.parked_rx.locked();
        rx.try_iter().collect()
    }

    /// The meter of `state` was just changed (charged, given back, counted): queue it for the
    /// keeper's next visit, unless it is queued already. Call it after the change. The flag
    /// is swapped (a read-modify-write), not only read: a change made after the keeper took
    /// the meter off the queue (and cleared the flag) either finds the flag clear and queues
    /// the meter again, or is seen by the keeper's visit (which clears the flag with a
    /// read-modify-write too, before it reads the counts).
    #[inline]
    pub fn touched<H: MeterHolder + 'static>(&self, state: &Arc<H>) {
        if let Some(m) = state.meter_cell().get() {
            if !m.queued.swap(true, Ordering::AcqRel) {
                self.queue(state);
            }
        }
    }

    #[cold]
    fn queue<H: MeterHolder + 'static>(&self, state: &Arc<H>) {
        let tx = self.changed_tx.locked();
        let _ = tx.send(Arc::clone(state) as Held);
    }

    /// The meters changed since the last call, each once, their flags cleared: the keeper
    /// reads their counts after this returns.
    pub fn take_changed(&self) -> Vec<Held> {
        let rx = self.changed_rx.locked();
        rx.try_iter()
            .inspect(|state| {
                if let Some(m) = state.meter_cell().get() {
                    Self::visit(m);
                }
            })
            .collect()
    }

    /// The keeper is about to read `m`: later changes queue it again.
    fn visit(m: &Meter) {
        m.queued.swap(false, Ordering::AcqRel);
    }

    /// The meter of the key whose rate state is `state`, allocated on first use (it reaches
    /// the keeper with its first change: [`Metering::touched`]).
    #[inline]
    pub fn meter<'s, H: MeterHolder>(&self, state: &'s Arc<H>, name: &KeyName) -> &'s Meter {
        if let Some(m) = state.meter_cell().get() {
            return m;
        }
        self.allocate(state.meter_cell(), name)
    }

    #[cold]
    fn allocate<'s>(&self, cell: &'s MeterCell, name: &KeyName) -> &'s Meter {
        let _ = cell.set(Box::new(Meter::new(name.clone())));
        cell.get().expect("set above, or by another thread")
    }
}
