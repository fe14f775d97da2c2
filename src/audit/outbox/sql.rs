//! The `trigger_outbox` table's SQL: valid on both backends but for
//! `take`'s `FOR UPDATE SKIP LOCKED`, PostgreSQL's alone.

use super::{OutboxRepository, Pending};
use crate::store::{Arg, Backend, Statement, Store, StoreError};
use serde_json::Value;

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn OutboxRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

/// A PENDING row of `trigger` for `team`: what it starts, and the event's fields.
pub(super) fn insert(trigger: &str, team: &str, row: &Value, now_ms: i64) -> Statement {
    Statement::new(
        "INSERT INTO trigger_outbox (id, trigger_name, team_id, event, status, created_at_ms, \
         updated_at_ms) VALUES ($1, $2, $3, $4, 'PENDING', $5, $5)",
        vec![
            uuid::Uuid::now_v7().to_string().into(),
            trigger.into(),
            team.into(),
            row.to_string().into(),
            now_ms.into(),
        ],
    )
}

/// Ends `row` as `status` while PENDING under its lease (the guard).
pub(super) fn end(
    row: &Pending,
    status: &str,
    invocation_id: Option<&str>,
    error: &str,
    now_ms: i64,
) -> Statement {
    Statement::new(
        "UPDATE trigger_outbox SET status = $2, invocation_id = $3, error = $4, \
         updated_at_ms = $5 WHERE id = $1 AND status = 'PENDING' AND lease_until_ms = $6",
        vec![
            row.id.as_str().into(),
            status.into(),
            invocation_id.map_or(Arg::Null, Arg::from),
            error.into(),
            now_ms.into(),
            row.lease_until_ms.into(),
        ],
    )
}

crate::impl_for_both_pools!(OutboxRepository {
    async fn take(
        &self,
        now_ms: i64,
        lease_until_ms: i64,
        limit: i64,
    ) -> Result<Vec<Pending>, StoreError> {
        let lock = if Self::POSTGRES {
            // SKIP LOCKED: every replica's relay shares the outbox, never a row.
            " FOR UPDATE SKIP LOCKED"
        } else {
            ""
        };
        let sql = format!(
            "UPDATE trigger_outbox SET lease_until_ms = $2, attempts = attempts + 1, \
             updated_at_ms = $1 WHERE id IN (SELECT id FROM trigger_outbox \
             WHERE status = 'PENDING' AND lease_until_ms < $1 ORDER BY id LIMIT $3{lock}) \
             RETURNING id, trigger_name, team_id, event, attempts, lease_until_ms"
        );
        let rows: Vec<(String, String, String, String, i64, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(now_ms)
                .bind(lease_until_ms)
                .bind(limit)
                .fetch_all(self)
                .await?;
        let mut out: Vec<Pending> = rows
            .into_iter()
            .map(|(id, trigger, team_id, event, attempts, lease)| {
                Pending::from_stored(id, trigger, team_id, &event, attempts, lease)
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn renew(&self, id: &str, held: i64, until: i64) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE trigger_outbox SET lease_until_ms = $3 \
             WHERE id = $1 AND status = 'PENDING' AND lease_until_ms = $2",
        )
        .bind(id)
        .bind(held)
        .bind(until)
        .execute(self)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn purge(&self, before_ms: i64) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM trigger_outbox WHERE status <> 'PENDING' AND updated_at_ms < $1",
        )
        .bind(before_ms)
        .execute(self)
        .await?;
        Ok(done.rows_affected())
    }

    async fn rows(&self) -> Result<Vec<(String, String, Option<String>)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT trigger_name, status, invocation_id FROM trigger_outbox ORDER BY id",
        )
        .fetch_all(self)
        .await?)
    }
});
