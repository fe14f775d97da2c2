//! A model call in our own terms, whatever the wire format: the request,
//! its messages, the answer and its token counts. The providers translate
//! these to and from each wire format; the router, the pipeline and the
//! features speak only these.

use super::{ToolCall, ToolOutcome, ToolSpec};
use serde_json::Value;
use tokio::time::Instant;

/// Who wrote a conversation message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// The end user / the input.
    #[default]
    User,
    /// The model (earlier replies, e.g. our outbound SMS).
    Assistant,
    /// A tool's result, answering one of the model's tool calls.
    Tool,
}

/// One conversation message sent to a model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    /// Author.
    pub role: Role,
    /// Text (an assistant message with tool calls may have none).
    pub content: String,
    /// The tool calls of an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// The result a [`Role::Tool`] message carries.
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

    /// Bytes of everything it carries: text, tool calls, a tool result.
    pub(crate) fn bytes(&self) -> usize {
        self.content.len()
            + self
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>()
            + self.tool_result.as_ref().map_or(0, |r| r.content.len())
    }

    /// Whether it carries tool calls or a tool result.
    fn has_tool_parts(&self) -> bool {
        !self.tool_calls.is_empty() || self.tool_result.is_some()
    }
}

/// Ask the model for JSON matching a schema (OpenAI `response_format`,
/// Gemini `responseSchema`; others get it as an instruction in the prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSchemaFormat {
    /// Schema name (`[a-zA-Z0-9_-]`), e.g. `sms_classification`.
    pub name: String,
    /// The JSON schema.
    pub schema: Value,
}

/// One call to a model, in our own terms.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    /// Model name to send.
    pub model: String,
    /// System prompt.
    pub system: Option<String>,
    /// Conversation, oldest first; the last one is the current input.
    pub messages: Vec<ChatMessage>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Output token cap.
    pub max_tokens: u32,
    /// Structured output request.
    pub response_format: Option<JsonSchemaFormat>,
    /// Tools the model may call (none: a plain completion).
    pub tools: Vec<ToolSpec>,
    /// Trace ID, sent upstream as `x-trace-id`.
    pub trace_id: String,
    /// W3C `traceparent` to send upstream, when tracing is on.
    pub traceparent: Option<String>,
    /// When this attempt must be over (the smaller of the request deadline and
    /// the provider timeout). Providers stop waiting at this instant.
    pub deadline: Instant,
}

/// Token counts reported by the provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

/// Input tokens a provider may bill beyond our text's bytes: its own chat
/// framing, a structured-output schema, tool prompts it adds.
const INPUT_SLACK: u64 = 16_384;

/// Output tokens a provider may report beyond `max_tokens`: reasoning or
/// "thinking" tokens some count in the output.
const OUTPUT_SLACK: u64 = 1_024;

impl TokenUsage {
    /// Both counts added, saturating: provider numbers must never wrap.
    pub fn saturating_add(self, other: TokenUsage) -> TokenUsage {
        TokenUsage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
        }
    }

    /// `Ok` when the provider's counts are plausible for `req`; else `Err`
    /// with the counts capped at what is plausible, the amount the attempt
    /// is charged (docs/metering.md, *Implausible usage*).
    ///
    /// Plausible: input at most twice the bytes of our text plus
    /// [`INPUT_SLACK`] (every token of a byte-level tokenizer is at least
    /// one byte), output at most twice `max_tokens` plus [`OUTPUT_SLACK`].
    /// An answer claiming more (a broken or hostile upstream, `u64::MAX`)
    /// is malformed: it would otherwise saturate the cost and the ledger.
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
    /// Natural end of the answer.
    #[default]
    Stop,
    /// Output token cap reached.
    Length,
    /// Blocked by the provider's content filter.
    ContentFilter,
    /// The model asked for tool calls.
    ToolCalls,
    /// Anything else the provider reported.
    Other,
}

/// A source the provider cited (Perplexity citations / search results).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Citation {
    /// Source URL.
    pub url: String,
    /// Title, when given.
    pub title: Option<String>,
}

/// A finished model answer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Completion {
    /// Answer text.
    pub text: String,
    /// Tokens billed.
    pub usage: TokenUsage,
    /// Why it stopped.
    pub finish_reason: FinishReason,
    /// Sources, when the provider gives them.
    pub citations: Vec<Citation>,
    /// The model that answered as the provider names it (often a dated
    /// version of the one asked for: `gpt-4o-mini-2024-07-18`), when it
    /// says.
    pub model: Option<String>,
    /// The tool calls the model asked for, in its order.
    pub tool_calls: Vec<ToolCall>,
}

impl CompletionRequest {
    /// Bytes of everything sent as input: system prompt, messages, tools.
    fn input_bytes(&self) -> usize {
        self.system.as_deref().map_or(0, str::len)
            + self.messages.iter().map(ChatMessage::bytes).sum::<usize>()
            + self
                .tools
                .iter()
                .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
                .sum::<usize>()
    }

    /// The tokens a `tpm` limit takes for this call when it is sent: the
    /// input at about four bytes a token, plus `max_tokens`, the most it
    /// can answer. Corrected by the provider's report when it ends.
    pub fn token_estimate(&self) -> u64 {
        u64::try_from(self.input_bytes().div_ceil(4))
            .unwrap_or(u64::MAX)
            .saturating_add(u64::from(self.max_tokens))
    }

    /// Whether the request offers tools or carries tool calls or results:
    /// a wire format without tool calling must refuse it, never drop them.
    pub fn uses_tools(&self) -> bool {
        !self.tools.is_empty() || self.messages.iter().any(ChatMessage::has_tool_parts)
    }
}

/// One event of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    /// Next piece of text.
    Delta(String),
    /// End of stream with the assembled answer (text, usage, finish reason).
    Done(Completion),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str, max_tokens: u32) -> CompletionRequest {
        CompletionRequest {
            tools: Vec::new(),
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
