//! Time for the rate limiter, injectable so tests move it by hand instead of sleeping.
//!
//! The limiter only needs a monotonic count of nanoseconds from some fixed origin; wall-clock
//! time never enters a decision, so a clock step (NTP, DST) cannot refill or drain a budget.
//!
//! This is the only module of the core that reads the system's clocks (`Instant::now`,
//! `SystemTime::now`): everything else takes time as an argument or a [`Clock`], and
//! `crates/core/clippy.toml` makes a read anywhere else an error.

// The one module allowed to read the system's clocks (crates/core/clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the clock's origin.
pub type Nanos = u64;

/// A source of monotonic time in [`Nanos`] for the rate limiter.
pub trait Clock: Send + Sync + 'static {
    /// Monotonic: never smaller than a value returned before.
    fn now(&self) -> Nanos;
}

/// The process's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    /// A clock that reads 0 until advanced.
    pub fn new() -> Self {
        Self::default()
    }

    /// Move the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}

/// The monotonic clock read as ms since the Unix epoch, from where the wall clock stood when
/// the anchor was made: times that stay as many ms apart as the events were, whatever the
/// wall clock does afterwards (the operator's view, [`crate::usage`]).
#[derive(Debug, Clone, Copy)]
pub struct Anchor {
    origin: Instant,
    origin_ms: u64,
}

impl Anchor {
    /// Both clocks read now.
    pub fn now() -> Self {
        Self::at(
            Instant::now(),
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        )
    }

    /// An anchor at a given pair: `origin` is `origin_ms` ms since the epoch.
    pub fn at(origin: Instant, origin_ms: u64) -> Self {
        Self { origin, origin_ms }
    }

    /// Now, in ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.ms_at(Instant::now())
    }

    /// `at`, in ms since the Unix epoch (an instant before the origin reads as the origin).
    pub fn ms_at(&self, at: Instant) -> u64 {
        self.origin_ms + at.saturating_duration_since(self.origin).as_millis() as u64
    }
}

/// `unix_ms` as an RFC 3339 instant in UTC, to the second: `2026-11-25T19:40:00Z` (the
/// operator's API; out of range reads as the epoch).
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = i64::try_from(unix_ms / 1000).unwrap_or(0);
    let at =
        time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The wall clock now, in ms since the Unix epoch (expiry and rotation deadlines, which the
/// operator writes as instants; never a rate-limit window).
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An RFC 3339 instant in UTC (`Z` or `+00:00`), in ms since the Unix epoch; `None` for any
/// other text, another offset, or an instant before the epoch.
pub fn parse_rfc3339_utc(text: &str) -> Option<u64> {
    let at =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    if !at.offset().is_utc() {
        return None;
    }
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod rfc3339_tests {
    use super::{parse_rfc3339_utc, rfc3339};

    #[test]
    fn only_utc_instants_are_read() {
        assert_eq!(parse_rfc3339_utc("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(
            parse_rfc3339_utc("2026-11-25T19:40:00.5+00:00"),
            Some(1_795_635_600_500)
        );
        for bad in [
            "2026-11-25T19:40:00+01:00",
            "2026-11-25",
            "2026-11-25 19:40:00",
            "1969-12-31T23:59:59Z",
            "",
        ] {
            assert_eq!(parse_rfc3339_utc(bad), None, "{bad}");
        }
    }

    #[test]
    fn instants_are_written_in_utc_to_the_second() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_635_600_999), "2026-11-25T19:40:00Z");
        assert_eq!(rfc3339(u64::MAX), "1970-01-01T00:00:00Z");
    }
}
