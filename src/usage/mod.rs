//! Usage metering: what a call may spend under its team's monthly caps, and
//! what it did spend.
//!
//! - [`amount`]: tokens, requests and cost as one value, sums saturating;
//! - [`policy`]: the cap rule, its one statement (and the SQL guard held to
//!   it);
//! - [`session`]: a request's reservations and its settlement ([`Meter`],
//!   [`MeterSession`]);
//! - [`estimate`] and [`pricing`]: a model call's worst case and its cost;
//! - [`ledger`]: the reserve → settle ledger, group commit, both backends;
//! - [`record`], [`summary`], [`sweeper`]: the usage records, the sums
//!   `GetUsage` reads, and the orphans a crash leaves.
//!
//! Nothing here knows the router or a provider: the call pipeline hands in
//! plain amounts and records.

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
