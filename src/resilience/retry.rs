//! Retry policy (SPEC §4): exponential backoff with full jitter, `Retry-After`, the deadline and
//! the priority. It only decides; the router sleeps, having dropped its permits. After attempt
//! `n` the wait is uniform in `[0, min(base · 2^(n-1), max_backoff)]`: full jitter spreads the
//! retries of clients that failed together.

use crate::{domain::Priority, domain::ProviderError};
use rand::RngExt;
use std::time::Duration;
use tokio::time::Instant;

pub use crate::config::{
    DEFAULT_BASE_BACKOFF, DEFAULT_INTERACTIVE_MAX_WAIT, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF,
};

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Sleep this long, then call the same target again.
    RetryAfter(Duration),
    /// Stop retrying this target; try the next one in the chain.
    NextTarget,
    /// Stop: no next target, and no (useful) retry here.
    GiveUp,
}

/// A source of jitter: any [`rand::Rng`], or [`FixedJitter`] for exact waits in tests.
pub trait JitterSource {
    /// The next fraction of the backoff cap to wait, in `[0, 1)`; others are clamped.
    fn fraction(&mut self) -> f64;
}

impl<R: rand::Rng + ?Sized> JitterSource for R {
    fn fraction(&mut self) -> f64 {
        self.random::<f64>()
    }
}

/// Always the same fraction: 0.0 waits nothing beyond `Retry-After`, 1.0 the full cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedJitter(pub f64);

impl JitterSource for FixedJitter {
    fn fraction(&mut self) -> f64 {
        self.0
    }
}

/// The jitter a router holds: `Copy` and `Send`, unlike `rand::rng()`, and fixable in tests.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Jitter {
    /// Fresh randomness for every draw (production).
    #[default]
    Random,
    /// Always this fraction, like [`FixedJitter`] (tests, reproducible runs).
    Fixed(f64),
}

impl JitterSource for Jitter {
    fn fraction(&mut self) -> f64 {
        match self {
            Jitter::Random => rand::rng().random::<f64>(),
            Jitter::Fixed(f) => *f,
        }
    }
}

/// How failed attempts at one target are retried; `Default` is the SPEC's seed policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Calls per target, the first included; 1 disables retries.
    pub max_attempts: u32,
    /// Backoff cap after attempt 1.
    pub base_backoff: Duration,
    /// Largest backoff cap.
    pub max_backoff: Duration,
    /// See [`DEFAULT_INTERACTIVE_MAX_WAIT`].
    pub interactive_max_wait: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base_backoff: DEFAULT_BASE_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            interactive_max_wait: DEFAULT_INTERACTIVE_MAX_WAIT,
        }
    }
}

impl RetryPolicy {
    /// The backoff cap after attempt `attempt` (1-based) failed.
    pub fn backoff_cap(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1);
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        self.base_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    /// The wait after attempt `attempt` failed: uniform in `[0, cap]`, at least `Retry-After`.
    pub fn backoff(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        jitter: &mut impl JitterSource,
    ) -> Duration {
        let f = jitter.fraction();
        // `Duration::mul_f64` panics on NaN/negative input; keep it in [0, 1].
        let f = if f.is_nan() { 0.0 } else { f.clamp(0.0, 1.0) };
        let jittered = self.backoff_cap(attempt).mul_f64(f);
        retry_after.map_or(jittered, |ra| jittered.max(ra))
    }

    /// What to do after attempt `attempt` (1-based, per target) failed with `err`. A wait that
    /// reaches the deadline moves on (the router then notices the deadline); INTERACTIVE with a
    /// next target retries here only within `interactive_max_wait`, else fails over at once.
    #[allow(clippy::too_many_arguments)] // each input is one fact the caller has at hand
    pub fn decide(
        &self,
        err: &ProviderError,
        attempt: u32,
        priority: Priority,
        has_next_target: bool,
        now: Instant,
        deadline: Instant,
        jitter: &mut impl JitterSource,
    ) -> Decision {
        let move_on = if has_next_target {
            Decision::NextTarget
        } else {
            Decision::GiveUp
        };
        if !err.is_retryable() || attempt >= self.max_attempts {
            return move_on;
        }
        // A bare 429 still starts the default cooldown; a retry inside it would only be skipped.
        let retry_after = err.retry_after().or_else(|| {
            err.is_rate_limited()
                .then_some(super::breaker::DEFAULT_COOLDOWN)
        });
        let wait = self.backoff(attempt, retry_after, jitter);
        if wait >= deadline.saturating_duration_since(now) {
            return move_on;
        }
        if priority == Priority::Interactive && has_next_target && wait > self.interactive_max_wait
        {
            return Decision::NextTarget;
        }
        Decision::RetryAfter(wait)
    }
}

#[cfg(test)]
mod tests;
