//! The `tool_invocations` table: claiming an idempotency key (the unique
//! constraint decides who runs the webhook), recording ends, reading back,
//! and handing ASYNC work to a worker under a lease a crash lets expire.

use super::{Failure, Status};
use crate::{
    on_store,
    store::{Store, StoreError},
};
use serde_json::Value;
use sqlx::Row as _;

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

const COLUMNS: &str = "id, team_id, tool, version, mode, status, idempotency_key, \
     window_start_ms, trace_id, principal, input, output, error_code, error_message, \
     estimated_cost_micros, cost_micros, duration_ms, execution_id, attempts, created_at_ms, \
     timeout_ms";

fn decode<R: sqlx::Row>(row: &R) -> Result<Invocation, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database>,
{
    let json = |text: Option<String>| text.and_then(|t| serde_json::from_str(&t).ok());
    let mode: String = row.try_get(4)?;
    let status: String = row.try_get(5)?;
    let input: String = row.try_get(10)?;
    let code: Option<String> = row.try_get(12)?;
    let message: Option<String> = row.try_get(13)?;
    Ok(Invocation {
        id: row.try_get(0)?,
        team_id: row.try_get(1)?,
        tool: row.try_get(2)?,
        version: row.try_get(3)?,
        mode: if mode == "ASYNC" {
            Mode::Async
        } else {
            Mode::Sync
        },
        status: Status::parse(&status).unwrap_or(Status::Failed),
        idempotency_key: row.try_get(6)?,
        window_start_ms: row.try_get(7)?,
        trace_id: row.try_get(8)?,
        principal: row.try_get(9)?,
        input: serde_json::from_str(&input).unwrap_or(Value::Null),
        output: json(row.try_get(11)?),
        error: code.map(|code| Failure {
            code,
            message: message.unwrap_or_default(),
        }),
        estimated_cost_micros: row.try_get(14)?,
        cost_micros: row.try_get(15)?,
        duration_ms: row.try_get(16)?,
        execution_id: row.try_get(17)?,
        attempts: row.try_get(18)?,
        created_at_ms: row.try_get(19)?,
        timeout_ms: row.try_get(20)?,
    })
}

/// Inserts `inv` unless its key is taken in its window, in one statement,
/// so two replicas racing for a key cannot both win.
pub async fn claim(
    store: &Store,
    inv: &Invocation,
    lease_until_ms: Option<i64>,
) -> Result<Claimed, StoreError> {
    let sql = format!(
        "INSERT INTO tool_invocations ({COLUMNS}, updated_at_ms, lease_until_ms) VALUES \
         ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, NULL, NULL, NULL, $12, NULL, NULL, NULL, \
          0, $13, $15, $13, $14) \
         ON CONFLICT (team_id, idempotency_key, window_start_ms) DO NOTHING"
    );
    let input = inv.input.to_string();
    let inserted = on_store!(store, |pool| {
        sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(&inv.id)
            .bind(&inv.team_id)
            .bind(&inv.tool)
            .bind(&inv.version)
            .bind(inv.mode.as_str())
            .bind(inv.status.as_str())
            .bind(&inv.idempotency_key)
            .bind(inv.window_start_ms)
            .bind(&inv.trace_id)
            .bind(&inv.principal)
            .bind(&input)
            .bind(inv.estimated_cost_micros)
            .bind(inv.created_at_ms)
            .bind(lease_until_ms)
            .bind(inv.timeout_ms)
            .execute(pool)
            .await?
            .rows_affected()
    });
    if inserted == 1 {
        return Ok(Claimed::New);
    }
    let sql = format!(
        "SELECT {COLUMNS} FROM tool_invocations \
         WHERE team_id = $1 AND idempotency_key = $2 AND window_start_ms = $3"
    );
    let existing = on_store!(store, |pool| {
        let row = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(&inv.team_id)
            .bind(&inv.idempotency_key)
            .bind(inv.window_start_ms)
            .fetch_one(pool)
            .await?;
        decode(&row)?
    });
    Ok(Claimed::Existing(Box::new(existing)))
}

/// How an invocation ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// SUCCEEDED, FAILED or TIMED_OUT.
    pub status: Status,
    pub output: Option<Value>,
    pub error: Option<Failure>,
    pub cost_micros: i64,
    pub duration_ms: i64,
    pub execution_id: Option<String>,
    pub attempts: i64,
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
    let output = o.output.as_ref().map(Value::to_string);
    let now = chrono::Utc::now().timestamp_millis();
    let written = on_store!(store, |pool| {
        sqlx::query(
            "UPDATE tool_invocations SET status = $2, output = $3, error_code = $4, \
             error_message = $5, cost_micros = $6, duration_ms = $7, execution_id = $8, \
             attempts = $9, updated_at_ms = $10, lease_until_ms = NULL WHERE id = $1 \
             AND ((status = 'RUNNING' AND lease_until_ms = $11) \
              OR (mode = 'SYNC' AND status = 'FAILED' AND error_code = 'INTERRUPTED'))",
        )
        .bind(id)
        .bind(o.status.as_str())
        .bind(&output)
        .bind(o.error.as_ref().map(|e| e.code.clone()))
        .bind(o.error.as_ref().map(|e| e.message.clone()))
        .bind(o.cost_micros)
        .bind(o.duration_ms)
        .bind(&o.execution_id)
        .bind(o.attempts)
        .bind(now)
        .bind(lease_until_ms)
        .execute(pool)
        .await?
        .rows_affected()
    });
    Ok(written == 1)
}

/// Gives back invocation `id`, leased by [`take_work`] but not started:
/// PENDING again, unleased; a no-op once the lease is not that one.
pub async fn release(store: &Store, id: &str, lease_until_ms: i64) -> Result<(), StoreError> {
    let now = chrono::Utc::now().timestamp_millis();
    on_store!(store, |pool| {
        sqlx::query(
            "UPDATE tool_invocations SET status = 'PENDING', lease_until_ms = NULL, \
             updated_at_ms = $2 WHERE id = $1 AND status = 'RUNNING' AND lease_until_ms = $3",
        )
        .bind(id)
        .bind(now)
        .bind(lease_until_ms)
        .execute(pool)
        .await?;
    });
    Ok(())
}

/// Invocation `id` of `team` (another team's is not found).
pub async fn get(store: &Store, team: &str, id: &str) -> Result<Option<Invocation>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM tool_invocations WHERE id = $1 AND team_id = $2");
    let found = on_store!(store, |pool| {
        let row = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(id)
            .bind(team)
            .fetch_optional(pool)
            .await?;
        row.as_ref().map(decode).transpose()?
    });
    Ok(found)
}

/// An invocation [`take_work`] leased to this runner.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub invocation: Invocation,
    /// Its lease: what [`finish`] and [`release`] are guarded by.
    pub lease_until_ms: i64,
}

/// The index of `lease_until_ms` after [`COLUMNS`] in `take_work`'s rows.
const LEASE: usize = 21;

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
    let mut due = String::from(
        "(status = 'PENDING' OR (status = 'RUNNING' AND lease_until_ms < $1)) AND mode = 'ASYNC'",
    );
    for i in 0..busy.len() {
        let n = 4 + 3 * i;
        due.push_str(&format!(
            " AND NOT (team_id = ${n} AND tool = ${} AND version = ${})",
            n + 1,
            n + 2
        ));
    }
    let sql = match store {
        // SKIP LOCKED: several replicas' workers share the queue, never a row.
        Store::Postgres(_) => format!(
            "UPDATE tool_invocations SET status = 'RUNNING', lease_until_ms = $1 + timeout_ms + $2, \
             updated_at_ms = $1 WHERE id IN (SELECT id FROM tool_invocations WHERE {due} \
             ORDER BY created_at_ms LIMIT $3 FOR UPDATE SKIP LOCKED) \
             RETURNING {COLUMNS}, lease_until_ms"
        ),
        // One process per SQLite file: the statement alone decides.
        Store::Sqlite(_) => format!(
            "UPDATE tool_invocations SET status = 'RUNNING', lease_until_ms = $1 + timeout_ms + $2, \
             updated_at_ms = $1 WHERE id IN (SELECT id FROM tool_invocations WHERE {due} \
             ORDER BY created_at_ms LIMIT $3) RETURNING {COLUMNS}, lease_until_ms"
        ),
    };
    let taken = on_store!(store, |pool| {
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(now_ms)
            .bind(slack_ms)
            .bind(limit);
        for (team, tool, version) in busy {
            query = query.bind(team).bind(tool).bind(version);
        }
        let rows = query.fetch_all(pool).await?;
        rows.iter()
            .map(|row| {
                Ok(Taken {
                    invocation: decode(row)?,
                    lease_until_ms: row.try_get(LEASE)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?
    });
    Ok(taken)
}

/// Marks FAILED (`INTERRUPTED`) the SYNC invocations RUNNING past their lease;
/// the key still holds the window, so a retry gets this answer. Returns them.
pub async fn fail_interrupted(store: &Store, now_ms: i64) -> Result<Vec<Invocation>, StoreError> {
    let sql = format!(
        "UPDATE tool_invocations SET status = 'FAILED', error_code = 'INTERRUPTED', \
         error_message = 'the process running it stopped before it finished', \
         lease_until_ms = NULL, updated_at_ms = $1 \
         WHERE mode = 'SYNC' AND status = 'RUNNING' AND lease_until_ms < $1 RETURNING {COLUMNS}"
    );
    let failed = on_store!(store, |pool| {
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .bind(now_ms)
            .fetch_all(pool)
            .await?;
        rows.iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?
    });
    Ok(failed)
}
