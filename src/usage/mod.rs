//! Usage metering: what a call may spend under its team's monthly caps
//! ([`policy`], [`session`], [`estimate`], [`pricing`]), and what it did
//! ([`ledger`], [`record`], [`summary`], [`sweeper`] for crash orphans).
//! Nothing here knows the router or a provider: the pipeline hands in plain
//! amounts and records.

pub mod amount;
pub mod estimate;
pub mod ledger;
pub mod policy;
pub mod pricing;
pub mod record;
pub mod session;
pub mod summary;
pub mod sweeper;

pub use amount::Amount;
pub use record::UsageRecord;
pub use session::{Estimate, Meter, MeterError, MeterSession};
