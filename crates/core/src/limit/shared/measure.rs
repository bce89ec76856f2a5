//! The measures both bounds of a shared budget are judged by, over two runs' admission times
//! (ns, sorted): the fleet's and one process's on the same requests. The simulation (`sim.rs`)
//! and the wire tests of a real fleet (`tests/it/cluster/`) use the same ones.

/// The most any window `[s, s + w)` holds of `a` (the fleet's admissions) beyond what
/// `[s - lead, s + w)` holds of `b` (one process's), less the budget the fleet left unspent in
/// the window before (what `b` admitted beyond `a` in `[s - w, s)`).
///
/// - `lead` is the reconciliation's lag (and one emission interval): within it the fleet and
///   one process may admit different requests of the same burst (one process the first `L`, the fleet, its
///   views anchored a few ms later, the last), and a window that starts between them would
///   count a shift in time as an excess.
/// - The credit: a fleet that refused requests one process admitted (a cold replica's cap)
///   keeps that budget, as one process would, and spends it on later requests that one
///   process, its budget spent, refuses. A GCRA budget carries over one window at most, so
///   only the window before counts. Without it, admitting less first and the same in all
///   would read as admitting more.
///
/// Every start at which the difference can change is tried.
pub fn worst_excess(a: &[u64], b: &[u64], w: u64, lead: u64) -> i64 {
    let count = |v: &[u64], from: u64, to: u64| {
        (v.partition_point(|&t| t < to) - v.partition_point(|&t| t < from)) as i64
    };
    let starts = a
        .iter()
        .flat_map(|&t| [t, t + 1, (t + 1).saturating_sub(w), t + w])
        .chain(
            b.iter()
                .flat_map(|&t| [t + lead, t + 1, (t + 1).saturating_sub(w), t + w]),
        );
    starts
        .map(|s| {
            let before = s.saturating_sub(w);
            let credit = (count(b, before, s) - count(a, before, s)).max(0);
            count(a, s, s + w) - count(b, s.saturating_sub(lead), s + w) - credit
        })
        .max()
        .unwrap_or(0)
}

/// The most one process admits beyond the fleet in a window that starts from a key idle
/// fleet-wide: for every `s` at which one process admits after a window with no admission of
/// either, one process's admissions in `[s, s + w)` less the fleet's in `[s, s + w + lead)`
/// (the fleet's may come a wait later).
pub fn worst_shortfall(fleet: &[u64], single: &[u64], w: u64, lead: u64) -> i64 {
    let count = |v: &[u64], from: u64, to: u64| {
        (v.partition_point(|&t| t < to) - v.partition_point(|&t| t < from)) as i64
    };
    let idle = |s: u64| {
        let from = s.saturating_sub(w);
        count(single, from, s) == 0 && count(fleet, from, s) == 0
    };
    single
        .iter()
        .filter(|&&s| idle(s))
        .map(|&s| count(single, s, s + w) - count(fleet, s, s + w + lead))
        .max()
        .unwrap_or(0)
}
