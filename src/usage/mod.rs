//! Usage metering: pricing, token estimates, the reserve -> settle ledger
//! with group commit, the orphan sweeper, and the sums `GetUsage` reads.

pub mod admission;
mod batch;
pub mod estimate;
pub mod ledger;
pub mod meter;
pub mod pricing;
pub mod record;
mod sqlite_thread;
pub mod sqlite_writer;
pub mod summary;
pub mod sweeper;
mod wal_sync;
pub mod writer;

pub use meter::{Estimate, Meter, MeterError, MeterSession};
pub use record::UsageRecord;
