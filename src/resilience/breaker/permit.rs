//! The permit a breaker hands out for one call, and how its result (or its
//! cancellation) is reported back.

use super::{DEFAULT_COOLDOWN, Inner, Outcome};
use crate::providers::ProviderError;
use std::sync::Arc;

/// Permission for one call, issued by
/// [`CircuitBreaker::try_acquire`](super::CircuitBreaker::try_acquire).
///
/// Report the result with [`Permit::record`] or [`Permit::record_error`].
/// Dropping it unrecorded (the client cancelled) frees a half-open probe slot
/// and changes nothing else.
#[derive(Debug)]
#[must_use = "dropping a permit unrecorded reports the call as cancelled"]
pub struct Permit {
    breaker: Arc<Inner>,
    generation: u64,
    done: bool,
}

impl Permit {
    pub(super) fn new(breaker: Arc<Inner>, generation: u64) -> Self {
        Self {
            breaker,
            generation,
            done: false,
        }
    }

    /// The breaker generation this permit was issued in.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Reports the call's result. Ignored if the breaker changed state since
    /// the permit was issued.
    pub fn record(mut self, outcome: Outcome) {
        self.done = true;
        self.breaker.finish(self.generation, Some(outcome));
    }

    /// Reports a failed call: a 429 starts a cooldown (its `Retry-After`, or
    /// [`DEFAULT_COOLDOWN`]) — even for a stale permit, since the provider's
    /// request to back off holds regardless — and the error counts as a
    /// failure only if [`ProviderError::counts_against_breaker`].
    pub fn record_error(self, err: &ProviderError) {
        if err.is_rate_limited() {
            self.breaker
                .cooldown(err.retry_after().unwrap_or(DEFAULT_COOLDOWN));
        }
        self.record(Outcome::of_error(err));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.finish(self.generation, None);
        }
    }
}
