//! The rows of workflows that call back (SPEC §16): found by ID alone (the
//! callback carries no team, its signature is its credential), ended once
//! by the first valid callback, or TIMED_OUT by the sweeper.

use super::{Invocation, Outcome, sql::callbacks as repository};
use crate::store::{Store, StoreError};

/// Invocation `id` of any team, with the digest of the callback that ended it.
pub async fn find(
    store: &Store,
    id: &str,
) -> Result<Option<(Invocation, Option<String>)>, StoreError> {
    repository(store).find(id).await
}

/// Ends invocation `id` with `outcome` and the callback's body digest while
/// it waits for one: of two callbacks racing on two replicas, one wins.
pub async fn complete(
    store: &Store,
    id: &str,
    outcome: &Outcome,
    digest: &str,
) -> Result<bool, StoreError> {
    let now = chrono::Utc::now().timestamp_millis();
    repository(store).complete(id, outcome, digest, now).await
}

/// Ends TIMED_OUT the invocations whose workflow did not call back in time.
pub async fn expire(store: &Store, now_ms: i64) -> Result<Vec<Invocation>, StoreError> {
    repository(store).expire(now_ms).await
}
