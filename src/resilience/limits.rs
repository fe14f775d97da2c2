//! Per-provider request rate (RPM, `governor`) and concurrency
//! (`tokio::sync::Semaphore`) limits for this replica (SPEC §4).
//!
//! Two ways in:
//! - [`ProviderLimits::try_acquire`] never waits: INTERACTIVE requests skip a
//!   saturated provider and move on to the next target.
//! - [`ProviderLimits::acquire_until`] waits for a concurrency slot and a rate
//!   token, but never past the deadline: BACKGROUND requests.
//!
//! The concurrency slot is taken *before* the rate token: a slot can be given
//! back, a governor token cannot, so a request that fails to get a slot must
//! not have spent one. The [`LimitPermit`] releases the slot when dropped.
//!
//! # Clock
//!
//! governor's default clock (quanta) reads real time, which tokio's paused
//! test clock cannot move. The limiter therefore runs on [`TokioClock`], a
//! governor clock reading [`tokio::time::Instant`]: in production it is the
//! monotonic clock, in tests `tokio::time::advance` drives the rate limit,
//! so the exact code that runs in production is the code under test.

use governor::{
    Quota, RateLimiter,
    clock::Clock,
    middleware::NoOpMiddleware,
    state::{InMemoryState, NotKeyed},
};
use std::{num::NonZeroU32, sync::Arc, time::Duration};
use tokio::{
    sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError},
    time::Instant,
};

/// A governor clock on tokio's time: time since the limiter was built.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    // governor implements its `Reference` for `Duration`: an offset from
    // `origin` is all the GCRA needs.
    type Instant = Duration;

    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>;

/// Why no permit was granted. The provider is skipped (INTERACTIVE) or the
/// deadline would have passed while waiting (BACKGROUND).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitRejected {
    /// Every concurrency slot is in use (until the deadline, for
    /// [`ProviderLimits::acquire_until`]).
    #[error("provider concurrency limit reached")]
    Saturated,
    /// The RPM budget is spent; the next request conforms in `retry_in`.
    #[error("provider rate limit reached (retry in {retry_in:?})")]
    RateLimited {
        /// Time until a request would be admitted.
        retry_in: Duration,
    },
}

/// Permission to send one request; holds one concurrency slot until dropped.
#[derive(Debug)]
#[must_use = "the concurrency slot is released as soon as the permit is dropped"]
pub struct LimitPermit {
    _slot: OwnedSemaphorePermit,
}

/// One provider's limits. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct ProviderLimits {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rate: Option<Limiter>,
    slots: Arc<Semaphore>,
    max_concurrency: usize,
}

impl ProviderLimits {
    /// Limits of `rpm` requests per minute (`None` or 0 = unlimited; config
    /// validation rejects 0) and `max_concurrency` calls in flight (at least
    /// 1, at most [`Semaphore::MAX_PERMITS`]).
    ///
    /// The rate uses governor's `Quota::per_minute`: a burst of up to `rpm`
    /// requests, then one every `60 s / rpm`.
    pub fn new(rpm: Option<u32>, max_concurrency: usize) -> Self {
        let max_concurrency = max_concurrency.clamp(1, Semaphore::MAX_PERMITS);
        let rate = rpm
            .and_then(NonZeroU32::new)
            .map(|n| RateLimiter::direct_with_clock(Quota::per_minute(n), TokioClock::new()));
        Self {
            inner: Arc::new(Inner {
                rate,
                slots: Arc::new(Semaphore::new(max_concurrency)),
                max_concurrency,
            }),
        }
    }

    /// A permit now, or why not. Never waits.
    pub fn try_acquire(&self) -> Result<LimitPermit, LimitRejected> {
        let slot = match Arc::clone(&self.inner.slots).try_acquire_owned() {
            Ok(slot) => slot,
            // The semaphore is never closed; treat it as full if it were.
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                return Err(LimitRejected::Saturated);
            }
        };
        match self.rate_wait() {
            None => Ok(LimitPermit { _slot: slot }),
            Some(retry_in) => Err(LimitRejected::RateLimited { retry_in }),
        }
    }

    /// Waits for a concurrency slot and then a rate token, never past
    /// `deadline`. Gives up at the deadline when no slot frees up, and at once
    /// when the rate limiter's next opening is at or after the deadline.
    pub async fn acquire_until(&self, deadline: Instant) -> Result<LimitPermit, LimitRejected> {
        let slots = Arc::clone(&self.inner.slots);
        let slot = match tokio::time::timeout_at(deadline, slots.acquire_owned()).await {
            Ok(Ok(slot)) => slot,
            // Deadline reached, or (never happens) the semaphore was closed.
            Ok(Err(_)) | Err(_) => return Err(LimitRejected::Saturated),
        };
        // Holding the slot while waiting for the rate keeps the token from
        // being spent by a request that would then find no slot.
        loop {
            let Some(wait) = self.rate_wait() else {
                return Ok(LimitPermit { _slot: slot });
            };
            let now = Instant::now();
            if wait >= deadline.saturating_duration_since(now) {
                return Err(LimitRejected::RateLimited { retry_in: wait });
            }
            // Another waiter may take the token first; then check again.
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a rate token: `None` when taken (or unlimited), else how long
    /// until one is available.
    fn rate_wait(&self) -> Option<Duration> {
        let limiter = self.inner.rate.as_ref()?;
        match limiter.check() {
            Ok(()) => None,
            // At least 1 ns, so "not now" never reads as "now".
            Err(not_until) => Some(
                not_until
                    .wait_time_from(limiter.clock().now())
                    .max(Duration::from_nanos(1)),
            ),
        }
    }

    /// Concurrency slots configured.
    pub fn max_concurrency(&self) -> usize {
        self.inner.max_concurrency
    }

    /// Calls holding a slot right now (for the ops RPC).
    pub fn in_flight(&self) -> usize {
        self.inner
            .max_concurrency
            .saturating_sub(self.inner.slots.available_permits())
    }
}

#[cfg(test)]
mod tests;
