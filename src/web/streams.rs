//! The edge's open SSE streams at shutdown: they run on through the drain,
//! and once `server.shutdown_grace` is over each ends with a last event
//! saying so. Its call is dropped then, settling what it reserved at its
//! estimate while the ledger writer still runs: the edge's task ends only
//! after its streams have (or a second more).

use axum::response::sse::Event;
use futures::{Stream, StreamExt};
use std::{convert::Infallible, sync::Arc, time::Duration};
use tokio::sync::watch;

/// How long the edge waits for cut streams to be dropped.
const DROP_WAIT: Duration = Duration::from_secs(1);

/// The streams under way, and the signal that cuts them.
#[derive(Clone)]
pub(super) struct Streams {
    open: Arc<watch::Sender<usize>>,
    cut: watch::Receiver<bool>,
}

/// Ends every stream of [`Streams`] when told to.
pub(super) struct Cutter {
    open: Arc<watch::Sender<usize>>,
    cut: watch::Sender<bool>,
}

/// A new set of streams and its cutter.
pub(super) fn new() -> (Streams, Cutter) {
    let open = Arc::new(watch::Sender::new(0));
    let (cut, cut_rx) = watch::channel(false);
    let streams = Streams {
        open: Arc::clone(&open),
        cut: cut_rx,
    };
    (streams, Cutter { open, cut })
}

impl Cutter {
    /// Cuts every stream, then waits (briefly) until they are dropped.
    pub(super) async fn cut(self) {
        let _ = self.cut.send(true);
        let mut open = self.open.subscribe();
        let _ = tokio::time::timeout(DROP_WAIT, open.wait_for(|n| *n == 0)).await;
    }
}

/// One stream counted in [`Streams::open`] while it lives.
struct Counted(Arc<watch::Sender<usize>>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Streams {
    /// `events`, ended by `last` if the edge is cut first.
    pub(super) fn bounded(
        &self,
        events: impl Stream<Item = Result<Event, Infallible>> + Send + 'static,
        last: Vec<Event>,
    ) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
        self.open.send_modify(|n| *n += 1);
        let counted = Counted(Arc::clone(&self.open));
        let mut cut = self.cut.clone();
        async_stream::stream! {
            let _counted = counted;
            futures::pin_mut!(events);
            loop {
                tokio::select! {
                    item = events.next() => match item {
                        Some(item) => yield item,
                        None => return,
                    },
                    // The guard `wait_for` returns is not `Send`: dropped here.
                    () = async { drop(cut.wait_for(|c| *c).await) } => {
                        for event in last {
                            yield Ok(event);
                        }
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_cut_stream_ends_with_its_last_event_and_is_counted_out() {
        let (streams, cutter) = new();
        let endless = futures::stream::pending::<Result<Event, Infallible>>();
        let bounded = streams.bounded(endless, vec![Event::default().data("bye")]);
        let reader = tokio::spawn(async move { bounded.count().await });
        cutter.cut().await;
        assert_eq!(reader.await.ok(), Some(1));
        assert_eq!(*streams.open.borrow(), 0);
    }
}
