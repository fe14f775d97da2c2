//! The database: SQLite (one file) or PostgreSQL (shared by replicas), by URL scheme. Only
//! connections live here. Each service reaches its tables through a repository trait of its
//! own, implemented for both pools in the service's `sql` module: the only place its SQL sits.

pub mod statement;

pub use statement::{Arg, Statement};

use crate::config::{DatabaseConfig, SqliteDurability};
use sqlx::{
    PgPool, SqlitePool,
    postgres::PgPoolOptions,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use std::{str::FromStr, time::Duration};

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL could not be understood.
    #[error("database.url: {0}")]
    BadUrl(String),
    /// The database could not be reached or a query failed.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// The ledger writer's own SQLite connection failed.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A migration failed.
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The SQLite file's folder could not be created.
    #[error("cannot create the database folder: {0}")]
    Io(#[from] std::io::Error),
    /// Another server process holds the SQLite file.
    #[error(
        "database file {0} is in use by another ai-orchestrator server: a SQLite file serves one \
         process (use PostgreSQL to run replicas)"
    )]
    InUse(std::path::PathBuf),
    /// A blocking task of the ledger panicked or was cancelled.
    #[error("the ledger's blocking task failed: {0}")]
    Blocking(#[from] tokio::task::JoinError),
    /// An operation this backend does not offer.
    #[error("{0}")]
    Unsupported(&'static str),
    /// A row the operation relied on changed under it; trying again may succeed.
    #[error("{0}")]
    Raced(&'static str),
}

/// Runs `$body` once per backend with `$pool` bound to its pool, for SQL valid on both: the
/// store's own queries and tests that inspect tables. Services use their repository.
#[macro_export]
#[doc(hidden)]
macro_rules! on_store {
    ($store:expr, |$pool:ident| $body:expr) => {
        match $store {
            $crate::store::Store::Sqlite($pool) => $body,
            $crate::store::Store::Postgres($pool) => $body,
        }
    };
}

/// Implements a repository trait for both pools from one body, for SQL valid on both backends
/// (`$1` placeholders, standard types); inside, `self` is the pool and `Self::POSTGRES` tells
/// the backend where a statement must differ.
#[macro_export]
macro_rules! impl_for_both_pools {
    ($repository:path { $($body:tt)* }) => {
        #[async_trait::async_trait]
        impl $repository for sqlx::SqlitePool {
            $($body)*
        }
        #[async_trait::async_trait]
        impl $repository for sqlx::PgPool {
            $($body)*
        }
    };
}

/// A pool's backend, for the few statements that differ between the two.
pub trait Backend {
    /// True for PostgreSQL.
    const POSTGRES: bool;
}

impl Backend for SqlitePool {
    const POSTGRES: bool = false;
}

impl Backend for PgPool {
    const POSTGRES: bool = true;
}

/// Begins a write transaction: `BEGIN IMMEDIATE` on SQLite, so that a read-then-write
/// transaction takes the write lock up front instead of failing on upgrade.
pub async fn begin_write<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    postgres: bool,
) -> Result<sqlx::Transaction<'static, DB>, sqlx::Error> {
    if postgres {
        pool.begin().await
    } else {
        pool.begin_with("BEGIN IMMEDIATE").await
    }
}

/// A connection pool to one of the two backends.
#[derive(Clone, Debug)]
pub enum Store {
    /// Embedded SQLite file.
    Sqlite(SqlitePool),
    /// PostgreSQL server.
    Postgres(PgPool),
}

/// A schema migrated by a newer release is accepted: migrations never drop or change a column,
/// so an older binary still runs on it (rollback, rolling upgrade).
fn migrator(postgres: bool) -> sqlx::migrate::Migrator {
    let mut migrator = if postgres {
        sqlx::migrate!("./migrations/postgres")
    } else {
        sqlx::migrate!("./migrations/sqlite")
    };
    migrator.set_ignore_missing(true);
    migrator
}

impl Store {
    /// Connects (creating the SQLite file and its folder if missing). Does not migrate.
    pub async fn connect(config: &DatabaseConfig) -> Result<Self, StoreError> {
        let url = config.url.as_str();
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(config.max_connections)
                .acquire_timeout(config.acquire_timeout)
                .connect(url)
                .await?;
            return Ok(Store::Postgres(pool));
        }
        if !url.starts_with("sqlite:") {
            return Err(StoreError::BadUrl(
                "expected sqlite:, postgres:// or postgresql://".into(),
            ));
        }
        let options = SqliteConnectOptions::from_str(url)
            .map_err(|e| StoreError::BadUrl(e.to_string()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a commit is on disk before the call is acknowledged; NORMAL is opt-in.
            .synchronous(match config.sqlite_synchronous {
                SqliteDurability::Full => SqliteSynchronous::Full,
                SqliteDurability::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(config.busy_timeout)
            .foreign_keys(true);
        if let Some(parent) = options.get_filename().parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent)?;
        }
        let pool = SqlitePoolOptions::new()
            // A local file cannot go stale; the ping would cost every ledger batch a round trip.
            .test_before_acquire(false)
            .max_connections(config.max_connections)
            .acquire_timeout(config.acquire_timeout)
            .connect_with(options)
            .await?;
        Ok(Store::Sqlite(pool))
    }

    /// Applies every pending migration; sqlx's lock makes it safe from several replicas.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(pool) => migrator(false).run(pool).await?,
            Store::Postgres(pool) => migrator(true).run(pool).await?,
        }
        Ok(())
    }

    /// True when a trivial query answers within `timeout` (health checks).
    pub async fn ping(&self, timeout: Duration) -> bool {
        let query = async {
            on_store!(self, |pool| sqlx::query("SELECT 1")
                .execute(pool)
                .await
                .map(drop))
        };
        matches!(tokio::time::timeout(timeout, query).await, Ok(Ok(())))
    }

    /// Backend name for logs: `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Names of the tables that exist (used by tests and `migrate`).
    pub async fn tables(&self) -> Result<Vec<String>, StoreError> {
        let names = match self {
            Store::Sqlite(pool) => {
                sqlx::query_scalar(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
                )
                .fetch_all(pool)
                .await?
            }
            Store::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT table_name::text FROM information_schema.tables \
                     WHERE table_schema = current_schema() ORDER BY table_name",
                )
                .fetch_all(pool)
                .await?
            }
        };
        Ok(names)
    }

    /// Closes the pool, waiting for connections to be returned (shutdown).
    pub async fn close(&self) {
        on_store!(self, |pool| pool.close().await)
    }
}
