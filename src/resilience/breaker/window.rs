//! The `error_rate` mode's sliding window: a fixed ring of buckets, so memory and a look cost the
//! same at any call rate (one entry per call would be 150,000 at 5,000/s over 30 s). The price:
//! a call counts for 0.9 to 1 × `window`, which matters only right at the threshold.

use std::time::Duration;
use tokio::time::Instant;

/// Buckets in the window: 3 s each for the default 30 s.
pub(super) const BUCKETS: usize = 10;

#[derive(Debug)]
pub(super) struct Window {
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
    /// At least `min_requests` calls, and a failure share of at least `error_rate`.
    pub(super) fn trips(self, min_requests: u32, error_rate: f64) -> bool {
        self.calls >= min_requests.max(1)
            && f64::from(self.failures) >= error_rate * f64::from(self.calls)
    }
}

impl Window {
    pub(super) fn new(window: Duration, now: Instant) -> Self {
        let width = (window / BUCKETS as u32).max(Duration::from_nanos(1));
        Self {
            origin: now,
            width,
            ring: [(u64::MAX, 0, 0); BUCKETS],
        }
    }

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

    pub(super) fn clear(&mut self) {
        self.ring = [(u64::MAX, 0, 0); BUCKETS];
    }

    fn bucket(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos() / self.width.as_nanos()).unwrap_or(u64::MAX - 1)
    }
}
