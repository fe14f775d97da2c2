//! The usage tables' SQL, valid on both backends: the record's insert (the ledgers' batches
//! and the orphan sweep), the reads behind `GetUsage`, and the orphan sweep. The ledger's
//! own statements are in `ledger::sql`.

use super::{
    UsageRecord, UsageRepository,
    summary::{Dimension, RollupRow, SumRow},
};
use crate::store::{Backend, Store, StoreError, begin_write};
use futures::TryStreamExt;
use sqlx::Row;

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn UsageRepository + 'static) {
    crate::on_store!(store, |pool| pool)
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
        $crate::bind_usage_record!(sqlx::query($crate::usage::sql::INSERT), $r)
            .execute($exec)
            .await
    }};
}

/// A dimension's SQL expression; fixed strings only, never caller input.
fn column(d: Dimension) -> &'static str {
    match d {
        Dimension::Task => "task",
        Dimension::Provider => "provider",
        Dimension::Model => "model",
        Dimension::Day => DAY_OF_RECORD,
        Dimension::User => "user_id",
    }
}

/// A record's UTC day.
const DAY_OF_RECORD: &str = "CAST(created_at_ms / 86400000 AS BIGINT)";

/// The select and `GROUP BY` lists of `dims` (`day_column`: the table's UTC
/// day). Fixed strings only, never caller input.
fn dimension_sql(dims: &[Dimension], day_column: &str) -> (String, String) {
    let column = |d: &Dimension| match d {
        Dimension::Day => day_column,
        other => column(*other),
    };
    let select = dims
        .iter()
        .map(|d| format!("CAST({} AS TEXT), ", column(d)))
        .collect();
    let group_by = dims.iter().map(column).collect::<Vec<_>>().join(", ");
    (select, group_by)
}

const ORPHANS: &str = "SELECT id, team_id, month_start_ms, day_start_ms, input_tokens, output_tokens, requests, \
cost_micros, task, user_id, trace_id, channel, priority, created_at_ms FROM usage_reservations \
WHERE created_at_ms < $1 ORDER BY created_at_ms LIMIT $2";

/// Releases ($5..$7) never below zero, as in the ledger's settlement, in the bucket `$1..$4`.
const MOVE_TO_SPENT: &str = "UPDATE usage_ledger SET \
reserved_tokens = CASE WHEN reserved_tokens > $5 THEN reserved_tokens - $5 ELSE 0 END, \
reserved_requests = CASE WHEN reserved_requests > $6 THEN reserved_requests - $6 ELSE 0 END, \
reserved_cost_micros = CASE WHEN reserved_cost_micros > $7 THEN reserved_cost_micros - $7 ELSE 0 END, \
spent_tokens = spent_tokens + $5, \
spent_requests = spent_requests + $6, spent_cost_micros = spent_cost_micros + $7 \
WHERE team_id = $1 AND user_id = $2 AND period = $3 AND period_start_ms = $4";

type OrphanRow = (
    String,
    String,
    i64,
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

/// A row's group: its first `n` columns, the dimensions' values as text.
fn group_key<R: Row>(row: &R, n: usize) -> Result<Vec<String>, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    (0..n).map(|i| row.try_get::<String, _>(i)).collect()
}

/// A usage record from a row of [`record_columns!`].
fn decode_record<R: Row>(row: &R) -> Result<UsageRecord, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    i64: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    Option<i64>: for<'r> sqlx::Decode<'r, R::Database>,
{
    Ok(UsageRecord {
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
    })
}

crate::impl_for_both_pools!(UsageRepository {
    async fn by_trace(&self, trace_id: &str) -> Result<Vec<UsageRecord>, StoreError> {
        let sql = concat!(
            "SELECT ",
            record_columns!(),
            " FROM usage_records WHERE trace_id = $1 ORDER BY id"
        );
        let rows = sqlx::query(sql).bind(trace_id).fetch_all(self).await?;
        Ok(rows.iter().map(decode_record).collect::<Result<_, _>>()?)
    }

    async fn of_trace(
        &self,
        team: &str,
        trace_id: &str,
        limit: i64,
    ) -> Result<Vec<UsageRecord>, StoreError> {
        let sql = concat!(
            "SELECT ",
            record_columns!(),
            " FROM usage_records WHERE trace_id = $1 AND team_id = $2 ORDER BY id LIMIT $3"
        );
        let rows = sqlx::query(sql)
            .bind(trace_id)
            .bind(team)
            .bind(limit)
            .fetch_all(self)
            .await?;
        Ok(rows.iter().map(decode_record).collect::<Result<_, _>>()?)
    }

    async fn recent(&self, team: &str, limit: i64) -> Result<Vec<UsageRecord>, StoreError> {
        let sql = concat!(
            "SELECT ",
            record_columns!(),
            " FROM usage_records WHERE team_id = $1 ORDER BY created_at_ms DESC LIMIT $2"
        );
        let rows = sqlx::query(sql).bind(team).bind(limit).fetch_all(self).await?;
        Ok(rows.iter().map(decode_record).collect::<Result<_, _>>()?)
    }

    async fn active_teams(&self, first_day: i64, limit: i64) -> Result<Vec<String>, StoreError> {
        let sql = "SELECT DISTINCT team_id FROM usage_rollup WHERE day >= $1 ORDER BY team_id LIMIT $2";
        Ok(sqlx::query_scalar(sql)
            .bind(first_day)
            .bind(limit)
            .fetch_all(self)
            .await?)
    }

    async fn rollups(
        &self,
        team: &str,
        first_day: i64,
        end_day: i64,
        dims: &[Dimension],
    ) -> Result<Vec<(Vec<String>, RollupRow)>, StoreError> {
        let (select, group_by) = dimension_sql(dims, "day");
        let group_by = if group_by.is_empty() {
            String::new()
        } else {
            format!(" GROUP BY {group_by}")
        };
        let sum = |c: &str| format!("CAST(COALESCE(SUM({c}), 0) AS BIGINT)");
        let sql = format!(
            "SELECT {select}{}, {}, {}, {}, {}, {}, {} FROM usage_rollup \
             WHERE team_id = $1 AND day >= $2 AND day < $3{group_by}",
            sum("requests"),
            sum("input_tokens"),
            sum("output_tokens"),
            sum("cost_micros"),
            sum("errors"),
            sum("degraded"),
            sum("unpriced"),
        );
        let n = dims.len();
        // Audited: the only dynamic parts are `column`'s constants.
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team)
            .bind(first_day)
            .bind(end_day)
            .fetch_all(self)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let key = group_key(&row, n)?;
            let sums: RollupRow = (
                row.try_get(n)?,
                row.try_get(n + 1)?,
                row.try_get(n + 2)?,
                row.try_get(n + 3)?,
                row.try_get(n + 4)?,
                row.try_get(n + 5)?,
                row.try_get(n + 6)?,
            );
            out.push((key, sums));
        }
        // No rollup rows: one all-zero row without groups.
        Ok(out.into_iter().filter(|(_, sums)| sums.0 > 0).collect())
    }

    async fn latency_histogram(
        &self,
        team: &str,
        first_day: i64,
        end_day: i64,
        dims: &[Dimension],
    ) -> Result<Vec<(Vec<String>, i64, u64)>, StoreError> {
        let (select, group_by) = dimension_sql(dims, "day");
        let group_by = if group_by.is_empty() {
            "floor_ms".to_owned()
        } else {
            format!("{group_by}, floor_ms")
        };
        let sql = format!(
            "SELECT {select}floor_ms, CAST(SUM(count) AS BIGINT) FROM usage_latency_rollup \
             WHERE team_id = $1 AND day >= $2 AND day < $3 GROUP BY {group_by}"
        );
        let n = dims.len();
        // Audited: the only dynamic parts are `column`'s constants.
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team)
            .bind(first_day)
            .bind(end_day)
            .fetch_all(self)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let key = group_key(&row, n)?;
            let count: i64 = row.try_get(n + 1)?;
            out.push((key, row.try_get(n)?, u64::try_from(count).unwrap_or(0)));
        }
        Ok(out)
    }

    async fn records(
        &self,
        team: &str,
        start_ms: i64,
        end_ms: i64,
        dims: &[Dimension],
        each: &mut (dyn FnMut(Vec<String>, SumRow) + Send),
    ) -> Result<(), StoreError> {
        let (select, _) = dimension_sql(dims, DAY_OF_RECORD);
        let sql = format!(
            "SELECT {select}latency_ms, input_tokens, output_tokens, CAST(COALESCE(cost_micros, 0) AS BIGINT), \
             CAST(CASE WHEN outcome = 'ok' THEN 0 ELSE 1 END AS BIGINT), degraded, \
             CAST(CASE WHEN cost_micros IS NULL THEN 1 ELSE 0 END AS BIGINT) \
             FROM usage_records WHERE team_id = $1 AND created_at_ms >= $2 AND created_at_ms < $3"
        );
        let n = dims.len();
        // Audited: the only dynamic parts are `column`'s constants.
        let mut rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(team)
            .bind(start_ms)
            .bind(end_ms)
            .fetch(self);
        while let Some(row) = rows.try_next().await? {
            let key = group_key(&row, n)?;
            let sums: SumRow = (
                row.try_get(n)?,
                row.try_get(n + 1)?,
                row.try_get(n + 2)?,
                row.try_get(n + 3)?,
                row.try_get::<i64, _>(n + 4)?,
                row.try_get(n + 5)?,
                row.try_get::<i64, _>(n + 6)?,
            );
            each(key, sums);
        }
        Ok(())
    }

    async fn sweep_orphans(&self, before_ms: i64, limit: usize) -> Result<(u64, usize), StoreError> {
        let mut tx = begin_write(self, Self::POSTGRES).await?;
        let rows: Vec<OrphanRow> = sqlx::query_as(ORPHANS)
            .bind(before_ms)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await?;
        // Every reservation claimed before any ledger row is locked: a writer
        // settling one of them holds it while it waits for those rows.
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows.iter() {
            let deleted = sqlx::query("DELETE FROM usage_reservations WHERE id = $1")
                .bind(&row.0)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if deleted == 1 {
                claimed.push(row);
            }
        }
        // Team and month order, each month row first, as the writers lock them.
        claimed.sort_by(|a, b| (&a.1, a.2).cmp(&(&b.1, b.2)));
        let mut swept = 0_u64;
        for (
            _,
            team,
            month,
            day,
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
        ) in claimed
        {
            let account = super::bucket::Account {
                team_id: team,
                user_id: user,
                month_start_ms: *month,
                day_start_ms: *day,
            };
            for bucket in account.buckets() {
                sqlx::query(MOVE_TO_SPENT)
                    .bind(&bucket.team_id)
                    .bind(&bucket.user_id)
                    .bind(bucket.period.as_str())
                    .bind(bucket.start_ms)
                    .bind(input + output)
                    .bind(requests)
                    .bind(cost)
                    .execute(&mut *tx)
                    .await?;
            }
            let record = UsageRecord {
                created_at_ms: *created,
                team_id: team.clone(),
                user_id: user.clone(),
                task: task.clone(),
                trace_id: trace.clone(),
                input_tokens: *input,
                output_tokens: *output,
                cost_micros: Some(*cost),
                outcome: super::sweeper::ORPHANED.into(),
                channel: channel.clone(),
                priority: priority.clone(),
                attempts: "[]".into(),
                ..UsageRecord::default()
            };
            crate::insert_usage_record!(&mut *tx, &record)?;
            swept += 1;
        }
        tx.commit().await?;
        Ok((swept, rows.len()))
    }

    async fn open_reservations(&self) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM usage_reservations")
            .fetch_one(self)
            .await?)
    }
});
