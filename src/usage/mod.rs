//! Usage metering: what a call may spend under its team's and user's caps
//! ([`policy`], [`session`], [`estimate`], [`pricing`]), and what it did
//! ([`ledger`], [`record`], [`summary`], [`sweeper`] for crash orphans).
//! Nothing here knows the router or a provider: the pipeline hands in plain
//! amounts and records.

pub mod amount;
pub mod bucket;
pub mod estimate;
pub mod ledger;
pub mod policy;
pub mod pricing;
pub mod record;
pub mod session;
pub mod sql;
pub mod summary;
pub mod sweeper;

pub use amount::Amount;
pub use record::UsageRecord;
pub use session::{Estimate, Meter, MeterError, MeterSession};

use crate::store::StoreError;
use summary::{Dimension, RollupRow, SumRow};

/// The usage tables' reads and the orphan sweep (implemented per backend in `sql`); the
/// ledger's batches write records through `ledger::sql`.
#[async_trait::async_trait]
pub trait UsageRepository: Send + Sync + std::fmt::Debug {
    /// Every record of a trace, in insertion order.
    async fn by_trace(&self, trace_id: &str) -> Result<Vec<UsageRecord>, StoreError>;

    /// The team's records of a trace, at most `limit`, in insertion order.
    async fn of_trace(
        &self,
        team: &str,
        trace_id: &str,
        limit: i64,
    ) -> Result<Vec<UsageRecord>, StoreError>;

    /// The team's latest `limit` records, newest first.
    async fn recent(&self, team: &str, limit: i64) -> Result<Vec<UsageRecord>, StoreError>;

    /// Teams with usage on or after UTC day `first_day` (days since the epoch), by name.
    async fn active_teams(&self, first_day: i64, limit: i64) -> Result<Vec<String>, StoreError>;

    /// The rollup sums of whole UTC days `[first_day, end_day)`, per group of `dims`.
    async fn rollups(
        &self,
        team: &str,
        first_day: i64,
        end_day: i64,
        dims: &[Dimension],
    ) -> Result<Vec<(Vec<String>, RollupRow)>, StoreError>;

    /// `(group, bucket floor, count)` of whole UTC days `[first_day, end_day)`.
    async fn latency_histogram(
        &self,
        team: &str,
        first_day: i64,
        end_day: i64,
        dims: &[Dimension],
    ) -> Result<Vec<(Vec<String>, i64, u64)>, StoreError>;

    /// Hands `each` every record of `[start_ms, end_ms)` with its group as rows arrive: a
    /// busy team's day is many records, and only sums are kept.
    async fn records(
        &self,
        team: &str,
        start_ms: i64,
        end_ms: i64,
        dims: &[Dimension],
        each: &mut (dyn FnMut(Vec<String>, SumRow) + Send),
    ) -> Result<(), StoreError>;

    /// Charges up to `limit` reservations created before `before_ms` at their estimate, in
    /// one transaction: `(charged, seen)`; one `DELETE` wins each orphan across replicas.
    async fn sweep_orphans(&self, before_ms: i64, limit: usize)
    -> Result<(u64, usize), StoreError>;

    /// Reservations still open.
    async fn open_reservations(&self) -> Result<i64, StoreError>;
}
