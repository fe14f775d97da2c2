//! A model call in our own terms; providers translate it to and from each wire format.

use super::{ToolCall, ToolChoice, ToolOutcome, ToolSpec};
use serde_json::Value;
use tokio::time::Instant;

/// Who wrote a conversation message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    User,
    /// The model (earlier replies, e.g. our outbound SMS).
    Assistant,
    Tool,
}

/// One conversation message sent to a model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    pub role: Role,
    /// May be empty in an assistant message with tool calls.
    pub content: String,
    pub tool_calls: Vec<ToolCall>,
    pub tool_result: Option<ToolOutcome>,
}

impl ChatMessage {
    /// A plain text message.
    pub fn text(role: Role, content: impl Into<String>) -> Self {
        Self {
            role,
            content: content.into(),
            ..Self::default()
        }
    }

    /// Bytes of the text, tool calls and tool result.
    pub(crate) fn bytes(&self) -> usize {
        self.content.len()
            + self
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>()
            + self.tool_result.as_ref().map_or(0, |r| r.content.len())
    }

    fn has_tool_parts(&self) -> bool {
        !self.tool_calls.is_empty() || self.tool_result.is_some()
    }
}

/// JSON matching a schema (OpenAI `response_format`, Gemini `responseSchema`, else a prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSchemaFormat {
    /// `[a-zA-Z0-9_-]`, e.g. `sms_classification`.
    pub name: String,
    pub schema: Value,
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub model: String,
    pub system: Option<String>,
    /// Oldest first; the last one is the current input.
    pub messages: Vec<ChatMessage>,
    pub temperature: Option<f32>,
    pub max_tokens: u32,
    pub response_format: Option<JsonSchemaFormat>,
    pub tools: Vec<ToolSpec>,
    /// Sent only with tools ([`Self::tool_choice_to_send`]).
    pub tool_choice: ToolChoice,
    pub trace_id: String,
    pub traceparent: Option<String>,
    /// The earlier of the request deadline and the provider timeout; providers stop there.
    pub deadline: Instant,
}

/// Token counts reported by the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Input tokens billed beyond our bytes: chat framing, a schema, tool prompts.
const INPUT_SLACK: u64 = 16_384;

/// Output tokens some report beyond `max_tokens`: reasoning ("thinking") tokens.
const OUTPUT_SLACK: u64 = 1_024;

impl TokenUsage {
    /// Both counts added, saturating: provider numbers must never wrap.
    pub fn saturating_add(self, other: TokenUsage) -> TokenUsage {
        TokenUsage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
        }
    }

    /// `Err` capped at 2x our bytes plus [`INPUT_SLACK`] and 2x `max_tokens` plus
    /// [`OUTPUT_SLACK`] (the charge; docs/metering.md): a hostile count would saturate the cost.
    pub fn plausible_for(self, req: &CompletionRequest) -> Result<TokenUsage, TokenUsage> {
        let input = u64::try_from(req.input_bytes())
            .unwrap_or(u64::MAX)
            .saturating_mul(2)
            .saturating_add(INPUT_SLACK);
        let output = u64::from(req.max_tokens)
            .saturating_mul(2)
            .saturating_add(OUTPUT_SLACK);
        if self.input_tokens <= input && self.output_tokens <= output {
            return Ok(self);
        }
        Err(TokenUsage {
            input_tokens: self.input_tokens.min(input),
            output_tokens: self.output_tokens.min(output),
        })
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FinishReason {
    #[default]
    Stop,
    Length,
    ContentFilter,
    ToolCalls,
    Other,
}

/// A source the provider cited (Perplexity citations / search results).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Citation {
    pub url: String,
    pub title: Option<String>,
}

/// A finished model answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    pub text: String,
    pub usage: TokenUsage,
    pub finish_reason: FinishReason,
    pub citations: Vec<Citation>,
    /// As the provider names it, often dated (`gpt-4o-mini-2024-07-18`).
    pub model: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

impl CompletionRequest {
    fn input_bytes(&self) -> usize {
        self.system.as_deref().map_or(0, str::len)
            + self.messages.iter().map(ChatMessage::bytes).sum::<usize>()
            + self
                .tools
                .iter()
                .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
                .sum::<usize>()
    }

    /// What a `tpm` limit takes: input at ~4 bytes a token plus `max_tokens`, until reported.
    pub fn token_estimate(&self) -> u64 {
        u64::try_from(self.input_bytes().div_ceil(4))
            .unwrap_or(u64::MAX)
            .saturating_add(u64::from(self.max_tokens))
    }

    /// The tool choice to put on the wire: `None` for `Auto` (every provider's default, so
    /// bodies stay as they were) and without tools (OpenAI refuses a choice with no tools).
    pub fn tool_choice_to_send(&self) -> Option<&ToolChoice> {
        if self.tools.is_empty() || self.tool_choice == ToolChoice::Auto {
            return None;
        }
        Some(&self.tool_choice)
    }

    /// Whether tools are in play: a wire format without tool calling must refuse, never drop.
    pub fn uses_tools(&self) -> bool {
        !self.tools.is_empty() || self.messages.iter().any(ChatMessage::has_tool_parts)
    }
}

/// One event of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Delta(String),
    Done(Completion),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str, max_tokens: u32) -> CompletionRequest {
        CompletionRequest {
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            model: String::new(),
            system: Some("sys".into()),
            messages: vec![ChatMessage {
                role: Role::User,
                content: text.into(),
                ..Default::default()
            }],
            temperature: None,
            max_tokens,
            response_format: None,
            trace_id: String::new(),
            traceparent: None,
            deadline: Instant::now(),
        }
    }

    #[test]
    fn implausible_usage_is_refused_and_capped() {
        let req = request(&"x".repeat(1000), 100);
        let usage = |input, output| TokenUsage {
            input_tokens: input,
            output_tokens: output,
        };
        // 2 x 1003 bytes + 16,384 input, 2 x 100 + 1,024 output.
        assert_eq!(
            usage(18_390, 1_224).plausible_for(&req),
            Ok(usage(18_390, 1_224))
        );
        assert_eq!(
            usage(u64::MAX, u64::MAX).plausible_for(&req),
            Err(usage(18_390, 1_224))
        );
        assert_eq!(usage(10, 1_225).plausible_for(&req), Err(usage(10, 1_224)));
        assert_eq!(
            usage(u64::MAX, 1).saturating_add(usage(5, u64::MAX)),
            usage(u64::MAX, u64::MAX)
        );
    }
}
