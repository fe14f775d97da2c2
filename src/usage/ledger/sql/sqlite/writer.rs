//! The SQLite ledger writer's thread (not a blocking-pool task: fewer
//! wake-ups, never behind request tasks): one commit per batch, then the WAL
//! sync settlements wait for. It must never answer a settlement before its
//! commit is synced (`"full"`), nor hold an operation somebody waits for.

use super::{
    Admission, apply_reading,
    wal::{self, Wal},
};
use crate::usage::ledger::{
    Done, Op,
    group_commit::{Applier, Outcome, Reply, answer, isolate, outcomes, take_queued},
};
use crate::{store::StoreError, telemetry::metrics};
use futures::FutureExt;
use std::{
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Wake, Waker},
    thread::Thread,
    time::{Duration, Instant},
};
use tokio::sync::mpsc;

/// How long a batch of only reservations waits for a settlement to share its
/// commit (one per call); bounds what a crash can lose (docs/metering.md).
pub const LINGER: Duration = Duration::from_millis(1);

/// The SQLite writer's connection and how its WAL reaches the disk.
pub struct SqliteWriter {
    conn: rusqlite::Connection,
    /// With `"full"`: synced before answering settlements.
    wal: Option<Wal>,
    /// Syncs the commits left unsynced within [`wal::BACKGROUND_EVERY`].
    background: wal::Background,
    admission: Arc<Admission>,
}

impl SqliteWriter {
    /// The writer over `conn`, the ledger's file at `path`.
    pub fn new(
        conn: rusqlite::Connection,
        path: &std::path::Path,
        full: bool,
        admission: Arc<Admission>,
    ) -> std::io::Result<Self> {
        Ok(Self {
            conn,
            wal: full.then(|| Wal::of(path)),
            background: wal::Background::start(path, wal::BACKGROUND_EVERY)?,
            admission,
        })
    }

    /// Commits `ops` and answers `replies` (settlements once synced). Blocking.
    async fn commit(&mut self, ops: &[Op], replies: &mut Vec<Reply>) {
        let started = Instant::now();
        let conn = &mut self.conn;
        let units = isolate(ops, |batch| std::future::ready(apply_reading(conn, batch))).await;
        // Admission learns the final fate of each operation once.
        let units = units
            .into_iter()
            .map(|(batch, result)| match result {
                Ok((done, rows)) => {
                    self.admission.committed(batch, rows);
                    (batch, Ok(done))
                }
                Err(e) => {
                    self.admission.failed(batch);
                    (batch, Err(e))
                }
            })
            .collect();
        let outcomes = outcomes(units);
        metrics::ledger_commit(ops.len(), started.elapsed());
        let committed = outcomes.iter().any(Result::is_ok);
        let settled = |o: &Outcome| o.as_ref().is_ok_and(Done::durable);
        let Some(wal) = self.wal.as_mut().filter(|_| outcomes.iter().any(settled)) else {
            // Nobody waits for this commit's sync (or nothing committed).
            if committed {
                self.background.mark();
            }
            answer(replies, outcomes, |_| true);
            return;
        };
        let durable: Vec<Outcome> = outcomes.iter().filter(|o| settled(o)).cloned().collect();
        answer(replies, outcomes, |o| !settled(o));
        // This sync covers every commit so far.
        self.background.unmark();
        let started = Instant::now();
        let synced = wal.sync();
        metrics::ledger_sync(started.elapsed());
        let durable = match synced {
            Ok(()) => durable,
            Err(e) => {
                let e = Arc::new(StoreError::Io(e));
                durable.iter().map(|_| Err(e.clone())).collect()
            }
        };
        answer(replies, durable, |_| true);
    }
}

impl SqliteWriter {
    /// How many WAL syncs answered settlements (with full durability).
    pub fn wal_syncs(&self) -> Option<Arc<std::sync::atomic::AtomicU64>> {
        self.wal.as_ref().map(Wal::counter)
    }
}

impl Applier for SqliteWriter {
    fn gather(
        &mut self,
        rx: &mut mpsc::Receiver<(Op, Reply)>,
        batch_max: usize,
        ops: &mut Vec<Op>,
        replies: &mut Vec<Reply>,
    ) {
        linger(rx, batch_max, ops, replies);
    }

    async fn apply(&mut self, ops: &[Op], replies: &mut Vec<Reply>) {
        let applied = std::panic::AssertUnwindSafe(self.commit(ops, replies))
            .catch_unwind()
            .await;
        if applied.is_err() {
            // Rolled back; the replies left are dropped: STORAGE_UNAVAILABLE.
            tracing::error!(batch = ops.len(), "ledger batch panicked");
        }
    }
}

/// Holds a batch of only reservations up to [`LINGER`] for a settlement.
fn linger(
    rx: &mut mpsc::Receiver<(Op, Reply)>,
    batch_max: usize,
    ops: &mut Vec<Op>,
    replies: &mut Vec<Reply>,
) {
    let deadline = Instant::now() + LINGER;
    while ops.len() < batch_max && !ops.iter().any(Op::goes_at_once) {
        // Closed (stopping): what is queued is taken by the next batch.
        let Some(Some((op, reply))) = block_on(rx.recv(), Some(deadline)) else {
            return;
        };
        ops.push(op);
        replies.push(reply);
        take_queued(rx, batch_max, ops, replies);
    }
}

/// Runs `future` here until done or `deadline`; not tokio's timer, gone at
/// runtime shutdown while the writer drains.
pub(in crate::usage::ledger) fn block_on<F: Future>(
    future: F,
    deadline: Option<Instant>,
) -> Option<F::Output> {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Some(out);
        }
        // A wake between poll and park leaves the token set: park returns at once.
        match deadline {
            None => std::thread::park(),
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::DatabaseConfig,
        store::Store,
        usage::ledger::{Reservation, Reserve, Settle},
    };
    use tokio::sync::oneshot;

    fn reserve(id: &str) -> Reserve {
        Reserve {
            id: id.into(),
            team_id: "t".into(),
            requests: 1,
            input_tokens: 10,
            admitted: true,
            ..Reserve::default()
        }
    }

    fn settle(of: &Reserve) -> Settle {
        Settle {
            reservations: vec![Reservation::from(of)],
            charge: true,
            recorded: true,
            record: crate::usage::UsageRecord {
                team_id: "t".into(),
                trace_id: of.id.clone(),
                ..Default::default()
            },
            month_start_ms: 0,
            day_start_ms: 0,
            user_id: String::new(),
            prompt_owner: None,
            audit: Vec::new(),
            outbox: Vec::new(),
            triggers: None,
        }
    }

    async fn writer(dir: &std::path::Path) -> (SqliteWriter, Store) {
        let path = dir.join("w.db");
        let config = DatabaseConfig {
            url: format!("sqlite://{}", path.display()),
            ..DatabaseConfig::default()
        };
        let store = Store::connect(&config).await.unwrap();
        store.migrate().await.unwrap();
        let admission = Arc::new(Admission::new(store.clone(), Duration::from_secs(3600)));
        let mut writer = SqliteWriter::new(
            super::super::open(&path, &config).unwrap(),
            &path,
            true,
            admission,
        )
        .unwrap();
        // No background pass within a test: only the writer's marks show.
        writer.background = wal::Background::start(&path, Duration::from_secs(3600)).unwrap();
        (writer, store)
    }

    type Answer = oneshot::Receiver<Result<Done, Arc<StoreError>>>;

    /// A batch of `op` alone, and where its caller hears back.
    fn one(op: Op) -> (Vec<Op>, Vec<Reply>, Answer) {
        let (tx, rx) = oneshot::channel();
        (vec![op], vec![tx], rx)
    }

    /// Settlements are answered after the sync; reservations left to the thread.
    #[tokio::test]
    async fn full_durability_syncs_before_settlements_and_leaves_reservations_to_the_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (mut writer, store) = writer(dir.path()).await;
        let synced = |w: &SqliteWriter| w.wal.as_ref().unwrap().syncs();

        let r = reserve("r1");
        let (ops, mut replies, mut rx) = one(Op::Reserve(r.clone()));
        writer.commit(&ops, &mut replies).await;
        assert_eq!(rx.try_recv().unwrap().unwrap(), Done::Admitted);
        assert_eq!(synced(&writer), 0, "a reservation batch waited for a sync");
        assert!(writer.background.marked(), "left unsynced for nobody");

        let (ops, mut replies, mut rx) = one(Op::Settle(settle(&r)));
        writer.commit(&ops, &mut replies).await;
        assert_eq!(rx.try_recv().unwrap().unwrap(), Done::Settled);
        assert_eq!(synced(&writer), 1, "a settlement answered without a sync");
        assert!(!writer.background.marked(), "the writer's sync covers it");

        // A failing batch (table gone): no sync, no mark, the caller gets the error.
        writer
            .conn
            .execute_batch("ALTER TABLE usage_records RENAME TO gone")
            .unwrap();
        let (ops, mut replies, mut rx) = one(Op::Settle(settle(&reserve("r2"))));
        writer.commit(&ops, &mut replies).await;
        assert!(rx.try_recv().unwrap().is_err());
        assert_eq!(synced(&writer), 1);
        assert!(!writer.background.marked());
        store.close().await;
    }

    /// Reservations wait up to [`LINGER`] for a settlement; nothing else waits.
    #[test]
    fn reservations_linger_for_a_settlement_and_settlements_never_wait() {
        let (tx, mut rx) = mpsc::channel::<(Op, Reply)>(8);
        let r = reserve("r1");
        let queue = |op: Op| tx.try_send((op, oneshot::channel().0)).unwrap();

        // A batch with a settlement goes at once.
        queue(Op::Reserve(reserve("r2")));
        let (mut ops, mut replies, _) = one(Op::Settle(settle(&r)));
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 1, "a settlement was held");
        assert_eq!(rx.len(), 1);
        rx.try_recv().unwrap();

        // So does one with another service's rows, which somebody awaits.
        queue(Op::Reserve(reserve("r2")));
        let write = Op::Write(crate::usage::ledger::Write {
            team_id: "t1".into(),
            statements: Vec::new(),
            durable: false,
            audit: Vec::new(),
            audit_only_if_stored: false,
            outbox: Vec::new(),
        });
        let (mut ops, mut replies, _) = one(write);
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 1, "a write was held");
        assert_eq!(rx.len(), 1);

        // Reservations and a settlement queued behind them: one commit.
        queue(Op::Settle(settle(&r)));
        let (mut ops, mut replies, _) = one(Op::Reserve(r.clone()));
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 3, "the settlement joined the reservations");
        assert_eq!(replies.len(), 3);
        assert!(rx.is_empty());

        // Reservations alone: held for LINGER, then committed.
        let (mut ops, mut replies, _) = one(Op::Reserve(r.clone()));
        let started = Instant::now();
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 1);
        assert!(started.elapsed() >= LINGER, "not held");

        // A batch already at batch_max goes as it is.
        queue(Op::Settle(settle(&r)));
        let (mut ops, mut replies, _) = one(Op::Reserve(r.clone()));
        linger(&mut rx, 1, &mut ops, &mut replies);
        assert_eq!((ops.len(), rx.len()), (1, 1));

        // A closed queue ends the linger with what is left queued.
        drop(tx);
        let (mut ops, mut replies, _) = one(Op::Reserve(r));
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 2);
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 2);
    }

    #[test]
    fn block_on_returns_the_output_or_none_at_the_deadline() {
        assert_eq!(block_on(async { 7 }, None), Some(7));
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let deadline = Instant::now() + Duration::from_millis(5);
        assert_eq!(block_on(rx, Some(deadline)), None);
        assert!(Instant::now() >= deadline);
        drop(tx);

        // Woken from another thread while parked.
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let sender = std::thread::spawn(move || {
            #[allow(clippy::disallowed_methods)]
            // a plain thread of the test, not a runtime worker
            std::thread::sleep(Duration::from_millis(5));
            tx.send(3).unwrap();
        });
        assert_eq!(block_on(rx, None), Some(Ok(3)));
        sender.join().unwrap();
    }
}
