//! `[database]`: where the ledger and everything else is stored, and what a commit survives.

use serde::Deserialize;
use std::time::Duration;

/// Storage settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatabaseConfig {
    /// `sqlite://path/to/file.db` (created if missing) or `postgres://...`.
    pub url: String,
    pub max_connections: u32,
    /// How long a SQLite writer waits for the lock before failing.
    #[serde(with = "humantime_serde")]
    pub busy_timeout: Duration,
    /// How long to wait for a pooled connection.
    #[serde(with = "humantime_serde")]
    pub acquire_timeout: Duration,
    /// When a SQLite commit counts as done (ignored for PostgreSQL).
    pub sqlite_synchronous: SqliteDurability,
    /// SQLite only: WAL pages the ledger writer lets the WAL grow to before it checkpoints:
    /// 10,000 keeps it ~40 MB and checkpoints rarely stall the single writer (docs/adr/0006).
    pub sqlite_wal_autocheckpoint: u32,
}

/// SQLite's `synchronous` setting (WAL mode), i.e. what a commit survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SqliteDurability {
    /// Every commit fsynced before it returns: survives a crash and a power loss.
    #[default]
    Full,
    /// Fsync only at WAL checkpoints: survives a process crash, but a power loss or kernel crash
    /// can lose the last commits. Saves one fsync per group commit.
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
