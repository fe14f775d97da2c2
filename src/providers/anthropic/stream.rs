//! Anthropic's streaming events, folded into our [`Step`]s one at a time.
//!
//! Only `message_stop` finishes a stream: a connection that closes earlier
//! is a truncated answer, reported by the caller as malformed.
//!
//! An `error` event arrives after a 200 head, so it has no HTTP status; it
//! gets the status Anthropic documents for that error type (529 for
//! `overloaded_error`, 429 for `rate_limit_error`, ...), so retries and the
//! breaker treat it exactly like the same error sent up front. An unknown
//! type is a server-side failure mid-answer and becomes 500 (`api_error`).

use super::{MessagesResponseHead, WireUsage, finish_reason};
use crate::providers::{Completion, ProviderError, TokenUsage, http, tool_calls::CallBuffer};
use serde::Deserialize;

/// What one event means for the caller.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// Nothing to pass on (`ping`, block boundaries, unknown events).
    Skip,
    /// More answer text.
    Delta(String),
    /// The finished answer.
    Done(Completion),
}

/// What we know of the answer so far.
#[derive(Debug)]
pub(super) struct State {
    text: String,
    usage: WireUsage,
    stop_reason: Option<String>,
    /// The answering model, from `message_start`.
    model: Option<String>,
    /// Most bytes of text (and, apart, of tool-call IDs, names and
    /// arguments) it may accumulate.
    limit: usize,
    /// `tool_use` blocks in pieces, by block index (bounded in count and
    /// bytes, IDs and names included).
    calls: CallBuffer,
}

impl Default for State {
    fn default() -> Self {
        Self::new(crate::config::DEFAULT_MAX_RESPONSE_BYTES)
    }
}

/// The events we act on, by their `type` (always equal to the SSE `event:`).
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    MessageStart {
        message: MessagesResponseHead,
    },
    ContentBlockStart {
        #[serde(default)]
        index: u64,
        content_block: BlockStart,
    },
    ContentBlockDelta {
        #[serde(default)]
        index: u64,
        delta: BlockDelta,
    },
    MessageDelta {
        #[serde(default)]
        delta: Option<MessageDeltaBody>,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        error: ErrorBody,
    },
    /// `ping`, `content_block_stop`, and event types Anthropic adds later
    /// (its docs ask clients to ignore unknown events).
    #[serde(other)]
    Ignored,
}

/// The head of a content block: a `tool_use` names its call; any other
/// block's text comes in deltas.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockStart {
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum BlockDelta {
    TextDelta {
        text: String,
    },
    /// A piece of a `tool_use` block's input: JSON text split anywhere.
    InputJsonDelta {
        #[serde(default)]
        partial_json: String,
    },
    /// `thinking_delta`, `citations_delta`, ...
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct MessageDeltaBody {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// The error type only; the human-readable message is never deserialized.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    #[serde(rename = "type")]
    kind: String,
}

impl State {
    /// No answer yet; the text may grow to `limit` bytes.
    pub(super) fn new(limit: usize) -> Self {
        Self {
            text: String::new(),
            usage: WireUsage::default(),
            stop_reason: None,
            model: None,
            limit,
            calls: CallBuffer::default(),
        }
    }

    /// Folds in one event's `data:` payload.
    pub(super) fn on_event(&mut self, data: &str) -> Result<Step, ProviderError> {
        if data.trim().is_empty() {
            return Ok(Step::Skip);
        }
        let event: Event = serde_json::from_str(data).map_err(|e| {
            // Position only: serde's message can quote upstream text.
            ProviderError::Malformed(format!(
                "stream event JSON ({:?} error at column {})",
                e.classify(),
                e.column()
            ))
        })?;
        Ok(match event {
            Event::MessageStart { message } => {
                self.model = message.model;
                self.merge_usage(message.usage);
                Step::Skip
            }
            Event::ContentBlockStart {
                index,
                content_block: BlockStart::ToolUse { id, name },
            } => {
                self.calls
                    .add(index, Some(&id), Some(&name), "", self.limit)?;
                Step::Skip
            }
            Event::ContentBlockDelta {
                delta: BlockDelta::TextDelta { text },
                ..
            } => {
                http::append_limited(&mut self.text, &text, self.limit)?;
                Step::Delta(text)
            }
            Event::ContentBlockDelta {
                index,
                delta: BlockDelta::InputJsonDelta { partial_json },
            } => {
                self.calls
                    .add(index, None, None, &partial_json, self.limit)?;
                Step::Skip
            }
            Event::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.and_then(|d| d.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                self.merge_usage(usage);
                Step::Skip
            }
            Event::MessageStop => Step::Done(self.finish()?),
            Event::Error { error } => return Err(stream_error(&error.kind, data)),
            Event::ContentBlockStart {
                content_block: BlockStart::Other,
                ..
            }
            | Event::ContentBlockDelta {
                delta: BlockDelta::Other,
                ..
            }
            | Event::Ignored => Step::Skip,
        })
    }

    /// Counts in `message_delta` are cumulative, so a later value replaces
    /// an earlier one field by field.
    fn merge_usage(&mut self, later: Option<WireUsage>) {
        let Some(later) = later else { return };
        let u = &mut self.usage;
        u.input_tokens = later.input_tokens.or(u.input_tokens);
        u.output_tokens = later.output_tokens.or(u.output_tokens);
        u.cache_creation_input_tokens = later
            .cache_creation_input_tokens
            .or(u.cache_creation_input_tokens);
        u.cache_read_input_tokens = later.cache_read_input_tokens.or(u.cache_read_input_tokens);
    }

    fn finish(&mut self) -> Result<Completion, ProviderError> {
        Ok(Completion {
            tool_calls: std::mem::take(&mut self.calls).finish()?,
            text: std::mem::take(&mut self.text),
            usage: TokenUsage {
                input_tokens: self.usage.prompt_tokens().unwrap_or(0),
                output_tokens: self.usage.output_tokens.unwrap_or(0),
            },
            finish_reason: finish_reason(self.stop_reason.as_deref()),
            citations: Vec::new(),
            model: self.model.take(),
        })
    }
}

/// The status Anthropic sends with each error type up front
/// (docs.anthropic.com, "Errors").
fn stream_error(kind: &str, data: &str) -> ProviderError {
    let status = match kind {
        "invalid_request_error" => 400,
        "authentication_error" => 401,
        "billing_error" => 402,
        "permission_error" => 403,
        "not_found_error" => 404,
        "request_too_large" => 413,
        "rate_limit_error" => 429,
        "timeout_error" => 504,
        "overloaded_error" => 529,
        _ => 500,
    };
    ProviderError::Status {
        status,
        retry_after: None,
        // The same sanitized type `http::send` reports for an up-front error.
        summary: http::error_type(data.as_bytes()),
    }
}
