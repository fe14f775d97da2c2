//! The usage record: one row per request, written before the response is sent.

use crate::store::{Store, StoreError};

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

/// Every record of a trace (tests, ops look-ups).
pub async fn by_trace(store: &Store, trace_id: &str) -> Result<Vec<UsageRecord>, StoreError> {
    super::sql::repository(store).by_trace(trace_id).await
}

/// The team's records of a trace, at most `limit`, in order (a caller picks its
/// trace IDs: one may be on any number of records).
pub async fn of_trace(
    store: &Store,
    team: &str,
    trace_id: &str,
    limit: i64,
) -> Result<Vec<UsageRecord>, StoreError> {
    super::sql::repository(store)
        .of_trace(team, trace_id, limit)
        .await
}

/// The team's latest `limit` records, newest first (the console's Calls page).
pub async fn recent(store: &Store, team: &str, limit: i64) -> Result<Vec<UsageRecord>, StoreError> {
    super::sql::repository(store).recent(team, limit).await
}

/// Teams with usage since the start of UTC day `first_day`, by name, at most `limit`.
pub async fn active_teams(
    store: &Store,
    first_day: i64,
    limit: i64,
) -> Result<Vec<String>, StoreError> {
    super::sql::repository(store)
        .active_teams(first_day, limit)
        .await
}
