//! HTTP plumbing shared by every wire format: the clients, sending with a deadline, and mapping
//! failures (status, `Retry-After`, transport) to [`ProviderError`]. Of an error body only the
//! provider's error type/code is kept, so its message can never reach logs or clients.

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

/// Adds the trace headers: `traceparent` names the current span (the attempt) when trace export
/// is on, so the provider's spans nest under it; otherwise the caller's passes through.
pub fn with_trace(builder: RequestBuilder, req: &CompletionRequest) -> RequestBuilder {
    let builder = builder.header("x-trace-id", &req.trace_id);
    match crate::telemetry::otel::traceparent_of(&tracing::Span::current())
        .or_else(|| req.traceparent.clone())
    {
        Some(tp) => builder.header("traceparent", tp),
        None => builder,
    }
}

/// Sends a request, waiting until `deadline` for the response head; a non-2xx becomes
/// [`ProviderError::Status`]. Not an `async fn`, and the error path boxed: this future lives as
/// long as the call, so it holds only the pending request and its timer (ADR 0009).
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

/// Sends a probe's request: a 2xx whose body is JSON of at most `limit` bytes, read before the
/// deadline, proves the provider answers.
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

async fn status_error(response: Response, deadline: Instant) -> ProviderError {
    let status = response.status().as_u16();
    let retry_after = retry_after(response.headers(), SystemTime::now());
    // Only to name the error type: a slow body must not hold the attempt past its deadline.
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

/// Decodes a JSON body read before `deadline`, refusing more than `limit` bytes.
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

/// Appends a streamed piece to `text`, refusing to grow it past `limit` bytes.
pub fn append_limited(text: &mut String, piece: &str, limit: usize) -> Result<(), ProviderError> {
    if text.len().saturating_add(piece.len()) > limit {
        return Err(ProviderError::TooLarge { limit });
    }
    text.push_str(piece);
    Ok(())
}

/// A JSON decoding failure by category and position only: serde's message can quote upstream text.
pub fn malformed_json(e: &serde_json::Error) -> ProviderError {
    ProviderError::Malformed(format!(
        "response JSON: {:?} error at line {} column {}",
        e.classify(),
        e.line(),
        e.column()
    ))
}

/// Maps a reqwest transport failure. reqwest calls any failure to read a body frame a *decode*
/// error, a reset or GOAWAY included: those are connection failures (counted once per event);
/// only a decode error with no transport error under it is the body's fault.
pub fn transport_error(e: &reqwest::Error) -> ProviderError {
    if e.is_timeout() {
        ProviderError::Timeout
    } else if e.is_decode() && !from_transport(e) {
        ProviderError::Malformed("undecodable body".into())
    } else {
        ProviderError::Connect(connect_failure(e))
    }
}

fn from_transport(e: &reqwest::Error) -> bool {
    sources(e)
        .any(|err| err.is::<h2::Error>() || err.is::<hyper::Error>() || err.is::<std::io::Error>())
}

fn sources(e: &reqwest::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    use std::error::Error as _;
    std::iter::successors(e.source(), |&err| err.source())
}

/// What broke under a reqwest error, and whether the request provably never reached the provider.
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
    // h2 gives this only to our streams above the GOAWAY's last stream ID; those at or below it
    // fail later, as the connection closes, and may have been processed.
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

/// The provider's error type/code from a JSON error body (`error.type` for OpenAI and Anthropic,
/// `error.status` for Gemini). Never the message.
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

/// The wait the provider asked for: `retry-after-ms` (OpenAI), else `retry-after` in seconds or
/// as an HTTP-date, at most [`MAX_RETRY_AFTER`]. Negative, NaN or infinite values are ignored
/// rather than panicking `Duration::from_secs_f64`.
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
