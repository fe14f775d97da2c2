//! This replica's limits (SPEC §4): RPM with `governor`, TPM with a [`TokenBucket`], concurrency
//! with a semaphore; the limits without `[cluster]`, the fallback share while its store is down.
//! [`LocalLimits::try_acquire`] never waits (INTERACTIVE); [`LocalLimits::acquire_until`] waits
//! up to a deadline (BACKGROUND). The slot is taken first, then tokens, then the rate token:
//! slot and tokens can be given back, a governor token cannot.
//!
//! governor's default clock reads real time, which tokio's paused clock cannot move; on
//! [`TokioClock`] the tests drive the very code that runs in production.

use super::{LimitRejected, tokens::TokenBucket};
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
    // governor's `Reference` is implemented for `Duration`: an offset is all the GCRA needs.
    type Instant = Duration;

    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>;

/// Permission to send one request: a slot until dropped, the token estimate until settled.
#[derive(Debug)]
#[must_use = "the concurrency slot is released as soon as the permit is dropped"]
pub struct LocalPermit {
    _slot: OwnedSemaphorePermit,
    tokens: Option<Taken>,
}

#[derive(Debug)]
struct Taken {
    bucket: Arc<TokenBucket>,
    estimate: u64,
    at: Instant,
}

impl LocalPermit {
    /// Corrects the call's token estimate to `actual`, if reported, and releases the slot.
    pub fn settle(self, actual: Option<u64>) {
        if let (Some(taken), Some(actual)) = (&self.tokens, actual) {
            taken.bucket.settle(taken.estimate, actual, taken.at);
        }
    }
}

/// One provider's limits. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct LocalLimits {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rate: Option<Limiter>,
    tokens: Option<Arc<TokenBucket>>,
    slots: Arc<Semaphore>,
    max_concurrency: usize,
}

impl LocalLimits {
    /// At most `rpm` requests a minute (governor's `per_minute`: a burst of `rpm`, then one every
    /// 60 s / `rpm`; `None` or 0: unlimited), `tpm` tokens, and `max_concurrency` calls at once.
    pub fn new(rpm: Option<u32>, tpm: Option<u64>, max_concurrency: usize) -> Self {
        let max_concurrency = max_concurrency.clamp(1, Semaphore::MAX_PERMITS);
        let rate = rpm
            .and_then(NonZeroU32::new)
            .map(|n| RateLimiter::direct_with_clock(Quota::per_minute(n), TokioClock::new()));
        Self {
            inner: Arc::new(Inner {
                rate,
                tokens: tpm.map(|tpm| Arc::new(TokenBucket::new(tpm))),
                slots: Arc::new(Semaphore::new(max_concurrency)),
                max_concurrency,
            }),
        }
    }

    /// A permit for a call of `estimate` tokens now, or why not.
    pub fn try_acquire(&self, estimate: u64) -> Result<LocalPermit, LimitRejected> {
        let slot = match Arc::clone(&self.inner.slots).try_acquire_owned() {
            Ok(slot) => slot,
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => {
                return Err(LimitRejected::Saturated);
            }
        };
        let tokens = self.take_tokens(estimate)?;
        match self.rate_wait() {
            None => Ok(LocalPermit {
                _slot: slot,
                tokens,
            }),
            Some(retry_in) => {
                give_back(tokens);
                Err(LimitRejected::RateLimited { retry_in })
            }
        }
    }

    fn take_tokens(&self, estimate: u64) -> Result<Option<Taken>, LimitRejected> {
        let Some(bucket) = &self.inner.tokens else {
            return Ok(None);
        };
        bucket
            .try_take(estimate)
            .map(|()| {
                Some(Taken {
                    bucket: Arc::clone(bucket),
                    estimate,
                    at: Instant::now(),
                })
            })
            .map_err(|retry_in| LimitRejected::TokensLimited { retry_in })
    }

    /// Waits for a slot, then the tokens and a rate token, never past `deadline`.
    pub async fn acquire_until(
        &self,
        deadline: Instant,
        estimate: u64,
    ) -> Result<LocalPermit, LimitRejected> {
        let slots = Arc::clone(&self.inner.slots);
        let slot = match tokio::time::timeout_at(deadline, slots.acquire_owned()).await {
            Ok(Ok(slot)) => slot,
            Ok(Err(_)) | Err(_) => return Err(LimitRejected::Saturated),
        };
        // Holding the slot while waiting keeps the tokens and the rate for a call that can go.
        let tokens = loop {
            match self.take_tokens(estimate) {
                Ok(tokens) => break tokens,
                Err(LimitRejected::TokensLimited { retry_in })
                    if retry_in < deadline.saturating_duration_since(Instant::now()) =>
                {
                    tokio::time::sleep(retry_in).await;
                }
                Err(rejected) => return Err(rejected),
            }
        };
        loop {
            let Some(wait) = self.rate_wait() else {
                return Ok(LocalPermit {
                    _slot: slot,
                    tokens,
                });
            };
            let now = Instant::now();
            if wait >= deadline.saturating_duration_since(now) {
                give_back(tokens);
                return Err(LimitRejected::RateLimited { retry_in: wait });
            }
            // Another waiter may take the token first; then check again.
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a rate token: `None` when taken (or unlimited), else how long until one is.
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

fn give_back(tokens: Option<Taken>) {
    if let Some(taken) = tokens {
        taken.bucket.give_back(taken.estimate, taken.at);
    }
}

#[cfg(test)]
mod tests;
