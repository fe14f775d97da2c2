//! Group commit: whatever is queued is one transaction, one loop ([`run`])
//! per writer; a failed batch is applied again op by op ([`isolate`]).

use super::{Done, Op, postgres};
use crate::{
    store::{Store, StoreError},
    telemetry::metrics,
};
use std::{future::Future, sync::Arc, time::Instant};
use tokio::sync::{mpsc, oneshot, watch};

/// Where a caller hears how its operation went.
pub(super) type Reply = oneshot::Sender<Result<Done, Arc<crate::store::StoreError>>>;

/// How one operation of a batch went.
pub(super) type Outcome = Result<Done, Arc<StoreError>>;

/// Answers the replies whose outcome `now` accepts, keeping the others in order.
pub(super) fn answer(
    replies: &mut Vec<Reply>,
    outcomes: Vec<Outcome>,
    now: impl Fn(&Outcome) -> bool,
) {
    let mut later = Vec::new();
    for (reply, outcome) in replies.drain(..).zip(outcomes) {
        if now(&outcome) {
            let _ = reply.send(outcome);
        } else {
            later.push(reply);
        }
    }
    *replies = later;
}

/// Operations applied in one transaction, with what came of it.
pub(super) type Unit<'a, R> = (&'a [Op], R);

/// Applies `ops` as one transaction, else each alone; each unit as last applied.
pub(super) async fn isolate<'o, T, E, F>(
    ops: &'o [Op],
    mut apply: impl FnMut(&'o [Op]) -> F,
) -> Vec<Unit<'o, Result<T, E>>>
where
    E: std::fmt::Display,
    F: Future<Output = Result<T, E>>,
{
    match apply(ops).await {
        Err(e) if ops.len() > 1 => {
            tracing::warn!(error = %e, batch = ops.len(), "ledger batch failed; applying its operations one by one");
            let mut units = Vec::with_capacity(ops.len());
            for op in ops.chunks(1) {
                units.push((op, apply(op).await));
            }
            units
        }
        whole => vec![(ops, whole)],
    }
}

/// The outcome of every operation of `units` (see [`isolate`]), in order.
pub(super) fn outcomes(units: Vec<Unit<'_, Result<Vec<Done>, StoreError>>>) -> Vec<Outcome> {
    let mut out = Vec::new();
    for (ops, result) in units {
        match result {
            Ok(done) => out.extend(done.into_iter().map(Ok)),
            Err(e) => {
                tracing::error!(error = %e, batch = ops.len(), "ledger batch failed");
                let e = Arc::new(e);
                out.extend(ops.iter().map(|_| Err(e.clone())));
            }
        }
    }
    out
}

/// Waits for the next batch (up to `batch_max`); false once closed and empty.
pub(super) async fn next_batch(
    rx: &mut mpsc::Receiver<(Op, Reply)>,
    stop: &mut watch::Receiver<bool>,
    batch_max: usize,
    ops: &mut Vec<Op>,
    replies: &mut Vec<Reply>,
) -> bool {
    loop {
        // Once stopping, refuse new work and drain. Checked every turn: a stop
        // during a batch would else leave the receiver waiting for live handles.
        if *stop.borrow() {
            rx.close();
        }
        let next = tokio::select! {
            biased;
            next = rx.recv() => next,
            _ = stop.wait_for(|s| *s), if !*stop.borrow() => continue,
        };
        let Some((op, reply)) = next else {
            return false;
        };
        ops.push(op);
        replies.push(reply);
        take_queued(rx, batch_max, ops, replies);
        return true;
    }
}

/// Adds what is already queued to the batch, up to `batch_max` operations.
pub(super) fn take_queued(
    rx: &mut mpsc::Receiver<(Op, Reply)>,
    batch_max: usize,
    ops: &mut Vec<Op>,
    replies: &mut Vec<Reply>,
) {
    while ops.len() < batch_max {
        let Ok((op, reply)) = rx.try_recv() else {
            break;
        };
        ops.push(op);
        replies.push(reply);
    }
}

/// What gathers, applies and answers a writer's batches for [`run`].
pub(super) trait Applier {
    /// Takes more queued operations into the batch; by default nothing.
    fn gather(
        &mut self,
        _rx: &mut mpsc::Receiver<(Op, Reply)>,
        _batch_max: usize,
        _ops: &mut Vec<Op>,
        _replies: &mut Vec<Reply>,
    ) {
    }

    /// Applies `ops` (see [`isolate`]) and answers `replies`, in order.
    fn apply(&mut self, ops: &[Op], replies: &mut Vec<Reply>) -> impl Future<Output = ()>;
}

/// The group-commit loop of one writer, until its queue is closed and drained.
pub(super) async fn run<A: Applier>(
    mut applier: A,
    mut rx: mpsc::Receiver<(Op, Reply)>,
    batch_max: usize,
    mut stop: watch::Receiver<bool>,
) {
    let mut ops = Vec::with_capacity(batch_max);
    let mut replies = Vec::with_capacity(batch_max);
    while next_batch(&mut rx, &mut stop, batch_max, &mut ops, &mut replies).await {
        applier.gather(&mut rx, batch_max, &mut ops, &mut replies);
        applier.apply(&ops, &mut replies).await;
        ops.clear();
        replies.clear();
    }
}

/// A PostgreSQL writer: each batch one transaction on a pooled connection.
pub(super) struct Pool(pub(super) Store);

impl Applier for Pool {
    async fn apply(&mut self, ops: &[Op], replies: &mut Vec<Reply>) {
        let started = Instant::now();
        let store = &self.0;
        let units = isolate(ops, move |batch| postgres::apply(store, batch)).await;
        metrics::ledger_commit(ops.len(), started.elapsed());
        answer(replies, outcomes(units), |_| true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::{
        UsageRecord,
        ledger::{Reserve, Settle},
    };

    fn reserve(team: &str) -> Op {
        Op::Reserve(Reserve {
            team_id: team.into(),
            requests: 1,
            ..Reserve::default()
        })
    }

    fn settle(team: &str) -> Op {
        Op::Settle(Settle {
            reservations: Vec::new(),
            charge: false,
            recorded: true,
            record: UsageRecord {
                team_id: team.into(),
                ..Default::default()
            },
            month_start_ms: 0,
            day_start_ms: 0,
            user_id: String::new(),
            prompt_owner: None,
            audit: Vec::new(),
            outbox: Vec::new(),
            triggers: None,
        })
    }

    /// A failed batch is applied again op by op: only the faulty one fails.
    #[tokio::test]
    async fn a_failed_batch_is_retried_operation_by_operation() {
        let ops = [reserve("a"), settle("bad"), reserve("c")];
        let bad = |op: &Op| matches!(op, Op::Settle(s) if s.record.team_id == "bad");
        let mut calls = Vec::new();
        let units = isolate(&ops, |batch| {
            calls.push(batch.len());
            std::future::ready(if batch.iter().any(bad) {
                Err("constraint")
            } else {
                Ok(batch.len())
            })
        })
        .await;
        assert_eq!(calls, [3, 1, 1, 1]);
        let results: Vec<_> = units.iter().map(|(b, r)| (b.len(), *r)).collect();
        assert_eq!(results, [(1, Ok(1)), (1, Err("constraint")), (1, Ok(1))]);

        let mut calls = 0;
        let units = isolate(&ops, |batch| {
            calls += 1;
            std::future::ready(Ok::<_, &str>(batch.len()))
        })
        .await;
        assert_eq!((calls, units.len()), (1, 1));
        let lone = isolate(&ops[1..2], |_| {
            std::future::ready(Err::<(), _>("constraint"))
        })
        .await;
        assert_eq!(lone.len(), 1);
    }
}
