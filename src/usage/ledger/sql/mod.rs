//! The ledger's SQL: the statements both backends' batches run (`sqlite` on its own
//! connection, `postgres` through sqlx), and the reads and cap overrides on either pool.
//! A bucket's row is `$1..$4` = (team, user, period, start) in every statement.

pub mod postgres;
pub mod sqlite;

use super::{Done, LedgerRepository, Op};
use crate::{
    store::{Statement, Store, StoreError},
    usage::{
        bucket::{Bucket, Period, PeriodCaps},
        policy::{Balance, Caps},
    },
};
use std::sync::OnceLock;

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn LedgerRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

/// Creates a ledger row (`$1..$4`: team, user, period, start) that does not exist yet.
pub(super) const ENSURE_ROW: &str = "INSERT INTO usage_ledger (team_id, user_id, period, period_start_ms) \
VALUES ($1, $2, $3, $4) ON CONFLICT (team_id, user_id, period, period_start_ms) DO NOTHING";

pub(super) const BALANCE: &str = "SELECT spent_tokens, spent_requests, spent_cost_micros, reserved_tokens, \
reserved_requests, reserved_cost_micros FROM usage_ledger \
WHERE team_id = $1 AND user_id = $2 AND period = $3 AND period_start_ms = $4";

/// A batch's delta: `$5..$7` the net release, `$8..$10` the charge. A release
/// stops at zero (CHECK constraints): after an earlier inconsistency the row
/// heals instead of failing every later settlement.
pub(super) const UPDATE_ROW: &str = "UPDATE usage_ledger SET \
reserved_tokens = CASE WHEN reserved_tokens > $5 THEN reserved_tokens - $5 ELSE 0 END, \
reserved_requests = CASE WHEN reserved_requests > $6 THEN reserved_requests - $6 ELSE 0 END, \
reserved_cost_micros = CASE WHEN reserved_cost_micros > $7 THEN reserved_cost_micros - $7 ELSE 0 END, \
spent_tokens = spent_tokens + $8, \
spent_requests = spent_requests + $9, spent_cost_micros = spent_cost_micros + $10 \
WHERE team_id = $1 AND user_id = $2 AND period = $3 AND period_start_ms = $4";

/// Folds one call into its stored prompt version's running means.
pub(super) const RECORD_STATS: &str = "UPDATE ai_prompts SET \
avg_latency_ms = (avg_latency_ms * usage_count + $4) / (usage_count + 1), \
success_rate = (success_rate * usage_count + $5) / (usage_count + 1), \
usage_count = usage_count + 1 \
WHERE team_id = $1 AND prompt_key = $2 AND version = $3";

pub(super) const INSERT_RESERVATION_HEAD: &str = "INSERT INTO usage_reservations (id, team_id, month_start_ms, \
day_start_ms, input_tokens, output_tokens, requests, cost_micros, task, user_id, trace_id, channel, priority, \
created_at_ms)";

pub(super) const RESERVATION_COLUMNS: usize = 14;

/// The override columns of a period, tokens, requests, cost.
fn cap_columns(period: Period) -> &'static str {
    match period {
        Period::Month => "max_tokens, max_requests, max_cost_micros",
        Period::Day => "max_tokens_per_day, max_requests_per_day, max_cost_micros_per_day",
    }
}

/// The override row of `$1` (team) or `$1, $2` (team, user).
fn override_row(user: bool) -> &'static str {
    if user {
        "user_limits WHERE team_id = $1 AND user_id = $2"
    } else {
        "tenant_limits WHERE team_id = $1"
    }
}

/// One statement per bucket kind, built once: team month, team day, user month, user day.
fn per_kind(
    cache: &'static OnceLock<[String; 4]>,
    build: fn(bool, Period) -> String,
    bucket: &Bucket,
) -> &'static str {
    let all = cache.get_or_init(|| {
        [
            build(false, Period::Month),
            build(false, Period::Day),
            build(true, Period::Month),
            build(true, Period::Day),
        ]
    });
    let index = usize::from(bucket.is_user()) * 2 + usize::from(bucket.period == Period::Day);
    all.get(index).map_or("", String::as_str)
}

/// The once-per-period guard of a cap event (`level`: warning or reached):
/// it inserts a row only the first time, so its event is appended once.
pub fn cap_event_guard(bucket: &Bucket, cap: &str, level: &str, now_ms: i64) -> Statement {
    Statement::new(
        "INSERT INTO cap_events (team_id, user_id, period, start_ms, cap, level, at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
        vec![
            bucket.team_id.as_str().into(),
            bucket.user_id.as_str().into(),
            bucket.period.as_str().into(),
            bucket.start_ms.into(),
            cap.into(),
            level.into(),
            now_ms.into(),
        ],
    )
}

/// The bucket's own caps: `(tokens, requests, cost)` of its override row.
pub(super) fn bucket_caps(bucket: &Bucket) -> &'static str {
    static CACHE: OnceLock<[String; 4]> = OnceLock::new();
    per_kind(
        &CACHE,
        |user, period| format!("SELECT {} FROM {}", cap_columns(period), override_row(user)),
        bucket,
    )
}

/// [`policy::check`](crate::usage::policy::check) in SQL: reserves `($5, $6, $7)`
/// in the bucket `($1..$4)` under its override row (NULL: no cap) or `($8, $9,
/// $10)`. READ COMMITTED re-checks the `WHERE` on a concurrently updated row:
/// it holds across replicas.
pub(super) fn guarded_reserve(bucket: &Bucket) -> &'static str {
    static CACHE: OnceLock<[String; 4]> = OnceLock::new();
    per_kind(&CACHE, guarded_reserve_sql, bucket)
}

fn guarded_reserve_sql(user: bool, period: Period) -> String {
    let (columns, from) = (cap_columns(period), override_row(user));
    format!(
        "WITH caps (t, r, c) AS (SELECT {columns} FROM {from} \
UNION ALL SELECT CAST($8 AS BIGINT), CAST($9 AS BIGINT), CAST($10 AS BIGINT) \
WHERE NOT EXISTS (SELECT 1 FROM {from})) \
UPDATE usage_ledger SET \
reserved_tokens = reserved_tokens + $5, reserved_requests = reserved_requests + $6, \
reserved_cost_micros = reserved_cost_micros + $7 \
FROM caps \
WHERE usage_ledger.team_id = $1 AND usage_ledger.user_id = $2 AND usage_ledger.period = $3 \
AND usage_ledger.period_start_ms = $4 \
AND (caps.t IS NULL OR usage_ledger.spent_tokens + usage_ledger.reserved_tokens + $5 <= caps.t) \
AND (caps.r IS NULL OR usage_ledger.spent_requests + usage_ledger.reserved_requests + $6 <= caps.r) \
AND (caps.c IS NULL OR usage_ledger.spent_cost_micros + usage_ledger.reserved_cost_micros + $7 <= caps.c)"
    )
}

pub(super) type BalanceRow = (i64, i64, i64, i64, i64, i64);

pub(super) type CapsRow = (Option<i64>, Option<i64>, Option<i64>);

pub(super) fn caps((tokens, requests, cost_micros): CapsRow) -> Caps {
    Caps {
        tokens,
        requests,
        cost_micros,
    }
}

pub(super) fn balance(row: Option<BalanceRow>) -> Balance {
    let (st, sr, sc, rt, rr, rc) = row.unwrap_or_default();
    Balance {
        spent_tokens: st,
        spent_requests: sr,
        spent_cost_micros: sc,
        reserved_tokens: rt,
        reserved_requests: rr,
        reserved_cost_micros: rc,
    }
}

/// Both periods' override columns of a team's or user's row.
fn overrides_sql(user: bool) -> String {
    format!(
        "SELECT {}, {} FROM {}",
        cap_columns(Period::Month),
        cap_columns(Period::Day),
        override_row(user)
    )
}

/// Writes a team's (`$1`, then the caps) or user's (`$1, $2`, then the caps) override row.
fn upsert_sql(user: bool) -> String {
    let (table, key, conflict) = if user {
        ("user_limits", "team_id, user_id, ", "team_id, user_id")
    } else {
        ("tenant_limits", "team_id, ", "team_id")
    };
    let values = if user {
        "$1, $2, $3, $4, $5, $6, $7, $8, $9"
    } else {
        "$1, $2, $3, $4, $5, $6, $7, $8"
    };
    format!(
        "INSERT INTO {table} ({key}max_tokens, max_requests, max_cost_micros, max_tokens_per_day, \
max_requests_per_day, max_cost_micros_per_day, updated_at_ms) VALUES ({values}) ON CONFLICT ({conflict}) \
DO UPDATE SET max_tokens = excluded.max_tokens, max_requests = excluded.max_requests, \
max_cost_micros = excluded.max_cost_micros, max_tokens_per_day = excluded.max_tokens_per_day, \
max_requests_per_day = excluded.max_requests_per_day, \
max_cost_micros_per_day = excluded.max_cost_micros_per_day, updated_at_ms = excluded.updated_at_ms"
    )
}

crate::impl_for_both_pools!(LedgerRepository {
    async fn balance(&self, bucket: &Bucket) -> Result<Balance, StoreError> {
        let row: Option<BalanceRow> = sqlx::query_as(BALANCE)
            .bind(&bucket.team_id)
            .bind(&bucket.user_id)
            .bind(bucket.period.as_str())
            .bind(bucket.start_ms)
            .fetch_optional(self)
            .await?;
        Ok(balance(row))
    }

    async fn caps(&self, team: &str, user: &str) -> Result<Option<PeriodCaps>, StoreError> {
        type Row = (Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<i64>, Option<i64>);
        let sql = overrides_sql(!user.is_empty());
        let mut q = sqlx::query_as::<_, Row>(sqlx::AssertSqlSafe(sql)).bind(team);
        if !user.is_empty() {
            q = q.bind(user);
        }
        let row = q.fetch_optional(self).await?;
        Ok(row.map(|(t, r, c, dt, dr, dc)| PeriodCaps {
            month: caps((t, r, c)),
            day: caps((dt, dr, dc)),
        }))
    }

    async fn set_caps(
        &self,
        team: &str,
        user: &str,
        caps: PeriodCaps,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let mut q = sqlx::query(sqlx::AssertSqlSafe(upsert_sql(!user.is_empty()))).bind(team);
        if !user.is_empty() {
            q = q.bind(user);
        }
        q.bind(caps.month.tokens)
            .bind(caps.month.requests)
            .bind(caps.month.cost_micros)
            .bind(caps.day.tokens)
            .bind(caps.day.requests)
            .bind(caps.day.cost_micros)
            .bind(now_ms)
            .execute(self)
            .await?;
        Ok(())
    }

    async fn clear_caps(&self, team: &str, user: &str) -> Result<bool, StoreError> {
        let sql = format!("DELETE FROM {}", override_row(!user.is_empty()));
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(team);
        if !user.is_empty() {
            q = q.bind(user);
        }
        let n = q
            .execute(self)
            .await?
            .rows_affected();
        Ok(n > 0)
    }
});

/// Applies `ops` in one transaction, outside any writer. Test support: it
/// bypasses a running server's in-memory admission.
#[doc(hidden)]
pub async fn apply(store: &Store, ops: &[Op]) -> Result<Vec<Done>, StoreError> {
    let Store::Sqlite(pool) = store else {
        return postgres::apply(store, ops).await;
    };
    let path = pool.connect_options().get_filename().to_path_buf();
    let ops = ops.to_vec();
    tokio::task::spawn_blocking(move || {
        let mut conn = sqlite::open(&path, &crate::config::DatabaseConfig::default())?;
        sqlite::apply(&mut conn, &ops)
    })
    .await?
}

#[cfg(test)]
mod tests;
