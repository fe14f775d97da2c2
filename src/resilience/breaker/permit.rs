//! The permit a breaker hands out for one call, and how its result (or its
//! cancellation) is reported back.

use super::{DEFAULT_COOLDOWN, Inner, Outcome};
use crate::domain::ProviderError;
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
    /// The connection epoch it was issued in (see the module docs).
    connection_epoch: u64,
    done: bool,
}

impl Permit {
    pub(super) fn new(breaker: Arc<Inner>, generation: u64, connection_epoch: u64) -> Self {
        Self {
            breaker,
            generation,
            connection_epoch,
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
        self.breaker.finish(self.generation, Some(outcome), None);
    }

    /// Reports a failed call: a 429 starts a cooldown (its `Retry-After`, or
    /// [`DEFAULT_COOLDOWN`]) — even for a stale permit, since the provider's
    /// request to back off holds regardless — and the error counts as a
    /// failure only if [`ProviderError::counts_against_breaker`].
    pub fn record_error(mut self, err: &ProviderError) {
        if err.is_rate_limited() {
            self.breaker
                .cooldown(err.retry_after().unwrap_or(DEFAULT_COOLDOWN));
        }
        if err.connection_failure().is_some() {
            self.done = true;
            self.breaker.finish(
                self.generation,
                Some(Outcome::Failure),
                Some(self.connection_epoch),
            );
            return;
        }
        self.record(Outcome::of_error(err));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.done {
            self.breaker.finish(self.generation, None, None);
        }
    }
}
