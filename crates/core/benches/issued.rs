//! Keys issued through the admin API, at scale: what a create, a rotation and a deletion
//! cost the core with 1k, 100k and 1M issued keys in the table (the goal: the same at each),
//! what a start (or a reload) costs to put them all back from their records, the heap each
//! issued key holds, and a lookup of an issued key against one of the YAML's.
//!
//! One process; the heap is counted by the global allocator below (live bytes after, minus
//! before). The runtime's own cost of a change (keeping it: a disk commit, a Redis script)
//! is not here: `benches/load/issue.py` measures creates a second through the admin API.
//!
//! Run (release profile): `cargo bench -p tollgate-core --bench issued`
//! (`ISSUED_SIZES=1000,100000` for other sizes).

// The counting allocator implements `GlobalAlloc`, `unsafe` by definition; the bench times
// with the system's clock by design.
#![allow(unsafe_code, clippy::disallowed_methods)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tollgate_core::digest::Digest;
use tollgate_core::policy::overrides::{KeyRecords, NewKey};
use tollgate_core::policy::Policy;
use tollgate_core::testing::TestConfig;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn key(name: String) -> NewKey {
    NewKey {
        name,
        plan: "standard".into(),
        partner: None,
        expires_ms: None,
        requests_per_window: None,
        quota: None,
    }
}

/// Issue `key` on `p` as the runtime does: the record made, kept in `set`, applied.
fn issue(p: &Policy, set: &mut KeyRecords, name: String, d: Digest) {
    for (d, _, o) in p.issue(&key(name), d, "admin", 1, set).expect("issued") {
        set.insert(d, o.clone());
        p.apply_record(&d, &o);
    }
}

/// ns per call of `f` over `n` calls.
fn per(n: usize, mut f: impl FnMut(usize)) -> f64 {
    let t = Instant::now();
    for i in 0..n {
        f(i);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let sizes: Vec<usize> = std::env::var("ISSUED_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000, 100_000, 1_000_000]);
    let config = TestConfig::new();
    println!("| issued keys | create µs | rotate µs | delete µs | lookup ns (issued / YAML) | table heap B/key | records heap B/key | start ms |");
    println!("|---|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let p = Policy::new(config.parse(), None);
        let mut set = KeyRecords::new();
        let before = LIVE.load(Ordering::Relaxed);
        let digest = |i: usize| Digest::of(format!("issued-{i}").as_bytes());
        let fill = n.saturating_sub(1000);
        for i in 0..fill {
            issue(&p, &mut set, format!("shop-{i:07}"), digest(i));
        }
        // The last thousand creates, timed: the cost of one more at N.
        let create = per(n - fill, |j| {
            let i = fill + j;
            issue(&p, &mut set, format!("shop-{i:07}"), digest(i));
        }) / 1000.0;
        let heap = LIVE.load(Ordering::Relaxed) - before;
        let now = tollgate_core::clock::wall_ms();
        let rotate = per(1000, |j| {
            let k = p.keys.find_by_name(&format!("shop-{j:07}")).unwrap();
            let new = Digest::of(format!("rotated-{j}").as_bytes());
            for (d, _, o) in p.rotate(k, new, 60_000, now, &set).unwrap() {
                set.insert(d, o.clone());
                p.apply_record(&d, &o);
            }
        }) / 1000.0;
        // The records alone (what the runtime keeps in force beside the table): a copy's heap.
        // Measured after the rotations: freeing the copy leaves glibc's heap to consolidate
        // on the next allocations, which timed rotations would pay for.
        let set_heap = {
            let b = LIVE.load(Ordering::Relaxed);
            let copy = set.clone();
            let a = LIVE.load(Ordering::Relaxed);
            drop(copy);
            a - b
        };
        let table_heap = heap.saturating_sub(set_heap);
        let probe: Vec<Digest> = (0..200_000).map(|i| digest((i * 7919) % n)).collect();
        let yaml = Digest::of(b"basic-key-1");
        let lookup_issued = per(probe.len(), |i| {
            std::hint::black_box(p.keys.lookup(&probe[i]));
        });
        let lookup_yaml = per(probe.len(), |_| {
            std::hint::black_box(p.keys.lookup(std::hint::black_box(&yaml)));
        });
        // A start (or a reload): a new table, every issued key put back from its record.
        let t = Instant::now();
        let q = Policy::new(config.parse(), Some(&p));
        let dropped = q.apply_overrides(&set);
        let start = t.elapsed().as_secs_f64() * 1000.0;
        assert!(dropped.is_empty() && q.keys.issued().len() == n);
        drop(q);
        let delete = per(1000, |j| {
            let k = p
                .keys
                .find_by_name(&format!("shop-{:07}", n - 1 - j))
                .unwrap();
            for (d, _, o) in p.delete(k, "admin", now, &set).unwrap() {
                set.insert(d, o.clone());
                p.apply_record(&d, &o);
            }
        }) / 1000.0;
        println!(
            "| {n} | {create:.2} | {rotate:.2} | {delete:.2} | {lookup_issued:.0} / {lookup_yaml:.0} | {} | {} | {start:.0} |",
            table_heap / n,
            set_heap / n
        );
    }
}
