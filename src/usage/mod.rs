//! Usage metering: a record per request, and the sums `GetUsage` reads.

pub mod record;
pub mod summary;

pub use record::UsageRecord;
