//! Server-sent events over a provider response, with the stream idle
//! timeout and the attempt deadline applied to every event.

use super::ProviderError;
use crate::resilience::instant_after;
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
    let mut inner = Box::pin(without_bom(response.bytes_stream()).eventsource());
    async_stream::stream! {
        loop {
            // `idle` comes from config: an absurd value must not overflow.
            let wait_until = deadline.min(instant_after(Instant::now(), idle));
            match tokio::time::timeout_at(wait_until, inner.next()).await {
                Err(_) => { yield Err(ProviderError::Timeout); return; }
                Ok(None) => return,
                Ok(Some(Ok(e))) => yield Ok(SseEvent { event: e.event, data: e.data }),
                Ok(Some(Err(eventsource_stream::EventStreamError::Transport(e)))) => {
                    yield Err(super::http::transport_error(&e));
                    return;
                }
                Ok(Some(Err(e))) => {
                    // The parser's message quotes the offending input
                    // (upstream text): keep only what kind of error it was.
                    let kind = match e {
                        eventsource_stream::EventStreamError::Utf8(_) => "invalid UTF-8",
                        _ => "unparsable event",
                    };
                    yield Err(ProviderError::Malformed(format!("SSE framing: {kind}")));
                    return;
                }
            }
        }
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Drops a leading UTF-8 byte-order mark, which SSE allows. The
/// `eventsource-stream` parser slices it off at a wrong byte index and
/// panics (0.2.3, unmaintained), so it never gets to see one.
fn without_bom<S, E>(bytes: S) -> impl Stream<Item = Result<bytes::Bytes, E>> + Send + 'static
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    E: Send + 'static,
{
    async_stream::stream! {
        futures::pin_mut!(bytes);
        // Hold back the first bytes until it is clear whether they are a BOM
        // (it may arrive split across chunks).
        let mut head = Vec::new();
        while head.len() < BOM.len() {
            match bytes.next().await {
                Some(Ok(chunk)) => head.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    yield Err(e);
                    return;
                }
                None => break,
            }
        }
        let start = if head.starts_with(BOM) { BOM.len() } else { 0 };
        if head.len() > start {
            yield Ok(bytes::Bytes::copy_from_slice(&head[start..]));
        }
        while let Some(item) = bytes.next().await {
            yield item;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn strip(chunks: &[&[u8]]) -> Vec<u8> {
        let items: Vec<Result<bytes::Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        let out: Vec<_> = without_bom(futures::stream::iter(items)).collect().await;
        out.into_iter().flat_map(|b| b.unwrap().to_vec()).collect()
    }

    #[tokio::test]
    async fn a_leading_bom_is_dropped_even_when_split() {
        assert_eq!(strip(&[b"\xEF\xBB\xBFdata: x\n\n"]).await, b"data: x\n\n");
        assert_eq!(strip(&[b"\xEF", b"\xBB", b"\xBFdata: x"]).await, b"data: x");
        assert_eq!(
            strip(&[b"da", b"ta: \xEF\xBB\xBF"]).await,
            b"data: \xEF\xBB\xBF"
        );
        assert_eq!(strip(&[b"\xEF"]).await, b"\xEF");
        assert!(strip(&[]).await.is_empty());
    }

    /// A response with `body`, as if read from the network.
    fn response(body: &'static str) -> Response {
        Response::from(axum::http::Response::new(body))
    }

    #[tokio::test]
    async fn an_absurd_idle_timeout_does_not_overflow() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let events: Vec<_> = events(response("data: a\n\ndata: b\n\n"), Duration::MAX, deadline)
            .collect()
            .await;
        let data: Vec<_> = events.into_iter().map(|e| e.unwrap().data).collect();
        assert_eq!(data, ["a", "b"]);
    }
}
