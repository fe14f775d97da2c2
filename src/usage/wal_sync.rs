//! Durability of the SQLite ledger, one step after its commit: the writer
//! commits with `synchronous = NORMAL` (the WAL is written, not synced),
//! answers the batch's reservations, then syncs the WAL (`fdatasync`) and
//! only then answers its settlements.
//!
//! Why: with `synchronous = FULL` every commit waited for its fsync before
//! anyone heard back, so a metered call waited for two fsyncs in a row (its
//! reservation's, then its record's), and on a disk whose fsync has a long
//! tail under load both showed in the call's latency. A reservation's
//! answer only needs its admission decided and visible to every later
//! admission, which the commit gives; a settlement is still answered only
//! once its usage record is on disk (SPEC §5: no acknowledged call goes
//! unrecorded). The WAL is append-ordered, so that sync also covers the
//! call's reservation, and the writer syncs before it starts the next batch.
//!
//! What this trades (docs/metering.md): a reservation reaches the disk one
//! fsync after its caller was answered, i.e. while its provider request is
//! being sent. A process crash loses nothing (the WAL is in the OS's page
//! cache); a power loss in that window loses the reservation of a call that
//! was never acknowledged, whose provider cost is then not recorded.
//!
//! It must never let a settlement be answered before a sync that started
//! after its commit has finished.

use std::{
    fs::File,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

/// The WAL file of the ledger database, opened on first use.
#[derive(Debug)]
pub struct Wal {
    path: PathBuf,
    file: Option<File>,
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
        result
    }
}

/// With `sqlite_synchronous = "normal"` no commit syncs the WAL, so the
/// automatic checkpoint (run inside the commit that crosses 1,000 frames)
/// first had to sync the whole unsynced WAL, ~4 MB: a 10–20 ms stall for
/// every call queued behind that commit, which set that mode's p99 in the
/// benchmark. This thread syncs the WAL every [`BACKGROUND_EVERY`], beside
/// the writer, so the checkpoint finds it nearly all on disk. Nobody waits
/// for these syncs; they also bound what a host crash can lose in that mode.
pub struct Background {
    // Dropping it ends the thread.
    _stop: mpsc::Sender<()>,
    // Read by tests only: that the thread syncs, and ends when dropped.
    #[cfg_attr(not(test), allow(dead_code))]
    syncs: Arc<AtomicU64>,
}

/// How often [`Background`] syncs the WAL.
pub const BACKGROUND_EVERY: Duration = Duration::from_millis(20);

impl Background {
    /// Starts syncing the WAL of the database file `db` every `every`,
    /// until dropped.
    pub fn start(db: &Path, every: Duration) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let syncs = Arc::new(AtomicU64::new(0));
        let counter = syncs.clone();
        let mut wal = Wal::of(db);
        std::thread::Builder::new()
            .name("wal-sync".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    match wal.sync() {
                        Ok(()) => {
                            counter.fetch_add(1, Ordering::Relaxed);
                        }
                        // The next checkpoint syncs it anyway.
                        Err(e) => tracing::debug!(error = %e, "background WAL sync failed"),
                    }
                }
            })?;
        Ok(Self { _stop: stop, syncs })
    }

    /// Syncs done so far.
    #[cfg(test)]
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
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

    #[test]
    fn the_background_sync_runs_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.db");
        std::fs::write(dir.path().join("ledger.db-wal"), b"frames").unwrap();
        let background = Background::start(&db, Duration::from_millis(1)).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while background.syncs() < 3 {
            assert!(std::time::Instant::now() < deadline, "no background sync");
            std::thread::sleep(Duration::from_millis(1));
        }
        let counter = background.syncs.clone();
        drop(background);
        // The thread ends: it drops its counter handle.
        while Arc::strong_count(&counter) > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the thread did not end"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
