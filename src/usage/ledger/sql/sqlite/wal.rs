//! Durability of the SQLite ledger: commits use `synchronous = NORMAL`; a
//! batch with settlements then syncs the WAL and only then answers them
//! (SPEC §5), covering every earlier commit. A reservation reaches the disk
//! at most [`BACKGROUND_EVERY`] later: a power loss in that window loses one
//! of a call never acknowledged (docs/metering.md).
//! It must never answer a settlement before a sync started after its commit.

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
    synced: Arc<AtomicU64>,
}

impl Wal {
    /// The WAL (`<db>-wal`) of the SQLite database file at `db`.
    pub fn of(db: &Path) -> Self {
        let mut path = db.as_os_str().to_owned();
        path.push("-wal");
        Self {
            path: PathBuf::from(path),
            file: None,
            synced: Arc::default(),
        }
    }

    /// `fdatasync` of the WAL (inode-checked): every earlier commit durable on `Ok`.
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

/// Syncs marked commits within [`BACKGROUND_EVERY`] on its own thread, and
/// once more when dropped; else a checkpoint would sync the whole WAL inside
/// a commit, stalling calls behind it (docs/adr/0006).
pub struct Background {
    // Dropping it ends the thread.
    _stop: mpsc::Sender<()>,
    dirty: Arc<AtomicBool>,
    // Read by tests only: that the thread syncs, and ends when dropped.
    #[cfg_attr(not(test), allow(dead_code))]
    syncs: Arc<AtomicU64>,
}

/// How often [`Background`] syncs marked commits: what a power loss can take.
pub const BACKGROUND_EVERY: Duration = Duration::from_millis(20);

impl Background {
    /// Starts syncing `db`'s WAL every `every` while commits are marked.
    pub fn start(db: &Path, every: Duration) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let dirty = Arc::new(AtomicBool::new(false));
        let syncs = Arc::new(AtomicU64::new(0));
        let (marked, counter) = (dirty.clone(), syncs.clone());
        let mut wal = Wal::of(db);
        let mut pass = move || {
            // Cleared before the sync: a commit marked during it waits a pass.
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

    /// Marks the commits so far for the thread's next pass.
    pub fn mark(&self) {
        self.dirty.store(true, Ordering::Release);
    }

    /// Takes the mark back: the writer is about to sync itself.
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

        // Replaced (the old file kept so its inode is not reused): the new one is synced.
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

        // Marked, then dropped before a pass: synced on the way out, thread ended.
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
