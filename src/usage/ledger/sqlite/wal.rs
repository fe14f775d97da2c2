//! Durability of the SQLite ledger, one step after its commit: the writer
//! commits with `synchronous = NORMAL` (the WAL is written, not synced),
//! then, when the batch holds settlements, syncs the WAL (`fdatasync`) and
//! only then answers them. Commits nobody waits for are synced by a thread
//! beside the writer within [`BACKGROUND_EVERY`] ([`Background`]).
//!
//! Why: with `synchronous = FULL` every commit waited for its fsync before
//! anyone heard back, so a metered call waited for two fsyncs in a row (its
//! reservation's, then its record's), and on a disk whose fsync has a long
//! tail under load both showed in the call's latency. A reservation is
//! admitted in memory and nobody waits for its commit; a settlement is
//! still answered only once its usage record is on disk (SPEC §5: no
//! acknowledged call goes unrecorded). The WAL is written in order, so that
//! sync also covers every earlier commit, the call's reservation included,
//! and the writer syncs before it starts the next batch.
//!
//! What this trades (docs/metering.md): a reservation reaches the disk with
//! the next settlement's sync or the background thread's, at most
//! [`BACKGROUND_EVERY`] after its commit, while its provider call runs. A
//! process crash after the commit loses nothing (the WAL is in the OS's
//! page cache); a power loss in that window loses the reservation of a call
//! that was never acknowledged, whose provider cost is then not recorded.
//!
//! It must never let a settlement be answered before a sync that started
//! after its commit has finished.

use std::{
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

/// The WAL file of the ledger database, opened on first use.
#[derive(Debug)]
pub struct Wal {
    path: PathBuf,
    file: Option<File>,
    /// Syncs that succeeded (ops and tests read it).
    synced: Arc<AtomicU64>,
}

impl Wal {
    /// The WAL of the SQLite database file at `db` (SQLite names it
    /// `<db>-wal`).
    pub fn of(db: &Path) -> Self {
        let mut path = db.as_os_str().to_owned();
        path.push("-wal");
        Self {
            path: PathBuf::from(path),
            file: None,
            synced: Arc::default(),
        }
    }

    /// `fdatasync` of the file now at the WAL's path: every commit made
    /// before this call is durable when it returns `Ok`. SQLite keeps one
    /// WAL file for as long as a connection is open (the writer's always
    /// is) and rewrites it in place; comparing inodes is a cheap guard
    /// against ever syncing a file that is no longer the WAL.
    pub fn sync(&mut self) -> std::io::Result<()> {
        let current = std::fs::metadata(&self.path)?.ino();
        let file = match self.file.take() {
            Some(f) if f.metadata()?.ino() == current => f,
            _ => File::open(&self.path)?,
        };
        let result = file.sync_data();
        self.file = Some(file);
        self.synced
            .fetch_add(u64::from(result.is_ok()), Ordering::Relaxed);
        result
    }

    /// Syncs that succeeded so far.
    #[cfg(test)]
    pub fn syncs(&self) -> u64 {
        self.synced.load(Ordering::Relaxed)
    }

    /// The count of syncs that succeeded, shared.
    pub fn counter(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.synced)
    }
}

/// Syncs commits that no caller waits for, at most [`BACKGROUND_EVERY`]
/// after they were made, on a thread beside the writer.
///
/// With `sqlite_synchronous = "normal"` no commit syncs the WAL, and the
/// automatic checkpoint (run inside the commit that crosses its threshold)
/// would first sync the whole unsynced WAL, stalling every call queued
/// behind that commit (docs/adr/0006). With `"full"` a batch of
/// reservations alone (admitted in memory, nobody waiting) is not synced by
/// the writer, so a settlement never waits behind it: the next
/// settlement's sync covers it (the WAL is written in order), and until
/// then this thread bounds how long it stays only in the OS's page cache.
///
/// The writer [`mark`](Self::mark)s what it leaves unsynced; the thread
/// syncs only when something is marked, so an idle server does no I/O. The
/// last marked commits are synced when the thread ends (dropped), so a
/// clean stop leaves nothing unsynced in either mode.
pub struct Background {
    // Dropping it ends the thread.
    _stop: mpsc::Sender<()>,
    dirty: Arc<AtomicBool>,
    // Read by tests only: that the thread syncs, and ends when dropped.
    #[cfg_attr(not(test), allow(dead_code))]
    syncs: Arc<AtomicU64>,
}

/// How often [`Background`] syncs the WAL when commits are waiting for it:
/// what a power loss can take of commits nobody waited for.
pub const BACKGROUND_EVERY: Duration = Duration::from_millis(20);

impl Background {
    /// Starts syncing the WAL of the database file `db` every `every` while
    /// commits are marked, until dropped.
    pub fn start(db: &Path, every: Duration) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let dirty = Arc::new(AtomicBool::new(false));
        let syncs = Arc::new(AtomicU64::new(0));
        let (marked, counter) = (dirty.clone(), syncs.clone());
        let mut wal = Wal::of(db);
        let mut pass = move || {
            // Cleared before the sync: a commit marked during it is synced
            // by the next pass.
            if !marked.swap(false, Ordering::AcqRel) {
                return;
            }
            match wal.sync() {
                Ok(()) => {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                // The next sync (the writer's, a checkpoint's) covers it.
                Err(e) => tracing::debug!(error = %e, "background WAL sync failed"),
            }
        };
        std::thread::Builder::new()
            .name("wal-sync".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    pass();
                }
                pass();
            })?;
        Ok(Self {
            _stop: stop,
            dirty,
            syncs,
        })
    }

    /// Marks commits made so far as not synced by anyone else: the thread's
    /// next pass syncs them.
    pub fn mark(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Takes the mark back: the writer is about to sync everything
    /// committed so far itself.
    pub fn unmark(&self) {
        self.dirty.store(false, Ordering::Release);
    }

    /// Syncs done so far.
    #[cfg(test)]
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Whether commits are marked for the next pass.
    #[cfg(test)]
    pub fn marked(&self) -> bool {
        self.dirty.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn syncs_the_file_at_the_wal_path_even_after_it_was_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.db");
        let mut wal = Wal::of(&db);
        assert!(wal.sync().is_err(), "no WAL yet");

        std::fs::write(dir.path().join("ledger.db-wal"), b"frames").unwrap();
        wal.sync().unwrap();
        let first = wal.file.as_ref().unwrap().metadata().unwrap().ino();

        // Replaced (a new file at the same path; the old one kept so its
        // inode number cannot be reused): the new one is synced.
        std::fs::rename(dir.path().join("ledger.db-wal"), dir.path().join("old")).unwrap();
        let mut f = File::create(dir.path().join("ledger.db-wal")).unwrap();
        f.write_all(b"other frames").unwrap();
        wal.sync().unwrap();
        let second = wal.file.as_ref().unwrap().metadata().unwrap().ino();
        assert_ne!(first, second);
        assert_eq!(
            second,
            std::fs::metadata(dir.path().join("ledger.db-wal"))
                .unwrap()
                .ino()
        );
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            #[allow(clippy::disallowed_methods)] // the test's own thread, not a runtime worker
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn the_background_sync_runs_while_marked_and_once_more_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.db");
        std::fs::write(dir.path().join("ledger.db-wal"), b"frames").unwrap();
        let background = Background::start(&db, Duration::from_millis(1)).unwrap();

        // Nothing marked: many passes, no sync.
        #[allow(clippy::disallowed_methods)] // the test's own thread, not a runtime worker
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(background.syncs(), 0, "synced with nothing marked");

        for n in 1..=3 {
            background.mark();
            wait_until("no background sync", || background.syncs() >= n);
        }
        // Unmarked before a pass (the writer syncs itself): no sync.
        let before = background.syncs();
        background.mark();
        background.unmark();
        #[allow(clippy::disallowed_methods)] // the test's own thread, not a runtime worker
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(background.syncs(), before, "synced an unmarked commit");

        // Marked, then dropped before a pass could run: synced on the way
        // out, and the thread ends (it drops its counter handle).
        let slow = Background::start(&db, Duration::from_secs(3600)).unwrap();
        slow.mark();
        let counter = slow.syncs.clone();
        drop(slow);
        wait_until("the thread did not end", || {
            Arc::strong_count(&counter) == 1
        });
        assert_eq!(counter.load(Ordering::Relaxed), 1, "not synced at the end");
        drop(background);
    }
}
