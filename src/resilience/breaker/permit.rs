//! The permit a breaker hands out for one call, and how its result is reported back.

use super::{DEFAULT_COOLDOWN, Inner, Outcome};
use crate::domain::ProviderError;
use std::sync::Arc;

/// Permission for one call. Dropping it unrecorded (the client cancelled) only frees a half-open
/// probe slot.
#[derive(Debug)]
#[must_use = "dropping a permit unrecorded reports the call as cancelled"]
pub struct Permit {
    breaker: Arc<Inner>,
    generation: u64,
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

    /// Reports the call's result; ignored if the breaker changed state since.
    pub fn record(mut self, outcome: Outcome) {
        self.done = true;
        self.breaker.finish(self.generation, Some(outcome), None);
    }

    /// Reports a failed call. A 429 starts a cooldown even for a stale permit: the provider's
    /// request to back off holds regardless.
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
