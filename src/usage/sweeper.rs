//! Charges reservations orphaned by a crash at their estimate: usage may be
//! over-estimated, never lost. One older than `metering.sweep_after` has no
//! live owner; at start-up on SQLite every one is an orphan.

use crate::store::{Store, StoreError};

/// Outcome written on the usage record of a swept reservation.
pub const ORPHANED: &str = "ORPHANED";

/// Charges every reservation created before `before_ms`; returns how many.
/// Safe on several replicas at once: one `DELETE` wins each orphan.
pub async fn sweep(store: &Store, before_ms: i64) -> Result<u64, StoreError> {
    let repository = super::sql::repository(store);
    let mut total = 0;
    loop {
        let (swept, seen) = repository.sweep_orphans(before_ms, BATCH).await?;
        total += swept;
        if seen < BATCH {
            return Ok(total);
        }
    }
}

/// Orphans charged per transaction.
const BATCH: usize = 1000;

/// Reservations still open (tests, ops).
pub async fn open_reservations(store: &Store) -> Result<i64, StoreError> {
    super::sql::repository(store).open_reservations().await
}
