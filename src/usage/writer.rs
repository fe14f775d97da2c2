//! Group commit: one task owns ledger writes and applies whatever operations
//! are queued as one transaction, so one fsync covers a whole burst while
//! every caller still waits until its own operation is durable.

use super::ledger::{self, Done, Op};
use crate::store::Store;
use std::sync::Arc;
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};

/// Queue depth before callers wait for the writer (back-pressure).
const QUEUE: usize = 4096;

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

/// Handle to the writer task; cheap to clone.
#[derive(Clone, Debug)]
pub struct LedgerWriter {
    tx: mpsc::Sender<(Op, Reply)>,
}

impl LedgerWriter {
    /// Starts the writer. It stops once every handle is dropped, or when
    /// `stop` turns true: then it refuses new operations, commits everything
    /// already queued (the usage flush on shutdown) and exits.
    pub fn spawn(
        store: Store,
        batch_max: usize,
        stop: watch::Receiver<bool>,
    ) -> (Self, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let handle = tokio::spawn(run(store, rx, batch_max.max(1), stop));
        (Self { tx }, handle)
    }

    /// Queues `op` and waits until it is committed.
    pub async fn submit(&self, op: Op) -> Result<Done, WriteError> {
        let (reply, done) = oneshot::channel();
        self.tx
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
    store: Store,
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
        match ledger::apply(&store, &ops).await {
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
