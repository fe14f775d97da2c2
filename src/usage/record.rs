//! The usage record: one row per request, written before the response is sent.

use crate::{
    on_store,
    store::{Store, StoreError},
};

/// One request's usage.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRecord {
    /// When the request finished (unix ms, UTC).
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
    /// Cost in USD; `None` when a model involved has no price.
    pub cost_usd: Option<f64>,
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
}

const INSERT: &str = "INSERT INTO usage_records (created_at_ms, team_id, user_id, task, provider, model, \
prompt_key, prompt_version, trace_id, input_tokens, output_tokens, cost_usd, latency_ms, outcome, \
attempts, degraded, channel, priority) \
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)";

/// Writes `records` in one transaction.
pub async fn insert(store: &Store, records: &[UsageRecord]) -> Result<(), StoreError> {
    on_store!(store, |pool| {
        let mut tx = pool.begin().await?;
        for r in records {
            sqlx::query(INSERT)
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
                .bind(r.cost_usd)
                .bind(r.latency_ms)
                .bind(&r.outcome)
                .bind(&r.attempts)
                .bind(i64::from(r.degraded))
                .bind(&r.channel)
                .bind(&r.priority)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    })
}
