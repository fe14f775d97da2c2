//! Group commit: a writer task owns ledger writes and applies whatever
//! operations are queued as one transaction, so one fsync covers a whole
//! burst while every caller still waits until its own operation is durable.
//!
//! A SQLite file has one writer, with its own synchronous connection
//! ([`super::sqlite_writer`]), a batch per blocking task; with
//! `synchronous = NORMAL`, WAL checkpoints run beside it on the pool, so no
//! commit waits for one. PostgreSQL has
//! `metering.ledger_writers` writers, each on its own pooled connection,
//! and a team always goes to the same one: batches for different teams
//! commit in parallel (a network round trip per statement no longer
//! serialises the whole replica), while one team's operations keep their
//! order. An in-memory SQLite database (tests) has one pooled writer.

use super::{
    ledger::{self, Done, Op},
    sqlite_writer,
};
use crate::{
    config::DatabaseConfig,
    store::{Store, StoreError},
};
use std::{
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};

/// Queue depth per writer before callers wait (back-pressure).
const QUEUE: usize = 4096;

/// How often the SQLite WAL is checkpointed beside the writer. Short enough
/// that the WAL stays a few MB under full load.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(200);

type Reply = oneshot::Sender<Result<Done, Arc<crate::store::StoreError>>>;

/// Why a ledger operation did not complete.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WriteError {
    /// The transaction failed (the whole batch was rolled back).
    #[error("ledger write failed: {0}")]
    Store(Arc<crate::store::StoreError>),
    /// The writer has stopped (shutdown).
    #[error("ledger writer stopped")]
    Stopped,
}

/// Handle to the writer tasks; cheap to clone.
#[derive(Clone, Debug)]
pub struct LedgerWriter {
    shards: Arc<[mpsc::Sender<(Op, Reply)>]>,
}

/// Where a batch is applied.
enum Applier {
    /// Through the pool (PostgreSQL, in-memory SQLite).
    Pool(Store),
    /// Through the writer's own SQLite connection, on a blocking thread.
    /// The mutex is only ever taken by that one task at a time; it is what
    /// lets the connection move between blocking-pool threads.
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
}

impl Applier {
    /// Applies `ops`, handing them back for reuse of the buffer.
    async fn apply(&self, ops: Vec<Op>) -> (Vec<Op>, Result<Vec<Done>, StoreError>) {
        match self {
            Applier::Pool(store) => {
                let result = ledger::apply(store, &ops).await;
                (ops, result)
            }
            Applier::Sqlite(conn) => {
                let conn = conn.clone();
                let n = ops.len();
                let task = tokio::task::spawn_blocking(move || {
                    // Poisoning only means an earlier batch panicked; the
                    // connection rolled that transaction back when its
                    // `Transaction` dropped.
                    let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
                    let result = sqlite_writer::apply(&mut conn, &ops).map_err(StoreError::from);
                    (ops, result)
                });
                match task.await {
                    Ok(out) => out,
                    Err(e) => (
                        Vec::with_capacity(n),
                        Err(StoreError::Io(std::io::Error::other(format!(
                            "ledger batch task failed: {e}"
                        )))),
                    ),
                }
            }
        }
    }
}

impl LedgerWriter {
    /// Starts the writers on `store`: one on its own connection for a
    /// SQLite file, `postgres_writers` for PostgreSQL, one otherwise. They
    /// stop once every handle is dropped, or when `stop` turns true: then
    /// they refuse new operations, commit everything already queued (the
    /// usage flush on shutdown) and exit. The handle ends when all have.
    pub fn spawn(
        store: Store,
        config: &DatabaseConfig,
        batch_max: usize,
        postgres_writers: usize,
        stop: watch::Receiver<bool>,
    ) -> Result<(Self, JoinHandle<()>), StoreError> {
        let mut appliers = Vec::new();
        let mut checkpointer = None;
        match (&store, sqlite_writer::file_of(&config.url)) {
            (Store::Sqlite(_), Some(path)) => {
                let conn = sqlite_writer::open(&path, config)?;
                appliers.push(Applier::Sqlite(Arc::new(Mutex::new(conn))));
                if sqlite_writer::checkpoints_beside(config) {
                    let (alive, writer_gone) = watch::channel(());
                    tokio::spawn(checkpoint(store.clone(), writer_gone));
                    checkpointer = Some(alive);
                }
            }
            (Store::Postgres(_), _) => {
                for _ in 0..postgres_writers.max(1) {
                    appliers.push(Applier::Pool(store.clone()));
                }
            }
            (Store::Sqlite(_), None) => appliers.push(Applier::Pool(store.clone())),
        }
        let mut shards = Vec::with_capacity(appliers.len());
        let mut tasks = Vec::with_capacity(appliers.len());
        for applier in appliers {
            let (tx, rx) = mpsc::channel(QUEUE);
            shards.push(tx);
            tasks.push(tokio::spawn(run(
                applier,
                rx,
                batch_max.max(1),
                stop.clone(),
            )));
        }
        let handle = tokio::spawn(async move {
            for task in tasks {
                let _ = task.await;
            }
            // The last write is committed: the checkpointer may stop.
            drop(checkpointer);
        });
        Ok((
            Self {
                shards: shards.into(),
            },
            handle,
        ))
    }

    /// The writer of `op`'s team.
    fn shard(&self, op: &Op) -> Option<&mpsc::Sender<(Op, Reply)>> {
        if self.shards.len() == 1 {
            return self.shards.first();
        }
        let team = match op {
            Op::Reserve(r) => &r.team_id,
            Op::Settle(s) => &s.record.team_id,
        };
        let mut hasher = DefaultHasher::new();
        team.hash(&mut hasher);
        let n = self.shards.len() as u64;
        self.shards
            .get(usize::try_from(hasher.finish() % n).unwrap_or(0))
    }

    /// Queues `op` and waits until it is committed.
    pub async fn submit(&self, op: Op) -> Result<Done, WriteError> {
        let (reply, done) = oneshot::channel();
        self.shard(&op)
            .ok_or(WriteError::Stopped)?
            .send((op, reply))
            .await
            .map_err(|_| WriteError::Stopped)?;
        match done.await {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(WriteError::Store(e)),
            Err(_) => Err(WriteError::Stopped),
        }
    }
}

async fn run(
    applier: Applier,
    mut rx: mpsc::Receiver<(Op, Reply)>,
    batch_max: usize,
    mut stop: watch::Receiver<bool>,
) {
    let mut ops = Vec::with_capacity(batch_max);
    let mut replies = Vec::with_capacity(batch_max);
    loop {
        let next = tokio::select! {
            next = rx.recv() => next,
            _ = stop.wait_for(|s| *s), if !*stop.borrow() => {
                // Refuse new work; what is queued is still drained below.
                rx.close();
                continue;
            }
        };
        let Some((op, reply)) = next else { return };
        ops.push(op);
        replies.push(reply);
        // Everything already queued joins this transaction.
        while ops.len() < batch_max {
            match rx.try_recv() {
                Ok((op, reply)) => {
                    ops.push(op);
                    replies.push(reply);
                }
                Err(_) => break,
            }
        }
        let (returned, result) = applier.apply(std::mem::take(&mut ops)).await;
        ops = returned;
        match result {
            Ok(results) => {
                for (reply, result) in replies.drain(..).zip(results) {
                    let _ = reply.send(Ok(result));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch = ops.len(), "ledger batch failed");
                let e = Arc::new(e);
                for reply in replies.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
        ops.clear();
    }
}

/// Checkpoints the SQLite WAL through the pool every [`CHECKPOINT_EVERY`]
/// until the writer is gone, when the writer's connection does not
/// checkpoint itself ([`sqlite_writer::checkpoints_beside`]): a commit that
/// crosses the auto-checkpoint threshold would copy the WAL into the
/// database and fsync it before its caller hears back. A passive checkpoint
/// here runs beside the writer without blocking it.
async fn checkpoint(store: Store, mut writer_gone: watch::Receiver<()>) {
    let Store::Sqlite(pool) = store else { return };
    loop {
        tokio::select! {
            _ = writer_gone.changed() => return,
            _ = tokio::time::sleep(CHECKPOINT_EVERY) => {}
        }
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .fetch_optional(&pool)
            .await
        {
            tracing::warn!(error = %e, "WAL checkpoint failed; retrying");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::ledger::{Reserve, Settle};

    fn reserve(team: &str) -> Op {
        Op::Reserve(Reserve {
            id: "r".into(),
            team_id: team.into(),
            month_start_ms: 0,
            input_tokens: 0,
            output_tokens: 0,
            requests: 1,
            cost_micros: 0,
            default_caps: ledger::Caps::default(),
            task: String::new(),
            user_id: String::new(),
            trace_id: String::new(),
            channel: String::new(),
            priority: String::new(),
            created_at_ms: 0,
        })
    }

    fn settle(team: &str) -> Op {
        Op::Settle(Settle {
            reservations: Vec::new(),
            charge: false,
            record: crate::usage::UsageRecord {
                team_id: team.into(),
                ..Default::default()
            },
            month_start_ms: 0,
            prompt_owner: None,
        })
    }

    #[test]
    fn a_team_always_uses_one_writer_and_teams_spread_over_all() {
        let (senders, _receivers): (Vec<_>, Vec<_>) = (0..4).map(|_| mpsc::channel(1)).unzip();
        let writer = LedgerWriter {
            shards: senders.into(),
        };
        let index = |op: &Op| {
            let shard = writer.shard(op).unwrap();
            writer
                .shards
                .iter()
                .position(|s| s.same_channel(shard))
                .unwrap()
        };
        let mut used = std::collections::HashSet::new();
        for t in 0..64 {
            let team = format!("team-{t}");
            let first = index(&reserve(&team));
            assert_eq!(index(&settle(&team)), first, "{team}");
            assert_eq!(index(&reserve(&team)), first, "{team}");
            used.insert(first);
        }
        assert_eq!(used.len(), 4, "64 teams use every writer");
    }
}
