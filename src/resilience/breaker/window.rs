//! The sliding window of the `error_rate` mode: counted successes and
//! failures of the last `window`, in a fixed ring of buckets.
//!
//! A bucket ring instead of one entry per call keeps memory and the cost of
//! a look constant at any call rate (5,000 calls a second over 30 s would be
//! 150,000 entries). The price is granularity: the window is the current
//! bucket and the nine before it, so a call counts for between 0.9 and 1
//! × `window` (it leaves up to one bucket early), which only matters for
//! a rate sitting right at the threshold.

use std::time::Duration;
use tokio::time::Instant;

/// Buckets the window is cut into: 3 s each for the default 30 s window.
pub(super) const BUCKETS: usize = 10;

/// Counted calls of the last `window`.
#[derive(Debug)]
pub(super) struct Window {
    /// Start of bucket 0; bucket numbers count widths from here.
    origin: Instant,
    width: Duration,
    /// `(bucket number, successes, failures)`, slot = number % BUCKETS.
    ring: [(u64, u32, u32); BUCKETS],
}

/// The window's counts at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowCounts {
    /// Counted calls (successes and failures) in the window.
    pub calls: u32,
    /// Counted failures among them.
    pub failures: u32,
}

impl WindowCounts {
    /// Whether these counts open a breaker: at least `min_requests` calls
    /// and a failure share of at least `error_rate`.
    pub(super) fn trips(self, min_requests: u32, error_rate: f64) -> bool {
        self.calls >= min_requests.max(1)
            && f64::from(self.failures) >= error_rate * f64::from(self.calls)
    }
}

impl Window {
    /// An empty window of length `window` (at least `BUCKETS` ns).
    pub(super) fn new(window: Duration, now: Instant) -> Self {
        let width = (window / BUCKETS as u32).max(Duration::from_nanos(1));
        Self {
            origin: now,
            width,
            ring: [(u64::MAX, 0, 0); BUCKETS],
        }
    }

    /// Counts one call that ended at `now`.
    pub(super) fn record(&mut self, now: Instant, failed: bool) {
        let number = self.bucket(now);
        let slot = &mut self.ring[(number % BUCKETS as u64) as usize];
        if slot.0 != number {
            *slot = (number, 0, 0);
        }
        if failed {
            slot.2 = slot.2.saturating_add(1);
        } else {
            slot.1 = slot.1.saturating_add(1);
        }
    }

    /// The calls of the buckets still inside the window at `now`.
    pub(super) fn counts(&self, now: Instant) -> WindowCounts {
        let current = self.bucket(now);
        let oldest = current.saturating_sub(BUCKETS as u64 - 1);
        self.ring
            .iter()
            .filter(|(number, _, _)| (oldest..=current).contains(number))
            .fold(WindowCounts::default(), |acc, &(_, ok, failed)| {
                WindowCounts {
                    calls: acc.calls.saturating_add(ok).saturating_add(failed),
                    failures: acc.failures.saturating_add(failed),
                }
            })
    }

    /// Forgets every call: a breaker that opened or closed starts afresh.
    pub(super) fn clear(&mut self) {
        self.ring = [(u64::MAX, 0, 0); BUCKETS];
    }

    fn bucket(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos() / self.width.as_nanos()).unwrap_or(u64::MAX - 1)
    }
}
