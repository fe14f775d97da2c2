//! The SQLite ledger: one writer per file on its own rusqlite connection
//! ([`writer`]), not sqlx's pool, where each statement is a round trip to a
//! worker thread (docs/adr); admission in memory ([`admission`]).

pub mod admission;
pub mod busy;
mod wal;
pub mod writer;

pub use admission::Admission;

use super::{
    BALANCE, BalanceRow, ENSURE_ROW, INSERT_RESERVATION_HEAD, RECORD_STATS, UPDATE_ROW, balance,
    bucket_caps, caps, guarded_reserve,
};
use crate::usage::ledger::{Backend, Delta, Done, Op, Reserve, Rows, Settle, net_release, plan};
use crate::{
    audit::chain::{Head, Linked},
    config::DatabaseConfig,
    store::StoreError,
    usage::{
        amount::Amount,
        bucket::{Bucket, Period},
        policy::{Balance, Caps},
        record::UsageRecord,
        sql as records,
    },
};
use futures::FutureExt;
use rusqlite::{Connection, OpenFlags, OptionalExtension, ToSql, Transaction, TransactionBehavior};
use std::{collections::HashSet, ffi::CStr, path::PathBuf, str::FromStr, sync::OnceLock};

/// Names to bind `$n` by: SQLite numbers them in order of first appearance.
const NAMES: [&CStr; 21] = [
    c"$1", c"$2", c"$3", c"$4", c"$5", c"$6", c"$7", c"$8", c"$9", c"$10", c"$11", c"$12", c"$13",
    c"$14", c"$15", c"$16", c"$17", c"$18", c"$19", c"$20", c"$21",
];

/// The database file behind a `sqlite:` URL; `None` in memory.
pub fn file_of(url: &str) -> Option<PathBuf> {
    if url.contains(":memory:") || url.contains("mode=memory") {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    Some(options.get_filename().to_path_buf())
}

/// Claims the file for this process (an advisory `flock`) until dropped:
/// admission lives in one server's memory.
pub fn claim(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    let file = std::fs::OpenOptions::new().read(true).open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::InUse(path.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Io(e)),
    }
}

/// Opens the writer's connection to the migrated file, with [`busy`]'s handler.
pub fn open(path: &std::path::Path, config: &DatabaseConfig) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    busy::wait_at_most(config.busy_timeout);
    conn.busy_handler(Some(busy::retry))?;
    // WAL is set on the file by the pool; asking again is harmless.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    // Commits do not wait for the disk: the writer syncs the WAL ([`wal`]).
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Checkpoints between commits: a passive one beside a busy writer never catches up.
    conn.pragma_update(None, "wal_autocheckpoint", config.sqlite_wal_autocheckpoint)?;
    // Every SQL text the ledger uses, with room to spare.
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// Applies `ops` in one `BEGIN IMMEDIATE` transaction. Blocking.
pub fn apply(conn: &mut Connection, ops: &[Op]) -> Result<Vec<Done>, StoreError> {
    apply_reading(conn, ops).map(|(done, _)| done)
}

/// [`apply`], also returning every touched ledger row as left (for [`Admission`]).
pub fn apply_reading(conn: &mut Connection, ops: &[Op]) -> Result<(Vec<Done>, Rows), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Every statement is synchronous: the plan's future is ready when first polled.
    let applied = plan::apply(&mut Sqlite { tx: &tx }, ops, true)
        .now_or_never()
        .unwrap_or(Err(StoreError::Unsupported(
            "a SQLite ledger batch waited on something",
        )))?;
    tx.commit()?;
    Ok(applied)
}

struct Sqlite<'t, 'c> {
    tx: &'t Transaction<'c>,
}

impl Sqlite<'_, '_> {
    /// Runs a cached statement whose parameters are `$1..$n`, bound by name.
    fn execute(&self, sql: &str, args: &[&dyn ToSql]) -> rusqlite::Result<usize> {
        let mut stmt = self.tx.prepare_cached(sql)?;
        for (name, value) in NAMES.iter().zip(args) {
            stmt.raw_bind_parameter(*name, value)?;
        }
        stmt.raw_execute()
    }

    /// [`Self::execute`] for SQL whose parameters first appear in order,
    /// `$1` to `$n`, so that SQLite numbered them so: bound by index, without
    /// a search of the names per value.
    fn execute_in_order(&self, sql: &str, args: &[&dyn ToSql]) -> rusqlite::Result<usize> {
        let mut stmt = self.tx.prepare_cached(sql)?;
        for (i, value) in args.iter().enumerate() {
            stmt.raw_bind_parameter(i + 1, value)?;
        }
        stmt.raw_execute()
    }

    fn ensure_row(&self, bucket: &Bucket) -> rusqlite::Result<usize> {
        self.execute(ENSURE_ROW, &key_args(bucket))
    }
}

/// A bucket's `$1..$4`.
fn key_args(bucket: &Bucket) -> [&dyn ToSql; 4] {
    let period: &'static &'static str = match bucket.period {
        Period::Month => &"month",
        Period::Day => &"day",
    };
    [&bucket.team_id, &bucket.user_id, period, &bucket.start_ms]
}

/// `INSERT INTO usage_reservations ... VALUES ($1, ..., $13)`.
fn insert_reservation_sql() -> &'static str {
    static SQL: OnceLock<String> = OnceLock::new();
    SQL.get_or_init(|| {
        let cells: Vec<String> = (1..=super::RESERVATION_COLUMNS)
            .map(|i| format!("${i}"))
            .collect();
        format!("{INSERT_RESERVATION_HEAD} VALUES ({})", cells.join(", "))
    })
}

impl Backend for Sqlite<'_, '_> {
    const ADMITS_IN_MEMORY: bool = true;

    async fn delete_reservations(&mut self, ids: &[&str]) -> Result<HashSet<String>, StoreError> {
        let mut deleted = HashSet::new();
        for id in ids {
            if self.execute("DELETE FROM usage_reservations WHERE id = $1", &[id])? == 1 {
                deleted.insert((*id).to_owned());
            }
        }
        Ok(deleted)
    }

    async fn insert_reservations(&mut self, rows: &[&Reserve]) -> Result<(), StoreError> {
        for r in rows {
            self.execute(
                insert_reservation_sql(),
                &[
                    &r.id,
                    &r.team_id,
                    &r.month_start_ms,
                    &r.day_start_ms,
                    &r.input_tokens,
                    &r.output_tokens,
                    &r.requests,
                    &r.cost_micros,
                    &r.task,
                    &r.user_id,
                    &r.trace_id,
                    &r.channel,
                    &r.priority,
                    &r.created_at_ms,
                ],
            )?;
        }
        Ok(())
    }

    async fn insert_records(&mut self, rows: &[&UsageRecord]) -> Result<(), StoreError> {
        for r in rows {
            self.execute(
                records::INSERT,
                &[
                    &r.created_at_ms,
                    &r.team_id,
                    &r.user_id,
                    &r.task,
                    &r.provider,
                    &r.model,
                    &r.prompt_key,
                    &r.prompt_version,
                    &r.trace_id,
                    &r.input_tokens,
                    &r.output_tokens,
                    &r.cost_micros,
                    &r.latency_ms,
                    &r.outcome,
                    &r.attempts,
                    &i64::from(r.degraded),
                    &r.channel,
                    &r.priority,
                    &r.conversation_id,
                    &r.iteration,
                ],
            )?;
        }
        Ok(())
    }

    async fn update_row(&mut self, bucket: &Bucket, d: &Delta) -> Result<(), StoreError> {
        let [rt, rr, rc] = net_release(d);
        let [team, user, period, start] = key_args(bucket);
        let args: [&dyn ToSql; 10] = [
            team,
            user,
            period,
            start,
            &rt,
            &rr,
            &rc,
            &d.charged.tokens,
            &d.charged.requests,
            &d.charged.cost_micros,
        ];
        if self.execute(UPDATE_ROW, &args)? == 0 {
            self.ensure_row(bucket)?;
            self.execute(UPDATE_ROW, &args)?;
        }
        Ok(())
    }

    async fn reserve_guarded(
        &mut self,
        bucket: &Bucket,
        defaults: &Caps,
        amount: Amount,
    ) -> Result<bool, StoreError> {
        let [team, user, period, start] = key_args(bucket);
        let args: [&dyn ToSql; 10] = [
            team,
            user,
            period,
            start,
            &amount.tokens,
            &amount.requests,
            &amount.cost_micros,
            &defaults.tokens,
            &defaults.requests,
            &defaults.cost_micros,
        ];
        let sql = guarded_reserve(bucket);
        if self.execute(sql, &args)? == 1 {
            return Ok(true);
        }
        // The row may not exist yet: create it and ask once more.
        if self.ensure_row(bucket)? == 1 {
            return Ok(self.execute(sql, &args)? == 1);
        }
        Ok(false)
    }

    async fn lock_row(&mut self, _: &Bucket) -> Result<(), StoreError> {
        // BEGIN IMMEDIATE holds the database's one write lock.
        Ok(())
    }

    async fn bucket_caps(&mut self, bucket: &Bucket) -> Result<Option<Caps>, StoreError> {
        let mut stmt = self.tx.prepare_cached(bucket_caps(bucket))?;
        let mut args: Vec<&dyn ToSql> = vec![&bucket.team_id];
        if bucket.is_user() {
            args.push(&bucket.user_id);
        }
        Ok(stmt
            .query_row(args.as_slice(), |row| {
                Ok(caps((row.get(0)?, row.get(1)?, row.get(2)?)))
            })
            .optional()?)
    }

    async fn audit_head(&mut self, team: &str) -> Result<Head, StoreError> {
        use crate::audit::{chain, store::sql};
        // IMMEDIATE holds the write lock: nobody else appends meanwhile.
        self.execute(sql::ENSURE_HEAD, &[&team, &chain::GENESIS])?;
        let (seq, hash) = self
            .tx
            .prepare_cached(sql::select_head(false))?
            .query_row(rusqlite::params![team], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?;
        Ok(Head { seq, hash })
    }

    async fn insert_audit(&mut self, rows: &[Linked]) -> Result<(), StoreError> {
        let sql = crate::audit::store::sql::insert_one_sql();
        for l in rows {
            let e = &l.event;
            // Built by `insert_sql`: $1 to $21 in order.
            self.execute_in_order(
                sql,
                &[
                    &e.id,
                    &e.team_id,
                    &l.seq,
                    &e.at_ms,
                    &e.trace_id,
                    &e.principal,
                    &e.category.as_str(),
                    &e.action,
                    &e.subject,
                    &e.decision,
                    &e.reason,
                    &e.input_sha256,
                    &e.output_sha256,
                    &e.input_bytes,
                    &e.output_bytes,
                    &e.duration_ms,
                    &e.estimated_cost_micros,
                    &e.actual_cost_micros,
                    &e.idempotency_key,
                    &l.prev_hash,
                    &l.hash,
                ],
            )?;
        }
        Ok(())
    }

    async fn write(&mut self, statements: &[crate::store::Statement]) -> Result<bool, StoreError> {
        for (i, s) in statements.iter().enumerate() {
            if s.args.len() > NAMES.len() {
                return Err(StoreError::Unsupported(
                    "a ledger write's statement has more arguments than $1..$21",
                ));
            }
            let args: Vec<&dyn ToSql> = s.args.iter().map(|a| a as &dyn ToSql).collect();
            if self.execute(s.sql, &args)? == 0 && i == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    async fn set_audit_head(&mut self, team: &str, head: &Head) -> Result<(), StoreError> {
        self.execute(
            crate::audit::store::sql::UPDATE_HEAD,
            &[&team, &head.seq, &head.hash],
        )?;
        Ok(())
    }

    async fn balance(&mut self, bucket: &Bucket) -> Result<Balance, StoreError> {
        let row: Option<BalanceRow> = self
            .tx
            .prepare_cached(BALANCE)?
            .query_row(key_args(bucket).as_slice(), |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                ))
            })
            .optional()?;
        Ok(balance(row))
    }

    async fn fold_prompt_stats(
        &mut self,
        s: &Settle,
        owner: &str,
        success: f64,
    ) -> Result<(), StoreError> {
        self.execute(
            RECORD_STATS,
            &[
                &owner,
                &s.record.prompt_key,
                &s.record.prompt_version,
                &(s.record.latency_ms as f64),
                &success,
            ],
        )?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use crate::audit::store::sql::{COLUMN_COUNT, insert_one_sql};

    /// `insert_audit` binds by index, so the audit insert's `$n` must be SQLite's parameter n.
    #[test]
    fn the_audit_insert_numbers_its_parameters_in_order() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(include_str!(
            "../../../../../migrations/sqlite/0008_audit.sql"
        ))
        .unwrap();
        let stmt = conn.prepare(insert_one_sql()).unwrap();
        assert_eq!(stmt.parameter_count(), COLUMN_COUNT);
        for i in 1..=COLUMN_COUNT {
            assert_eq!(stmt.parameter_name(i), Some(format!("${i}").as_str()));
        }
    }
}
