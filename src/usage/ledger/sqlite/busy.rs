//! How the ledger writer waits for SQLite's write lock when another
//! connection holds it (the pool's transactions: conversations, tool
//! invocations, prompts, keys).
//!
//! SQLite's own busy handler (`busy_timeout`) sleeps 1, 2, 5, 10, 15, 20,
//! 25 ms … between attempts: a lock held for one 1 ms commit costs the
//! writer up to 3 ms, and one held a little longer under load 33, 53 or 78
//! ms, while every metered call of every team queues behind the writer.
//! The writer is one thread doing nothing else, so it asks again after
//! 100 µs, then 200 µs, … up to every [`POLL_MAX`], until the database's
//! `busy_timeout` has passed: the lock is taken within a fraction of a
//! millisecond of a usual commit's release, for a few attempts (each a
//! failed lock, microseconds of CPU).

use std::{
    cell::Cell,
    time::{Duration, Instant},
};

/// The first pause between two attempts at the lock; each next pause is
/// one step longer.
pub const POLL_STEP: Duration = Duration::from_micros(100);

/// The longest pause between two attempts.
pub const POLL_MAX: Duration = Duration::from_millis(1);

thread_local! {
    /// How long this thread's ledger connection waits for the lock.
    static LIMIT: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
    /// When the current wait began.
    static SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Sets how long the ledger connection used on this thread waits for the
/// lock before its statement fails with "database is locked" (the
/// database's `busy_timeout`; 5 s until set). The busy handler runs on the
/// thread that runs the statement: call it on the writer's thread.
pub fn wait_at_most(limit: Duration) {
    LIMIT.set(limit);
}

/// The busy handler: `count` is SQLite's number of earlier calls for this
/// wait. True to try again.
pub fn retry(count: i32) -> bool {
    let now = Instant::now();
    let since = match SINCE.get() {
        Some(since) if count > 0 => since,
        _ => {
            SINCE.set(Some(now));
            now
        }
    };
    if now.duration_since(since) >= LIMIT.get() {
        return false;
    }
    let steps = u32::try_from(count).unwrap_or(0).saturating_add(1);
    // SQLite calls it on the thread running the statement: the ledger
    // writer's own thread, never a runtime worker.
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(POLL_STEP.saturating_mul(steps).min(POLL_MAX));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, TransactionBehavior};

    /// The writer gets the lock within a few polls of its release, not
    /// after SQLite's next back-off step; and gives up at its limit.
    #[test]
    fn the_writer_takes_the_lock_soon_after_its_release_and_gives_up_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.db");
        let writer = Connection::open(&path).unwrap();
        let _: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        writer.execute("CREATE TABLE t (x INTEGER)", []).unwrap();
        writer.busy_handler(Some(retry)).unwrap();

        // Another connection, on another thread, holds the lock for 40 ms:
        // SQLite's back-off would have the writer asleep from 33 to 53 ms.
        let (held, release) = (
            std::sync::mpsc::channel::<()>(),
            std::sync::mpsc::channel::<()>(),
        );
        let (took_tx, took_rx) = held;
        let (release_tx, release_rx) = release;
        let other_path = path.clone();
        let other = std::thread::spawn(move || {
            let mut conn = Connection::open(&other_path).unwrap();
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .unwrap();
            tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
            took_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            tx.commit().unwrap();
            Instant::now()
        });
        took_rx.recv().unwrap();
        let releaser = std::thread::spawn(move || {
            // How long the lock is held is what is tested, on a plain thread.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(40));
            release_tx.send(()).unwrap();
        });
        writer.execute("INSERT INTO t VALUES (2)", []).unwrap();
        let got = Instant::now();
        let released = other.join().unwrap();
        releaser.join().unwrap();
        let after = got.saturating_duration_since(released);
        assert!(
            after < Duration::from_millis(8),
            "took the lock {after:?} after its release"
        );

        // Held for good: the writer gives up at its limit.
        wait_at_most(Duration::from_millis(50));
        let mut holder = Connection::open(&path).unwrap();
        let tx = holder
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let started = Instant::now();
        let err = writer.execute("INSERT INTO t VALUES (3)", []).unwrap_err();
        let waited = started.elapsed();
        drop(tx);
        assert_eq!(
            err.sqlite_error_code(),
            Some(rusqlite::ErrorCode::DatabaseBusy),
            "{err}"
        );
        assert!(
            waited >= Duration::from_millis(50) && waited < Duration::from_millis(500),
            "{waited:?}"
        );
    }
}
