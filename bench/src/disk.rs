//! The disk's share of a quiet host: how long an `fdatasync` of a small
//! overwrite takes right now, on the filesystem the ledger's SQLite files
//! live on.
//!
//! Why: with full durability a metered call waits for one WAL sync, and on
//! this VM the disk's flush latency comes and goes with the neighbours
//! independently of the cores (run r12: direct p99 quiet, WAL sync p99
//! 0.95–2.37 ms against r8's 0.25). The direct probe of `--wait-quiet`
//! only sees the cores, so it also asks this one.

use crate::loadgen;
use hdrhistogram::Histogram;
use std::{
    fs::OpenOptions,
    io::{Seek, SeekFrom, Write},
    path::Path,
    time::{Duration, Instant},
};

/// One probe: this many syncs, a pause between them (a writer syncing at
/// a few hundred commits per second, as the ledger does at 1,000 calls/s).
pub const SYNCS: usize = 400;
pub const PAUSE: Duration = Duration::from_millis(2);
/// Bytes rewritten before each sync: a commit of ~4 WAL frames.
const WRITE: usize = 16 * 1024;
/// Size of the probe file; the writes go round it, so each sync flushes
/// data in place (as the WAL is rewritten once it has been checkpointed)
/// and never waits for the file to grow.
const FILE: usize = 64 * WRITE;

/// Writes `syncs` blocks of 16 KiB in place into a file in `dir` and
/// `fdatasync`s each; returns the syncs' durations (µs, as the steps'
/// latencies). Blocking. The file is removed afterwards.
pub fn sync_probe(dir: &Path, syncs: usize, pause: Duration) -> anyhow::Result<Histogram<u64>> {
    let path = dir.join("disk-probe.bin");
    let result = probe_file(&path, syncs, pause);
    let _ = std::fs::remove_file(&path);
    result
}

fn probe_file(path: &Path, syncs: usize, pause: Duration) -> anyhow::Result<Histogram<u64>> {
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)?;
    // Allocated and on disk before the first timed sync.
    file.write_all(&vec![0x5a; FILE])?;
    file.sync_all()?;
    let block: Vec<u8> = (0..WRITE).map(|i| (i % 251) as u8).collect();
    let mut times = loadgen::histogram()?;
    for i in 0..syncs {
        let offset = (i * WRITE) % FILE;
        file.seek(SeekFrom::Start(offset as u64))?;
        file.write_all(&block)?;
        let started = Instant::now();
        file.sync_data()?;
        times.saturating_record(loadgen::micros(started.elapsed()).max(1));
        #[allow(clippy::disallowed_methods)] // the probe runs on a blocking thread of its own
        std::thread::sleep(pause);
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_syncs_a_real_file_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let times = sync_probe(dir.path(), 5, Duration::ZERO).unwrap();
        assert_eq!(times.len(), 5);
        assert!(times.min() >= 1);
        assert!(!dir.path().join("disk-probe.bin").exists(), "left behind");

        // A folder that is not there is an error, not a panic.
        assert!(sync_probe(&dir.path().join("gone"), 1, Duration::ZERO).is_err());
    }
}
