//! `tpm` on one replica: a bucket draining `tpm` tokens a minute, by the rule of the shared
//! store's script (`cluster::scripts::ADMIT`) on tokio's clock. A call is refused while it would
//! overfill the bucket, unless the bucket is empty: a call larger than `tpm` goes alone.

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};
use tokio::time::Instant;

const MINUTE: f64 = 60.0;

/// Tokens of the last minute, draining continuously.
#[derive(Debug)]
pub struct TokenBucket {
    tpm: u64,
    state: Mutex<Level>,
}

#[derive(Debug, Clone, Copy)]
struct Level {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// An empty bucket of `tpm` tokens a minute (at least 1).
    pub fn new(tpm: u64) -> Self {
        Self {
            tpm: tpm.max(1),
            state: Mutex::new(Level {
                tokens: 0.0,
                at: Instant::now(),
            }),
        }
    }

    fn per_second(&self) -> f64 {
        self.tpm as f64 / MINUTE
    }

    fn drained(&self, level: Level, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(level.at).as_secs_f64();
        (level.tokens - elapsed * self.per_second()).max(0.0)
    }

    /// Takes `estimate` tokens, or says how long until they fit.
    pub fn try_take(&self, estimate: u64) -> Result<(), Duration> {
        let now = Instant::now();
        let mut level = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let tokens = self.drained(*level, now);
        let after = tokens + estimate as f64;
        if tokens > 0.0 && after > self.tpm as f64 {
            let excess = tokens.min(after - self.tpm as f64);
            let wait = excess / self.per_second();
            return Err(Duration::from_secs_f64(wait.min(MINUTE)).max(Duration::from_nanos(1)));
        }
        *level = Level {
            tokens: after,
            at: now,
        };
        Ok(())
    }

    /// Corrects a take of `estimate` tokens at `taken_at` to `actual`. A give-back is capped at
    /// what has not drained since: taking more would erase other calls' tokens.
    pub fn settle(&self, estimate: u64, actual: u64, taken_at: Instant) {
        let now = Instant::now();
        let mut delta = actual as f64 - estimate as f64;
        if delta < 0.0 {
            let since = now.saturating_duration_since(taken_at).as_secs_f64();
            let undrained = (estimate as f64 - since * self.per_second()).max(0.0);
            delta = delta.max(-undrained);
        }
        let mut level = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let tokens = (self.drained(*level, now) + delta).max(0.0);
        *level = Level { tokens, at: now };
    }

    /// Gives back a whole take (a call refused after taking it).
    pub fn give_back(&self, estimate: u64, taken_at: Instant) {
        self.settle(estimate, 0, taken_at);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::time::advance;

    #[tokio::test(start_paused = true)]
    async fn fills_to_tpm_drains_over_a_minute_and_takes_corrections() {
        let bucket = TokenBucket::new(6_000);
        bucket.try_take(4_000).unwrap();
        bucket.try_take(2_000).unwrap();
        // Full: 1,000 more fit after 10 s of draining at 100 a second.
        assert_eq!(bucket.try_take(1_000), Err(Duration::from_secs(10)));
        advance(Duration::from_secs(10)).await;
        bucket.try_take(1_000).unwrap();
        bucket.settle(4_000, 1_000, Instant::now());
        bucket.try_take(3_000).unwrap();
        assert!(bucket.try_take(1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_larger_than_tpm_goes_alone_on_an_empty_bucket() {
        let bucket = TokenBucket::new(1_000);
        bucket.try_take(500).unwrap();
        // It waits for the bucket to empty, not for room it can never have.
        assert_eq!(bucket.try_take(5_000), Err(Duration::from_secs(30)));
        advance(Duration::from_secs(30)).await;
        bucket.try_take(5_000).unwrap();
        assert!(bucket.try_take(1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_give_back_never_erases_later_takes() {
        let bucket = TokenBucket::new(6_000);
        let first = Instant::now();
        bucket.try_take(4_000).unwrap();
        // Meanwhile the first call's 4,000 drain: nothing is left to give back.
        advance(Duration::from_secs(40)).await;
        bucket.try_take(4_000).unwrap();
        bucket.settle(4_000, 100, first);
        assert!(
            bucket.try_take(2_001).is_err(),
            "the second call's 4,000 still count"
        );
        bucket.try_take(2_000).unwrap();
    }
}
