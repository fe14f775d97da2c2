//! The reserve → settle ledger: per bucket (a team's or user's month or day,
//! [`Bucket`]) what was spent and what calls in flight hold. One algorithm ([`plan::apply`]) over a [`Backend`]
//! per database applies each batch in one transaction ([`group_commit`]).

mod crossings;
pub mod group_commit;
mod plan;
mod sql;
pub mod writer;

pub use sql::{postgres, sqlite};

use super::policy::{Balance, Caps, Refusal};
pub use crossings::CapTriggers;
pub use writer::{LedgerWriter, WriteError};

use super::{
    amount::Amount,
    bucket::{Account, Bucket, Limits, PeriodCaps},
    record::UsageRecord,
};
use crate::{
    audit::{AuditEvent, chain::Head, chain::Linked},
    store::{Store, StoreError},
};
use std::collections::HashSet;

/// Ledger rows as a batch's transaction left them.
pub type Rows = Vec<(Bucket, Balance)>;

/// A reservation to make before calling a provider.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reserve {
    /// Reservation ID (UUIDv7).
    pub id: String,
    /// Team.
    pub team_id: String,
    /// Month the call is counted in.
    pub month_start_ms: i64,
    /// UTC day the call is counted in.
    pub day_start_ms: i64,
    /// Estimated input tokens.
    pub input_tokens: i64,
    /// Estimated output tokens (the output cap).
    pub output_tokens: i64,
    /// Requests (1 for a call's first reservation, 0 for a top-up).
    pub requests: i64,
    /// Estimated cost, micro-USD (0 when unpriced).
    pub cost_micros: i64,
    /// Caps from config for a team or user without an override row.
    pub default_caps: Limits,
    /// For the orphan record: task, user, trace, channel, priority.
    pub task: String,
    /// User.
    pub user_id: String,
    /// Trace ID.
    pub trace_id: String,
    /// Channel.
    pub channel: String,
    /// Priority.
    pub priority: String,
    /// Now, unix ms.
    pub created_at_ms: i64,
    /// Admitted in memory ([`sqlite::Admission`]): written unguarded where trusted.
    pub admitted: bool,
}

impl Reserve {
    /// Estimated tokens, input + output.
    pub fn tokens(&self) -> i64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// What the reservation holds against the team's caps.
    pub fn amount(&self) -> Amount {
        Amount::new(self.tokens(), self.requests, self.cost_micros)
    }

    /// Who and when it counts for.
    pub fn account(&self) -> Account<'_> {
        Account {
            team_id: &self.team_id,
            user_id: &self.user_id,
            month_start_ms: self.month_start_ms,
            day_start_ms: self.day_start_ms,
        }
    }

    /// Its ledger rows, in lock order.
    pub fn buckets(&self) -> Vec<Bucket> {
        self.account().buckets()
    }
}

/// A reservation a settlement releases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Its ID.
    pub id: String,
    /// What it holds.
    pub amount: Amount,
}

impl From<&Reserve> for Reservation {
    fn from(r: &Reserve) -> Self {
        Reservation {
            id: r.id.clone(),
            amount: r.amount(),
        }
    }
}

/// The end of a call: release its reservations, charge it, record it.
#[derive(Debug, Clone, PartialEq)]
pub struct Settle {
    /// Reservations to release.
    pub reservations: Vec<Reservation>,
    /// Charge the ledger (false for answers given without any provider).
    pub charge: bool,
    /// The usage record (team, month via `created_at_ms`, actuals).
    pub record: UsageRecord,
    /// Whether `record` is written (not for a refusal after reserving).
    pub recorded: bool,
    /// Month the call was admitted in.
    pub month_start_ms: i64,
    /// UTC day the call was admitted in.
    pub day_start_ms: i64,
    /// The user its reservations counted for ('' = none), whatever `record` says.
    pub user_id: String,
    /// Owner of the stored prompt version used ('' = global); `None` for built-ins.
    pub prompt_owner: Option<String>,
    /// The call's audit events (`call.completed` / `call.failed`, SPEC §14.3), of the
    /// record's team, appended in the same transaction as the record; empty for others.
    pub audit: Vec<AuditEvent>,
    /// The triggers' outbox rows `audit` fires, in the same transaction (set by the writer).
    pub outbox: Vec<crate::store::Statement>,
    /// Set by the writer when some trigger follows a cap: the ledger then
    /// audits the caps this settlement's charge crosses.
    pub triggers: Option<std::sync::Arc<CapTriggers>>,
}

impl Settle {
    /// What this settlement charges to the ledger.
    pub fn charged(&self) -> Amount {
        if !self.charge {
            return Amount::ZERO;
        }
        Amount::new(
            self.record
                .input_tokens
                .saturating_add(self.record.output_tokens),
            i64::from(!self.reservations.is_empty()),
            self.record.cost_micros.unwrap_or(0),
        )
    }

    /// Who and when it counts for.
    pub fn account(&self) -> Account<'_> {
        Account {
            team_id: &self.record.team_id,
            user_id: &self.user_id,
            month_start_ms: self.month_start_ms,
            day_start_ms: self.day_start_ms,
        }
    }

    /// Its ledger rows, in lock order.
    pub fn buckets(&self) -> Vec<Bucket> {
        self.account().buckets()
    }

    /// `(owner, success)` to fold into a stored prompt version's stats.
    pub fn prompt_stats(&self) -> Option<(&str, f64)> {
        let owner = self
            .prompt_owner
            .as_deref()
            .filter(|_| self.record.prompt_version > 0)?;
        let success = if self.record.outcome == "ok" {
            1.0
        } else {
            0.0
        };
        Some((owner, success))
    }
}

/// One ledger operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Admit a call.
    Reserve(Reserve),
    /// Finish a call.
    Settle(Settle),
    /// Append one team's audit events to its chain, durable like a settlement.
    Audit(Vec<AuditEvent>),
    /// Write another service's rows, never contending for the SQLite lock.
    Write(Write),
}

/// Rows of another service; if the first statement (the guard) changes no row, no more run.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// The team the rows belong to (its writer, on PostgreSQL).
    pub team_id: String,
    /// The statements, the guard first.
    pub statements: Vec<crate::store::Statement>,
    /// Whether the caller waits for the disk (else a later durable op covers it).
    pub durable: bool,
    /// Audit events, in the same transaction: they stand or fall together.
    pub audit: Vec<AuditEvent>,
    /// Appends `audit` only when the guard changed a row (else whatever it found).
    pub audit_only_if_stored: bool,
    /// The triggers' outbox rows `audit` fires, written with it (set by the writer).
    pub outbox: Vec<crate::store::Statement>,
}

impl Op {
    /// The team whose rows it touches (its writer, on PostgreSQL).
    pub fn team(&self) -> &str {
        match self {
            Op::Reserve(r) => &r.team_id,
            Op::Settle(s) => &s.record.team_id,
            Op::Audit(events) => events.first().map_or("", |e| e.team_id.as_str()),
            Op::Write(w) => &w.team_id,
        }
    }

    /// Whether its caller waits for it to be on disk.
    pub fn durable(&self) -> bool {
        match self {
            Op::Settle(_) | Op::Audit(_) => true,
            Op::Write(w) => w.durable,
            Op::Reserve(_) => false,
        }
    }

    /// Whether a batch holding it goes at once instead of lingering (ADR 0008).
    pub fn goes_at_once(&self) -> bool {
        !matches!(self, Op::Reserve(_))
    }
}

/// What an operation did.
#[derive(Debug, Clone, PartialEq)]
pub enum Done {
    /// Admitted.
    Admitted,
    /// Refused.
    Refused(Refusal),
    /// Settled and recorded.
    Settled,
    /// Audit events appended.
    Audited,
    /// Another service's rows.
    Written {
        /// Whether the rows were written.
        stored: bool,
        /// Whether the caller waited for the disk.
        durable: bool,
    },
}

impl Done {
    /// Whether its caller waits for the disk before hearing of it.
    pub fn durable(&self) -> bool {
        matches!(
            self,
            Done::Settled | Done::Audited | Done::Written { durable: true, .. }
        )
    }
}

/// What one ledger row changes by in a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    /// Reserved by reservations admitted in memory (written unguarded).
    pub reserved: Amount,
    /// Released by the batch's settlements.
    pub released: Amount,
    /// Charged by the batch's settlements.
    pub charged: Amount,
}

/// The statements a batch needs, on one transaction; one impl per driver.
pub(super) trait Backend {
    /// Whether [`Reserve::admitted`] may be trusted.
    const ADMITS_IN_MEMORY: bool;
    /// Deletes these reservations; returns the IDs that were still open.
    async fn delete_reservations(&mut self, ids: &[&str]) -> Result<HashSet<String>, StoreError>;
    async fn insert_reservations(&mut self, rows: &[&Reserve]) -> Result<(), StoreError>;
    async fn insert_records(&mut self, rows: &[&UsageRecord]) -> Result<(), StoreError>;
    /// Applies `delta` to a ledger row, creating it when missing.
    async fn update_row(&mut self, bucket: &Bucket, delta: &Delta) -> Result<(), StoreError>;
    /// Locks a row until the transaction ends, creating it when missing
    /// (nothing to do where the whole database is locked).
    async fn lock_row(&mut self, bucket: &Bucket) -> Result<(), StoreError>;
    /// [`sql::guarded_reserve`] of `amount`: true when admitted.
    async fn reserve_guarded(
        &mut self,
        bucket: &Bucket,
        defaults: &Caps,
        amount: Amount,
    ) -> Result<bool, StoreError>;
    /// The bucket's own caps, if its team or user has an override row.
    async fn bucket_caps(&mut self, bucket: &Bucket) -> Result<Option<Caps>, StoreError>;
    /// A ledger row (zeros when missing).
    async fn balance(&mut self, bucket: &Bucket) -> Result<Balance, StoreError>;
    /// Where `team`'s audit chain ends, its head row created and locked.
    async fn audit_head(&mut self, team: &str) -> Result<Head, StoreError>;
    async fn insert_audit(&mut self, rows: &[Linked]) -> Result<(), StoreError>;
    async fn set_audit_head(&mut self, team: &str, head: &Head) -> Result<(), StoreError>;
    /// Runs a [`Write`]'s statements: true when the guard changed a row.
    async fn write(&mut self, statements: &[crate::store::Statement]) -> Result<bool, StoreError>;
    /// Folds a settlement into its stored prompt version's stats.
    async fn fold_prompt_stats(
        &mut self,
        s: &Settle,
        owner: &str,
        success: f64,
    ) -> Result<(), StoreError>;
}

/// Released minus reserved, part by part (negative: the batch reserves).
fn net_release(d: &Delta) -> [i64; 3] {
    [
        d.released.tokens.saturating_sub(d.reserved.tokens),
        d.released.requests.saturating_sub(d.reserved.requests),
        d.released
            .cost_micros
            .saturating_sub(d.reserved.cost_micros),
    ]
}

/// The ledger's reads and the cap overrides of teams (`user` empty) and
/// users (implemented per backend in `sql`).
#[async_trait::async_trait]
pub trait LedgerRepository: Send + Sync + std::fmt::Debug {
    /// A bucket's balance (zeros when it has no row).
    async fn balance(&self, bucket: &Bucket) -> Result<Balance, StoreError>;

    /// The team's or user's own caps, if it has an override row.
    async fn caps(&self, team: &str, user: &str) -> Result<Option<PeriodCaps>, StoreError>;

    /// Sets (or with all `None`, makes unlimited) a team's or user's caps.
    async fn set_caps(
        &self,
        team: &str,
        user: &str,
        caps: PeriodCaps,
        now_ms: i64,
    ) -> Result<(), StoreError>;

    /// Removes a team's or user's override; false when it had none.
    async fn clear_caps(&self, team: &str, user: &str) -> Result<bool, StoreError>;
}

/// A bucket's balance.
pub async fn balance_of(store: &Store, bucket: &Bucket) -> Result<Balance, StoreError> {
    sql::repository(store).balance(bucket).await
}

/// The caps of a team (`user` empty) or user: its override row, else `defaults`.
pub async fn caps_of(
    store: &Store,
    team: &str,
    user: &str,
    defaults: PeriodCaps,
) -> Result<PeriodCaps, StoreError> {
    Ok(sql::repository(store)
        .caps(team, user)
        .await?
        .unwrap_or(defaults))
}

/// Sets (or with all `None`, makes unlimited) a team's or user's caps.
pub async fn set_caps(
    store: &Store,
    team: &str,
    user: &str,
    caps: PeriodCaps,
    now_ms: i64,
) -> Result<(), StoreError> {
    sql::repository(store)
        .set_caps(team, user, caps, now_ms)
        .await
}

/// Removes an override (the config defaults apply again).
pub async fn clear_caps(store: &Store, team: &str, user: &str) -> Result<bool, StoreError> {
    sql::repository(store).clear_caps(team, user).await
}

pub use sql::apply;
