//! How a provider call failed, and what that means for retries and breakers.

use std::time::Duration;

/// Longest wait we take from a provider's `Retry-After` (5 min; the
/// breaker's cooldown cap is the same). A larger value (`1e20`, a date
/// decades ahead) is a broken or hostile header, not advice; and no retry
/// ever sleeps past the request deadline.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// A failed provider call, classified per SPEC §4.
///
/// The text fields are short summaries for logs (status line, provider error
/// type); raw upstream bodies are never kept here, so nothing of them can
/// reach a client.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ProviderError {
    /// No complete answer before the provider's own timeout (incl. stream
    /// idle).
    #[error("timed out")]
    Timeout,
    /// The caller's deadline (gRPC deadline or `budget.max_latency_ms`)
    /// ended the attempt before the provider's own timeout: the caller's
    /// doing, so it never counts against the provider. Set by the router,
    /// which knows both deadlines; a provider only ever reports `Timeout`.
    #[error("the caller's deadline ended the attempt")]
    Deadline,
    /// The connection could not be made, refused the request, or broke
    /// mid-call.
    #[error("connection failed: {}", .0.as_str())]
    Connect(ConnectFailure),
    /// The provider answered with a non-success HTTP status.
    #[error("HTTP {status}: {summary}")]
    Status {
        /// HTTP status code (429, 500, 529, ...).
        status: u16,
        /// Parsed `Retry-After` / `retry-after-ms`, when sent.
        retry_after: Option<Duration>,
        /// Provider error type/code, never the raw body.
        summary: String,
    },
    /// The answer could not be understood (bad JSON, missing fields, a
    /// structured answer that fails validation, a truncated stream).
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The answer (a body, a streamed line or event, the streamed text)
    /// grew past the provider's `max_response_bytes`: a provider failure
    /// that falls back, and the reason no call holds more than that.
    #[error("response larger than {limit} bytes")]
    TooLarge {
        /// The provider's `max_response_bytes`.
        limit: usize,
    },
    /// The provider cannot be built from its config.
    #[error("{0}")]
    Unsupported(String),
}

/// What broke at the connection level: the transport's own error kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The connection could not be made (refused, unreachable, DNS, TLS).
    Connect,
    /// The server refused the HTTP/2 stream (`REFUSED_STREAM`).
    RefusedStream,
    /// The HTTP/2 stream was above a GOAWAY's last stream ID.
    GoAway,
    /// The connection went away before the request was written.
    Canceled,
    /// The server reset the HTTP/2 stream.
    StreamReset,
    /// The HTTP/2 connection failed with a protocol error.
    Protocol,
    /// The connection was reset or closed under the call.
    ConnectionReset,
    /// The server closed the connection before the whole response.
    IncompleteMessage,
    /// Reading the response body failed.
    Body,
    /// Any other transport failure.
    Transport,
}

impl ConnectFailure {
    /// Stable name for logs and the `cause` metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConnectFailure::Connect => "connect",
            ConnectFailure::RefusedStream => "h2_refused_stream",
            ConnectFailure::GoAway => "h2_goaway",
            ConnectFailure::Canceled => "canceled",
            ConnectFailure::StreamReset => "h2_reset",
            ConnectFailure::Protocol => "h2_protocol",
            ConnectFailure::ConnectionReset => "connection_reset",
            ConnectFailure::IncompleteMessage => "incomplete_message",
            ConnectFailure::Body => "body",
            ConnectFailure::Transport => "transport",
        }
    }

    /// The provider cannot have seen the request: the connection was never
    /// made, the stream was refused or above a GOAWAY's last stream ID
    /// (RFC 9113 §8.7), or it was never written. Such a call is resent at
    /// once within the same attempt.
    pub const fn unsent(self) -> bool {
        matches!(
            self,
            ConnectFailure::Connect
                | ConnectFailure::RefusedStream
                | ConnectFailure::GoAway
                | ConnectFailure::Canceled
        )
    }

    /// The connection itself broke: other connections of the same pool may
    /// be dead the same way (see `http::Clients`). A refused stream leaves
    /// a healthy connection that now knows the server's limit; a failed
    /// connect never had one.
    pub const fn broke_connection(self) -> bool {
        matches!(
            self,
            ConnectFailure::GoAway
                | ConnectFailure::Canceled
                | ConnectFailure::Protocol
                | ConnectFailure::ConnectionReset
                | ConnectFailure::IncompleteMessage
        )
    }
}

impl ProviderError {
    /// The connection-level failure, if this is one: on a multiplexed
    /// connection one such event fails every call on it at once, so the
    /// breaker counts it once (`resilience::breaker`).
    pub fn connection_failure(&self) -> Option<ConnectFailure> {
        match self {
            ProviderError::Connect(failure) => Some(*failure),
            _ => None,
        }
    }

    /// Stable, low-cardinality code for `meta.attempts[].error_code` and metrics.
    pub fn code(&self) -> String {
        match self {
            ProviderError::Timeout => "TIMEOUT".into(),
            ProviderError::Deadline => "DEADLINE_EXCEEDED".into(),
            ProviderError::Connect(_) => "CONNECTION_ERROR".into(),
            ProviderError::Status { status: 429, .. } => "RATE_LIMITED".into(),
            ProviderError::Status { status: 529, .. } => "OVERLOADED".into(),
            ProviderError::Status { status, .. } => format!("HTTP_{status}"),
            ProviderError::Malformed(_) => "MALFORMED_RESPONSE".into(),
            ProviderError::TooLarge { .. } => "RESPONSE_TOO_LARGE".into(),
            ProviderError::Unsupported(_) => "UNSUPPORTED".into(),
        }
    }

    /// Worth another try at the same target (after backoff).
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::Timeout | ProviderError::Connect(_) => true,
            ProviderError::Status { status, .. } => matches!(status, 408 | 429) || *status >= 500,
            // A model that produced bad structure is asked again at the next
            // target rather than re-rolled at the same one.
            ProviderError::Malformed(_)
            | ProviderError::TooLarge { .. }
            | ProviderError::Unsupported(_) => false,
            // Nothing is left of the time another try would need.
            ProviderError::Deadline => false,
        }
    }

    /// Counts as a failure for the provider's circuit breaker. Client errors
    /// (4xx other than 408) are our fault, and 429 is a cooldown, not a failure.
    pub fn counts_against_breaker(&self) -> bool {
        match self {
            ProviderError::Timeout
            | ProviderError::Connect(_)
            | ProviderError::Malformed(_)
            | ProviderError::TooLarge { .. } => true,
            ProviderError::Status { status, .. } => *status == 408 || *status >= 500,
            ProviderError::Unsupported(_) | ProviderError::Deadline => false,
        }
    }

    /// The provider asked us to back off (HTTP 429).
    pub fn is_rate_limited(&self) -> bool {
        matches!(self, ProviderError::Status { status: 429, .. })
    }

    /// How long the provider asked us to wait, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// A short description for the attempt's log line: the provider's
    /// error type (`rate_limit_error`, `overloaded_error`, ...) or the
    /// transport's error kind. Never the body, and nothing for a malformed
    /// answer: its description can quote the model's output (a parse error
    /// naming the value it rejected), and model output can echo the user's
    /// text, which stays out of logs.
    pub fn summary(&self) -> Option<&str> {
        match self {
            ProviderError::Status { summary, .. } => Some(summary),
            ProviderError::Connect(failure) => Some(failure.as_str()),
            _ => None,
        }
    }

    /// True for a timeout (reported as a TIMEOUT attempt outcome).
    pub fn is_timeout(&self) -> bool {
        matches!(self, ProviderError::Timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> ProviderError {
        ProviderError::Status {
            status: code,
            retry_after: None,
            summary: String::new(),
        }
    }

    #[test]
    fn classification_follows_the_spec() {
        // (error, retryable, counts against breaker)
        let table = [
            (ProviderError::Timeout, true, true),
            (
                ProviderError::Connect(ConnectFailure::ConnectionReset),
                true,
                true,
            ),
            (status(500), true, true),
            (status(503), true, true),
            (status(529), true, true),
            (status(408), true, true),
            (status(429), true, false),
            (status(400), false, false),
            (status(401), false, false),
            (status(404), false, false),
            (ProviderError::Malformed("x".into()), false, true),
            (ProviderError::Deadline, false, false),
            (ProviderError::TooLarge { limit: 1 }, false, true),
        ];
        for (err, retryable, counts) in table {
            assert_eq!(err.is_retryable(), retryable, "{err:?} retryable");
            assert_eq!(err.counts_against_breaker(), counts, "{err:?} counts");
        }
        assert_eq!(status(529).code(), "OVERLOADED");
        assert_eq!(status(429).code(), "RATE_LIMITED");
        assert_eq!(status(502).code(), "HTTP_502");
    }
}
