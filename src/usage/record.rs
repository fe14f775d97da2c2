//! The usage record: one row per request, written before the response is sent.

use crate::{
    on_store,
    store::{Store, StoreError},
};

/// One request's usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRecord {
    /// When the request started (unix ms, UTC); a call counts in the month it started.
    pub created_at_ms: i64,
    /// Tenant.
    pub team_id: String,
    /// End user.
    pub user_id: String,
    /// Task name.
    pub task: String,
    /// Serving provider ('' when none served).
    pub provider: String,
    /// Serving model.
    pub model: String,
    /// Prompt key.
    pub prompt_key: String,
    /// Prompt version.
    pub prompt_version: i64,
    /// Trace ID.
    pub trace_id: String,
    /// Input tokens over all attempts.
    pub input_tokens: i64,
    /// Output tokens over all attempts.
    pub output_tokens: i64,
    /// Cost in micro-USD; `None` when a model involved has no price.
    pub cost_micros: Option<i64>,
    /// Server-side latency, ms.
    pub latency_ms: i64,
    /// `ok` or the error reason.
    pub outcome: String,
    /// Attempts as a JSON array.
    pub attempts: String,
    /// A fallback served.
    pub degraded: bool,
    /// Channel name.
    pub channel: String,
    /// Priority name.
    pub priority: String,
    /// The agent conversation the call belongs to ('' outside agents).
    pub conversation_id: String,
    /// The model call's number in its agent turn, from 1 (0 outside agents).
    pub iteration: i64,
}

/// The columns of a usage record, in bind order.
macro_rules! record_columns {
    () => {
        "created_at_ms, team_id, user_id, task, provider, model, prompt_key, prompt_version, \
trace_id, input_tokens, output_tokens, cost_micros, latency_ms, outcome, attempts, degraded, \
channel, priority, conversation_id, iteration"
    };
}

/// Columns bound per record by [`bind_usage_record!`](crate::bind_usage_record).
pub const COLUMNS: usize = 20;

/// `INSERT INTO usage_records (...)`, without `VALUES` (multi-row inserts).
pub const INSERT_HEAD: &str = concat!("INSERT INTO usage_records (", record_columns!(), ")");

/// Inserts one record (SQL valid on both backends).
pub const INSERT: &str = concat!(
    "INSERT INTO usage_records (",
    record_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)"
);

/// Binds the [`COLUMNS`] values of record `$r` to query `$query`, in order.
#[macro_export]
macro_rules! bind_usage_record {
    ($query:expr, $r:expr) => {{
        let r: &$crate::usage::UsageRecord = $r;
        $query
            .bind(r.created_at_ms)
            .bind(&r.team_id)
            .bind(&r.user_id)
            .bind(&r.task)
            .bind(&r.provider)
            .bind(&r.model)
            .bind(&r.prompt_key)
            .bind(r.prompt_version)
            .bind(&r.trace_id)
            .bind(r.input_tokens)
            .bind(r.output_tokens)
            .bind(r.cost_micros)
            .bind(r.latency_ms)
            .bind(&r.outcome)
            .bind(&r.attempts)
            .bind(i64::from(r.degraded))
            .bind(&r.channel)
            .bind(&r.priority)
            .bind(&r.conversation_id)
            .bind(r.iteration)
    }};
}

/// Inserts `record` with `exec` (a pool or transaction of either backend):
/// a macro, as the backends' executors share no object-safe trait.
#[macro_export]
macro_rules! insert_usage_record {
    ($exec:expr, $r:expr) => {{
        $crate::bind_usage_record!(sqlx::query($crate::usage::record::INSERT), $r)
            .execute($exec)
            .await
    }};
}

/// Every record of a trace (tests, ops look-ups).
pub async fn by_trace(store: &Store, trace_id: &str) -> Result<Vec<UsageRecord>, StoreError> {
    const SELECT: &str = "SELECT created_at_ms, team_id, user_id, task, provider, model, prompt_key, \
prompt_version, trace_id, input_tokens, output_tokens, cost_micros, latency_ms, outcome, attempts, degraded, \
channel, priority, conversation_id, iteration FROM usage_records WHERE trace_id = $1 ORDER BY id";
    on_store!(store, |pool| {
        use sqlx::Row;
        let rows = sqlx::query(SELECT).bind(trace_id).fetch_all(pool).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            out.push(UsageRecord {
                created_at_ms: row.try_get(0)?,
                team_id: row.try_get(1)?,
                user_id: row.try_get(2)?,
                task: row.try_get(3)?,
                provider: row.try_get(4)?,
                model: row.try_get(5)?,
                prompt_key: row.try_get(6)?,
                prompt_version: row.try_get(7)?,
                trace_id: row.try_get(8)?,
                input_tokens: row.try_get(9)?,
                output_tokens: row.try_get(10)?,
                cost_micros: row.try_get(11)?,
                latency_ms: row.try_get(12)?,
                outcome: row.try_get(13)?,
                attempts: row.try_get(14)?,
                degraded: row.try_get::<i64, _>(15)? != 0,
                channel: row.try_get(16)?,
                priority: row.try_get(17)?,
                conversation_id: row.try_get(18)?,
                iteration: row.try_get(19)?,
            });
        }
        Ok(out)
    })
}
