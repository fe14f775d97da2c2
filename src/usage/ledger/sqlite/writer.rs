//! The SQLite ledger writer's thread: it owns the writer's connection
//! ([`super`]), waits for the queue itself, and applies each batch where it
//! stands: one commit, then, for settlements, the WAL sync they wait for
//! ([`super::wal`]).
//!
//! Why a thread and not a task handing batches to the blocking pool: a
//! settlement then went through four wake-ups (the writer task, a blocking
//! thread, the caller, the writer task again through the blocking task's
//! handle), and the writer task, once woken, queued behind every request
//! task on the runtime's workers. Now it is two: this thread, then the
//! caller. Batches still form while a batch commits and syncs.
//!
//! It must never answer a settlement before its commit is synced (with
//! `sqlite_synchronous = "full"`), and never hold an operation somebody
//! waits for.

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

/// How long the writer holds a batch of reservations alone before
/// committing it, waiting for a settlement to share its commit.
///
/// Nobody waits for a reservation (it is admitted in memory), but every
/// commit costs the single writer ~0.1 ms of work it cannot do for a
/// settlement somebody does wait for. A call's own settlement often comes
/// within this time, and under load other calls' do, so most reservations
/// ride along: one commit per call instead of two. It bounds how long a
/// reservation stays only in memory, i.e. what a process crash can lose
/// (docs/metering.md): ~0.1–2 ms after admission with this value, against
/// ~0.1–1 ms without it.
pub const LINGER: Duration = Duration::from_millis(1);

/// The SQLite writer's connection and how its WAL reaches the disk.
pub struct SqliteWriter {
    conn: rusqlite::Connection,
    /// `"full"` (`database.sqlite_synchronous`): the WAL, synced by the
    /// writer after each commit that carries settlements, before it answers
    /// them. `None` for `"normal"`: nobody waits for a sync.
    wal: Option<Wal>,
    /// Syncs the commits the writer leaves unsynced (all of them in
    /// `"normal"`, reservation-only batches in `"full"`) within
    /// [`wal::BACKGROUND_EVERY`]; it ends with the writer.
    background: wal::Background,
    admission: Arc<Admission>,
}

impl SqliteWriter {
    /// The writer over `conn`, the ledger's file at `path`; with `full`
    /// durability it syncs the WAL before answering settlements.
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

    /// Commits `ops` and answers `replies`: reservations once committed,
    /// settlements once the WAL is synced (see [`super::wal`]).
    /// Blocking.
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
        // This sync covers every commit so far, the unsynced reservations
        // included.
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
    /// Holds a batch of reservations alone for up to [`LINGER`], until a
    /// settlement (or `batch_max` operations) joins it; a batch with
    /// anything but reservations goes at once.
    fn gather(
        &mut self,
        rx: &mut mpsc::Receiver<(Op, Reply)>,
        batch_max: usize,
        ops: &mut Vec<Op>,
        replies: &mut Vec<Reply>,
    ) {
        linger(rx, batch_max, ops, replies);
    }

    /// Blocking (this is the writer's own thread): commits, then syncs for
    /// the settlements.
    async fn apply(&mut self, ops: &[Op], replies: &mut Vec<Reply>) {
        let applied = std::panic::AssertUnwindSafe(self.commit(ops, replies))
            .catch_unwind()
            .await;
        if applied.is_err() {
            // The transaction rolled back when it dropped; the replies
            // still held are dropped by the loop, so their callers see the
            // writer as stopped (STORAGE_UNAVAILABLE, as any ledger
            // failure). The next batch goes on.
            tracing::error!(batch = ops.len(), "ledger batch panicked");
        }
    }
}

/// Holds a batch of reservations alone for up to [`LINGER`], until a
/// settlement (or `batch_max` operations) joins it; a batch with anything
/// but reservations goes at once ([`Op::goes_at_once`]).
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

/// Runs `future` on this thread until it completes (`Some`) or `deadline`
/// passes (`None`).
///
/// Hand-written rather than `futures::executor::block_on` (no deadline) or
/// tokio's `Handle::block_on` with a timer: this thread must not depend on
/// the runtime's timer (1 ms ticks, and gone once the runtime shuts down
/// while the writer drains), and parking with a timeout is all it takes.
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
        // A wake between the poll and the park leaves the thread's token
        // set, so the park returns at once; spurious returns just poll
        // again.
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

/// Wakes a parked thread.
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
            prompt_owner: None,
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

    /// With full durability the writer syncs the WAL before it answers a
    /// settlement, and leaves a batch of reservations alone (nobody waits
    /// for it) to the background thread, so a settlement arriving meanwhile
    /// does not queue behind a sync. A failed batch is neither synced nor
    /// marked.
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

        // A batch that fails (the table is gone) is rolled back: no sync,
        // no mark, its caller gets the error.
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

    /// A reservation waits on the writer for a settlement to share its
    /// commit, up to [`LINGER`]; a settlement or a write is never held back.
    #[test]
    fn reservations_linger_for_a_settlement_and_settlements_never_wait() {
        let (tx, mut rx) = mpsc::channel::<(Op, Reply)>(8);
        let r = reserve("r1");
        let queue = |op: Op| tx.try_send((op, oneshot::channel().0)).unwrap();

        // A batch with a settlement goes at once: what is queued behind it
        // stays for the next batch.
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
        });
        let (mut ops, mut replies, _) = one(write);
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 1, "a write was held");
        assert_eq!(rx.len(), 1);

        // Reservations, then a settlement queued behind them: taken
        // together, one commit.
        queue(Op::Settle(settle(&r)));
        let (mut ops, mut replies, _) = one(Op::Reserve(r.clone()));
        linger(&mut rx, 8, &mut ops, &mut replies);
        assert_eq!(ops.len(), 3, "the settlement joined the reservations");
        assert_eq!(replies.len(), 3);
        assert!(rx.is_empty());

        // Reservations alone, nothing else queued: held for LINGER, then
        // committed as they are.
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
