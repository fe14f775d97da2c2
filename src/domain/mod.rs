//! Plain domain types every layer may use: no I/O, no import from another module of the crate.

pub mod completion;
pub mod headers;
pub mod json;
pub mod provider_error;
pub mod sms;
pub mod tokens;
pub mod tool_call;

pub use completion::{
    ChatMessage, Citation, Completion, CompletionRequest, FinishReason, JsonSchemaFormat,
    StreamEvent, TokenUsage,
};
pub use headers::Headers;
pub use provider_error::{ConnectFailure, MAX_RETRY_AFTER, ProviderError};
pub use tool_call::{ToolCall, ToolChoice, ToolOutcome, ToolSpec, WireNames};

use std::time::Duration;
use tokio::time::Instant;

/// Where a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Channel {
    Sms,
    Web,
    #[default]
    System,
}

/// Latency or success first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// A human waits: fail over rather than wait.
    #[default]
    Interactive,
    /// Nobody waits: full retry schedule.
    Background,
}

impl Channel {
    /// Lower-case name for records.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Web => "web",
            Channel::System => "system",
        }
    }
}

impl Priority {
    /// Lower-case name for records.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Background => "background",
        }
    }
}

/// What a key may do beyond calling tasks; each role's tool capabilities are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Like a caller, but never runs a tool with side effects.
    Viewer,
    /// Calls the AI RPCs and tools and reads usage for its teams.
    Caller,
    /// Also manages prompts (`PromptAdmin`) and reads its teams' audit log (`AuditService`).
    Admin,
}

impl Role {
    /// The config/database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Caller => "caller",
            Role::Admin => "admin",
        }
    }

    /// Parses the config/database spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "viewer" => Some(Role::Viewer),
            "caller" => Some(Role::Caller),
            "admin" => Some(Role::Admin),
            _ => None,
        }
    }
}

/// The 32 bytes of a 64-character hex SHA-256 (a key's stored hash); `None` if malformed.
pub fn parse_hash(hex_hash: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_hash.trim(), &mut out).ok()?;
    Some(out)
}

/// `now + d` that saturates (about a century ahead) where `Instant + Duration` would panic.
pub fn instant_after(now: Instant, d: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(d)
        .or_else(|| now.checked_add(CENTURY))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_after_saturates_instead_of_panicking() {
        let now = Instant::now();
        assert_eq!(
            instant_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert!(instant_after(now, Duration::MAX) > now);
    }
}
