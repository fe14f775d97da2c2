//! The reserve → settle ledger: per team and month what was spent and what
//! calls in flight hold. One algorithm ([`plan::apply`]) over a [`Backend`]
//! per database applies each batch in one transaction ([`group_commit`]).

pub mod group_commit;
mod plan;
pub mod postgres;
pub mod sqlite;
pub mod writer;

use super::policy::{Balance, Caps, Refusal};
pub use writer::{LedgerWriter, WriteError};

use super::{amount::Amount, record::UsageRecord};
use crate::{
    audit::{AuditEvent, chain::Head, chain::Linked},
    on_store,
    store::{Store, StoreError},
};
use std::collections::HashSet;

/// A team's ledger row: (team, month start in unix ms).
pub type Key = (String, i64);

/// Ledger rows as a batch's transaction left them.
pub type Rows = Vec<(Key, Balance)>;

/// A reservation to make before calling a provider.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reserve {
    /// Reservation ID (UUIDv7).
    pub id: String,
    /// Team.
    pub team_id: String,
    /// Month the call is counted in.
    pub month_start_ms: i64,
    /// Estimated input tokens.
    pub input_tokens: i64,
    /// Estimated output tokens (the output cap).
    pub output_tokens: i64,
    /// Requests (1 for a call's first reservation, 0 for a top-up).
    pub requests: i64,
    /// Estimated cost, micro-USD (0 when unpriced).
    pub cost_micros: i64,
    /// Caps from config when the team has no `tenant_limits` row.
    pub default_caps: Caps,
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

    /// Its ledger row.
    pub fn key(&self) -> (&str, i64) {
        (&self.team_id, self.month_start_ms)
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
    /// Owner of the stored prompt version used ('' = global); `None` for built-ins.
    pub prompt_owner: Option<String>,
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

    /// Its ledger row.
    pub fn key(&self) -> (&str, i64) {
        (&self.record.team_id, self.month_start_ms)
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
    /// Audit events appended whatever the guard found: they stand or fall together.
    pub audit: Vec<AuditEvent>,
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
    async fn update_row(&mut self, key: (&str, i64), delta: &Delta) -> Result<(), StoreError>;
    /// [`super::policy::GUARDED_RESERVE`] of `amount`: true when admitted.
    async fn reserve_guarded(
        &mut self,
        key: (&str, i64),
        defaults: &Caps,
        amount: Amount,
    ) -> Result<bool, StoreError>;
    /// The team's own caps, if it has a `tenant_limits` row.
    async fn team_caps(&mut self, team: &str) -> Result<Option<Caps>, StoreError>;
    /// A ledger row (zeros when missing).
    async fn balance(&mut self, key: (&str, i64)) -> Result<Balance, StoreError>;
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

/// Creates a (team, month) ledger row that does not exist yet.
const ENSURE_ROW: &str = "INSERT INTO usage_ledger (team_id, month_start_ms) VALUES ($1, $2) \
ON CONFLICT (team_id, month_start_ms) DO NOTHING";

const TEAM_CAPS: &str =
    "SELECT max_tokens, max_requests, max_cost_micros FROM tenant_limits WHERE team_id = $1";

const BALANCE: &str = "SELECT spent_tokens, spent_requests, spent_cost_micros, reserved_tokens, \
reserved_requests, reserved_cost_micros FROM usage_ledger WHERE team_id = $1 AND month_start_ms = $2";

/// A batch's delta: `$3..$5` the net release, `$6..$8` the charge. A release
/// stops at zero (CHECK constraints): after an earlier inconsistency the row
/// heals instead of failing every later settlement.
const UPDATE_ROW: &str = "UPDATE usage_ledger SET \
reserved_tokens = CASE WHEN reserved_tokens > $3 THEN reserved_tokens - $3 ELSE 0 END, \
reserved_requests = CASE WHEN reserved_requests > $4 THEN reserved_requests - $4 ELSE 0 END, \
reserved_cost_micros = CASE WHEN reserved_cost_micros > $5 THEN reserved_cost_micros - $5 ELSE 0 END, \
spent_tokens = spent_tokens + $6, \
spent_requests = spent_requests + $7, spent_cost_micros = spent_cost_micros + $8 \
WHERE team_id = $1 AND month_start_ms = $2";

/// Folds one call into its stored prompt version's running means.
const RECORD_STATS: &str = "UPDATE ai_prompts SET \
avg_latency_ms = (avg_latency_ms * usage_count + $4) / (usage_count + 1), \
success_rate = (success_rate * usage_count + $5) / (usage_count + 1), \
usage_count = usage_count + 1 \
WHERE team_id = $1 AND prompt_key = $2 AND version = $3";

const INSERT_RESERVATION_HEAD: &str = "INSERT INTO usage_reservations (id, team_id, month_start_ms, \
input_tokens, output_tokens, requests, cost_micros, task, user_id, trace_id, channel, priority, created_at_ms)";

const RESERVATION_COLUMNS: usize = 13;

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

type BalanceRow = (i64, i64, i64, i64, i64, i64);

fn balance(row: Option<BalanceRow>) -> Balance {
    let (st, sr, sc, rt, rr, rc) = row.unwrap_or_default();
    Balance {
        spent_tokens: st,
        spent_requests: sr,
        spent_cost_micros: sc,
        reserved_tokens: rt,
        reserved_requests: rr,
        reserved_cost_micros: rc,
    }
}

/// The team's balance for a month.
pub async fn balance_of(
    store: &Store,
    team: &str,
    month_start_ms: i64,
) -> Result<Balance, StoreError> {
    let row: Option<BalanceRow> = on_store!(store, |pool| {
        sqlx::query_as(BALANCE)
            .bind(team)
            .bind(month_start_ms)
            .fetch_optional(pool)
            .await?
    });
    Ok(balance(row))
}

/// The caps of a team: its `tenant_limits` row, else `defaults`.
pub async fn caps_of(store: &Store, team: &str, defaults: Caps) -> Result<Caps, StoreError> {
    let row: Option<(Option<i64>, Option<i64>, Option<i64>)> =
        on_store!(store, |pool| sqlx::query_as(TEAM_CAPS)
            .bind(team)
            .fetch_optional(pool)
            .await?);
    Ok(
        row.map_or(defaults, |(tokens, requests, cost_micros)| Caps {
            tokens,
            requests,
            cost_micros,
        }),
    )
}

/// Sets (or with all `None`, makes unlimited) a team's caps.
pub async fn set_caps(
    store: &Store,
    team: &str,
    caps: Caps,
    now_ms: i64,
) -> Result<(), StoreError> {
    const UPSERT: &str = "INSERT INTO tenant_limits (team_id, max_tokens, max_requests, max_cost_micros, updated_at_ms) \
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (team_id) DO UPDATE SET max_tokens = excluded.max_tokens, \
max_requests = excluded.max_requests, max_cost_micros = excluded.max_cost_micros, updated_at_ms = excluded.updated_at_ms";
    on_store!(store, |pool| {
        sqlx::query(UPSERT)
            .bind(team)
            .bind(caps.tokens)
            .bind(caps.requests)
            .bind(caps.cost_micros)
            .bind(now_ms)
            .execute(pool)
            .await
            .map(drop)?
    });
    Ok(())
}

/// Removes a team's override (it falls back to the config defaults).
pub async fn clear_caps(store: &Store, team: &str) -> Result<bool, StoreError> {
    let n = on_store!(store, |pool| {
        sqlx::query("DELETE FROM tenant_limits WHERE team_id = $1")
            .bind(team)
            .execute(pool)
            .await?
            .rows_affected()
    });
    Ok(n > 0)
}

/// Applies `ops` in one transaction, outside any writer. Test support: it
/// bypasses a running server's in-memory admission.
#[doc(hidden)]
pub async fn apply(store: &Store, ops: &[Op]) -> Result<Vec<Done>, StoreError> {
    let Store::Sqlite(pool) = store else {
        return postgres::apply(store, ops).await;
    };
    let path = pool.connect_options().get_filename().to_path_buf();
    let ops = ops.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut conn = sqlite::open(&path, &crate::config::DatabaseConfig::default())?;
        sqlite::apply(&mut conn, &ops)
    })
    .await?
}
