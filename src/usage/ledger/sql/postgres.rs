//! The PostgreSQL ledger: multi-row statements (each a round trip); admission
//! in SQL on the locked row, as replicas share the ledger.

use super::{
    BALANCE, BalanceRow, CapsRow, ENSURE_ROW, INSERT_RESERVATION_HEAD, RECORD_STATS,
    RESERVATION_COLUMNS, UPDATE_ROW, balance, bucket_caps, caps, guarded_reserve,
};
use crate::usage::ledger::{Backend, Delta, Done, Op, Reserve, Settle, net_release, plan};
use crate::{
    audit::chain::{Head, Linked},
    store::{Store, StoreError},
    usage::{
        amount::Amount,
        bucket::Bucket,
        policy::{Balance, Caps},
        record::UsageRecord,
        sql as records,
    },
};
use sqlx::{Postgres, Transaction};
use std::{collections::HashSet, sync::OnceLock};

/// Applies `ops` in one transaction of `store`, one result per op.
pub async fn apply(store: &Store, ops: &[Op]) -> Result<Vec<Done>, StoreError> {
    let Store::Postgres(pool) = store else {
        return Err(StoreError::Unsupported(
            "the pooled ledger path is PostgreSQL's; a SQLite file has its own writer",
        ));
    };
    let mut tx = pool.begin().await?;
    let (done, _) = plan::apply(&mut Pg::new(&mut tx), ops, false).await?;
    tx.commit().await?;
    Ok(done)
}

/// Rows per statement, cut greedily: few SQL texts, all cached prepared.
const CHUNKS: [usize; 7] = [64, 32, 16, 8, 4, 2, 1];

/// `(start, len)` chunks covering `0..n`.
fn chunks(n: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for size in CHUNKS {
        while n - start >= size {
            out.push((start, size));
            start += size;
        }
    }
    out
}

/// `$first, …` for `n` parameters.
fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `head` followed by `rows` groups of `columns` placeholders.
fn values_sql(head: &str, columns: usize, rows: usize) -> String {
    let groups: Vec<String> = (0..rows)
        .map(|r| format!("({})", placeholders(r * columns + 1, columns)))
        .collect();
    format!("{head} VALUES {}", groups.join(", "))
}

/// The SQL of one statement kind for `rows` rows, built once per size.
fn cached(
    cache: &'static OnceLock<Vec<String>>,
    build: fn(usize) -> String,
    rows: usize,
) -> &'static str {
    let all = cache.get_or_init(|| CHUNKS.iter().map(|&n| build(n)).collect());
    let index = CHUNKS
        .iter()
        .position(|&n| n == rows)
        .unwrap_or(CHUNKS.len() - 1);
    all.get(index).map_or("", String::as_str)
}

fn insert_reservations_sql(rows: usize) -> &'static str {
    static CACHE: OnceLock<Vec<String>> = OnceLock::new();
    cached(
        &CACHE,
        |n| values_sql(INSERT_RESERVATION_HEAD, RESERVATION_COLUMNS, n),
        rows,
    )
}

fn insert_records_sql(rows: usize) -> &'static str {
    static CACHE: OnceLock<Vec<String>> = OnceLock::new();
    cached(
        &CACHE,
        |n| values_sql(records::INSERT_HEAD, records::COLUMNS, n),
        rows,
    )
}

fn delete_reservations_sql(rows: usize) -> &'static str {
    static CACHE: OnceLock<Vec<String>> = OnceLock::new();
    cached(
        &CACHE,
        |n| {
            format!(
                "DELETE FROM usage_reservations WHERE id IN ({}) RETURNING id",
                placeholders(1, n)
            )
        },
        rows,
    )
}

struct Pg<'t, 'c> {
    tx: &'t mut Transaction<'c, Postgres>,
    /// Rows known to exist: a refusal there is final, not a missing row.
    ensured: HashSet<Bucket>,
}

impl<'t, 'c> Pg<'t, 'c> {
    fn new(tx: &'t mut Transaction<'c, Postgres>) -> Self {
        Pg {
            tx,
            ensured: HashSet::new(),
        }
    }

    /// Creates the bucket's row unless known; true when just ensured.
    async fn ensure_row(&mut self, bucket: &Bucket) -> Result<bool, StoreError> {
        if !self.ensured.insert(bucket.clone()) {
            return Ok(false);
        }
        bind_key(sqlx::query(ENSURE_ROW), bucket)
            .execute(&mut **self.tx)
            .await?;
        Ok(true)
    }
}

/// Locks a bucket's row until commit.
const LOCK_ROW: &str = "SELECT 1 FROM usage_ledger WHERE team_id = $1 AND user_id = $2 AND period = $3 \
AND period_start_ms = $4 FOR UPDATE";

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>;

/// Binds a bucket's `$1..$4`.
fn bind_key<'q>(q: PgQuery<'q>, bucket: &'q Bucket) -> PgQuery<'q> {
    q.bind(&bucket.team_id)
        .bind(&bucket.user_id)
        .bind(bucket.period.as_str())
        .bind(bucket.start_ms)
}

impl Backend for Pg<'_, '_> {
    const ADMITS_IN_MEMORY: bool = false;

    async fn delete_reservations(&mut self, ids: &[&str]) -> Result<HashSet<String>, StoreError> {
        let mut deleted = HashSet::new();
        for (start, len) in chunks(ids.len()) {
            let mut q = sqlx::query_scalar::<_, String>(delete_reservations_sql(len));
            for id in &ids[start..start + len] {
                q = q.bind(*id);
            }
            deleted.extend(q.fetch_all(&mut **self.tx).await?);
        }
        Ok(deleted)
    }

    async fn insert_reservations(&mut self, rows: &[&Reserve]) -> Result<(), StoreError> {
        for (start, len) in chunks(rows.len()) {
            let mut q = sqlx::query(insert_reservations_sql(len));
            for r in &rows[start..start + len] {
                q = q
                    .bind(&r.id)
                    .bind(&r.team_id)
                    .bind(r.month_start_ms)
                    .bind(r.day_start_ms)
                    .bind(r.input_tokens)
                    .bind(r.output_tokens)
                    .bind(r.requests)
                    .bind(r.cost_micros)
                    .bind(&r.task)
                    .bind(&r.user_id)
                    .bind(&r.trace_id)
                    .bind(&r.channel)
                    .bind(&r.priority)
                    .bind(r.created_at_ms);
            }
            q.execute(&mut **self.tx).await?;
        }
        Ok(())
    }

    async fn insert_records(&mut self, rows: &[&UsageRecord]) -> Result<(), StoreError> {
        for (start, len) in chunks(rows.len()) {
            let mut q = sqlx::query(insert_records_sql(len));
            for r in &rows[start..start + len] {
                q = crate::bind_usage_record!(q, r);
            }
            q.execute(&mut **self.tx).await?;
        }
        Ok(())
    }

    async fn update_row(&mut self, bucket: &Bucket, d: &Delta) -> Result<(), StoreError> {
        let [rt, rr, rc] = net_release(d);
        for attempt in 0..2 {
            let updated = bind_key(sqlx::query(UPDATE_ROW), bucket)
                .bind(rt)
                .bind(rr)
                .bind(rc)
                .bind(d.charged.tokens)
                .bind(d.charged.requests)
                .bind(d.charged.cost_micros)
                .execute(&mut **self.tx)
                .await?
                .rows_affected();
            if updated > 0 {
                self.ensured.insert(bucket.clone());
                break;
            }
            if attempt > 0 || !self.ensure_row(bucket).await? {
                break;
            }
        }
        Ok(())
    }

    async fn reserve_guarded(
        &mut self,
        bucket: &Bucket,
        defaults: &Caps,
        amount: Amount,
    ) -> Result<bool, StoreError> {
        // Usually one statement; the row is created on the first miss.
        for attempt in 0..2 {
            let rows = bind_key(sqlx::query(guarded_reserve(bucket)), bucket)
                .bind(amount.tokens)
                .bind(amount.requests)
                .bind(amount.cost_micros)
                .bind(defaults.tokens)
                .bind(defaults.requests)
                .bind(defaults.cost_micros)
                .execute(&mut **self.tx)
                .await?
                .rows_affected();
            if rows == 1 {
                self.ensured.insert(bucket.clone());
                return Ok(true);
            }
            if attempt > 0 || !self.ensure_row(bucket).await? {
                return Ok(false);
            }
        }
        Ok(false)
    }

    async fn audit_head(&mut self, team: &str) -> Result<Head, StoreError> {
        use crate::audit::{chain, store::sql};
        sqlx::query(sql::ENSURE_HEAD)
            .bind(team)
            .bind(chain::GENESIS)
            .execute(&mut **self.tx)
            .await?;
        // Locked until commit: replicas append to one chain.
        let (seq, hash): (i64, String) = sqlx::query_as(sql::select_head(true))
            .bind(team)
            .fetch_one(&mut **self.tx)
            .await?;
        Ok(Head { seq, hash })
    }

    async fn insert_audit(&mut self, rows: &[Linked]) -> Result<(), StoreError> {
        for chunk in rows.chunks(32) {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(crate::audit::store::sql::insert_sql(
                chunk.len(),
            )));
            for l in chunk {
                q = crate::bind_audit_event!(q, l);
            }
            q.execute(&mut **self.tx).await?;
        }
        Ok(())
    }

    async fn write(&mut self, statements: &[crate::store::Statement]) -> Result<bool, StoreError> {
        for (i, s) in statements.iter().enumerate() {
            let q = crate::store::statement::bind_pg(sqlx::query(s.sql), &s.args);
            if q.execute(&mut **self.tx).await?.rows_affected() == 0 && i == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn set_audit_head(&mut self, team: &str, head: &Head) -> Result<(), StoreError> {
        sqlx::query(crate::audit::store::sql::UPDATE_HEAD)
            .bind(team)
            .bind(head.seq)
            .bind(&head.hash)
            .execute(&mut **self.tx)
            .await?;
        Ok(())
    }

    async fn lock_row(&mut self, bucket: &Bucket) -> Result<(), StoreError> {
        self.ensure_row(bucket).await?;
        bind_key(sqlx::query(LOCK_ROW), bucket)
            .execute(&mut **self.tx)
            .await?;
        Ok(())
    }

    async fn bucket_caps(&mut self, bucket: &Bucket) -> Result<Option<Caps>, StoreError> {
        let mut q = sqlx::query_as::<_, CapsRow>(bucket_caps(bucket)).bind(&bucket.team_id);
        if bucket.is_user() {
            q = q.bind(&bucket.user_id);
        }
        Ok(q.fetch_optional(&mut **self.tx).await?.map(caps))
    }

    async fn balance(&mut self, bucket: &Bucket) -> Result<Balance, StoreError> {
        let row: Option<BalanceRow> = sqlx::query_as(BALANCE)
            .bind(&bucket.team_id)
            .bind(&bucket.user_id)
            .bind(bucket.period.as_str())
            .bind(bucket.start_ms)
            .fetch_optional(&mut **self.tx)
            .await?;
        Ok(balance(row))
    }

    async fn fold_prompt_stats(
        &mut self,
        s: &Settle,
        owner: &str,
        success: f64,
    ) -> Result<(), StoreError> {
        sqlx::query(RECORD_STATS)
            .bind(owner)
            .bind(&s.record.prompt_key)
            .bind(s.record.prompt_version)
            .bind(s.record.latency_ms as f64)
            .bind(success)
            .execute(&mut **self.tx)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_every_row_with_few_sizes() {
        for n in 0..300 {
            let c = chunks(n);
            assert_eq!(c.iter().map(|(_, len)| len).sum::<usize>(), n);
            let mut next = 0;
            for (start, len) in c {
                assert_eq!(start, next);
                assert!(CHUNKS.contains(&len));
                next += len;
            }
        }
        assert_eq!(
            values_sql("INSERT INTO t (a, b)", 2, 2),
            "INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4)"
        );
        assert!(delete_reservations_sql(2).ends_with("IN ($1, $2) RETURNING id"));
    }
}
