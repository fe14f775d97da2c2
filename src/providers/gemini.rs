//! The `gemini` provider: Google's Gemini API (`models/{model}:generateContent`
//! and `:streamGenerateContent?alt=sse`).
//!
//! A JSON request sets `responseMimeType: application/json` and carries its
//! schema as an instruction in `systemInstruction`, not as `responseSchema`:
//! Gemini's schema dialect is an OpenAPI subset that rejects common JSON
//! Schema keywords, and the task layer validates the answer anyway.
//!
//! Decisions:
//! - A prompt Gemini blocks (`promptFeedback.blockReason`, no candidates) is
//!   [`ProviderError::Malformed`]: there is no answer, re-asking the same
//!   target gets the same block, and the router moves on to the next target,
//!   which may well answer.
//! - Streams have no end marker; the server just closes. A stream that closes
//!   before any chunk carried a `finishReason` was cut off: `Malformed`.
//!
//! Nothing here logs message contents or the key.

#[cfg(test)]
mod tests;

use super::{
    Completion, CompletionRequest, CompletionStream, FinishReason, Provider, ProviderError, Role,
    StreamEvent, TokenUsage, http, refuse_tools, sse, system_with_schema, turns,
};
use crate::config::ProviderConfig;
use futures::StreamExt;
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A provider speaking the Gemini API.
pub struct GeminiProvider {
    clients: http::Clients,
    base_url: String,
    /// `x-goog-api-key`, marked sensitive so it never shows in debug output.
    /// (The header rather than `?key=`, which would put the key in URLs.)
    api_key: Option<HeaderValue>,
    stream_idle: Duration,
    max_response: usize,
}

impl GeminiProvider {
    /// A provider calling `{base_url}/models/...` with the config's key and
    /// timeouts.
    pub fn new(config: &ProviderConfig, base_url: &str) -> Result<Self, ProviderError> {
        let api_key = config
            .api_key
            .as_ref()
            .map(|key| {
                let mut value = HeaderValue::from_str(key.expose()).map_err(|_| {
                    ProviderError::Unsupported("API key is not a valid header value".into())
                })?;
                value.set_sensitive(true);
                Ok::<_, ProviderError>(value)
            })
            .transpose()?;
        Ok(Self {
            clients: http::Clients::new(config)?,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            stream_idle: config.stream_idle_timeout,
            max_response: config.max_response_bytes,
        })
    }

    async fn send(
        &self,
        client: &http::Lease,
        req: &CompletionRequest,
        action: &str,
    ) -> Result<reqwest::Response, ProviderError> {
        // Accept both `gemini-2.0-flash` and the API's own `models/gemini-2.0-flash`.
        let model = req.model.strip_prefix("models/").unwrap_or(&req.model);
        let url = format!("{}/models/{model}:{action}", self.base_url);
        let mut builder = client.client().post(url).json(&body(req));
        if let Some(key) = &self.api_key {
            builder = builder.header("x-goog-api-key", key.clone());
        }
        client.checked(http::send(http::with_trace(builder, req), req.deadline).await)
    }
}

#[async_trait::async_trait]
impl Provider for GeminiProvider {
    async fn complete(&self, req: CompletionRequest) -> Result<Completion, ProviderError> {
        refuse_tools(&req)?;
        let lease = self.clients.lease();
        let response = self.send(&lease, &req, "generateContent").await?;
        let answer: GenerateResponse =
            lease.checked(http::json(response, req.deadline, self.max_response).await)?;
        let no_candidates = answer.candidates.is_empty();
        let mut state = StreamState::new(self.max_response);
        // Fails first on an error envelope or a blocked prompt.
        state.on_chunk(answer)?;
        if no_candidates {
            return Err(ProviderError::Malformed(
                "response has no candidates".into(),
            ));
        }
        Ok(state.finish())
    }

    async fn stream(&self, req: CompletionRequest) -> Result<CompletionStream, ProviderError> {
        refuse_tools(&req)?;
        let lease = self.clients.lease();
        let response = self
            .send(&lease, &req, "streamGenerateContent?alt=sse")
            .await?;
        let limit = self.max_response;
        let events = Box::pin(sse::events(
            response,
            self.stream_idle,
            req.deadline,
            self.max_response,
        ));
        Ok(Box::pin(async_stream::stream! {
            // The stream holds its place on the connection until it ends.
            let lease = lease;
            let mut events = events;
            let mut state = StreamState::new(limit);
            while let Some(event) = events.next().await {
                let step = lease.checked(event).and_then(|e| parse_chunk(&e.data)).and_then(|chunk| match chunk {
                    Some(chunk) => state.on_chunk(chunk),
                    None => Ok(String::new()),
                });
                match step {
                    Err(err) => {
                        yield Err(err);
                        return;
                    }
                    Ok(text) if text.is_empty() => {}
                    Ok(text) => yield Ok(StreamEvent::Delta(text)),
                }
            }
            if state.finish.is_none() {
                yield Err(ProviderError::Malformed("stream closed before a finishReason".into()));
                return;
            }
            yield Ok(StreamEvent::Done(state.finish()));
        }))
    }
}

/// Request body of `generateContent` / `streamGenerateContent`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateRequest {
    contents: Vec<Content>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<Content>,
    generation_config: GenerationConfig,
}

#[derive(Debug, Serialize)]
struct Content {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    parts: Vec<Part>,
}

#[derive(Debug, Serialize)]
struct Part {
    text: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig {
    max_output_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
}

/// The request body for `req`. Kept separate from sending so tests can
/// inspect the exact JSON.
fn body(req: &CompletionRequest) -> GenerateRequest {
    // Gemini also wants user-first alternating turns ("model" for the assistant).
    let contents = turns::alternating(&req.messages)
        .into_iter()
        .map(|(role, text)| Content {
            role: Some(match role {
                Role::User | Role::Tool => "user",
                Role::Assistant => "model",
            }),
            parts: vec![Part { text }],
        })
        .collect();
    GenerateRequest {
        contents,
        system_instruction: system_with_schema(req).map(|text| Content {
            role: None,
            parts: vec![Part { text }],
        }),
        generation_config: GenerationConfig {
            max_output_tokens: req.max_tokens,
            temperature: req.temperature,
            response_mime_type: req.response_format.as_ref().map(|_| "application/json"),
        },
    }
}

/// A `GenerateContentResponse` (whole answer or one stream chunk); only the
/// fields we use, all optional so a sparse chunk still parses.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GenerateResponse {
    #[serde(default)]
    candidates: Vec<Candidate>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
    /// The answering model (`gemini-2.0-flash-001`).
    #[serde(default)]
    model_version: Option<String>,
    /// An error sent in place of a chunk once the stream had started.
    #[serde(default)]
    error: Option<WireError>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    #[serde(default)]
    content: Option<CandidateContent>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct CandidateContent {
    #[serde(default)]
    parts: Vec<ResponsePart>,
}

#[derive(Debug, Deserialize)]
struct ResponsePart {
    #[serde(default)]
    text: Option<String>,
    /// Thought summaries (thinking models) are not part of the answer.
    #[serde(default)]
    thought: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: u64,
    #[serde(default)]
    candidates_token_count: u64,
    /// Thinking tokens, billed as output but not in `candidatesTokenCount`.
    #[serde(default)]
    thoughts_token_count: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    #[serde(default)]
    block_reason: Option<String>,
}

/// Gemini's error envelope; `message` is never deserialized.
#[derive(Debug, Deserialize)]
struct WireError {
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    status: Option<String>,
}

/// One SSE `data:` payload; `None` for an empty one.
fn parse_chunk(data: &str) -> Result<Option<GenerateResponse>, ProviderError> {
    if data.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(data).map(Some).map_err(|e| {
        // Position only: serde's message can quote upstream text.
        ProviderError::Malformed(format!(
            "stream chunk JSON ({:?} error at column {})",
            e.classify(),
            e.column()
        ))
    })
}

/// The answer assembled from one or more `GenerateContentResponse`s.
#[derive(Debug)]
struct StreamState {
    text: String,
    usage: TokenUsage,
    finish: Option<FinishReason>,
    model: Option<String>,
    /// Most bytes of text it may accumulate.
    limit: usize,
}

impl Default for StreamState {
    fn default() -> Self {
        Self::new(crate::config::DEFAULT_MAX_RESPONSE_BYTES)
    }
}

impl StreamState {
    fn new(limit: usize) -> Self {
        Self {
            text: String::new(),
            usage: TokenUsage::default(),
            finish: None,
            model: None,
            limit,
        }
    }

    /// Folds in one response/chunk and returns its new text.
    fn on_chunk(&mut self, chunk: GenerateResponse) -> Result<String, ProviderError> {
        if let Some(error) = chunk.error {
            return Err(ProviderError::Status {
                // An error after a 200 head: take its own code, else a 500.
                status: error.code.filter(|c| *c >= 400).unwrap_or(500),
                retry_after: None,
                summary: label(error.status.as_deref().unwrap_or("unknown")),
            });
        }
        if chunk.model_version.is_some() {
            self.model = chunk.model_version;
        }
        // Counts are cumulative: the latest chunk's replace earlier ones.
        if let Some(u) = chunk.usage_metadata {
            self.usage = TokenUsage {
                input_tokens: u.prompt_token_count,
                // Saturating: upstream numbers must not be able to panic us.
                output_tokens: u
                    .candidates_token_count
                    .saturating_add(u.thoughts_token_count),
            };
        }
        let Some(candidate) = chunk.candidates.into_iter().next() else {
            return match chunk.prompt_feedback.and_then(|f| f.block_reason) {
                Some(reason) => Err(ProviderError::Malformed(format!(
                    "prompt blocked by the provider ({})",
                    label(&reason)
                ))),
                // Usage-only chunks are normal while streaming.
                None => Ok(String::new()),
            };
        };
        let text: String = candidate
            .content
            .into_iter()
            .flat_map(|c| c.parts)
            .filter(|p| !p.thought)
            .filter_map(|p| p.text)
            .collect();
        http::append_limited(&mut self.text, &text, self.limit)?;
        if let Some(reason) = candidate.finish_reason {
            self.finish = Some(finish_reason(&reason));
        }
        Ok(text)
    }

    fn finish(self) -> Completion {
        Completion {
            tool_calls: Vec::new(),
            text: self.text,
            usage: self.usage,
            finish_reason: self.finish.unwrap_or(FinishReason::Other),
            citations: Vec::new(),
            model: self.model,
        }
    }
}

/// An upstream enum value made safe for logs and metrics: identifier
/// characters only, bounded length (as `http::error_type` does).
fn label(value: &str) -> String {
    value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect()
}

/// Maps Gemini's `finishReason`.
fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            FinishReason::ContentFilter
        }
        // LANGUAGE, OTHER, MALFORMED_FUNCTION_CALL, FINISH_REASON_UNSPECIFIED, ...
        _ => FinishReason::Other,
    }
}
