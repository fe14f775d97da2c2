//! The `tool_invocations` table: claiming an idempotency key (the unique
//! constraint decides who runs the webhook), recording ends, reading back,
//! and handing ASYNC work to a worker under a lease a crash lets expire.

pub mod callbacks;
mod sql;

pub use sql::end_run;

use super::{Failure, Status};
use crate::store::{Store, StoreError};
use serde_json::Value;

/// SYNC or ASYNC (SPEC §9.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The caller waits up to the tool's timeout.
    Sync,
    /// The caller gets the invocation's ID at once; a worker runs it.
    Async,
}

impl Mode {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sync => "SYNC",
            Mode::Async => "ASYNC",
        }
    }
}

/// A stored invocation.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// UUIDv7.
    pub id: String,
    pub team_id: String,
    pub tool: String,
    pub version: String,
    pub mode: Mode,
    pub status: Status,
    pub idempotency_key: String,
    /// The window the key belongs to, unix ms.
    pub window_start_ms: i64,
    pub trace_id: String,
    pub principal: String,
    /// The validated input.
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<Failure>,
    pub estimated_cost_micros: i64,
    pub cost_micros: Option<i64>,
    pub duration_ms: Option<i64>,
    /// The workflow's execution ID (from its response header).
    pub execution_id: Option<String>,
    /// POSTs made.
    pub attempts: i64,
    pub created_at_ms: i64,
    /// One run's limit (the tool's timeout), ms; a runner's lease adds the slack.
    pub timeout_ms: i64,
}

impl Invocation {
    /// A new invocation: RUNNING if SYNC, PENDING if ASYNC.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        team_id: &str,
        tool: &str,
        version: &str,
        mode: Mode,
        idempotency_key: &str,
        window_start_ms: i64,
        trace_id: &str,
        principal: &str,
        input: Value,
        estimated_cost_micros: i64,
        timeout: std::time::Duration,
    ) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            team_id: team_id.to_owned(),
            tool: tool.to_owned(),
            version: version.to_owned(),
            mode,
            status: match mode {
                Mode::Sync => Status::Running,
                Mode::Async => Status::Pending,
            },
            idempotency_key: idempotency_key.to_owned(),
            window_start_ms,
            trace_id: trace_id.to_owned(),
            principal: principal.to_owned(),
            input,
            output: None,
            error: None,
            estimated_cost_micros,
            cost_micros: None,
            duration_ms: None,
            execution_id: None,
            attempts: 0,
            created_at_ms: chrono::Utc::now().timestamp_millis(),
            timeout_ms: i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// What claiming a key found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claimed {
    /// This invocation is the key's: it runs.
    New,
    /// Another invocation holds the key in this window: it is the answer.
    Existing(Box<Invocation>),
}

/// The `tool_invocations` table's operations (implemented per backend in `sql`).
#[async_trait::async_trait]
pub trait InvocationRepository: Send + Sync + std::fmt::Debug {
    /// Inserts `inv` unless its key is taken in its window, in one statement, so two
    /// replicas racing for a key cannot both win; else reads back the key's holder.
    async fn claim(
        &self,
        inv: &Invocation,
        lease_until_ms: Option<i64>,
    ) -> Result<Claimed, StoreError>;

    /// Records how invocation `id` ended at `now_ms` and releases its lease while the runner
    /// owns it (RUNNING under `lease_until_ms`) or a SYNC row was marked `INTERRUPTED`;
    /// false when neither holds.
    async fn finish(
        &self,
        id: &str,
        lease_until_ms: i64,
        outcome: &Outcome,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Puts invocation `id` back to PENDING, unleased, while its lease is `lease_until_ms`.
    async fn release(&self, id: &str, lease_until_ms: i64, now_ms: i64) -> Result<(), StoreError>;

    /// Invocation `id` of `team`.
    async fn get(&self, team: &str, id: &str) -> Result<Option<Invocation>, StoreError>;

    /// `team`'s latest `limit` invocations, newest first.
    async fn recent(&self, team: &str, limit: i64) -> Result<Vec<Invocation>, StoreError>;

    /// The ID of `team`'s invocation holding idempotency `key` in any window, if any.
    async fn by_key(&self, team: &str, key: &str) -> Result<Option<String>, StoreError>;

    /// Leases up to `limit` due ASYNC invocations, oldest first, until `now_ms` + timeout +
    /// `slack_ms`, passing over the (team, tool, version) pairs of `busy` (at most
    /// [`MAX_BUSY`] of them).
    async fn take_work(
        &self,
        now_ms: i64,
        slack_ms: i64,
        limit: i64,
        busy: &[(String, String, String)],
    ) -> Result<Vec<Taken>, StoreError>;

    /// Marks FAILED (`INTERRUPTED`) the SYNC invocations RUNNING past their lease at
    /// `now_ms`, returning them.
    async fn fail_interrupted(&self, now_ms: i64) -> Result<Vec<Invocation>, StoreError>;
}

/// Inserts `inv` unless its key is taken in its window, in one statement,
/// so two replicas racing for a key cannot both win.
pub async fn claim(
    store: &Store,
    inv: &Invocation,
    lease_until_ms: Option<i64>,
) -> Result<Claimed, StoreError> {
    sql::repository(store).claim(inv, lease_until_ms).await
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// SUCCEEDED, FAILED, TIMED_OUT, or AWAITING_CALLBACK.
    pub status: Status,
    pub output: Option<Value>,
    pub error: Option<Failure>,
    pub cost_micros: i64,
    pub duration_ms: i64,
    pub execution_id: Option<String>,
    pub attempts: i64,
    /// AWAITING_CALLBACK: when it ends TIMED_OUT without one, unix ms.
    pub callback_until_ms: Option<i64>,
}

/// Records how invocation `id` ended and releases its lease while the runner
/// owns it (RUNNING under `lease_until_ms`), else `false`. A SYNC row marked
/// `INTERRUPTED` takes the late end: its runner was alive, its caller answered.
pub async fn finish(
    store: &Store,
    id: &str,
    lease_until_ms: i64,
    o: &Outcome,
) -> Result<bool, StoreError> {
    let now = chrono::Utc::now().timestamp_millis();
    sql::repository(store)
        .finish(id, lease_until_ms, o, now)
        .await
}

/// Gives back invocation `id`, leased by [`take_work`] but not started:
/// PENDING again, unleased; a no-op once the lease is not that one.
pub async fn release(store: &Store, id: &str, lease_until_ms: i64) -> Result<(), StoreError> {
    let now = chrono::Utc::now().timestamp_millis();
    sql::repository(store)
        .release(id, lease_until_ms, now)
        .await
}

/// `team`'s latest `limit` invocations, newest first (the console's Tools page).
pub async fn recent(store: &Store, team: &str, limit: i64) -> Result<Vec<Invocation>, StoreError> {
    sql::repository(store).recent(team, limit).await
}

/// See [`InvocationRepository::by_key`].
pub async fn by_key(store: &Store, team: &str, key: &str) -> Result<Option<String>, StoreError> {
    sql::repository(store).by_key(team, key).await
}

/// Invocation `id` of `team` (another team's is not found).
pub async fn get(store: &Store, team: &str, id: &str) -> Result<Option<Invocation>, StoreError> {
    sql::repository(store).get(team, id).await
}

/// An invocation [`take_work`] leased to this runner.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub invocation: Invocation,
    /// Its lease: what [`finish`] and [`release`] are guarded by.
    pub lease_until_ms: i64,
}

/// Most (team, tool) pairs [`take_work`] passes over in one statement: three
/// parameters each, far below SQLite's 32,766 and PostgreSQL's 65,535.
pub const MAX_BUSY: usize = 1000;

/// Takes up to `limit` ASYNC invocations, oldest first: PENDING, or RUNNING
/// past their lease (their runner died), leased until `now_ms` + timeout +
/// `slack_ms`. `busy` pairs are passed over: a busy tool's backlog blocks nothing.
pub async fn take_work(
    store: &Store,
    now_ms: i64,
    slack_ms: i64,
    limit: i64,
    busy: &[(String, String, String)],
) -> Result<Vec<Taken>, StoreError> {
    let busy = &busy[..busy.len().min(MAX_BUSY)];
    sql::repository(store)
        .take_work(now_ms, slack_ms, limit, busy)
        .await
}

/// Marks FAILED (`INTERRUPTED`) the SYNC invocations RUNNING past their lease;
/// the key still holds the window, so a retry gets this answer. Returns them.
pub async fn fail_interrupted(store: &Store, now_ms: i64) -> Result<Vec<Invocation>, StoreError> {
    sql::repository(store).fail_interrupted(now_ms).await
}
