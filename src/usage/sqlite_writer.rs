//! The SQLite ledger writer's own connection: a batch applied on one
//! thread, statement after statement, with no hop between threads.
//!
//! Why not sqlx here: sqlx drives SQLite from a worker thread per
//! connection, so every statement of a batch is a round trip between that
//! thread and the runtime (two context switches). The ledger runs ~6–20
//! statements per group commit and every metered call waited for two group
//! commits; the benchmark's profile had `finish_task_switch` as its largest
//! symbol. A synchronous connection (rusqlite, on the same linked SQLite as
//! sqlx) runs the whole batch on the writer's own thread
//! ([`super::sqlite_thread`]): no hand-off per statement. Everything else (reads, the sweeper,
//! prompts, limits) stays on the sqlx pool; WAL and the busy timeout order
//! the writers, as between any two pooled connections.
//!
//! The SQL and the admission rules are the ones of [`super::batch`] (the
//! same constants and helpers); only the driver differs, and the ledger's
//! tests run against both paths (SQLite files here, PostgreSQL there).

use super::{
    admission::Rows,
    batch::{self, Params},
    ledger::{
        BALANCE, BalanceRow, CHARGE_AND_RELEASE, Caps, Done, ENSURE_ROW, GUARDED_RESERVE, Op,
        Reserve, TEAM_CAPS, balance, refusal,
    },
    record::{self, UsageRecord},
};
use crate::{config::DatabaseConfig, store::StoreError};
use rusqlite::{
    CachedStatement, Connection, OpenFlags, OptionalExtension, ToSql, Transaction,
    TransactionBehavior,
};
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    ffi::CStr,
    path::PathBuf,
    str::FromStr,
};

/// Parameter names `$1`..`$18`, for binding by name: the shared SQL numbers
/// its parameters, and SQLite indexes them in order of first appearance,
/// which is not their number in `GUARDED_RESERVE` or `CHARGE_AND_RELEASE`.
const NAMES: [&CStr; 18] = [
    c"$1", c"$2", c"$3", c"$4", c"$5", c"$6", c"$7", c"$8", c"$9", c"$10", c"$11", c"$12", c"$13",
    c"$14", c"$15", c"$16", c"$17", c"$18",
];

/// The database file behind a `sqlite:` URL, or `None` when the database
/// lives only in memory (a second connection would open another database;
/// such stores keep the sqlx writer).
pub fn file_of(url: &str) -> Option<PathBuf> {
    if url.contains(":memory:") || url.contains("mode=memory") {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
    Some(options.get_filename().to_path_buf())
}

/// Claims the database file for this server process until the returned
/// handle is dropped (an advisory `flock`, released by the kernel if the
/// process dies; SQLite's own locks are `fcntl` ones and unaffected).
///
/// A SQLite file belongs to one server: admission is decided in its memory
/// ([`super::admission`]) and its start-up sweep charges every open
/// reservation as orphaned. The `limits` CLI and other readers do not
/// claim it.
pub fn claim(path: &std::path::Path) -> Result<std::fs::File, StoreError> {
    let file = std::fs::OpenOptions::new().read(true).open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::InUse(path.to_path_buf())),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Io(e)),
    }
}

/// Opens the writer's connection to the (already created and migrated)
/// file: the pool's busy timeout and foreign keys; commits that do not wait
/// for the disk (the writer syncs the WAL itself, see `super::wal_sync`).
pub fn open(path: &std::path::Path, config: &DatabaseConfig) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(config.busy_timeout)?;
    // WAL is a property of the file (set by the pool on creation); asking
    // again is harmless and makes this connection's view explicit.
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    // Commits do not wait for the disk: with `sqlite_synchronous = "full"`
    // the writer syncs the WAL right after each commit, before it answers
    // the settlements (`super::wal_sync`); with "normal" checkpoints do.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // SQLite's automatic checkpoint stays on this connection, between
    // commits: a passive checkpoint beside a busy writer never catches up,
    // and the WAL grew without bound. Its threshold is configurable: the
    // default 1,000 frames stalled the writer often enough to show in the
    // metered p99.
    conn.pragma_update(None, "wal_autocheckpoint", config.sqlite_wal_autocheckpoint)?;
    // Every SQL text the ledger uses, with room to spare.
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// Runs a cached statement whose parameters are `$1..$n`, bound by name.
fn execute(tx: &Transaction<'_>, sql: &str, args: &[&dyn ToSql]) -> rusqlite::Result<usize> {
    let mut stmt = tx.prepare_cached(sql)?;
    bind(&mut stmt, args)?;
    stmt.raw_execute()
}

fn bind(stmt: &mut CachedStatement<'_>, args: &[&dyn ToSql]) -> rusqlite::Result<()> {
    for (name, value) in NAMES.iter().zip(args) {
        stmt.raw_bind_parameter(*name, value)?;
    }
    Ok(())
}

/// The guarded reservation of [`GUARDED_RESERVE`], creating the ledger row
/// on the first miss: true when admitted.
fn guarded(
    tx: &Transaction<'_>,
    team: &str,
    month: i64,
    defaults: &Caps,
    ensured: &mut bool,
    (tokens, requests, cost): (i64, i64, i64),
) -> rusqlite::Result<bool> {
    loop {
        let rows = execute(
            tx,
            GUARDED_RESERVE,
            &[
                &team,
                &month,
                &tokens,
                &requests,
                &cost,
                &defaults.tokens,
                &defaults.requests,
                &defaults.cost_micros,
            ],
        )?;
        if rows == 1 || *ensured {
            return Ok(rows == 1);
        }
        execute(tx, ENSURE_ROW, &[&team, &month])?;
        *ensured = true;
    }
}

/// [`CHARGE_AND_RELEASE`] on a (team, month), creating its ledger row on
/// the first miss.
fn charge_and_release(
    tx: &Transaction<'_>,
    team: &str,
    month: i64,
    released: [i64; 3],
    charged: [i64; 3],
) -> rusqlite::Result<()> {
    let args: [&dyn ToSql; 8] = [
        &team,
        &month,
        &released[0],
        &released[1],
        &released[2],
        &charged[0],
        &charged[1],
        &charged[2],
    ];
    if execute(tx, CHARGE_AND_RELEASE, &args)? == 0 {
        execute(tx, ENSURE_ROW, &[&team, &month])?;
        execute(tx, CHARGE_AND_RELEASE, &args)?;
    }
    Ok(())
}

fn insert_record(tx: &Transaction<'_>, r: &UsageRecord) -> rusqlite::Result<usize> {
    execute(
        tx,
        record::INSERT,
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
        ],
    )
}

fn insert_reservation(tx: &Transaction<'_>, r: &Reserve) -> rusqlite::Result<usize> {
    execute(
        tx,
        batch::insert_reservations(1, Params::Numbered),
        &[
            &r.id,
            &r.team_id,
            &r.month_start_ms,
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
    )
}

/// Applies `ops` in one `BEGIN IMMEDIATE` transaction and returns one result
/// per op, in order: the semantics of [`super::batch::apply`] (settlements
/// first, then reservations, a team's group admitted together when it fits,
/// else one by one). Blocking: call it from the writer's thread (or a
/// blocking task).
pub fn apply(conn: &mut Connection, ops: &[Op]) -> rusqlite::Result<Vec<Done>> {
    apply_reading(conn, ops).map(|(done, _)| done)
}

/// [`apply`], also returning the ledger row of every (team, month) the
/// batch touched, as its transaction left them (for
/// [`super::admission::Admission::committed`]).
///
/// Reservations already admitted in memory (`Reserve::admitted`) are
/// recorded first, without the guard: their calls are running, and may be
/// settling in this very batch, whose settlements must find them. One that
/// does settle in this batch (a short call, whose reservation lingered for
/// its settlement: [`super::sqlite_thread::LINGER`]) is never written at
/// all: its row would be inserted and deleted in the same transaction, and
/// its estimate reserved and released on the same ledger row. The ledger
/// ends where it would have, with three statements and one B-tree page
/// fewer per call.
pub fn apply_reading(conn: &mut Connection, ops: &[Op]) -> rusqlite::Result<(Vec<Done>, Rows)> {
    let settles = batch::settles_of(ops);
    let mut groups = batch::reserve_groups(ops);
    let mut done: Vec<Done> = vec![Done::Settled; ops.len()];
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;

    let settling: HashSet<&str> = settles
        .iter()
        .flat_map(|s| s.reservations.iter().map(|(id, ..)| id.as_str()))
        .collect();
    // Reserved in this batch, per (team, month): applied together with the
    // settlements' releases and charges, one UPDATE per ledger row.
    let mut reserved: BTreeMap<(&str, i64), [i64; 3]> = BTreeMap::new();
    // Settled in this batch before ever being written: released as if
    // deleted.
    let mut deleted = HashSet::new();
    for group in &mut groups {
        let (admitted, guarded): (Vec<_>, Vec<_>) = group.iter().partition(|(_, r)| r.admitted);
        *group = guarded;
        let Some((_, first)) = admitted.first() else {
            continue;
        };
        for (i, r) in &admitted {
            if settling.contains(r.id.as_str()) {
                deleted.insert(r.id.clone());
            } else {
                insert_reservation(&tx, r)?;
            }
            done[*i] = Done::Admitted;
        }
        // A group is one (team, month); two groups of it differ only in
        // their default caps.
        let (tokens, requests, cost) = batch::sum(&admitted);
        let amount = reserved
            .entry((first.team_id.as_str(), first.month_start_ms))
            .or_default();
        for (total, added) in amount.iter_mut().zip([tokens, requests, cost]) {
            *total = total.saturating_add(added);
        }
    }

    for s in &settles {
        for (id, ..) in &s.reservations {
            if !deleted.contains(id)
                && execute(&tx, "DELETE FROM usage_reservations WHERE id = $1", &[id])? == 1
            {
                deleted.insert(id.clone());
            }
        }
    }
    let mut deltas = batch::settle_deltas(&settles, &deleted);
    for (key, amount) in reserved {
        // Releasing a negative amount reserves it.
        let released = &mut deltas.entry(key).or_default().released;
        for (released, reserved) in released.iter_mut().zip(amount) {
            *released = released.saturating_sub(reserved);
        }
    }
    for ((team, month), d) in deltas {
        if d != batch::Delta::default() {
            charge_and_release(&tx, team, month, d.released, d.charged)?;
        }
    }
    for s in &settles {
        insert_record(&tx, &s.record)?;
        let Some((owner, success)) = s.prompt_stats() else {
            continue;
        };
        execute(
            &tx,
            super::ledger::RECORD_STATS,
            &[
                &owner,
                &s.record.prompt_key,
                &s.record.prompt_version,
                &(s.record.latency_ms as f64),
                &success,
            ],
        )?;
    }

    for group in &groups {
        let Some((_, first)) = group.first() else {
            continue;
        };
        let (team, month) = (first.team_id.as_str(), first.month_start_ms);
        let defaults = first.default_caps;
        let mut ensured = false;
        if guarded(&tx, team, month, &defaults, &mut ensured, batch::sum(group))? {
            for (i, r) in group {
                insert_reservation(&tx, r)?;
                done[*i] = Done::Admitted;
            }
            continue;
        }
        let caps = tx
            .prepare_cached(TEAM_CAPS)?
            .query_row([team], |row| {
                Ok(Caps {
                    tokens: row.get(0)?,
                    requests: row.get(1)?,
                    cost_micros: row.get(2)?,
                })
            })
            .optional()?
            .unwrap_or(defaults);
        for (i, r) in group {
            let one = r.amount();
            // A lone reservation was just refused; do not ask twice.
            let fits = group.len() > 1 && guarded(&tx, team, month, &defaults, &mut ensured, one)?;
            if fits {
                insert_reservation(&tx, r)?;
                done[*i] = Done::Admitted;
                continue;
            }
            let row: Option<BalanceRow> = tx
                .prepare_cached(BALANCE)?
                .query_row(rusqlite::params![team, month], balance_row)
                .optional()?;
            // One writer: this is the balance the guarded UPDATE just
            // refused against (the pooled path re-asks under PostgreSQL's
            // READ COMMITTED; here there is nothing newer to see).
            done[*i] = Done::Refused(refusal(&balance(row), &caps, r));
        }
    }

    let keys: BTreeSet<(&str, i64)> = ops
        .iter()
        .map(|op| match op {
            Op::Reserve(r) => (r.team_id.as_str(), r.month_start_ms),
            Op::Settle(s) => (s.record.team_id.as_str(), s.month_start_ms),
        })
        .collect();
    let mut rows = Vec::with_capacity(keys.len());
    for (team, month) in keys {
        let row: Option<BalanceRow> = tx
            .prepare_cached(BALANCE)?
            .query_row(rusqlite::params![team, month], balance_row)
            .optional()?;
        rows.push(((team.to_owned(), month), balance(row)));
    }
    tx.commit()?;
    Ok((done, rows))
}

fn balance_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<BalanceRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}
