//! The ledger's SQL: the statements both backends' batches run (`sqlite` on its own
//! connection, `postgres` through sqlx), and the reads and cap overrides on either pool.

pub mod postgres;
pub mod sqlite;

use super::{Done, LedgerRepository, Op};
use crate::{
    store::{Store, StoreError},
    usage::policy::{Balance, Caps},
};

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn LedgerRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

/// Creates a (team, month) ledger row that does not exist yet.
pub(super) const ENSURE_ROW: &str = "INSERT INTO usage_ledger (team_id, month_start_ms) VALUES ($1, $2) \
ON CONFLICT (team_id, month_start_ms) DO NOTHING";

pub(super) const TEAM_CAPS: &str =
    "SELECT max_tokens, max_requests, max_cost_micros FROM tenant_limits WHERE team_id = $1";

pub(super) const BALANCE: &str = "SELECT spent_tokens, spent_requests, spent_cost_micros, reserved_tokens, \
reserved_requests, reserved_cost_micros FROM usage_ledger WHERE team_id = $1 AND month_start_ms = $2";

/// A batch's delta: `$3..$5` the net release, `$6..$8` the charge. A release
/// stops at zero (CHECK constraints): after an earlier inconsistency the row
/// heals instead of failing every later settlement.
pub(super) const UPDATE_ROW: &str = "UPDATE usage_ledger SET \
reserved_tokens = CASE WHEN reserved_tokens > $3 THEN reserved_tokens - $3 ELSE 0 END, \
reserved_requests = CASE WHEN reserved_requests > $4 THEN reserved_requests - $4 ELSE 0 END, \
reserved_cost_micros = CASE WHEN reserved_cost_micros > $5 THEN reserved_cost_micros - $5 ELSE 0 END, \
spent_tokens = spent_tokens + $6, \
spent_requests = spent_requests + $7, spent_cost_micros = spent_cost_micros + $8 \
WHERE team_id = $1 AND month_start_ms = $2";

/// Folds one call into its stored prompt version's running means.
pub(super) const RECORD_STATS: &str = "UPDATE ai_prompts SET \
avg_latency_ms = (avg_latency_ms * usage_count + $4) / (usage_count + 1), \
success_rate = (success_rate * usage_count + $5) / (usage_count + 1), \
usage_count = usage_count + 1 \
WHERE team_id = $1 AND prompt_key = $2 AND version = $3";

pub(super) const INSERT_RESERVATION_HEAD: &str = "INSERT INTO usage_reservations (id, team_id, month_start_ms, \
input_tokens, output_tokens, requests, cost_micros, task, user_id, trace_id, channel, priority, created_at_ms)";

pub(super) const RESERVATION_COLUMNS: usize = 13;

/// [`policy::check`](crate::usage::policy::check) in SQL: reserves `($3, $4, $5)` for `($1, $2)` under its
/// `tenant_limits` row (NULL: no cap) or `($6, $7, $8)`. READ COMMITTED
/// re-checks the `WHERE` on a concurrently updated row: it holds across replicas.
pub(super) const GUARDED_RESERVE: &str = "WITH caps (t, r, c) AS (\
SELECT max_tokens, max_requests, max_cost_micros FROM tenant_limits WHERE team_id = $1 \
UNION ALL SELECT CAST($6 AS BIGINT), CAST($7 AS BIGINT), CAST($8 AS BIGINT) \
WHERE NOT EXISTS (SELECT 1 FROM tenant_limits WHERE team_id = $1)) \
UPDATE usage_ledger SET \
reserved_tokens = reserved_tokens + $3, reserved_requests = reserved_requests + $4, \
reserved_cost_micros = reserved_cost_micros + $5 \
FROM caps \
WHERE usage_ledger.team_id = $1 AND usage_ledger.month_start_ms = $2 \
AND (caps.t IS NULL OR usage_ledger.spent_tokens + usage_ledger.reserved_tokens + $3 <= caps.t) \
AND (caps.r IS NULL OR usage_ledger.spent_requests + usage_ledger.reserved_requests + $4 <= caps.r) \
AND (caps.c IS NULL OR usage_ledger.spent_cost_micros + usage_ledger.reserved_cost_micros + $5 <= caps.c)";

pub(super) type BalanceRow = (i64, i64, i64, i64, i64, i64);

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

crate::impl_for_both_pools!(LedgerRepository {
    async fn balance(&self, team: &str, month_start_ms: i64) -> Result<Balance, StoreError> {
        let row: Option<BalanceRow> = sqlx::query_as(BALANCE)
            .bind(team)
            .bind(month_start_ms)
            .fetch_optional(self)
            .await?;
        Ok(balance(row))
    }

    async fn caps(&self, team: &str) -> Result<Option<Caps>, StoreError> {
        let row: Option<(Option<i64>, Option<i64>, Option<i64>)> = sqlx::query_as(TEAM_CAPS)
            .bind(team)
            .fetch_optional(self)
            .await?;
        Ok(row.map(|(tokens, requests, cost_micros)| Caps {
            tokens,
            requests,
            cost_micros,
        }))
    }

    async fn set_caps(&self, team: &str, caps: Caps, now_ms: i64) -> Result<(), StoreError> {
        const UPSERT: &str = "INSERT INTO tenant_limits (team_id, max_tokens, max_requests, max_cost_micros, updated_at_ms) \
VALUES ($1, $2, $3, $4, $5) ON CONFLICT (team_id) DO UPDATE SET max_tokens = excluded.max_tokens, \
max_requests = excluded.max_requests, max_cost_micros = excluded.max_cost_micros, updated_at_ms = excluded.updated_at_ms";
        sqlx::query(UPSERT)
            .bind(team)
            .bind(caps.tokens)
            .bind(caps.requests)
            .bind(caps.cost_micros)
            .bind(now_ms)
            .execute(self)
            .await?;
        Ok(())
    }

    async fn clear_caps(&self, team: &str) -> Result<bool, StoreError> {
        let n = sqlx::query("DELETE FROM tenant_limits WHERE team_id = $1")
            .bind(team)
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
