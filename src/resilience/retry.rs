//! Retry policy: exponential backoff with full jitter, `Retry-After`, the
//! request deadline and the request's priority (SPEC §4).
//!
//! The policy only *decides*; it never sleeps. The router sleeps for the
//! returned duration (after dropping its breaker and limit permits) and calls
//! the same target again, or moves on.
//!
//! Attempts are numbered from 1 per target. After attempt `n` fails, the
//! backoff cap is `base · 2^(n-1)` (1 s, 2 s, 4 s, ...) limited to
//! `max_backoff`, and the wait is drawn uniformly from `[0, cap]` ("full
//! jitter", which spreads the retries of many clients that failed together).
//! With the default 3 attempts, waits are drawn after attempts 1 and 2.

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

/// A source of jitter: fractions in `[0, 1)`.
///
/// Every [`rand::Rng`] is one (pass `&mut rand::rng()` in production); tests
/// use [`FixedJitter`] for exact, deterministic waits.
pub trait JitterSource {
    /// The next fraction of the backoff cap to wait, in `[0, 1)`. Values out
    /// of range (or NaN) are clamped into `[0, 1]`.
    fn fraction(&mut self) -> f64;
}

impl<R: rand::Rng + ?Sized> JitterSource for R {
    fn fraction(&mut self) -> f64 {
        self.random::<f64>()
    }
}

/// Always the same fraction: `FixedJitter(0.0)` waits nothing (beyond any
/// `Retry-After`), `FixedJitter(1.0)` waits the full cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedJitter(pub f64);

impl JitterSource for FixedJitter {
    fn fraction(&mut self) -> f64 {
        self.0
    }
}

/// The jitter a router draws from: `Copy` and `Send` (unlike `rand::rng()`,
/// which is made fresh for each draw), so a router can hold one and tests can
/// make its backoff exact.
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

/// How failed attempts at one target are retried. `Default` is the SPEC's
/// seed policy.
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
    /// The backoff cap after attempt `attempt` (1-based) failed:
    /// `base · 2^(attempt-1)`, at most `max_backoff`.
    pub fn backoff_cap(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1);
        let factor = 1u32.checked_shl(doublings).unwrap_or(u32::MAX);
        self.base_backoff
            .saturating_mul(factor)
            .min(self.max_backoff)
    }

    /// The wait after attempt `attempt` failed: uniform in `[0, cap]`, but
    /// never less than the provider's `Retry-After`.
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

    /// What to do after attempt `attempt` (1-based, per target) failed with
    /// `err`, at `now`, given the request `deadline`.
    ///
    /// `has_next_target` says whether the chain has a target after this one.
    ///
    /// - Not retryable ([`ProviderError::is_retryable`]) or out of attempts:
    ///   move on.
    /// - A wait ending at or after the deadline leaves no time for the call:
    ///   move on (the router then notices the deadline itself).
    /// - INTERACTIVE with a next target: retry here only if the wait is at
    ///   most `interactive_max_wait`, else fail over at once.
    /// - Otherwise (BACKGROUND, or INTERACTIVE at the last target): retry
    ///   after the wait.
    ///
    /// "Move on" is [`Decision::NextTarget`] when there is one, else
    /// [`Decision::GiveUp`].
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
        // A 429 without `Retry-After` still puts the provider in its
        // default cooldown; a retry inside it would only be skipped.
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
