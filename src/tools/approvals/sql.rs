//! The `approvals` table's SQL, valid on both backends but for `expire`'s
//! `FOR UPDATE SKIP LOCKED`, PostgreSQL's alone. Requesting and deciding also
//! write the held invocation's `tool_invocations` row, in the same transaction.

use super::{Approval, ApprovalRepository, ApprovalStatus, Decided, Decision};
use crate::store::{Backend, Store, StoreError, begin_write};
use crate::tools::invocations::Invocation;
use serde_json::Value;

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn ApprovalRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

const COLUMNS: &str = "id, team_id, tool, version, requested_by, trace_id, input, \
     input_sha256, invocation_id, conversation_id, call_id, status, decided_by, reason, \
     created_at_ms, decided_at_ms, expires_at_ms";

/// `invocations::claim`'s insert for a held invocation: ASYNC (an approved one
/// is the worker's), AWAITING_APPROVAL, no lease; the key's unique constraint decides.
const CLAIM_HELD: &str = "INSERT INTO tool_invocations (id, team_id, tool, version, mode, \
     status, idempotency_key, window_start_ms, trace_id, principal, input, \
     estimated_cost_micros, attempts, created_at_ms, timeout_ms, updated_at_ms) VALUES \
     ($1, $2, $3, $4, 'ASYNC', 'AWAITING_APPROVAL', $5, $6, $7, $8, $9, $10, 0, $11, $12, $11) \
     ON CONFLICT (team_id, idempotency_key, window_start_ms) DO NOTHING";

/// An approved invocation: the ASYNC worker's to run.
const RELEASE_HELD: &str = "UPDATE tool_invocations SET status = 'PENDING', updated_at_ms = $2 \
     WHERE id = $1 AND status = 'AWAITING_APPROVAL'";

/// A rejected or expired invocation ends without running, charged its estimate.
const REJECT_HELD: &str = "UPDATE tool_invocations SET status = 'REJECTED', error_code = $3, \
     error_message = $4, cost_micros = estimated_cost_micros, duration_ms = 0, \
     updated_at_ms = $2, lease_until_ms = NULL WHERE id = $1 AND status = 'AWAITING_APPROVAL'";

/// An `INSERT` of every column, `$1`..`$17` in [`COLUMNS`]' order, then `tail`.
fn insert_sql(tail: &str) -> String {
    format!(
        "INSERT INTO approvals ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
         $11, $12, $13, $14, $15, $16, $17){tail}"
    )
}

/// Binds approval `$a` to [`insert_sql`]'s statement `$query`, `$invocation` as its
/// `invocation_id` (a macro: the same binds for either pool and any executor).
macro_rules! bind_approval {
    ($query:expr, $a:expr, $invocation:expr) => {
        $query
            .bind(&$a.id)
            .bind(&$a.team_id)
            .bind(&$a.tool)
            .bind(&$a.version)
            .bind(&$a.requested_by)
            .bind(&$a.trace_id)
            .bind($a.input.to_string())
            .bind(&$a.input_sha256)
            .bind($invocation)
            .bind(&$a.conversation_id)
            .bind(&$a.call_id)
            .bind($a.status.as_str())
            .bind(&$a.decided_by)
            .bind(&$a.reason)
            .bind($a.created_at_ms)
            .bind($a.decided_at_ms)
            .bind($a.expires_at_ms)
    };
}

fn decode<R: sqlx::Row>(row: &R) -> Result<Approval, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database>,
{
    let input: String = row.try_get(6)?;
    let status: String = row.try_get(11)?;
    Ok(Approval {
        id: row.try_get(0)?,
        team_id: row.try_get(1)?,
        tool: row.try_get(2)?,
        version: row.try_get(3)?,
        requested_by: row.try_get(4)?,
        trace_id: row.try_get(5)?,
        // A stored input that no longer parses is shown as null, never a panic.
        input: serde_json::from_str(&input).unwrap_or(Value::Null),
        input_sha256: row.try_get(7)?,
        invocation_id: row.try_get(8)?,
        conversation_id: row.try_get(9)?,
        call_id: row.try_get(10)?,
        // An unknown status (a newer release's) is read as over: nothing acts on it.
        status: ApprovalStatus::parse(&status).unwrap_or(ApprovalStatus::Expired),
        decided_by: row.try_get(12)?,
        reason: row.try_get(13)?,
        created_at_ms: row.try_get(14)?,
        decided_at_ms: row.try_get(15)?,
        expires_at_ms: row.try_get(16)?,
    })
}

crate::impl_for_both_pools!(ApprovalRepository {
    async fn request_invocation(
        &self,
        inv: &Invocation,
        approval: &Approval,
    ) -> Result<Option<String>, StoreError> {
        let mut tx = begin_write(self, Self::POSTGRES).await?;
        let claimed = sqlx::query(CLAIM_HELD)
            .bind(&inv.id)
            .bind(&inv.team_id)
            .bind(&inv.tool)
            .bind(&inv.version)
            .bind(&inv.idempotency_key)
            .bind(inv.window_start_ms)
            .bind(&inv.trace_id)
            .bind(&inv.principal)
            .bind(inv.input.to_string())
            .bind(inv.estimated_cost_micros)
            .bind(inv.created_at_ms)
            .bind(inv.timeout_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if claimed == 0 {
            let holder: String = sqlx::query_scalar(
                "SELECT id FROM tool_invocations \
                 WHERE team_id = $1 AND idempotency_key = $2 AND window_start_ms = $3",
            )
            .bind(&inv.team_id)
            .bind(&inv.idempotency_key)
            .bind(inv.window_start_ms)
            .fetch_one(&mut *tx)
            .await?;
            tx.rollback().await?;
            return Ok(Some(holder));
        }
        let insert = sqlx::query(sqlx::AssertSqlSafe(insert_sql("")));
        bind_approval!(insert, approval, Some(inv.id.as_str()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(None)
    }

    async fn request_call(&self, approval: &Approval) -> Result<Approval, StoreError> {
        let insert = sqlx::query(sqlx::AssertSqlSafe(insert_sql("")));
        bind_approval!(insert, approval, &approval.invocation_id)
            .execute(self)
            .await?;
        Ok(approval.clone())
    }

    async fn get(&self, team: &str, id: &str) -> Result<Option<Approval>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM approvals WHERE id = $1 AND team_id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(team)
            .fetch_optional(self)
            .await?;
        Ok(row.as_ref().map(decode).transpose()?)
    }

    async fn for_call(
        &self,
        team: &str,
        conversation_id: &str,
        call_id: &str,
    ) -> Result<Option<Approval>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM approvals \
             WHERE team_id = $1 AND conversation_id = $2 AND call_id = $3 \
             ORDER BY id DESC LIMIT 1"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team)
            .bind(conversation_id)
            .bind(call_id)
            .fetch_optional(self)
            .await?;
        Ok(row.as_ref().map(decode).transpose()?)
    }

    async fn for_invocation(
        &self,
        team: &str,
        invocation_id: &str,
    ) -> Result<Option<Approval>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM approvals WHERE team_id = $1 AND invocation_id = $2 \
             ORDER BY id DESC LIMIT 1"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team)
            .bind(invocation_id)
            .fetch_optional(self)
            .await?;
        Ok(row.as_ref().map(decode).transpose()?)
    }

    async fn list(
        &self,
        team: &str,
        status: Option<ApprovalStatus>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<Approval>, StoreError> {
        // Only the filters given are in the statement: PostgreSQL refuses a bound
        // parameter the statement does not use.
        let mut sql = format!("SELECT {COLUMNS} FROM approvals WHERE team_id = $1");
        let mut n = 1;
        if status.is_some() {
            n += 1;
            sql.push_str(&format!(" AND status = ${n}"));
        }
        if before.is_some() {
            n += 1;
            sql.push_str(&format!(" AND id < ${n}"));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", n + 1));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(team);
        if let Some(status) = status {
            query = query.bind(status.as_str());
        }
        if let Some(before) = before {
            query = query.bind(before);
        }
        let rows = query.bind(limit).fetch_all(self).await?;
        Ok(rows
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    async fn decide(
        &self,
        team: &str,
        id: &str,
        decision: Decision,
        by: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Option<Decided>, StoreError> {
        let status = match decision {
            Decision::Approve => ApprovalStatus::Approved,
            Decision::Reject => ApprovalStatus::Rejected,
        };
        let mut tx = begin_write(self, Self::POSTGRES).await?;
        // The guard is the race's referee: of two deciders (or a decider and the
        // sweeper), on any replica, one changes the row, the other finds it decided.
        let sql = format!(
            "UPDATE approvals SET status = $3, decided_by = $4, reason = $5, decided_at_ms = $6 \
             WHERE team_id = $1 AND id = $2 AND status = 'PENDING' AND expires_at_ms > $6 \
             RETURNING {COLUMNS}"
        );
        // fetch_all: the statement runs to its end on SQLite, never left half-stepped.
        let changed = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team)
            .bind(id)
            .bind(status.as_str())
            .bind(by)
            .bind(reason)
            .bind(now_ms)
            .fetch_all(&mut *tx)
            .await?;
        if let Some(row) = changed.first() {
            let approval = decode(row)?;
            if let Some(invocation) = &approval.invocation_id {
                let moved = match decision {
                    Decision::Approve => sqlx::query(RELEASE_HELD).bind(invocation).bind(now_ms),
                    Decision::Reject => sqlx::query(REJECT_HELD)
                        .bind(invocation)
                        .bind(now_ms)
                        .bind("REJECTED")
                        .bind(if reason.is_empty() { "rejected" } else { reason }),
                };
                moved.execute(&mut *tx).await?;
            }
            tx.commit().await?;
            return Ok(Some(Decided::Now(Box::new(approval))));
        }
        let sql = format!("SELECT {COLUMNS} FROM approvals WHERE id = $1 AND team_id = $2");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(team)
            .fetch_optional(&mut *tx)
            .await?;
        tx.rollback().await?;
        Ok(row
            .as_ref()
            .map(decode)
            .transpose()?
            .map(|a| Decided::Already(Box::new(a))))
    }

    async fn expire(&self, now_ms: i64, limit: i64) -> Result<Vec<Approval>, StoreError> {
        // SKIP LOCKED: replicas sweeping at once take different rows; the outer
        // guard keeps a row another sweeper or a decider changed first out.
        let lock = if Self::POSTGRES {
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let sql = format!(
            "UPDATE approvals SET status = 'EXPIRED', decided_at_ms = $1, reason = 'expired', \
             decided_by = 'system' WHERE id IN (SELECT id FROM approvals \
             WHERE status = 'PENDING' AND expires_at_ms <= $1 ORDER BY expires_at_ms LIMIT $2{lock}) \
             AND status = 'PENDING' RETURNING {COLUMNS}"
        );
        let mut tx = begin_write(self, Self::POSTGRES).await?;
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(now_ms)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await?;
        let expired = rows
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        for invocation in expired.iter().filter_map(|a| a.invocation_id.as_ref()) {
            sqlx::query(REJECT_HELD)
                .bind(invocation)
                .bind(now_ms)
                .bind("EXPIRED")
                .bind("the approval expired")
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(expired)
    }
});

#[cfg(test)]
mod tests {
    use super::super::{
        ApprovalStatus, get, request_call,
        tests::{call, store},
    };
    use serde_json::Value;

    /// A row this release cannot read is shown, not a panic.
    #[tokio::test]
    async fn bad_stored_input_and_status_are_read_safely() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path()).await;
        let held = request_call(&store, &call("t", "c", "1")).await.unwrap();
        crate::on_store!(&store, |pool| sqlx::query(
            "UPDATE approvals SET input = 'not json', status = 'LATER' WHERE id = $1"
        )
        .bind(&held.id)
        .execute(pool)
        .await
        .map(drop))
        .unwrap();
        let read = get(&store, "t", &held.id).await.unwrap().unwrap();
        assert_eq!(
            (read.input, read.status),
            (Value::Null, ApprovalStatus::Expired)
        );
        store.close().await;
    }
}
