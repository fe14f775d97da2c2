//! HTTP plumbing shared by every wire format: client construction, sending
//! with a deadline, and classifying failures (status, `Retry-After`,
//! transport errors) into [`ProviderError`].
//!
//! Error bodies are read only to pick out the provider's error *type/code*
//! (e.g. `rate_limit_error`, `overloaded_error`); the human-readable message
//! and the rest of the body are dropped here, so they can never reach logs
//! shown to clients or the client itself.

use super::{CompletionRequest, ConnectFailure, ProviderError};
use crate::config::ProviderConfig;
use reqwest::{RequestBuilder, Response, header::HeaderMap};
use serde::de::DeserializeOwned;
use std::{
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime},
};
use tokio::time::Instant;

/// Largest error body we read to find the error type.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// The HTTP clients of one provider, each with its own connection pool,
/// filled in order: a call takes the first client carrying fewer than
/// `streams_per_connection` calls.
///
/// hyper's client keeps one HTTP/2 connection per host and does not open a
/// second when the server's `SETTINGS_MAX_CONCURRENT_STREAMS` is reached
/// (hyperium/hyper#2197, #3623): further calls wait inside it, unseen by
/// the provider's limits and counted as provider latency. With calls that
/// last seconds that caps a provider at ~100–256 calls in flight, so each
/// batch of `streams_per_connection` calls gets a client of its own. A
/// client is built on first use: under ordinary load a provider has one
/// connection, and its calls share it. Over HTTP/1.1 the split only divides
/// the idle pool.
///
/// A connection-level failure (a reset, a GOAWAY, a connection closed under
/// a call) makes the failed call's client suspect: its pool may hold more
/// connections that died the same way (a server that dropped its idle
/// keep-alive connections resets every one of them on reuse). The slot then
/// gets a fresh client with an empty pool for the calls that follow; calls
/// already on the old one finish on it.
pub struct Clients {
    config: ProviderConfig,
    per_client: usize,
    /// The first is built at start-up, the others on first use.
    slots: Box<[Arc<Slot>]>,
}

#[derive(Default)]
struct Slot {
    client: Mutex<Built>,
    in_flight: AtomicUsize,
}

/// A slot's client (`None` until built, or once replaced), and how many
/// times it was replaced.
#[derive(Default)]
struct Built {
    client: Option<reqwest::Client>,
    generation: u64,
}

/// One call's client and its place on it, released when dropped: hold it
/// until the call's response has been read to the end.
pub struct Lease {
    client: reqwest::Client,
    slot: Arc<Slot>,
    generation: u64,
}

impl Lease {
    /// The client to send the call with.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Hands back `result`, first replacing this call's client with a fresh
    /// one when its connection broke (see [`Clients`] and
    /// [`ConnectFailure::broke_connection`]).
    pub fn checked<T>(&self, result: Result<T, ProviderError>) -> Result<T, ProviderError> {
        if let Err(e) = &result
            && e.connection_failure()
                .is_some_and(ConnectFailure::broke_connection)
        {
            let mut built = lock(&self.slot.client);
            if built.generation == self.generation {
                // Built anew on the slot's next lease.
                built.client = None;
                built.generation += 1;
            }
        }
        result
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A slot's lock holds only a client handle: still usable after a panic.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Clients {
    /// The clients of one provider; the first is built now, so a config the
    /// client cannot work with fails at start-up.
    pub fn new(config: &ProviderConfig) -> Result<Self, ProviderError> {
        let per_client = config.streams_per_connection.max(1);
        let count = config.max_concurrency.div_ceil(per_client).max(1);
        let slots: Box<[Arc<Slot>]> = (0..count).map(|_| Arc::default()).collect();
        if let Some(first) = slots.first() {
            lock(&first.client).client = Some(client(config, per_client)?);
        }
        Ok(Self {
            config: config.clone(),
            per_client,
            slots,
        })
    }

    /// A client for one call: the first with room, else the least loaded
    /// (more calls than `max_concurrency` allows are not sent anyway).
    pub fn lease(&self) -> Lease {
        let take = |in_flight: &AtomicUsize| {
            in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < self.per_client).then_some(n + 1)
                })
                .is_ok()
        };
        let slot = match self.slots.iter().find(|slot| take(&slot.in_flight)) {
            Some(slot) => slot,
            None => {
                // All full: the least loaded, the first on a tie.
                let least = self
                    .slots
                    .iter()
                    .min_by_key(|slot| slot.in_flight.load(Ordering::Acquire));
                let Some(slot) = least.or(self.slots.first()) else {
                    unreachable!("a provider has at least one client slot")
                };
                slot.in_flight.fetch_add(1, Ordering::AcqRel);
                slot
            }
        };
        self.lease_of(slot)
    }

    /// A lease on `slot`, whose place is already taken. Its client is built
    /// on first use (or after a connection failure replaced it) from the
    /// config the first one was built from, so building cannot fail
    /// differently; should it fail, the call uses another slot's client.
    fn lease_of(&self, slot: &Arc<Slot>) -> Lease {
        let mut built = lock(&slot.client);
        let generation = built.generation;
        let client = match &built.client {
            Some(client) => client.clone(),
            None => match client(&self.config, self.per_client) {
                Ok(client) => built.client.insert(client).clone(),
                Err(_) => {
                    drop(built);
                    self.any_client()
                }
            },
        };
        Lease {
            client,
            slot: Arc::clone(slot),
            generation,
        }
    }

    /// Some built client (the first slot's is built at start-up).
    fn any_client(&self) -> reqwest::Client {
        self.slots
            .iter()
            .find_map(|s| lock(&s.client).client.clone())
            .unwrap_or_default()
    }

    /// Clients built so far (one connection pool each).
    #[cfg(test)]
    fn built(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| lock(&s.client).client.is_some())
            .count()
    }
}

/// Builds one HTTP client of a provider, keeping up to `idle` connections.
fn client(config: &ProviderConfig, idle: usize) -> Result<reqwest::Client, ProviderError> {
    let builder = reqwest::Client::builder();
    let tls = config
        .base_url
        .as_deref()
        .is_none_or(|url| url.starts_with("https://"));
    let builder = match (config.http2(), tls) {
        (false, _) => builder.http1_only(),
        // ALPN offers h2 (and http/1.1 for a server without it).
        (true, true) => builder,
        (true, false) => builder.http2_prior_knowledge(),
    };
    let builder = match &config.tls_ca {
        Some(path) => {
            let unusable =
                |e: String| ProviderError::Unsupported(format!("tls_ca {}: {e}", path.display()));
            let pem = std::fs::read(path).map_err(|e| unusable(e.to_string()))?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| unusable(e.to_string()))?;
            builder.tls_certs_merge(certs)
        }
        None => builder,
    };
    builder
        // Calls that never reached the provider are resent by the router,
        // which counts and shows them; reqwest would resend protocol NACKs
        // on its own, unseen.
        .retry(reqwest::retry::never())
        .connect_timeout(config.connect_timeout)
        // Nagle off upstream too: small request frames must not wait for ACKs.
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(idle.min(config.max_concurrency).max(1))
        .user_agent(concat!("ai-orchestrator/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ProviderError::Unsupported(format!("cannot build HTTP client: {e}")))
}

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

/// Longest wait we take from a provider's `Retry-After` (5 min; the
/// breaker's cooldown cap is the same). A larger value (`1e20`, a date
/// decades ahead) is a broken or hostile header, not advice; and no retry
/// ever sleeps past the request deadline.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

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
