//! `[database]`: where the ledger and everything else is stored, and what
//! a SQLite commit survives.

use serde::Deserialize;
use std::time::Duration;

/// Storage settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `sqlite://path/to/file.db` (created if missing) or `postgres://...`.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
    /// How long a SQLite writer waits for the lock before failing.
    #[serde(with = "humantime_serde")]
    pub busy_timeout: Duration,
    /// How long to wait for a pooled connection.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// When a SQLite commit counts as done (ignored for PostgreSQL).
    pub sqlite_synchronous: SqliteDurability,
    /// SQLite file only: WAL frames (pages) the ledger writer lets the WAL
    /// grow to before it checkpoints, between commits: 10,000 keeps a
    /// ~40 MB WAL, rewritten in place, and checkpoints rarely stall the
    /// single writer (docs/adr/0006).
    pub sqlite_wal_autocheckpoint: u32,
}

/// SQLite's `synchronous` setting (WAL mode), i.e. what a commit survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteDurability {
    /// Every commit is fsynced before it returns: an acknowledged call's
    /// usage record survives a process crash and a power loss.
    #[default]
    Full,
    /// Commits reach the OS before they return, fsync happens at WAL
    /// checkpoints: survives a process crash (SIGKILL, OOM kill, panic) but
    /// the last commits can be lost on power loss or a kernel crash. Saves
    /// one fsync per group commit.
    Normal,
}

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://data/ai-orchestrator.db".into(),
            max_connections: 8,
            busy_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(5),
            sqlite_synchronous: SqliteDurability::Full,
            sqlite_wal_autocheckpoint: 10_000,
        }
    }
}
