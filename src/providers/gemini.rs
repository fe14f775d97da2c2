//! The `gemini` provider: `models/{model}:generateContent` and `:streamGenerateContent?alt=sse`.
//!
//! - A JSON request sets `responseMimeType` and carries its schema as a system instruction, not
//!   `responseSchema`: Gemini's OpenAPI subset rejects common JSON Schema keywords, and the task
//!   layer validates the answer anyway.
//! - A blocked prompt (`promptFeedback.blockReason`) is `Malformed`: re-asking gets the same
//!   block, while the next target may answer.
//! - Streams have no end marker: one that closes before a `finishReason` was cut off.
//! - Tools use `parametersJsonSchema` (full JSON Schema). A `functionCall` arrives whole and
//!   without an ID, so ours is its place (`call_0`, …); a turn of calls ends with `STOP`.

#[cfg(test)]
mod tests;

use super::{
    Completion, CompletionRequest, CompletionStream, FinishReason, ProbeRequest, Provider,
    ProviderError, Role, StreamEvent, TokenUsage, ToolCall, ToolChoice, http, sse,
    system_with_schema,
    tool_calls::check_count,
    turns::{self, Part},
};
use crate::config::ProviderConfig;
use futures::StreamExt;
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::time::Duration;

/// A provider speaking the Gemini API.
pub struct GeminiProvider {
    clients: http::Clients,
    base_url: String,
    /// `x-goog-api-key` (not `?key=`, which would put it in URLs), marked sensitive.
    api_key: Option<HeaderValue>,
    stream_idle: Duration,
    max_response: usize,
}

impl GeminiProvider {
    /// A provider calling `{base_url}/models/...` with the config's key and timeouts.
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

    /// `GET /models?pageSize=1`: the model list, nothing generated.
    async fn probe(&self, probe: ProbeRequest) -> Result<(), ProviderError> {
        let request = |client: &reqwest::Client| {
            let builder = client.get(format!("{}/models?pageSize=1", self.base_url));
            match &self.api_key {
                Some(key) => builder.header("x-goog-api-key", key.clone()),
                None => builder,
            }
        };
        http::probe(&self.clients, request, &probe, self.max_response).await
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateRequest {
    contents: Vec<Content>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<Content>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<Value>,
    generation_config: GenerationConfig,
}

#[derive(Debug, Serialize)]
struct Content {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    parts: Vec<Value>,
}

/// A part on the wire: malformed call arguments go as `{}` (the call's result says why); a
/// result that is not a JSON object is wrapped as `{"result": …}`, a failure as `{"error": …}`.
fn part(p: Part) -> Value {
    match p {
        Part::Text(text) => json!({"text": text}),
        Part::Call(c) => json!({"functionCall": {"name": c.name, "args": c.arguments_object()}}),
        Part::Result(r) => {
            let value: Value = serde_json::from_str(&r.content).unwrap_or(Value::String(r.content));
            let response = match (r.is_error, value) {
                (true, v) => json!({"error": v}),
                (false, Value::Object(o)) => Value::Object(o),
                (false, v) => json!({"result": v}),
            };
            json!({"functionResponse": {"name": r.name, "response": response}})
        }
    }
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

/// The request body, apart from sending so tests can inspect the exact JSON.
fn body(req: &CompletionRequest) -> GenerateRequest {
    // User-first alternating turns, "model" for the assistant; tool results are the user's side.
    let contents = turns::alternating_parts(&req.messages)
        .into_iter()
        .map(|(role, parts)| Content {
            role: Some(match role {
                Role::User | Role::Tool => "user",
                Role::Assistant => "model",
            }),
            parts: parts.into_iter().map(part).collect(),
        })
        .collect();
    let declarations: Vec<Value> = req
        .tools
        .iter()
        .map(|t| {
            json!({"name": t.name, "description": t.description,
                   "parametersJsonSchema": t.parameters})
        })
        .collect();
    GenerateRequest {
        contents,
        system_instruction: system_with_schema(req).map(|text| Content {
            role: None,
            parts: vec![json!({ "text": text })],
        }),
        tools: if declarations.is_empty() {
            Vec::new()
        } else {
            vec![json!({ "functionDeclarations": declarations })]
        },
        tool_config: req.tool_choice_to_send().map(tool_config),
        generation_config: GenerationConfig {
            max_output_tokens: req.max_tokens,
            temperature: req.temperature,
            response_mime_type: req.response_format.as_ref().map(|_| "application/json"),
        },
    }
}

/// `toolConfig` for a tool choice: `required` is mode `ANY`, a named tool `ANY` limited to it.
fn tool_config(choice: &ToolChoice) -> Value {
    let config = match choice {
        ToolChoice::Auto => json!({"mode": "AUTO"}),
        ToolChoice::None => json!({"mode": "NONE"}),
        ToolChoice::Required => json!({"mode": "ANY"}),
        ToolChoice::Named(name) => json!({"mode": "ANY", "allowedFunctionNames": [name]}),
    };
    json!({ "functionCallingConfig": config })
}

/// A `GenerateContentResponse`, whole or one chunk; all optional, so a sparse chunk parses.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GenerateResponse {
    #[serde(default)]
    candidates: Vec<Candidate>,
    #[serde(default)]
    usage_metadata: Option<UsageMetadata>,
    #[serde(default)]
    prompt_feedback: Option<PromptFeedback>,
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
#[serde(rename_all = "camelCase")]
struct ResponsePart {
    #[serde(default)]
    text: Option<String>,
    /// Thought summaries (thinking models) are not part of the answer.
    #[serde(default)]
    thought: bool,
    #[serde(default)]
    function_call: Option<FunctionCall>,
}

#[derive(Debug, Deserialize)]
struct FunctionCall {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: String,
    #[serde(default)]
    args: Option<Value>,
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

#[derive(Debug)]
struct StreamState {
    text: String,
    usage: TokenUsage,
    finish: Option<FinishReason>,
    model: Option<String>,
    /// Most bytes of text, and apart, of tool-call IDs, names and arguments.
    limit: usize,
    calls: Vec<ToolCall>,
    /// Running total of `calls`' bytes, so each call costs the same however many came before.
    call_bytes: usize,
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
            calls: Vec::new(),
            call_bytes: 0,
        }
    }

    /// Folds in one response/chunk and returns its new text.
    fn on_chunk(&mut self, chunk: GenerateResponse) -> Result<String, ProviderError> {
        if let Some(error) = chunk.error {
            return Err(ProviderError::Status {
                // After a 200 head: its own code if an HTTP one (it labels metrics), else 500.
                status: error
                    .code
                    .filter(|c| (400..=599).contains(c))
                    .unwrap_or(500),
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
        let mut text = String::new();
        for p in candidate.content.into_iter().flat_map(|c| c.parts) {
            if let Some(call) = p.function_call {
                if call.name.is_empty() {
                    return Err(ProviderError::Malformed(
                        "a functionCall has no name".into(),
                    ));
                }
                check_count(self.calls.len().saturating_add(1), self.limit)?;
                let id = call
                    .id
                    .filter(|id| !id.is_empty())
                    .unwrap_or_else(|| format!("call_{}", self.calls.len()));
                let arguments = call.args.map_or_else(String::new, |a| a.to_string());
                // Everything kept counts, so calls without `args` are not free.
                let bytes = self
                    .call_bytes
                    .saturating_add(id.len())
                    .saturating_add(call.name.len())
                    .saturating_add(arguments.len());
                if bytes > self.limit {
                    return Err(ProviderError::TooLarge { limit: self.limit });
                }
                self.call_bytes = bytes;
                self.calls.push(ToolCall {
                    id,
                    name: call.name,
                    arguments,
                });
            } else if !p.thought {
                text.push_str(p.text.as_deref().unwrap_or_default());
            }
        }
        http::append_limited(&mut self.text, &text, self.limit)?;
        if let Some(reason) = candidate.finish_reason {
            self.finish = Some(finish_reason(&reason));
        }
        Ok(text)
    }

    fn finish(self) -> Completion {
        let finish_reason = match self.finish.unwrap_or(FinishReason::Other) {
            FinishReason::Stop if !self.calls.is_empty() => FinishReason::ToolCalls,
            other => other,
        };
        Completion {
            tool_calls: self.calls,
            text: self.text,
            usage: self.usage,
            finish_reason,
            citations: Vec::new(),
            model: self.model,
        }
    }
}

/// An upstream enum value made safe for logs and metrics, as `http::error_type` does.
fn label(value: &str) -> String {
    value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect()
}

fn finish_reason(reason: &str) -> FinishReason {
    match reason {
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            FinishReason::ContentFilter
        }
        _ => FinishReason::Other,
    }
}
