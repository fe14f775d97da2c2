//! How a provider call failed, and what that means for retries and breakers.

use std::time::Duration;

/// Longest `Retry-After` honoured (as the breaker's cooldown cap): more is a broken header.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// A failed provider call, classified per SPEC §4. Text fields are short log summaries,
/// never raw upstream bodies, so nothing of those can reach a client.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ProviderError {
    #[error("timed out")]
    Timeout,
    /// The caller's deadline ended the attempt: not the provider's fault (set by the router).
    #[error("the caller's deadline ended the attempt")]
    Deadline,
    #[error("connection failed: {}", .0.as_str())]
    Connect(ConnectFailure),
    #[error("HTTP {status}: {summary}")]
    Status {
        status: u16,
        retry_after: Option<Duration>,
        /// Provider error type/code, never the raw body.
        summary: String,
    },
    #[error("malformed response: {0}")]
    Malformed(String),
    /// The answer grew past `max_response_bytes`: a provider failure that falls back.
    #[error("response larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("{0}")]
    Unsupported(String),
}

/// What broke at the connection level: the transport's own error kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectFailure {
    Connect,
    RefusedStream,
    GoAway,
    /// The connection went away before the request was written.
    Canceled,
    StreamReset,
    Protocol,
    ConnectionReset,
    IncompleteMessage,
    Body,
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

    /// Never seen by the provider (no connection, refused, past a GOAWAY's last stream ID per
    /// RFC 9113 §8.7, never written): resent at once within the same attempt.
    pub const fn unsent(self) -> bool {
        matches!(
            self,
            ConnectFailure::Connect
                | ConnectFailure::RefusedStream
                | ConnectFailure::GoAway
                | ConnectFailure::Canceled
        )
    }

    /// The connection itself broke, so others of its pool may be dead too (`http::Clients`).
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
    /// The connection-level failure: it fails every call on its connection, so counts once.
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
            // Bad structure is asked of the next target, not re-rolled at the same one.
            ProviderError::Malformed(_)
            | ProviderError::TooLarge { .. }
            | ProviderError::Unsupported(_) => false,
            ProviderError::Deadline => false,
        }
    }

    /// Counts against the breaker; 4xx but 408 is our fault and 429 a cooldown, so neither does.
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

    /// The error type or transport kind, for logs; never a body or model output (user text).
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
