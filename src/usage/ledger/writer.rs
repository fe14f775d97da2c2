//! The ledger writers' handle; a team always on the same writer, in order.

use super::{
    Done, Op, Reserve,
    group_commit::{Pool, Reply, run},
    sqlite::{self, Admission, admission::Settling, writer::SqliteWriter},
};
use crate::{
    config::{DatabaseConfig, SqliteDurability},
    store::{Store, StoreError},
    telemetry::metrics,
};
use futures::future::Either;
use std::{
    future::Future,
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};

/// Queue depth per writer before callers wait (back-pressure).
const QUEUE: usize = 4096;

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
    /// A SQLite file's in-memory admission; `None` where SQL admits.
    admission: Option<Arc<Admission>>,
    wal_syncs: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// The triggers matched against every audit event (none configured: `None`).
    outbox: Option<Arc<crate::audit::outbox::Outbox>>,
    /// Given to every settlement when some trigger follows a cap.
    caps: Option<Arc<super::CapTriggers>>,
}

/// Where a batch is applied.
enum Writer {
    Pool(Store),
    /// Through its own SQLite connection, on its own thread ([`sqlite::writer`]).
    Sqlite(Box<SqliteWriter>),
}

impl LedgerWriter {
    /// Starts the writers on `store`; once every handle is dropped or `stop`
    /// turns true they commit what is queued and exit.
    pub fn spawn(
        store: Store,
        config: &DatabaseConfig,
        batch_max: usize,
        postgres_writers: usize,
        limits_refresh: Duration,
        stop: watch::Receiver<bool>,
    ) -> Result<(Self, JoinHandle<()>), StoreError> {
        let mut appliers = Vec::new();
        let mut admission = None;
        let mut wal_syncs = None;
        match (&store, sqlite::file_of(&config.url)) {
            (Store::Sqlite(_), Some(path)) => {
                let conn = sqlite::open(&path, config)?;
                let full = config.sqlite_synchronous == SqliteDurability::Full;
                let memory = Arc::new(Admission::new(store.clone(), limits_refresh));
                admission = Some(memory.clone());
                let writer = SqliteWriter::new(conn, &path, full, memory)?;
                wal_syncs = writer.wal_syncs();
                appliers.push(Writer::Sqlite(Box::new(writer)));
            }
            (Store::Postgres(_), _) => {
                for _ in 0..postgres_writers.max(1) {
                    appliers.push(Writer::Pool(store.clone()));
                }
            }
            (Store::Sqlite(_), None) => {
                return Err(StoreError::Unsupported(
                    "the ledger needs a SQLite file (database.url = sqlite://path), not an in-memory database",
                ));
            }
        }
        let mut shards = Vec::with_capacity(appliers.len());
        let mut tasks = Vec::with_capacity(appliers.len());
        let batch_max = batch_max.max(1);
        for applier in appliers {
            let (tx, rx) = mpsc::channel(QUEUE);
            shards.push(tx);
            let stop = stop.clone();
            tasks.push(match applier {
                Writer::Pool(store) => tokio::spawn(run(Pool(store), rx, batch_max, stop)),
                Writer::Sqlite(writer) => {
                    let (exited, ended) = oneshot::channel::<()>();
                    let busy_timeout = config.busy_timeout;
                    std::thread::Builder::new()
                        .name("ledger-writer".into())
                        .spawn(move || {
                            sqlite::busy::wait_at_most(busy_timeout);
                            sqlite::writer::block_on(run(*writer, rx, batch_max, stop), None);
                            drop(exited);
                        })?;
                    tokio::spawn(async move {
                        let _ = ended.await;
                    })
                }
            });
        }
        let handle = tokio::spawn(async move {
            for task in tasks {
                let _ = task.await;
            }
        });
        Ok((
            Self {
                shards: shards.into(),
                admission,
                wal_syncs,
                outbox: None,
                caps: None,
            },
            handle,
        ))
    }

    /// Matches every audit event written from now on against `outbox`'s
    /// triggers; when one follows a cap, settlements look for crossings of
    /// their bucket's caps (`defaults` without an override row).
    pub fn set_outbox(
        &mut self,
        outbox: Option<Arc<crate::audit::outbox::Outbox>>,
        defaults: crate::usage::bucket::Limits,
    ) {
        self.caps = outbox
            .as_ref()
            .filter(|o| o.follows_caps())
            .map(|o| Arc::new(super::CapTriggers::new(o.clone(), defaults)));
        self.outbox = outbox;
    }

    /// `op` carrying the outbox rows its audit events fire, written in its
    /// transaction (an audit-only op becomes a write without statements).
    fn with_outbox(&self, op: Op) -> Op {
        let Some(outbox) = &self.outbox else {
            return op;
        };
        let now = chrono::Utc::now().timestamp_millis();
        match op {
            Op::Audit(events) => {
                let rows = outbox.statements(&events, now);
                if rows.is_empty() {
                    return Op::Audit(events);
                }
                Op::Write(super::Write {
                    team_id: events
                        .first()
                        .map(|e| e.team_id.clone())
                        .unwrap_or_default(),
                    statements: Vec::new(),
                    durable: true,
                    audit: events,
                    audit_only_if_stored: false,
                    outbox: rows,
                })
            }
            Op::Settle(mut s) => {
                s.outbox = outbox.statements(&s.audit, now);
                s.triggers = self.caps.clone();
                Op::Settle(s)
            }
            Op::Write(mut w) => {
                w.outbox = outbox.statements(&w.audit, now);
                Op::Write(w)
            }
            reserve @ Op::Reserve(_) => reserve,
        }
    }

    /// Audits `refusal` as `usage.cap.reached` when a trigger follows caps
    /// ([`super::CapTriggers::reached_by_refusal`]); queued, not waited for.
    pub async fn tell_refusal(&self, refusal: &super::Refusal, trace_id: &str) {
        let Some(op) = self
            .caps
            .as_ref()
            .and_then(|c| c.reached_by_refusal(refusal, trace_id))
        else {
            return;
        };
        if let Err(e) = self.enqueue(op).await {
            tracing::warn!(error = %e, "a cap refusal's usage.cap.reached was not queued");
        }
    }

    /// WAL syncs of a SQLite file that answered settlements (full durability).
    pub fn wal_syncs(&self) -> Option<u64> {
        self.wal_syncs
            .as_ref()
            .map(|n| n.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The in-memory admission of a SQLite file's writer (tests, ops).
    pub fn admission(&self) -> Option<&Admission> {
        self.admission.as_deref()
    }

    /// The writer of `op`'s team.
    fn shard(&self, op: &Op) -> Option<&mpsc::Sender<(Op, Reply)>> {
        if self.shards.len() == 1 {
            return self.shards.first();
        }
        let mut hasher = DefaultHasher::new();
        op.team().hash(&mut hasher);
        let n = self.shards.len() as u64;
        self.shards
            .get(usize::try_from(hasher.finish() % n).unwrap_or(0))
    }

    /// Queues `op` and waits for its commit (a SQLite reservation: admitted in
    /// memory). Not `async`: each path's future holds only what it needs.
    pub fn submit(&self, op: Op) -> impl Future<Output = Result<Done, WriteError>> + Send + '_ {
        let started = Instant::now();
        let op = self.with_outbox(op);
        let shard = self.shard(&op);
        match (self.admission.as_deref(), op) {
            (Some(admission), Op::Reserve(r)) => Either::Left(admit(admission, shard, r, started)),
            (admission, op) => {
                let unsent = Unsent::of(admission, &op);
                Either::Right(queue(shard, op, started, unsent))
            }
        }
    }
}

impl LedgerWriter {
    /// Queues `op` waiting only for room (not covered by durability, docs/metering.md).
    pub fn enqueue(&self, op: Op) -> impl Future<Output = Result<(), WriteError>> + Send + '_ {
        let op = self.with_outbox(op);
        let unsent = Unsent::of(self.admission.as_deref(), &op);
        let shard = self.shard(&op);
        async move {
            let slot = shard
                .ok_or(WriteError::Stopped)?
                .reserve()
                .await
                .map_err(|_| WriteError::Stopped)?;
            // Nobody listens for the reply.
            slot.send((op, oneshot::channel().0));
            unsent.sent();
            Ok(())
        }
    }
}

/// Queues `op` and waits for its commit; an `async fn` would hold `op` twice.
fn queue<'a>(
    shard: Option<&'a mpsc::Sender<(Op, Reply)>>,
    op: Op,
    started: Instant,
    unsent: Unsent<'a>,
) -> impl Future<Output = Result<Done, WriteError>> + Send + 'a {
    let kind = match op {
        Op::Reserve(_) => "reserve",
        Op::Settle(_) => "settle",
        Op::Audit(_) => "audit",
        Op::Write(_) => "write",
    };
    async move {
        let (reply, done) = oneshot::channel();
        // Reserve a queue slot, then send, so the send holds no copy.
        let slot = shard
            .ok_or(WriteError::Stopped)?
            .reserve()
            .await
            .map_err(|_| WriteError::Stopped)?;
        slot.send((op, reply));
        unsent.sent();
        let done = done.await;
        metrics::ledger_wait(kind, started.elapsed());
        match done {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(e)) => Err(WriteError::Store(e)),
            Err(_) => Err(WriteError::Stopped),
        }
    }
}

/// Admits `r` in memory and queues its row (not an `async fn`, as [`queue`]).
#[allow(clippy::manual_async_fn)] // deliberately not one, see above
fn admit<'a>(
    admission: &'a Admission,
    shard: Option<&'a mpsc::Sender<(Op, Reply)>>,
    mut r: Reserve,
    started: Instant,
) -> impl Future<Output = Result<Done, WriteError>> + Send + 'a {
    async move {
        let waited = || metrics::ledger_wait("reserve", started.elapsed());
        match admission.admit(&r).await {
            Ok(Ok(())) => {}
            Ok(Err(refusal)) => {
                waited();
                return Ok(Done::Refused(refusal));
            }
            Err(e) => {
                waited();
                return Err(WriteError::Store(Arc::new(e)));
            }
        }
        let slot = match shard.map(|s| (s, s.try_reserve())) {
            Some((_, Ok(slot))) => slot,
            Some((shard, Err(mpsc::error::TrySendError::Full(())))) => {
                // Full: wait for room, withdrawing the admission if dropped
                // meanwhile (else it stays counted and is never written).
                let mut unqueued = Unqueued {
                    admission,
                    reserve: Some(&r),
                };
                match shard.reserve().await {
                    Ok(slot) => {
                        unqueued.reserve = None;
                        slot
                    }
                    Err(_) => {
                        // Dropping `unqueued` withdraws the admission.
                        drop(unqueued);
                        waited();
                        return Err(WriteError::Stopped);
                    }
                }
            }
            Some((_, Err(mpsc::error::TrySendError::Closed(())))) | None => {
                // The writer has stopped: the call will not run.
                admission.withdraw(&r);
                waited();
                return Err(WriteError::Stopped);
            }
        };
        r.admitted = true;
        slot.send((Op::Reserve(r), oneshot::channel().0));
        waited();
        Ok(Done::Admitted)
    }
}

/// A counted settlement not queued yet: taken back if dropped before [`Unsent::sent`].
struct Unsent<'a>(Option<(&'a Admission, Settling)>);

impl<'a> Unsent<'a> {
    /// Counts `op` if it is a settlement and admission is in memory.
    fn of(admission: Option<&'a Admission>, op: &Op) -> Self {
        Self(match (admission, op) {
            (Some(admission), Op::Settle(s)) => Some((admission, admission.settling(s))),
            _ => None,
        })
    }

    /// Queued: the writer accounts for it from now on.
    fn sent(mut self) {
        self.0 = None;
    }
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        if let Some((admission, settling)) = &self.0 {
            admission.unsent(settling);
        }
    }
}

/// An admission not queued yet: withdrawn if dropped while `reserve` is set.
struct Unqueued<'a> {
    admission: &'a Admission,
    reserve: Option<&'a Reserve>,
}

impl Drop for Unqueued<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.reserve {
            self.admission.withdraw(r);
        }
    }
}

#[cfg(test)]
mod tests;
