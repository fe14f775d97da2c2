//! Per-provider request rate (RPM, `governor`), token rate (TPM,
//! [`TokenBucket`]) and concurrency (`tokio::sync::Semaphore`) limits kept
//! by this replica alone (SPEC §4): the limits without `[cluster]`, and the
//! fallback share of them while the cluster store is down.
//!
//! Two ways in:
//! - [`LocalLimits::try_acquire`] never waits: INTERACTIVE requests skip a
//!   saturated provider and move on to the next target.
//! - [`LocalLimits::acquire_until`] waits for a concurrency slot and a rate
//!   token, but never past the deadline: BACKGROUND requests.
//!
//! The concurrency slot is taken first, then the call's tokens, then the
//! rate token: a slot and tokens can be given back, a governor token
//! cannot, so a request refused by either must not have spent one. The
//! [`LocalPermit`] releases the slot when dropped.
//!
//! # Clock
//!
//! governor's default clock (quanta) reads real time, which tokio's paused
//! test clock cannot move. The limiter therefore runs on [`TokioClock`], a
//! governor clock reading [`tokio::time::Instant`]: in production it is the
//! monotonic clock, in tests `tokio::time::advance` drives the rate limit,
//! so the exact code that runs in production is the code under test.

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
    // governor implements its `Reference` for `Duration`: an offset from
    // `origin` is all the GCRA needs.
    type Instant = Duration;

    fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Duration>>;

/// Permission to send one request; holds one concurrency slot until
/// dropped, and the call's token estimate until settled.
#[derive(Debug)]
#[must_use = "the concurrency slot is released as soon as the permit is dropped"]
pub struct LocalPermit {
    _slot: OwnedSemaphorePermit,
    tokens: Option<Taken>,
}

/// Tokens a call took: from which bucket, how many, when.
#[derive(Debug)]
struct Taken {
    bucket: Arc<TokenBucket>,
    estimate: u64,
    at: Instant,
}

impl LocalPermit {
    /// Corrects the call's token estimate to `actual` (`None`: the
    /// estimate stands) and releases the slot.
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
    /// Limits of `rpm` requests per minute (`None` or 0 = unlimited; config
    /// validation rejects 0) and `max_concurrency` calls in flight (at least
    /// 1, at most [`Semaphore::MAX_PERMITS`]).
    ///
    /// The rate uses governor's `Quota::per_minute`: a burst of up to `rpm`
    /// requests, then one every `60 s / rpm`.
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

    /// A permit for a call of `estimate` tokens now, or why not. Never
    /// waits.
    pub fn try_acquire(&self, estimate: u64) -> Result<LocalPermit, LimitRejected> {
        let slot = match Arc::clone(&self.inner.slots).try_acquire_owned() {
            Ok(slot) => slot,
            // The semaphore is never closed; treat it as full if it were.
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

    /// Takes the call's tokens, to be settled.
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

    /// Waits for a concurrency slot and then a rate token, never past
    /// `deadline`. Gives up at the deadline when no slot frees up, and at once
    /// when the rate limiter's next opening is at or after the deadline.
    pub async fn acquire_until(
        &self,
        deadline: Instant,
        estimate: u64,
    ) -> Result<LocalPermit, LimitRejected> {
        let slots = Arc::clone(&self.inner.slots);
        let slot = match tokio::time::timeout_at(deadline, slots.acquire_owned()).await {
            Ok(Ok(slot)) => slot,
            // Deadline reached, or (never happens) the semaphore was closed.
            Ok(Err(_)) | Err(_) => return Err(LimitRejected::Saturated),
        };
        // Holding the slot while waiting for tokens and the rate keeps
        // them from being spent by a request that would then find no slot.
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

/// Returns tokens taken for a call that was then refused.
fn give_back(tokens: Option<Taken>) {
    if let Some(taken) = tokens {
        taken.bucket.give_back(taken.estimate, taken.at);
    }
}

#[cfg(test)]
mod tests;
