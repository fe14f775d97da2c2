//! The rows of workflows that call back (SPEC §16): found by ID alone (the
//! callback carries no team, its signature is its credential), ended once
//! by the first valid callback, or TIMED_OUT once overdue. Each end is a
//! guarded statement the ledger runs with its audit event, in one
//! transaction, so an end is never recorded unaudited.

use super::{Invocation, sql::callbacks as repository};
use crate::store::{Store, StoreError};
use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

pub use super::sql::{complete, expire};

/// Invocation `id` of any team, with the digest of the callback that ended it.
pub async fn find(
    store: &Store,
    id: &str,
) -> Result<Option<(Invocation, Option<String>)>, StoreError> {
    repository(store).find(id).await
}

/// Up to `limit` invocations whose workflow did not call back in time.
pub async fn overdue(
    store: &Store,
    now_ms: i64,
    limit: i64,
) -> Result<Vec<Invocation>, StoreError> {
    repository(store).overdue(now_ms, limit).await
}

/// How often a bad callback for one invocation is audited.
const DENIAL_EVERY: Duration = Duration::from_secs(60);
/// Invocations remembered at most; past it the oldest are forgotten.
const DENIALS_KEPT: usize = 10_000;

/// Bad callbacks audited lately, by invocation: one event a minute each,
/// so whoever holds an invocation ID (it travels to a third-party
/// workflow) cannot flood a team's audit chain.
#[derive(Debug, Default)]
pub struct Denials(Mutex<HashMap<String, Instant>>);

impl Denials {
    /// Whether a bad callback for `id` at `now` is to be audited.
    pub fn audit(&self, id: &str, now: Instant) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= DENIALS_KEPT {
            seen.retain(|_, at| now.duration_since(*at) < DENIAL_EVERY);
            if seen.len() >= DENIALS_KEPT {
                seen.clear();
            }
        }
        match seen.get(id) {
            Some(at) if now.duration_since(*at) < DENIAL_EVERY => false,
            _ => {
                seen.insert(id.to_owned(), now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_callback_is_audited_once_a_minute_per_invocation() {
        let denials = Denials::default();
        let t0 = Instant::now();
        assert!(denials.audit("a", t0));
        assert!(!denials.audit("a", t0 + Duration::from_secs(59)));
        assert!(denials.audit("b", t0 + Duration::from_secs(1)));
        assert!(denials.audit("a", t0 + Duration::from_secs(61)));
        for i in 0..DENIALS_KEPT + 5 {
            denials.audit(&i.to_string(), t0);
        }
        assert!(denials.0.lock().unwrap().len() <= DENIALS_KEPT);
    }
}
