//! Server-sent events over a provider response, with the stream idle timeout, the attempt
//! deadline and a size limit applied to every event.
//!
//! The parser is ours: `eventsource-stream` buffers an unterminated line without limit and panics
//! on a leading BOM, and no maintained crate takes a per-provider size limit. WHATWG rules: lines
//! end in CRLF, LF or CR; `:` starts a comment; `data` lines join with `\n`; a blank line
//! dispatches an event with data; `id` and `retry` are ignored (a provider stream is never
//! resumed); an event unfinished at the end is dropped.

use super::ProviderError;
use crate::domain::instant_after;
use futures::{Stream, StreamExt};
use reqwest::Response;
use std::{collections::VecDeque, time::Duration};
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
/// [`ProviderError::Connect`]; bad framing with [`ProviderError::Malformed`];
/// a line or an event's data longer than `limit` bytes with
/// [`ProviderError::TooLarge`]. The stream ends (`None`) when the server
/// closes it.
pub fn events(
    response: Response,
    idle: Duration,
    deadline: Instant,
    limit: usize,
) -> impl Stream<Item = Result<SseEvent, ProviderError>> + Send + 'static {
    let mut body = Box::pin(response.bytes_stream());
    let mut parser = Parser::new(limit);
    async_stream::stream! {
        loop {
            while let Some(event) = parser.next_event() {
                yield Ok(event);
            }
            // `idle` comes from config: an absurd value must not overflow.
            let wait_until = deadline.min(instant_after(Instant::now(), idle));
            match tokio::time::timeout_at(wait_until, body.next()).await {
                Err(_) => { yield Err(ProviderError::Timeout); return; }
                Ok(None) => return,
                Ok(Some(Err(e))) => { yield Err(super::http::transport_error(&e)); return; }
                Ok(Some(Ok(chunk))) => {
                    if let Err(e) = parser.feed(&chunk) {
                        yield Err(e);
                        return;
                    }
                }
            }
        }
    }
}

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// An incremental event-stream parser: bytes in, in any chunks; events out.
/// It holds at most one unfinished line and one event's data, each at most
/// `limit` bytes.
#[derive(Debug)]
pub struct Parser {
    limit: usize,
    /// Bytes of the line being read (no terminator).
    line: Vec<u8>,
    /// The last byte fed was a CR: an LF right after it ends nothing.
    after_cr: bool,
    /// Still at the start of the stream, where a BOM is dropped.
    at_start: bool,
    event: String,
    data: String,
    has_data: bool,
    ready: VecDeque<SseEvent>,
}

impl Parser {
    /// A parser refusing lines and events longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            line: Vec::new(),
            after_cr: false,
            at_start: true,
            event: String::new(),
            data: String::new(),
            has_data: false,
            ready: VecDeque::new(),
        }
    }

    /// The next finished event, if any.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.ready.pop_front()
    }

    /// Feeds the next bytes of the stream.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<(), ProviderError> {
        if self.at_start {
            // Hold back the first bytes until it is clear whether they
            // start with a BOM (it may arrive split across chunks).
            let wanted = BOM.len().saturating_sub(self.line.len()).min(chunk.len());
            self.line.extend_from_slice(&chunk[..wanted]);
            chunk = &chunk[wanted..];
            if self.line.len() < BOM.len() && BOM.starts_with(&self.line) {
                return Ok(());
            }
            self.at_start = false;
            let held = std::mem::take(&mut self.line);
            let held = held.strip_prefix(BOM).unwrap_or(&held);
            self.feed_lines(held)?;
        }
        self.feed_lines(chunk)
    }

    fn feed_lines(&mut self, mut chunk: &[u8]) -> Result<(), ProviderError> {
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        while let Some(end) = chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
            self.push_line_bytes(&chunk[..end])?;
            let line = std::mem::take(&mut self.line);
            self.on_line(&line)?;
            // Keep the buffer's capacity for the next line.
            self.line = line;
            self.line.clear();
            let crlf = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if crlf {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
        }
        self.push_line_bytes(chunk)
    }

    fn push_line_bytes(&mut self, bytes: &[u8]) -> Result<(), ProviderError> {
        if self.line.len().saturating_add(bytes.len()) > self.limit {
            return Err(ProviderError::TooLarge { limit: self.limit });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn on_line(&mut self, line: &[u8]) -> Result<(), ProviderError> {
        if line.is_empty() {
            self.dispatch();
            return Ok(());
        }
        if line.first() == Some(&b':') {
            return Ok(());
        }
        // The parser's input is upstream text: the error names the kind of
        // problem only, never the bytes.
        let line = std::str::from_utf8(line)
            .map_err(|_| ProviderError::Malformed("SSE framing: invalid UTF-8".into()))?;
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                let added = value.len() + usize::from(self.has_data);
                if self.data.len().saturating_add(added) > self.limit {
                    return Err(ProviderError::TooLarge { limit: self.limit });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => {
                self.event.clear();
                self.event.push_str(value);
            }
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self) {
        if self.has_data {
            self.ready.push_back(SseEvent {
                event: std::mem::take(&mut self.event),
                data: std::mem::take(&mut self.data),
            });
        } else {
            self.event.clear();
        }
        self.has_data = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&[u8]]) -> Vec<bytes::Bytes> {
        parts
            .iter()
            .map(|p| bytes::Bytes::copy_from_slice(p))
            .collect()
    }

    fn parse(parts: &[&[u8]], limit: usize) -> Result<Vec<(String, String)>, ProviderError> {
        let mut p = Parser::new(limit);
        let mut out = Vec::new();
        for chunk in chunks(parts) {
            p.feed(&chunk)?;
            while let Some(e) = p.next_event() {
                out.push((e.event, e.data));
            }
        }
        Ok(out)
    }

    fn data(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(e, d)| ((*e).to_owned(), (*d).to_owned()))
            .collect()
    }

    #[test]
    fn events_in_every_line_ending_and_split_anywhere() {
        let stream = b"event: message_start\r\ndata: {\"a\":1}\r\n\r\n: ping\n\ndata: x\rdata:y\r\rid: 7\nretry: 5\ndata\n\nevent: lone\n\n";
        let expected = data(&[("message_start", "{\"a\":1}"), ("", "x\ny"), ("", "")]);
        assert_eq!(parse(&[stream], 1024).unwrap(), expected);
        // Every split point, including between CR and LF.
        for at in 0..stream.len() {
            let (a, b) = stream.split_at(at);
            assert_eq!(parse(&[a, b], 1024).unwrap(), expected, "split at {at}");
        }
        // Byte by byte.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(parse(&bytes, 1024).unwrap(), expected);
    }

    #[test]
    fn a_leading_bom_is_dropped_even_when_split() {
        let one = |parts: &[&[u8]]| parse(parts, 64).unwrap();
        assert_eq!(one(&[b"\xEF\xBB\xBFdata: x\n\n"]), data(&[("", "x")]));
        assert_eq!(
            one(&[b"\xEF", b"\xBB", b"\xBFdata: x\n\n"]),
            data(&[("", "x")])
        );
        // Only at the very start.
        assert_eq!(
            one(&[b"da", b"ta: \xEF\xBB\xBF\n\n"]),
            data(&[("", "\u{feff}")])
        );
        assert_eq!(one(&[b"\xEF"]), data(&[]));
        assert_eq!(one(&[b"d", b"ata: y\n\n"]), data(&[("", "y")]));
    }

    #[test]
    fn an_unfinished_event_at_the_end_is_dropped() {
        assert_eq!(
            parse(&[b"data: a\n\ndata: b\n"], 64).unwrap(),
            data(&[("", "a")])
        );
    }

    #[test]
    fn lines_and_events_past_the_limit_are_refused_never_buffered() {
        let too_large = Err(ProviderError::TooLarge { limit: 16 });
        // An endless line, in small chunks: refused once past the limit.
        let endless: Vec<&[u8]> = std::iter::repeat_n(&b"xxxx"[..], 5).collect();
        assert_eq!(parse(&endless, 16), too_large);
        // Many short data lines that add up.
        assert_eq!(parse(&[b"data: 12345678\ndata: 12345678\n"], 16), too_large);
        // Exactly at the limit is fine.
        assert_eq!(
            parse(&[b"data:1234567890\n\n"], 16).unwrap(),
            data(&[("", "1234567890")])
        );
        assert_eq!(
            parse(&[b"data: \xff\n\n"], 16),
            Err(ProviderError::Malformed(
                "SSE framing: invalid UTF-8".into()
            ))
        );
    }

    /// A response with `body`, as if read from the network.
    fn response(body: &'static str) -> Response {
        Response::from(axum::http::Response::new(body))
    }

    #[tokio::test]
    async fn an_absurd_idle_timeout_does_not_overflow() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let events: Vec<_> = events(
            response("data: a\n\ndata: b\n\n"),
            Duration::MAX,
            deadline,
            1024,
        )
        .collect()
        .await;
        let data: Vec<_> = events.into_iter().map(|e| e.unwrap().data).collect();
        assert_eq!(data, ["a", "b"]);
    }
}
