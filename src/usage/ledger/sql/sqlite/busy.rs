//! How the ledger writer waits for SQLite's write lock held by another
//! connection. SQLite's own handler sleeps 1, 2, 5, 10 … ms between
//! attempts, while every metered call queues behind the writer; the writer
//! is a thread doing nothing else, so it asks again after 100 µs, 200 µs, …
//! up to [`POLL_MAX`], until the database's `busy_timeout` has passed.

use std::{
    cell::Cell,
    time::{Duration, Instant},
};

/// The first pause between two attempts; each next one is a step longer.
pub const POLL_STEP: Duration = Duration::from_micros(100);

/// The longest pause between two attempts.
pub const POLL_MAX: Duration = Duration::from_millis(1);

thread_local! {
    /// How long this thread's ledger connection waits for the lock.
    static LIMIT: Cell<Duration> = const { Cell::new(Duration::from_secs(5)) };
    static SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Sets how long this thread's ledger connection waits for the lock (5 s
/// until set). The handler runs on the statement's thread: call it there.
pub fn wait_at_most(limit: Duration) {
    LIMIT.set(limit);
}

/// The busy handler (`count`: earlier calls for this wait); true to try again.
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
    // On the ledger writer's own thread, never a runtime worker.
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(pause(count));
    true
}

/// The pause before attempt `count + 1`.
fn pause(count: i32) -> Duration {
    let steps = u32::try_from(count).unwrap_or(0).saturating_add(1);
    POLL_STEP.saturating_mul(steps).min(POLL_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, TransactionBehavior};

    /// At most a millisecond between attempts. The schedule is tested, not
    /// the wall clock (that would test a shared machine's scheduler).
    #[test]
    fn attempts_are_at_most_a_millisecond_apart() {
        assert_eq!(pause(0), Duration::from_micros(100));
        assert_eq!(pause(4), Duration::from_micros(500));
        for count in [9, 10, 100, i32::MAX, -1] {
            assert!(pause(count) <= POLL_MAX, "{count}");
        }
        assert_eq!(pause(-1), POLL_STEP, "an odd count starts over");
    }

    /// The writer takes a released lock, and gives up at its limit.
    #[test]
    fn the_writer_takes_the_lock_after_its_release_and_gives_up_at_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.db");
        let writer = Connection::open(&path).unwrap();
        let _: String = writer
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        writer.execute("CREATE TABLE t (x INTEGER)", []).unwrap();
        writer.busy_handler(Some(retry)).unwrap();

        // Another thread holds the lock until the writer has waited once.
        let (took_tx, took_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
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
        });
        took_rx.recv().unwrap();
        let releaser = std::thread::spawn(move || {
            // Long enough for the writer to find the lock taken.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(40));
            release_tx.send(()).unwrap();
        });
        writer.execute("INSERT INTO t VALUES (2)", []).unwrap();
        other.join().unwrap();
        releaser.join().unwrap();
        let rows: i64 = writer
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 2);

        // Held for good: the writer gives up at its limit, not the default 5 s.
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
            waited >= Duration::from_millis(50) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
    }
}
