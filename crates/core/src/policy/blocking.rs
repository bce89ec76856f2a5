//! Auth-failure blocking: a client address that fails authentication too often is refused
//! outright for a while (`auth_failures`), before any key it sends is evaluated, so a correct
//! guess during a block cannot show.
//!
//! Failures are counted per [`ClientKey`] with the same GCRA arithmetic as the rate limits
//! ([`Rate`]), as a limit of `max_failures - 1` failures per `window`: from idle, the
//! `max_failures`-th failure of a burst starts a block; failing steadily faster than
//! `max_failures - 1` per window blocks sooner or later; more slowly, never. The block
//! lasts `block`; while it lasts every request from the address is `429 too_many_auth_failures`
//! with `Retry-After`.
//!
//! The state is a [`DashMap`] (concurrent, sharded) with a hard bound of `max_tracked_ips`
//! entries: an entry is only created by a failed authentication, and when the table is full
//! the least recently seen eighth of the addresses not blocked is evicted (one scan, amortized
//! over the inserts that follow). A block is never evicted: it ends when its time is up or an
//! operator releases it, however many other addresses fail meanwhile; a table full of blocks
//! counts no new address's failure until one ends (the bound holds either way).
//! A request from an address with no entry, and any request while no address is blocked, reads
//! one atomic and nothing else. Entries with nothing left to remember are dropped by
//! [`FailureTable::sweep`], which also reports the blocks that ended (for the log line and the
//! gauge); the runtime calls it every second.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::mapref::entry::Entry as MapEntry;
use dashmap::DashMap;

use super::client::ClientKey;
use crate::clock::Nanos;
use crate::config::AuthFailures;
use crate::limit::Rate;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// What is remembered of one address.
#[derive(Clone, Copy, Debug)]
struct Entry {
    /// GCRA theoretical arrival time of the next failure.
    tat: Nanos,
    /// The block's end, or 0 when not blocked.
    blocked_until: Nanos,
    /// When the block in force began (meaningful while `blocked_until` is set).
    blocked_since: Nanos,
    /// Failed authentications counted since the entry was made.
    failures: u32,
    last_seen: Nanos,
}

/// An address that blocking holds now ([`FailureTable::blocks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// The address (or IPv6 /64) blocked.
    pub key: ClientKey,
    /// When the block began.
    pub since: Nanos,
    /// When it ends.
    pub until: Nanos,
    /// Failed authentications from the address that the table counted (those that started
    /// the block, and any before it still remembered).
    pub failures: u32,
}

/// A block that a failure just started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockStarted {
    /// The address blocked.
    pub key: ClientKey,
    /// How long the block lasts (`auth_failures.block_seconds`).
    pub duration: Duration,
}

/// Failed authentications per client address, and the blocks they caused. One table lives for
/// the whole process: a reload keeps it, so a reload does not unblock anyone.
#[derive(Debug, Default)]
pub struct FailureTable {
    entries: DashMap<ClientKey, Entry, foldhash::fast::RandomState>,
    /// Entries in the table (reserved before an insert, so it never passes the bound).
    len: AtomicUsize,
    /// Entries whose block has not been reported ended by [`FailureTable::sweep`].
    blocked: AtomicUsize,
    /// Held by the one thread evicting.
    evicting: AtomicBool,
}

fn ceil_secs(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_SEC)
}

impl FailureTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Addresses currently blocked (including blocks over but not yet swept).
    pub fn blocked_count(&self) -> usize {
        self.blocked.load(Ordering::Relaxed)
    }

    /// Addresses tracked.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no address is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Seconds until `key`'s block ends (at least 1), or `None` when it is not blocked.
    pub fn blocked(&self, key: ClientKey, now: Nanos) -> Option<u64> {
        if self.blocked.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut e = self.entries.get_mut(&key)?;
        if e.blocked_until <= now {
            return None;
        }
        // A blocked address that keeps sending stays recently seen, so eviction takes the
        // quiet ones first.
        e.last_seen = now;
        Some(ceil_secs(e.blocked_until - now).max(1))
    }

    /// Count a failed authentication from `key`; the block it starts, if it does.
    pub fn failed(&self, key: ClientKey, now: Nanos, p: &AuthFailures) -> Option<BlockStarted> {
        let rate = failure_rate(p);
        let count = |e: &mut Entry| -> Option<BlockStarted> {
            e.last_seen = now;
            if e.blocked_until > now {
                return None;
            }
            e.failures = e.failures.saturating_add(1);
            // Up to `max_failures - 1` conform; the `max_failures`-th within the window does
            // not, and blocks.
            if let Some(Ok(next)) = rate.map(|r| r.admit(e.tat, now)) {
                e.tat = next;
                return None;
            }
            let was_blocked = e.blocked_until != 0;
            e.blocked_until = now + p.block.as_nanos() as u64;
            e.blocked_since = now;
            if !was_blocked {
                self.blocked.fetch_add(1, Ordering::Relaxed);
            }
            Some(BlockStarted {
                key,
                duration: p.block,
            })
        };
        if let Some(mut e) = self.entries.get_mut(&key) {
            return count(&mut e);
        }
        if !self.reserve(p.max_tracked_ips.get(), now) {
            // Full, and another thread is making room: this failure goes uncounted rather
            // than the bound being passed.
            return None;
        }
        match self.entries.entry(key) {
            MapEntry::Occupied(mut o) => {
                // Another thread inserted it meanwhile: give the reservation back.
                self.len.fetch_sub(1, Ordering::Relaxed);
                count(o.get_mut())
            }
            MapEntry::Vacant(v) => {
                let mut e = Entry {
                    tat: 0,
                    blocked_until: 0,
                    blocked_since: 0,
                    failures: 0,
                    last_seen: now,
                };
                let started = count(&mut e);
                v.insert(e);
                started
            }
        }
    }

    /// The addresses blocked at `now`, the longest-blocked first.
    pub fn blocks(&self, now: Nanos) -> Vec<Block> {
        if self.blocked.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let mut v: Vec<Block> = self
            .entries
            .iter()
            .filter(|r| r.value().blocked_until > now)
            .map(|r| Block {
                key: *r.key(),
                since: r.value().blocked_since,
                until: r.value().blocked_until,
                failures: r.value().failures,
            })
            .collect();
        v.sort_by_key(|b| (b.since, b.key));
        v
    }

    /// Release `key` at once, as an operator does: its block ends and its failures are
    /// forgotten (the next wrong key from it is its first). `false` when it was not blocked
    /// at `now` (nothing changes).
    pub fn release(&self, key: ClientKey, now: Nanos) -> bool {
        let was_blocked = self
            .entries
            .remove_if(&key, |_, e| e.blocked_until > now)
            .is_some();
        if was_blocked {
            self.len.fetch_sub(1, Ordering::Relaxed);
            self.blocked.fetch_sub(1, Ordering::Relaxed);
        }
        was_blocked
    }

    /// Reserve room for one more entry, evicting the least recently seen when full.
    fn reserve(&self, max: usize, now: Nanos) -> bool {
        let take = || {
            self.len
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |l| {
                    (l < max).then_some(l + 1)
                })
                .is_ok()
        };
        if take() {
            return true;
        }
        if self
            .evicting
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.evict_oldest((max / 8).max(1), now);
        self.evicting.store(false, Ordering::Release);
        take()
    }

    /// Remove the `n` least recently seen entries not blocked at `now`.
    fn evict_oldest(&self, n: usize, now: Nanos) {
        let mut seen: Vec<(Nanos, ClientKey)> = self
            .entries
            .iter()
            .filter(|r| r.value().blocked_until <= now)
            .map(|r| (r.value().last_seen, *r.key()))
            .collect();
        let n = n.min(seen.len());
        if n == 0 {
            return;
        }
        seen.select_nth_unstable(n - 1);
        for (_, key) in &seen[..n] {
            // Re-checked under the shard lock: a block may have started since.
            let gone = self.entries.remove_if(key, |_, e| e.blocked_until <= now);
            if let Some((_, e)) = gone {
                self.len.fetch_sub(1, Ordering::Relaxed);
                if e.blocked_until != 0 {
                    // A block over, not swept yet.
                    self.blocked.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// End the blocks that are over and drop entries with nothing left to remember (no block,
    /// no failure still inside its window). Returns the addresses whose block ended.
    pub fn sweep(&self, now: Nanos) -> Vec<ClientKey> {
        let mut ended = Vec::new();
        let mut stale = Vec::new();
        for mut r in self.entries.iter_mut() {
            let e = r.value_mut();
            if e.blocked_until != 0 && e.blocked_until <= now {
                e.blocked_until = 0;
                self.blocked.fetch_sub(1, Ordering::Relaxed);
                ended.push(*r.key());
            }
            let e = r.value();
            if e.blocked_until == 0 && e.tat <= now {
                stale.push(*r.key());
            }
        }
        for key in &stale {
            // Re-checked under the shard lock: a failure may have arrived since.
            let gone = self
                .entries
                .remove_if(key, |_, e| e.blocked_until == 0 && e.tat <= now);
            if gone.is_some() {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
        ended
    }
}

/// The failures that do not block: `max_failures - 1` per `window`, as a rate (`None` when
/// a single failure blocks).
fn failure_rate(p: &AuthFailures) -> Option<Rate> {
    let window = u32::try_from(p.window.as_secs())
        .ok()
        .and_then(NonZeroU32::new)
        .unwrap_or(NonZeroU32::MIN);
    NonZeroU32::new(p.max_failures.get() - 1).map(|allowed| Rate::new(allowed, window))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;
    use std::num::NonZeroUsize;

    const SEC: u64 = NANOS_PER_SEC;

    fn params(max: u32, window: u64, block: u64, tracked: usize) -> AuthFailures {
        AuthFailures {
            max_failures: NonZeroU32::new(max).unwrap(),
            window: Duration::from_secs(window),
            block: Duration::from_secs(block),
            max_tracked_ips: NonZeroUsize::new(tracked).unwrap(),
        }
    }

    fn key(s: &str) -> ClientKey {
        ClientKey::of(s.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn the_max_failures_th_failure_in_a_window_starts_the_block() {
        let t = FailureTable::new();
        let p = params(5, 60, 300, 100);
        let a = key("192.0.2.1");
        for i in 0..4 {
            assert_eq!(t.failed(a, 10 * SEC, &p), None, "failure {i}");
            assert_eq!(t.blocked(a, 10 * SEC), None);
        }
        let started = t.failed(a, 10 * SEC, &p).expect("the fifth blocks");
        assert_eq!(started.duration, Duration::from_secs(300));
        assert_eq!(t.blocked(a, 10 * SEC), Some(300));
        assert_eq!(t.blocked(a, 10 * SEC + 299 * SEC + 1), Some(1));
        assert_eq!(t.blocked_count(), 1);
        // Another address is untouched.
        assert_eq!(t.blocked(key("192.0.2.2"), 10 * SEC), None);
        // Failures while blocked are not counted and start nothing.
        assert_eq!(t.failed(a, 20 * SEC, &p), None);
        // Over: no longer blocked, and the sweep reports the end once.
        let end = 10 * SEC + 300 * SEC;
        assert_eq!(t.blocked(a, end), None);
        assert_eq!(t.sweep(end), vec![a]);
        assert_eq!(t.sweep(end + SEC), vec![]);
        assert_eq!((t.blocked_count(), t.len()), (0, 0));
    }

    #[test]
    fn blocks_are_listed_with_their_failures_and_released_at_once() {
        let t = FailureTable::new();
        let p = params(3, 60, 300, 100);
        let (a, b) = (key("192.0.2.1"), key("2001:db8:1:2::7"));
        assert_eq!(t.blocks(0), vec![]);
        for _ in 0..3 {
            t.failed(a, 10 * SEC, &p);
        }
        for _ in 0..3 {
            t.failed(b, 20 * SEC, &p);
        }
        // Failures while blocked are not counted.
        t.failed(a, 30 * SEC, &p);
        let want = |key, since: u64| Block {
            key,
            since: since * SEC,
            until: (since + 300) * SEC,
            failures: 3,
        };
        assert_eq!(t.blocks(30 * SEC), vec![want(a, 10), want(b, 20)]);
        // Released: not blocked, not listed, its failures forgotten (two more do not block).
        assert!(t.release(a, 40 * SEC));
        assert_eq!(t.blocked(a, 40 * SEC), None);
        assert_eq!(t.blocks(40 * SEC), vec![want(b, 20)]);
        assert_eq!((t.blocked_count(), t.len()), (1, 1));
        assert_eq!(t.failed(a, 41 * SEC, &p), None);
        assert_eq!(t.failed(a, 41 * SEC, &p), None);
        assert_eq!(t.blocked(a, 41 * SEC), None);
        // Not blocked (or no longer): nothing to release, nothing changes.
        assert!(!t.release(a, 42 * SEC));
        assert!(!t.release(key("192.0.2.99"), 42 * SEC));
        assert!(!t.release(b, 320 * SEC), "its block is over");
        assert_eq!(t.blocks(320 * SEC), vec![]);
        assert_eq!(t.sweep(320 * SEC), vec![b]);
        assert_eq!(t.blocked_count(), 0);
    }

    #[test]
    fn failing_more_slowly_than_the_window_allows_never_blocks() {
        let t = FailureTable::new();
        let p = params(5, 60, 300, 100);
        let a = key("2001:db8::1");
        // Four may fail per 60 s: one failure every 15 s never blocks.
        for i in 0..100u64 {
            assert_eq!(t.failed(a, i * 15 * SEC, &p), None, "failure {i}");
        }
        // One every 11 s catches up.
        let mut blocked = false;
        for i in 0..100u64 {
            blocked |= t.failed(a, 2000 * SEC + i * 11 * SEC, &p).is_some();
        }
        assert!(blocked);
    }

    #[test]
    fn failures_spread_over_real_time_still_block_at_the_max_th() {
        let t = FailureTable::new();
        let p = params(3, 60, 300, 100);
        let a = key("192.0.2.9");
        assert_eq!(t.failed(a, SEC, &p), None);
        assert_eq!(t.failed(a, SEC + 3_000_000, &p), None);
        assert!(t.failed(a, SEC + 7_000_000, &p).is_some());
        // A single failure blocks when `max_failures` is 1.
        let one = params(1, 60, 300, 100);
        assert!(t.failed(key("192.0.2.10"), SEC, &one).is_some());
    }

    #[test]
    fn an_ipv6_64_is_one_client() {
        let t = FailureTable::new();
        let p = params(3, 60, 60, 100);
        t.failed(key("2001:db8:1:2::1"), 0, &p);
        t.failed(key("2001:db8:1:2::2"), 0, &p);
        assert!(t.failed(key("2001:db8:1:2:ffff::3"), 0, &p).is_some());
        assert!(t.blocked(key("2001:db8:1:2::99"), 0).is_some());
        assert!(t.blocked(key("2001:db8:1:3::1"), 0).is_none());
    }

    #[test]
    fn the_table_never_passes_its_bound_and_evicts_the_least_recently_seen() {
        let t = FailureTable::new();
        let p = params(1000, 60, 60, 16);
        for i in 0..16u64 {
            t.failed(key(&format!("198.51.100.{i}")), i * SEC, &p);
        }
        assert_eq!(t.len(), 16);
        // A new address evicts the oldest eighth (2 entries): .0 and .1.
        t.failed(key("203.0.113.1"), 100 * SEC, &p);
        assert_eq!(t.len(), 15);
        assert!(t.entries.get(&key("198.51.100.0")).is_none());
        assert!(t.entries.get(&key("198.51.100.1")).is_none());
        assert!(t.entries.get(&key("198.51.100.2")).is_some());
        for i in 0..1000u64 {
            t.failed(
                key(&format!("10.0.{}.{}", i / 256, i % 256)),
                200 * SEC + i,
                &p,
            );
            assert!(t.len() <= 16);
        }
    }

    #[test]
    fn a_block_outlasts_any_number_of_other_failing_addresses() {
        let t = FailureTable::new();
        let p = params(3, 60, 600, 16);
        // The oldest entry of all, and blocked.
        for _ in 0..3 {
            t.failed(key("192.0.2.66"), 0, &p);
        }
        assert!(t.blocked(key("192.0.2.66"), 0).is_some());
        // Ten thousand other addresses fail meanwhile, each once, far past the table's bound.
        for i in 0..10_000u64 {
            let ip = format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256);
            t.failed(key(&ip), SEC + i * 1000, &p);
            assert!(t.len() <= 16);
        }
        assert_eq!(t.blocked(key("192.0.2.66"), 2 * SEC), Some(598));
        // A table of blocks only: a new address's failure goes uncounted, the bound holds.
        let full = FailureTable::new();
        for i in 0..16u64 {
            for _ in 0..3 {
                full.failed(key(&format!("198.51.100.{i}")), i, &p);
            }
        }
        assert_eq!(full.blocked_count(), 16);
        for _ in 0..5 {
            assert!(full.failed(key("203.0.113.9"), 100, &p).is_none());
        }
        assert_eq!(full.len(), 16);
        assert!(full.blocked(key("203.0.113.9"), 100).is_none());
        // Once the blocks are over, their entries are evicted like any other.
        assert!(full.failed(key("203.0.113.9"), 700 * SEC, &p).is_none());
        assert!(full.entries.get(&key("203.0.113.9")).is_some());
    }

    #[test]
    fn many_threads_never_pass_the_bound() {
        let t = std::sync::Arc::new(FailureTable::new());
        let p = params(1000, 60, 60, 64);
        let threads: Vec<_> = (0..4u64)
            .map(|th| {
                let t = std::sync::Arc::clone(&t);
                std::thread::spawn(move || {
                    for i in 0..2000u64 {
                        let ip = format!("10.{th}.{}.{}", i / 256, i % 256);
                        t.failed(key(&ip), i, &p);
                        assert!(t.len() <= 64);
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert!(t.len() <= 64);
        assert_eq!(t.len(), t.entries.len());
    }

    #[test]
    fn the_sweep_drops_what_has_nothing_left_to_remember() {
        let t = FailureTable::new();
        let p = params(5, 60, 300, 100);
        t.failed(key("192.0.2.1"), 0, &p);
        // One failure: remembered for one interval (60 s / 4 = 15 s).
        assert_eq!(t.sweep(14 * SEC), vec![]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.sweep(15 * SEC), vec![]);
        assert_eq!(t.len(), 0);
    }
}
