//! The audit tables' SQL, valid on both backends; the ledgers (group commit) and the prompt
//! store (its own transactions) append with the statements and macros here too.

use super::{AuditRepository, Filter};
use crate::{
    audit::{AuditEvent, Category, chain::Linked},
    store::{Backend as _, Store, StoreError},
};

/// The repository over `store`'s pool.
pub(super) fn repository(store: &Store) -> &(dyn AuditRepository + 'static) {
    crate::on_store!(store, |pool| pool)
}

/// The stored columns, in the order of [`insert_sql`]'s values and of `SELECT`.
pub const COLUMNS: &str = "id, team_id, seq, at_ms, trace_id, principal, category, action, \
     subject, decision, reason, input_sha256, output_sha256, input_bytes, output_bytes, \
     duration_ms, estimated_cost_micros, actual_cost_micros, idempotency_key, prev_hash, hash";

/// Number of [`COLUMNS`].
pub const COLUMN_COUNT: usize = 21;

/// Creates a team's head row at the start of its chain, when missing.
pub const ENSURE_HEAD: &str = "INSERT INTO audit_heads (team_id, seq, hash) VALUES ($1, 0, $2) \
     ON CONFLICT (team_id) DO NOTHING";

const SELECT_HEAD: &str = "SELECT seq, hash FROM audit_heads WHERE team_id = $1";

/// Moves a team's head.
pub const UPDATE_HEAD: &str = "UPDATE audit_heads SET seq = $2, hash = $3 WHERE team_id = $1";

/// PostgreSQL locks the head row; on SQLite, [`ENSURE_HEAD`]'s write lock already serializes.
pub fn select_head(postgres: bool) -> &'static str {
    if postgres {
        "SELECT seq, hash FROM audit_heads WHERE team_id = $1 FOR UPDATE"
    } else {
        SELECT_HEAD
    }
}

/// [`insert_sql`] of one event, built once: the SQLite ledger writer inserts
/// every audited call's event with it, on its one thread.
pub fn insert_one_sql() -> &'static str {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| insert_sql(1));
    &SQL
}

/// `INSERT INTO audit_events (...) VALUES (...), ...` for `rows` events.
pub fn insert_sql(rows: usize) -> String {
    let mut sql = format!("INSERT INTO audit_events ({COLUMNS}) VALUES ");
    for r in 0..rows {
        if r > 0 {
            sql.push_str(", ");
        }
        let first = r * COLUMN_COUNT + 1;
        let params: Vec<String> = (first..first + COLUMN_COUNT)
            .map(|i| format!("${i}"))
            .collect();
        sql.push('(');
        sql.push_str(&params.join(", "));
        sql.push(')');
    }
    sql
}

/// Binds one linked event's values, in [`COLUMNS`] order, to a sqlx query.
#[macro_export]
macro_rules! bind_audit_event {
    ($q:expr, $l:expr) => {{
        let l = $l;
        let e = &l.event;
        $q.bind(&e.id)
            .bind(&e.team_id)
            .bind(l.seq)
            .bind(e.at_ms)
            .bind(&e.trace_id)
            .bind(&e.principal)
            .bind(e.category.as_str())
            .bind(&e.action)
            .bind(&e.subject)
            .bind(&e.decision)
            .bind(&e.reason)
            .bind(&e.input_sha256)
            .bind(&e.output_sha256)
            .bind(e.input_bytes)
            .bind(e.output_bytes)
            .bind(e.duration_ms)
            .bind(e.estimated_cost_micros)
            .bind(e.actual_cost_micros)
            .bind(&e.idempotency_key)
            .bind(&l.prev_hash)
            .bind(&l.hash)
    }};
}

/// Appends `$events` in `$tx`, the caller's transaction, so a change and its event commit together.
#[macro_export]
macro_rules! append_audit_events {
    ($tx:expr, $postgres:expr, $events:expr) => {{
        use $crate::audit::{chain, store};
        async {
            for (team, events) in store::by_team($events) {
                sqlx::query(store::sql::ENSURE_HEAD)
                    .bind(&team)
                    .bind(chain::GENESIS)
                    .execute(&mut *$tx)
                    .await?;
                let (seq, hash): (i64, String) = sqlx::query_as(store::sql::select_head($postgres))
                    .bind(&team)
                    .fetch_one(&mut *$tx)
                    .await?;
                let (linked, head) = chain::link(&chain::Head { seq, hash }, events);
                for chunk in linked.chunks(32) {
                    let mut q =
                        sqlx::query(sqlx::AssertSqlSafe(store::sql::insert_sql(chunk.len())));
                    for l in chunk {
                        q = $crate::bind_audit_event!(q, l);
                    }
                    q.execute(&mut *$tx).await?;
                }
                sqlx::query(store::sql::UPDATE_HEAD)
                    .bind(&team)
                    .bind(head.seq)
                    .bind(&head.hash)
                    .execute(&mut *$tx)
                    .await?;
            }
            Ok::<(), sqlx::Error>(())
        }
        .await
    }};
}

const SELECT: &str = "SELECT id, team_id, seq, at_ms, trace_id, principal, category, action, \
     subject, decision, reason, input_sha256, output_sha256, input_bytes, output_bytes, \
     duration_ms, estimated_cost_micros, actual_cost_micros, idempotency_key, prev_hash, hash \
     FROM audit_events";

fn decode<R: sqlx::Row>(row: &R) -> Result<Linked, sqlx::Error>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database>,
    for<'r> Option<i64>: sqlx::Decode<'r, R::Database>,
{
    let category: String = row.try_get(6)?;
    Ok(Linked {
        event: AuditEvent {
            id: row.try_get(0)?,
            team_id: row.try_get(1)?,
            at_ms: row.try_get(3)?,
            trace_id: row.try_get(4)?,
            principal: row.try_get(5)?,
            // An unknown category is tampering, which the hash check reports.
            category: Category::parse(&category).unwrap_or(Category::Admin),
            action: row.try_get(7)?,
            subject: row.try_get(8)?,
            decision: row.try_get(9)?,
            reason: row.try_get(10)?,
            input_sha256: row.try_get(11)?,
            output_sha256: row.try_get(12)?,
            input_bytes: row.try_get(13)?,
            output_bytes: row.try_get(14)?,
            duration_ms: row.try_get(15)?,
            estimated_cost_micros: row.try_get(16)?,
            actual_cost_micros: row.try_get(17)?,
            idempotency_key: row.try_get(18)?,
        },
        seq: row.try_get(2)?,
        prev_hash: row.try_get(19)?,
        hash: row.try_get(20)?,
    })
}

crate::impl_for_both_pools!(AuditRepository {
    async fn append(&self, events: Vec<AuditEvent>) -> Result<(), StoreError> {
        let mut tx = self.begin().await?;
        crate::append_audit_events!(tx, Self::POSTGRES, events)?;
        tx.commit().await?;
        Ok(())
    }

    async fn list(&self, filter: &Filter) -> Result<Vec<Linked>, StoreError> {
        // Only the conditions asked for: without a time range the team's
        // chain index serves `ORDER BY seq` as is, where a time condition
        // would have the planner sort the whole team's events for a page.
        let timed = filter.since_ms.is_some() || filter.until_ms.is_some();
        let trace = filter.trace_id.as_deref().filter(|t| !t.is_empty());
        let mut sql = format!("{SELECT} WHERE team_id = $1 AND seq > $2");
        let mut next = 3;
        if timed {
            sql.push_str(" AND at_ms >= $3 AND at_ms < $4");
            next = 5;
        }
        if trace.is_some() {
            sql.push_str(&format!(" AND trace_id = ${next}"));
            next += 1;
        }
        sql.push_str(&format!(" ORDER BY seq LIMIT ${next}"));
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&filter.team_id)
            .bind(filter.after_seq);
        if timed {
            query = query
                .bind(filter.since_ms.unwrap_or(i64::MIN))
                .bind(filter.until_ms.unwrap_or(i64::MAX));
        }
        if let Some(trace) = trace {
            query = query.bind(trace.to_owned());
        }
        let rows = query.bind(filter.limit.max(1)).fetch_all(self).await?;
        Ok(rows
            .iter()
            .map(decode)
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    async fn teams(&self) -> Result<Vec<String>, StoreError> {
        let teams: Vec<String> = sqlx::query_scalar(
            "SELECT team_id FROM audit_heads UNION SELECT team_id FROM audit_events ORDER BY 1",
        )
        .fetch_all(self)
        .await?;
        Ok(teams)
    }

    async fn head(&self, team: &str) -> Result<Option<(i64, String)>, StoreError> {
        let head: Option<(i64, String)> = sqlx::query_as(SELECT_HEAD)
            .bind(team)
            .fetch_optional(self)
            .await?;
        Ok(head)
    }
});
