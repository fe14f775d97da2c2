//! The `tool_invocations` table's SQL: valid on both backends but for `take_work`'s
//! `FOR UPDATE SKIP LOCKED`, PostgreSQL's alone.

use super::{Claimed, Failure, Invocation, InvocationRepository, Mode, Outcome, Status, Taken};
use crate::store::{Arg, Backend, Statement, Store, StoreError};
use serde_json::Value;
use sqlx::Row as _;

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn InvocationRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

const COLUMNS: &str = "id, team_id, tool, version, mode, status, idempotency_key, \
     window_start_ms, trace_id, principal, input, output, error_code, error_message, \
     estimated_cost_micros, cost_micros, duration_ms, execution_id, attempts, created_at_ms, \
     timeout_ms";

/// Ends a run's row while the runner owns it (RUNNING under lease `$11`) or a
/// SYNC row was marked INTERRUPTED; `$12` the callback deadline, if any.
const FINISH: &str = "UPDATE tool_invocations SET status = $2, output = $3, error_code = $4, \
     error_message = $5, cost_micros = $6, duration_ms = $7, execution_id = $8, \
     attempts = $9, updated_at_ms = $10, lease_until_ms = $12 WHERE id = $1 \
     AND ((status = 'RUNNING' AND lease_until_ms = $11) \
      OR (mode = 'SYNC' AND status = 'FAILED' AND error_code = 'INTERRUPTED'))";

/// The index of `lease_until_ms` after [`COLUMNS`] in `take_work`'s rows.
const LEASE: usize = 21;

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

crate::impl_for_both_pools!(InvocationRepository {
    async fn claim(
        &self,
        inv: &Invocation,
        lease_until_ms: Option<i64>,
    ) -> Result<Claimed, StoreError> {
        let sql = format!(
            "INSERT INTO tool_invocations ({COLUMNS}, updated_at_ms, lease_until_ms) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, NULL, NULL, NULL, $12, \
             NULL, NULL, NULL, 0, $13, $15, $13, $14) \
             ON CONFLICT (team_id, idempotency_key, window_start_ms) DO NOTHING"
        );
        let input = inv.input.to_string();
        let inserted = sqlx::query(sqlx::AssertSqlSafe(sql))
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
            .execute(self)
            .await?
            .rows_affected();
        if inserted == 1 {
            return Ok(Claimed::New);
        }
        let sql = format!(
            "SELECT {COLUMNS} FROM tool_invocations \
             WHERE team_id = $1 AND idempotency_key = $2 AND window_start_ms = $3"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&inv.team_id)
            .bind(&inv.idempotency_key)
            .bind(inv.window_start_ms)
            .fetch_one(self)
            .await?;
        Ok(Claimed::Existing(Box::new(decode(&row)?)))
    }

    async fn finish(
        &self,
        id: &str,
        lease_until_ms: i64,
        outcome: &Outcome,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let output = outcome.output.as_ref().map(Value::to_string);
        let written = sqlx::query(FINISH)
        .bind(id)
        .bind(outcome.status.as_str())
        .bind(&output)
        .bind(outcome.error.as_ref().map(|e| e.code.clone()))
        .bind(outcome.error.as_ref().map(|e| e.message.clone()))
        .bind(outcome.cost_micros)
        .bind(outcome.duration_ms)
        .bind(&outcome.execution_id)
        .bind(outcome.attempts)
        .bind(now_ms)
        .bind(lease_until_ms)
        .bind(outcome.callback_until_ms)
        .execute(self)
        .await?
        .rows_affected();
        Ok(written == 1)
    }

    async fn release(&self, id: &str, lease_until_ms: i64, now_ms: i64) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE tool_invocations SET status = 'PENDING', lease_until_ms = NULL, \
             updated_at_ms = $2 WHERE id = $1 AND status = 'RUNNING' AND lease_until_ms = $3",
        )
        .bind(id)
        .bind(now_ms)
        .bind(lease_until_ms)
        .execute(self)
        .await?;
        Ok(())
    }

    async fn recent(&self, team: &str, limit: i64) -> Result<Vec<Invocation>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM tool_invocations WHERE team_id = $1 \
             ORDER BY created_at_ms DESC LIMIT $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team)
            .bind(limit)
            .fetch_all(self)
            .await?;
        Ok(rows
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    async fn get(&self, team: &str, id: &str) -> Result<Option<Invocation>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM tool_invocations WHERE id = $1 AND team_id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(team)
            .fetch_optional(self)
            .await?;
        Ok(row.as_ref().map(decode).transpose()?)
    }

    async fn by_key(&self, team: &str, key: &str) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM tool_invocations WHERE team_id = $1 AND idempotency_key = $2 \
             ORDER BY window_start_ms LIMIT 1",
        )
        .bind(team)
        .bind(key)
        .fetch_optional(self)
        .await?)
    }

    async fn take_work(
        &self,
        now_ms: i64,
        slack_ms: i64,
        limit: i64,
        busy: &[(String, String, String)],
    ) -> Result<Vec<Taken>, StoreError> {
        let mut due = String::from(
            "(status = 'PENDING' OR (status = 'RUNNING' AND lease_until_ms < $1)) \
             AND mode = 'ASYNC'",
        );
        for i in 0..busy.len() {
            let n = 4 + 3 * i;
            due.push_str(&format!(
                " AND NOT (team_id = ${n} AND tool = ${} AND version = ${})",
                n + 1,
                n + 2
            ));
        }
        let sql = if Self::POSTGRES {
            // SKIP LOCKED: several replicas' workers share the queue, never a row.
            format!(
                "UPDATE tool_invocations SET status = 'RUNNING', \
                 lease_until_ms = $1 + timeout_ms + $2, \
                 updated_at_ms = $1 WHERE id IN (SELECT id FROM tool_invocations WHERE {due} \
                 ORDER BY created_at_ms LIMIT $3 FOR UPDATE SKIP LOCKED) \
                 RETURNING {COLUMNS}, lease_until_ms"
            )
        } else {
            // One process per SQLite file: the statement alone decides.
            format!(
                "UPDATE tool_invocations SET status = 'RUNNING', \
                 lease_until_ms = $1 + timeout_ms + $2, \
                 updated_at_ms = $1 WHERE id IN (SELECT id FROM tool_invocations WHERE {due} \
                 ORDER BY created_at_ms LIMIT $3) RETURNING {COLUMNS}, lease_until_ms"
            )
        };
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now_ms)
            .bind(slack_ms)
            .bind(limit);
        for (team, tool, version) in busy {
            query = query.bind(team).bind(tool).bind(version);
        }
        let rows = query.fetch_all(self).await?;
        Ok(rows
            .iter()
            .map(|row| {
                Ok(Taken {
                    invocation: decode(row)?,
                    lease_until_ms: row.try_get(LEASE)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    async fn fail_interrupted(&self, now_ms: i64) -> Result<Vec<Invocation>, StoreError> {
        let sql = format!(
            "UPDATE tool_invocations SET status = 'FAILED', error_code = 'INTERRUPTED', \
             error_message = 'the process running it stopped before it finished', \
             lease_until_ms = NULL, updated_at_ms = $1 \
             WHERE mode = 'SYNC' AND status = 'RUNNING' AND lease_until_ms < $1 RETURNING {COLUMNS}"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now_ms)
            .fetch_all(self)
            .await?;
        Ok(rows
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }
});

// The rows of workflows that call back (`super::callbacks`).

/// The index of `callback_sha256` after [`COLUMNS`].
const DIGEST: usize = 21;

/// The callback rows' reads (one SQL for both backends); their ends are
/// [`complete`] and [`expire`], run by the ledger with their audit events.
#[async_trait::async_trait]
pub trait CallbackRepository: Send + Sync + std::fmt::Debug {
    /// Invocation `id` of any team, with the digest of the callback that ended it.
    async fn find(&self, id: &str) -> Result<Option<(Invocation, Option<String>)>, StoreError>;

    /// Up to `limit` invocations AWAITING_CALLBACK past their wait at `now_ms`.
    async fn overdue(&self, now_ms: i64, limit: i64) -> Result<Vec<Invocation>, StoreError>;
}

/// The callback repository over `store`'s pool.
pub(super) fn callbacks(store: &Store) -> &(dyn CallbackRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

crate::impl_for_both_pools!(CallbackRepository {
    async fn find(&self, id: &str) -> Result<Option<(Invocation, Option<String>)>, StoreError> {
        let sql = format!("SELECT {COLUMNS}, callback_sha256 FROM tool_invocations WHERE id = $1");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self)
            .await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some((decode(&row)?, row.try_get(DIGEST)?)))
    }

    async fn overdue(&self, now_ms: i64, limit: i64) -> Result<Vec<Invocation>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM tool_invocations \
             WHERE status = 'AWAITING_CALLBACK' AND lease_until_ms < $1 LIMIT $2"
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now_ms)
            .bind(limit)
            .fetch_all(self)
            .await?;
        Ok(rows
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }
});

/// Ends invocation `id` with a callback's `outcome` and body `digest` at
/// `now_ms`: while it awaits one within its wait, or still RUNNING (the
/// workflow called back before its acceptance was recorded).
pub fn complete(id: &str, outcome: &Outcome, digest: &str, now_ms: i64) -> Statement {
    let text = |v: Option<String>| v.map_or(Arg::Null, Arg::Text);
    Statement::new(
        "UPDATE tool_invocations SET status = $2, output = $3, error_code = $4, \
         error_message = $5, duration_ms = $6, callback_sha256 = $7, updated_at_ms = $8, \
         cost_micros = COALESCE(cost_micros, estimated_cost_micros), lease_until_ms = NULL \
         WHERE id = $1 AND (status = 'RUNNING' \
         OR (status = 'AWAITING_CALLBACK' AND lease_until_ms >= $8))",
        vec![
            id.into(),
            outcome.status.as_str().into(),
            text(outcome.output.as_ref().map(Value::to_string)),
            text(outcome.error.as_ref().map(|e| e.code.clone())),
            text(outcome.error.as_ref().map(|e| e.message.clone())),
            outcome.duration_ms.into(),
            digest.into(),
            now_ms.into(),
        ],
    )
}

/// [`InvocationRepository::finish`] as a statement, for the ledger to run
/// with the result's audit event (and the triggers it fires) in one
/// transaction: changes no row when the runner no longer owns it.
pub fn end_run(id: &str, lease_until_ms: i64, outcome: &Outcome, now_ms: i64) -> Statement {
    let text = |v: Option<String>| v.map_or(Arg::Null, Arg::Text);
    Statement::new(
        FINISH,
        vec![
            id.into(),
            outcome.status.as_str().into(),
            text(outcome.output.as_ref().map(Value::to_string)),
            text(outcome.error.as_ref().map(|e| e.code.clone())),
            text(outcome.error.as_ref().map(|e| e.message.clone())),
            outcome.cost_micros.into(),
            outcome.duration_ms.into(),
            text(outcome.execution_id.clone()),
            outcome.attempts.into(),
            now_ms.into(),
            lease_until_ms.into(),
            outcome.callback_until_ms.map_or(Arg::NullInt, Arg::Int),
        ],
    )
}

/// Ends invocation `id` TIMED_OUT while it still awaits a callback past its wait.
pub fn expire(id: &str, now_ms: i64) -> Statement {
    Statement::new(
        "UPDATE tool_invocations SET status = 'TIMED_OUT', error_code = 'TIMED_OUT', \
         error_message = 'the workflow did not call back within the tool''s callback_timeout', \
         cost_micros = COALESCE(cost_micros, estimated_cost_micros), \
         lease_until_ms = NULL, updated_at_ms = $2 \
         WHERE id = $1 AND status = 'AWAITING_CALLBACK' AND lease_until_ms < $2",
        vec![id.into(), now_ms.into()],
    )
}
