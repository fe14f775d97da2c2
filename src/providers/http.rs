//! HTTP plumbing shared by every wire format: the clients ([`clients`]),
//! sending with a deadline, and classifying failures (status,
//! `Retry-After`, transport errors) into [`ProviderError`].
//!
//! Error bodies are read only to pick out the provider's error *type/code*
//! (e.g. `rate_limit_error`, `overloaded_error`); the human-readable message
//! and the rest of the body are dropped here, so they can never reach logs
//! shown to clients or the client itself.

mod clients;

pub use clients::{Clients, Lease};

use super::{CompletionRequest, ConnectFailure, ProbeRequest, ProviderError};
use reqwest::{RequestBuilder, Response, header::HeaderMap};
use serde::de::DeserializeOwned;
use std::{
    future::Future,
    time::{Duration, SystemTime},
};
use tokio::time::Instant;

/// Largest error body we read to find the error type.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// Adds the trace headers every provider call carries.
/// `traceparent` names the current span (the provider attempt) when trace
/// export is on, so the provider's spans nest under it; otherwise the
/// caller's own `traceparent` passes through.
pub fn with_trace(builder: RequestBuilder, req: &CompletionRequest) -> RequestBuilder {
    let builder = builder.header("x-trace-id", &req.trace_id);
    match crate::telemetry::otel::traceparent_of(&tracing::Span::current())
        .or_else(|| req.traceparent.clone())
    {
        Some(tp) => builder.header("traceparent", tp),
        None => builder,
    }
}

/// Sends a request, waiting at most until `deadline` for the response head.
/// A non-2xx status becomes [`ProviderError::Status`].
///
/// Not an `async fn`, and the error path is boxed: this future lives inside
/// every call in flight, for as long as the provider takes. An `async fn`
/// would keep the request builder (272 bytes) for its whole life and be as
/// large as its largest state, the error body's read (920 bytes in all);
/// this one holds the pending request and its timer (~150 bytes), and
/// only a failed call allocates the read.
pub fn send(
    builder: RequestBuilder,
    deadline: Instant,
) -> impl Future<Output = Result<Response, ProviderError>> + Send {
    let pending = builder.send();
    async move {
        let response = match tokio::time::timeout_at(deadline, pending).await {
            Err(_) => return Err(ProviderError::Timeout),
            Ok(Err(e)) => return Err(transport_error(&e)),
            Ok(Ok(r)) => r,
        };
        if response.status().is_success() {
            return Ok(response);
        }
        Err(Box::pin(status_error(response, deadline)).await)
    }
}

/// Sends a probe's request (a model list, built by `request` on one of
/// `clients`): a 2xx whose body is JSON of at most `limit` bytes, read
/// before the probe's deadline, proves the provider answers.
pub async fn probe(
    clients: &Clients,
    request: impl FnOnce(&reqwest::Client) -> RequestBuilder,
    probe: &ProbeRequest,
    limit: usize,
) -> Result<(), ProviderError> {
    let lease = clients.lease();
    let builder = request(lease.client()).header("x-trace-id", &probe.trace_id);
    let response = lease.checked(send(builder, probe.deadline).await)?;
    lease.checked(json::<serde::de::IgnoredAny>(response, probe.deadline, limit).await)?;
    Ok(())
}

/// The [`ProviderError::Status`] of a non-2xx response.
async fn status_error(response: Response, deadline: Instant) -> ProviderError {
    let status = response.status().as_u16();
    let retry_after = retry_after(response.headers(), SystemTime::now());
    // The body only serves to name the error type; a slow or broken body
    // must not hold the attempt past its deadline.
    let body = tokio::time::timeout_at(deadline, read_capped(response))
        .await
        .unwrap_or_default();
    ProviderError::Status {
        status,
        retry_after,
        summary: error_type(&body),
    }
}

async fn read_capped(mut response: Response) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= MAX_ERROR_BODY {
            break;
        }
    }
    body
}

/// Reads and decodes a JSON success body before `deadline`, refusing one
/// longer than `limit` bytes (by its `Content-Length` at once, else as soon
/// as it grows past it).
pub async fn json<T: DeserializeOwned>(
    response: Response,
    deadline: Instant,
    limit: usize,
) -> Result<T, ProviderError> {
    let bytes = match tokio::time::timeout_at(deadline, read_limited(response, limit)).await {
        Err(_) => return Err(ProviderError::Timeout),
        Ok(read) => read?,
    };
    serde_json::from_slice(&bytes).map_err(|e| malformed_json(&e))
}

async fn read_limited(mut response: Response, limit: usize) -> Result<Vec<u8>, ProviderError> {
    let too_large = ProviderError::TooLarge { limit };
    let announced = response.content_length().unwrap_or(0);
    if announced > u64::try_from(limit).unwrap_or(u64::MAX) {
        return Err(too_large);
    }
    let mut body = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
    while let Some(chunk) = response.chunk().await.map_err(|e| transport_error(&e))? {
        if body.len().saturating_add(chunk.len()) > limit {
            return Err(too_large);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Appends a streamed piece to the text accumulated so far, refusing to grow
/// it past `limit` bytes.
pub fn append_limited(text: &mut String, piece: &str, limit: usize) -> Result<(), ProviderError> {
    if text.len().saturating_add(piece.len()) > limit {
        return Err(ProviderError::TooLarge { limit });
    }
    text.push_str(piece);
    Ok(())
}

/// A JSON decoding failure, described by its category and position only:
/// serde's own message can quote upstream text.
pub fn malformed_json(e: &serde_json::Error) -> ProviderError {
    ProviderError::Malformed(format!(
        "response JSON: {:?} error at line {} column {}",
        e.classify(),
        e.line(),
        e.column()
    ))
}

/// Maps a reqwest transport failure.
///
/// reqwest reports every failure to read a body frame as a *decode* error,
/// the connection's own included (a reset or a GOAWAY while the body is
/// read): those are connection failures, counted once per connection event
/// by the breaker, not a malformed answer per call. Only a decode error
/// with no transport error under it is the body's fault.
pub fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Timeout
    } else if e.is_decode() && !from_transport(e) {
        ProviderError::Malformed("undecodable body".into())
    } else {
        ProviderError::Connect(connect_failure(e))
    }
}

/// Whether a transport error (h2's, hyper's, the socket's) lies under `e`.
fn from_transport(e: &reqwest::Error) -> bool {
    sources(e)
        .any(|err| err.is::<h2::Error>() || err.is::<hyper::Error>() || err.is::<std::io::Error>())
}

/// The errors under `e`, nearest first.
fn sources(e: &reqwest::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    use std::error::Error as _;
    std::iter::successors(e.source(), |&err| err.source())
}

/// What broke under a reqwest error, read from its source chain (hyper's
/// and h2's own errors, the socket's), and whether the request provably
/// never reached the provider.
pub fn connect_failure(e: &reqwest::Error) -> ConnectFailure {
    if e.is_connect() {
        // Refused, unreachable, DNS, TLS handshake: nothing was sent.
        return ConnectFailure::Connect;
    }
    for err in sources(e) {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2_failure(h2);
        }
        if let Some(hyper) = err.downcast_ref::<hyper::Error>() {
            if hyper.is_canceled() {
                // The connection went away before the request was written.
                return ConnectFailure::Canceled;
            }
            if hyper.is_incomplete_message() {
                return ConnectFailure::IncompleteMessage;
            }
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) {
                return ConnectFailure::ConnectionReset;
            }
        }
    }
    if e.is_body() || e.is_decode() {
        ConnectFailure::Body
    } else {
        ConnectFailure::Transport
    }
}

/// An HTTP/2 stream's error: RFC 9113 §8.7 names what was never processed.
fn h2_failure(e: &h2::Error) -> ConnectFailure {
    if e.is_remote() && e.reason() == Some(h2::Reason::REFUSED_STREAM) {
        return ConnectFailure::RefusedStream;
    }
    // h2 gives this error only to our streams above the GOAWAY's last
    // stream ID; the ones at or below it fail later, as the connection
    // closes (broken pipe), and may have been processed.
    if e.is_go_away() && e.is_remote() {
        return ConnectFailure::GoAway;
    }
    if e.is_io() {
        return ConnectFailure::ConnectionReset;
    }
    if e.is_reset() {
        return ConnectFailure::StreamReset;
    }
    ConnectFailure::Protocol
}

/// The provider's error type/code from a JSON error body, e.g.
/// `{"error":{"type":"rate_limit_error"}}` (OpenAI, Anthropic) or
/// `{"error":{"status":"RESOURCE_EXHAUSTED"}}` (Gemini). Never the message.
pub fn error_type(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return "non-JSON error body".into();
    };
    let err = v.get("error").unwrap_or(&v);
    let pick = |key: &str| err.get(key).and_then(|x| x.as_str()).map(str::to_owned);
    let kind = pick("type")
        .or_else(|| pick("status"))
        .or_else(|| pick("code"));
    let kind: String = kind
        .unwrap_or_else(|| "unknown".into())
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect();
    kind
}

pub use crate::domain::MAX_RETRY_AFTER;

/// How long the provider asked us to wait: `retry-after-ms` (OpenAI),
/// `retry-after` in seconds or as an HTTP-date; at most [`MAX_RETRY_AFTER`].
/// A negative, NaN, infinite or unparsable value is ignored (`None`), so a
/// header can never panic the request (`Duration::from_secs_f64` would).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(wait) = get("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| capped_secs(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = get("retry-after")?;
    if let Ok(secs) = value.parse::<f64>() {
        return capped_secs(secs);
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let at = SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(u64::try_from(at.timestamp()).ok()?))?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// `secs` as a wait of at most [`MAX_RETRY_AFTER`]; `None` when it is not a
/// non-negative finite number.
fn capped_secs(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // `+ 0.0` turns -0.0 into 0.0; what is left only fails when too large.
    Some(
        Duration::try_from_secs_f64(secs + 0.0).map_or(MAX_RETRY_AFTER, |d| d.min(MAX_RETRY_AFTER)),
    )
}

#[cfg(test)]
mod tests;
