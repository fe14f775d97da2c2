//! Server-sent events over a provider response, with the stream idle
//! timeout and the attempt deadline applied to every event.

use super::ProviderError;
use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use reqwest::Response;
use std::time::Duration;
use tokio::time::Instant;

/// One SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` name; empty when the server sent none (OpenAI, Gemini).
    pub event: String,
    /// `data:` payload.
    pub data: String,
}

/// The events of `response`. An event that does not arrive within `idle` of
/// the previous one, or before `deadline`, ends the stream with
/// [`ProviderError::Timeout`]; a broken connection with
/// [`ProviderError::Connect`]; bad framing with [`ProviderError::Malformed`].
/// The stream ends (`None`) when the server closes it.
pub fn events(
    response: Response,
    idle: Duration,
    deadline: Instant,
) -> impl Stream<Item = Result<SseEvent, ProviderError>> + Send + 'static {
    let mut inner = response.bytes_stream().eventsource();
    async_stream::stream! {
        loop {
            let wait_until = deadline.min(Instant::now() + idle);
            match tokio::time::timeout_at(wait_until, inner.next()).await {
                Err(_) => { yield Err(ProviderError::Timeout); return; }
                Ok(None) => return,
                Ok(Some(Ok(e))) => yield Ok(SseEvent { event: e.event, data: e.data }),
                Ok(Some(Err(eventsource_stream::EventStreamError::Transport(e)))) => {
                    yield Err(super::http::transport_error(&e));
                    return;
                }
                Ok(Some(Err(e))) => {
                    yield Err(ProviderError::Malformed(format!("SSE framing: {e}")));
                    return;
                }
            }
        }
    }
}
