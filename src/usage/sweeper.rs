//! Charges reservations orphaned by a crash at their estimate: usage may be
//! over-estimated, never lost. One older than `metering.sweep_after` has no
//! live owner; at start-up on SQLite every one is an orphan.

use super::UsageRecord;
use crate::{
    on_store,
    store::{Store, StoreError},
};

const ORPHANS: &str = "SELECT id, team_id, month_start_ms, input_tokens, output_tokens, requests, cost_micros, \
task, user_id, trace_id, channel, priority, created_at_ms FROM usage_reservations \
WHERE created_at_ms < $1 ORDER BY created_at_ms LIMIT 1000";

/// Releases ($3..$5) never below zero, as in the ledger's settlement.
const MOVE_TO_SPENT: &str = "UPDATE usage_ledger SET \
reserved_tokens = CASE WHEN reserved_tokens > $3 THEN reserved_tokens - $3 ELSE 0 END, \
reserved_requests = CASE WHEN reserved_requests > $4 THEN reserved_requests - $4 ELSE 0 END, \
reserved_cost_micros = CASE WHEN reserved_cost_micros > $5 THEN reserved_cost_micros - $5 ELSE 0 END, \
spent_tokens = spent_tokens + $3, \
spent_requests = spent_requests + $4, spent_cost_micros = spent_cost_micros + $5 \
WHERE team_id = $1 AND month_start_ms = $2";

/// Outcome written on the usage record of a swept reservation.
pub const ORPHANED: &str = "ORPHANED";

type OrphanRow = (
    String,
    String,
    i64,
    i64,
    i64,
    i64,
    i64,
    String,
    String,
    String,
    String,
    String,
    i64,
);

/// Charges every reservation created before `before_ms`; returns how many.
/// Safe on several replicas at once: one `DELETE` wins each orphan.
pub async fn sweep(store: &Store, before_ms: i64) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let swept = on_store!(store, |pool| {
            let mut tx = match store {
                Store::Sqlite(_) => pool.begin_with("BEGIN IMMEDIATE").await?,
                Store::Postgres(_) => pool.begin().await?,
            };
            let mut rows: Vec<OrphanRow> = sqlx::query_as(ORPHANS)
                .bind(before_ms)
                .fetch_all(&mut *tx)
                .await?;
            // (team, month) order, as the writers lock rows: no wait cycle.
            rows.sort_by(|a, b| (&a.1, a.2).cmp(&(&b.1, b.2)));
            let mut swept = 0_u64;
            for (
                id,
                team,
                month,
                input,
                output,
                requests,
                cost,
                task,
                user,
                trace,
                channel,
                priority,
                created,
            ) in &rows
            {
                let claimed = sqlx::query("DELETE FROM usage_reservations WHERE id = $1")
                    .bind(id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if claimed != 1 {
                    continue;
                }
                sqlx::query(MOVE_TO_SPENT)
                    .bind(team)
                    .bind(month)
                    .bind(input + output)
                    .bind(requests)
                    .bind(cost)
                    .execute(&mut *tx)
                    .await?;
                let record = UsageRecord {
                    created_at_ms: *created,
                    team_id: team.clone(),
                    user_id: user.clone(),
                    task: task.clone(),
                    trace_id: trace.clone(),
                    input_tokens: *input,
                    output_tokens: *output,
                    cost_micros: Some(*cost),
                    outcome: ORPHANED.into(),
                    channel: channel.clone(),
                    priority: priority.clone(),
                    attempts: "[]".into(),
                    ..UsageRecord::default()
                };
                crate::insert_usage_record!(&mut *tx, &record)?;
                swept += 1;
            }
            tx.commit().await?;
            Ok::<_, StoreError>((swept, rows.len()))
        })?;
        total += swept.0;
        if swept.1 < 1000 {
            return Ok(total);
        }
    }
}

/// Reservations still open (tests, ops).
pub async fn open_reservations(store: &Store) -> Result<i64, StoreError> {
    let n: i64 = on_store!(store, |pool| {
        sqlx::query_scalar("SELECT COUNT(*) FROM usage_reservations")
            .fetch_one(pool)
            .await?
    });
    Ok(n)
}
