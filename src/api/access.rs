//! One access log line per RPC when it ends (unary reply or stream's last status): method,
//! code, reason, latency, attempts, provider, model, trace ID and team. Never content.
//!
//! [`super::metrics_layer`] writes the line; handlers add what only they know through
//! [`note`], into a task-local record the layer sets around the handler's future (and each
//! poll of a response stream, see [`Noted`]), so no signature in between changes.

use std::{
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

/// What the handler learnt about an RPC, for its access line.
#[derive(Debug, Default)]
pub struct Fields {
    pub trace_id: String,
    pub team: String,
    /// The stable `ErrorInfo.reason` of a failure.
    pub reason: &'static str,
    pub attempts: usize,
    pub provider: String,
    pub model: String,
}

/// An RPC's access record, shared by the layer and the handler.
#[derive(Debug, Clone, Default)]
pub struct Record(Arc<Mutex<Fields>>);

impl Record {
    fn update(&self, f: impl FnOnce(&mut Fields)) {
        // Plain data written in single steps: usable after a panic.
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Writes the access line of an RPC (or HTTP edge request) that ended with `code` after
    /// `took`; health checks, reflection and unknown methods at debug, lest probes every
    /// few seconds drown the calls.
    pub(crate) fn log(&self, method: &'static str, code: &str, took: Duration) {
        let f = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Whole microseconds: a float of nanoseconds prints as 1.2345670000000001.
        let latency_ms = u64::try_from(took.as_micros()).unwrap_or(u64::MAX) as f64 / 1000.0;
        macro_rules! line {
            ($level:expr) => {
                tracing::event!(
                    target: "ai_orchestrator::access",
                    $level,
                    rpc = method,
                    code,
                    reason = f.reason,
                    latency_ms,
                    attempts = f.attempts,
                    provider = %f.provider,
                    model = %f.model,
                    trace_id = %f.trace_id,
                    team_id = %f.team,
                    "rpc"
                )
            };
        }
        if method.starts_with("ai.orchestrator.") || method.contains(" /v1/") {
            line!(tracing::Level::INFO);
        } else {
            line!(tracing::Level::DEBUG);
        }
    }
}

tokio::task_local! {
    static CURRENT: Record;
}

/// Notes something about the current RPC for its access line; nothing
/// outside an RPC (a CLI command, a test calling a handler directly).
pub fn note(f: impl FnOnce(&mut Fields)) {
    let _ = CURRENT.try_with(|record| record.update(f));
}

/// `future`, with `record` as the current RPC's while it is polled.
pub(crate) fn scope<F: Future>(
    record: Record,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<Record, F> {
    CURRENT.scope(record, future)
}

/// A response stream polled with its RPC's record current, so failures and
/// answers produced while streaming are noted like a unary call's.
pub struct Noted<S> {
    inner: S,
    record: Record,
}

impl<S> Noted<S> {
    /// `inner`, noting into the current RPC's record (none outside one).
    pub fn current(inner: S) -> Self {
        let record = CURRENT.try_with(Record::clone).unwrap_or_default();
        Self { inner, record }
    }
}

impl<S: futures::Stream + Unpin> futures::Stream for Noted<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        let record = this.record.clone();
        CURRENT.sync_scope(record, || Pin::new(&mut this.inner).poll_next(cx))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn notes_reach_the_rpcs_record_and_nothing_else() {
        note(|f| f.team = "outside".into());
        let record = Record::default();
        scope(record.clone(), async {
            note(|f| f.team = "t1".into());
            tokio::task::yield_now().await;
            note(|f| f.attempts = 2);
        })
        .await;
        let fields = record.0.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!((fields.team.as_str(), fields.attempts), ("t1", 2));
    }

    #[tokio::test]
    async fn a_stream_notes_into_the_record_current_when_it_was_made() {
        use futures::StreamExt;
        let record = Record::default();
        let stream = scope(record.clone(), async {
            Noted::current(Box::pin(futures::stream::iter([1, 2]).map(|i| {
                note(|f| f.attempts += i);
                i
            })))
        })
        .await;
        // Polled outside the scope, as hyper polls a response body.
        assert_eq!(stream.collect::<Vec<_>>().await, [1, 2]);
        let fields = record.0.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(fields.attempts, 3);
    }
}
