//! The OpenAI Chat Completions wire format (`POST {base_url}/chat/completions`),
//! shared by kinds `openai`, `openai_compatible` (DeepSeek, vLLM, Ollama,
//! llama.cpp server) and `perplexity`. What differs between them is a
//! [`Flavor`]: how structured output is asked for, whether streams are asked
//! to report usage, and (Perplexity) citations, mapped in `perplexity.rs`.
//!
//! Streams end at `data: [DONE]`, or when the server closes after a chunk with
//! a `finish_reason` (Perplexity sends no `[DONE]`). A stream that closes with
//! neither was cut off and ends with [`ProviderError::Malformed`]. An
//! `{"error": ...}` object inside a stream (the HTTP status was already 200)
//! becomes [`ProviderError::Status`] with the error's own numeric code when it
//! has one in 400..=599, else 502: the upstream failed mid-answer, which is
//! retryable and counts against the breaker like any 5xx.
//!
//! Nothing here logs or keeps message contents, error messages or the key.

use super::{
    Citation, Completion, CompletionRequest, CompletionStream, FinishReason, Provider,
    ProviderError, Role, StreamEvent, TokenUsage, http, perplexity, sse, system_with_schema,
};
use crate::config::{Config, ProviderConfig, ProviderKind, Secret};
use futures::StreamExt;
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::{borrow::Cow, time::Duration};

/// Which server speaks the Chat Completions format, and so which of its
/// optional features we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// api.openai.com: native `json_schema` output, usage in streams.
    Openai,
    /// Any other server: only `json_object` mode is widely supported, so the
    /// schema goes into the system prompt, and `stream_options` is not sent
    /// because some servers reject unknown parameters.
    Compatible,
    /// Perplexity: its own `json_schema` form, plus citations.
    Perplexity,
}

impl Flavor {
    /// The flavor of a config kind; `None` for kinds with another wire format.
    pub fn of(kind: ProviderKind) -> Option<Self> {
        match kind {
            ProviderKind::Openai => Some(Flavor::Openai),
            ProviderKind::OpenaiCompatible => Some(Flavor::Compatible),
            ProviderKind::Perplexity => Some(Flavor::Perplexity),
            ProviderKind::Anthropic | ProviderKind::Gemini | ProviderKind::Mock => None,
        }
    }
}

/// A provider speaking Chat Completions.
pub struct OpenAiProvider {
    flavor: Flavor,
    clients: http::Clients,
    /// Parsed once, not per call (IDNA host processing included).
    url: reqwest::Url,
    /// `Authorization: Bearer …`, built once and marked sensitive so it
    /// never shows in debug output.
    authorization: Option<HeaderValue>,
    stream_idle: Duration,
    max_response: usize,
}

impl OpenAiProvider {
    /// Builds provider `name` of the config.
    pub fn new(name: &str, p: &ProviderConfig, config: &Config) -> Result<Self, ProviderError> {
        let unsupported =
            |why: &str| ProviderError::Unsupported(format!("provider `{name}`: {why}"));
        let flavor =
            Flavor::of(p.kind).ok_or_else(|| unsupported("not a Chat Completions kind"))?;
        let base = config
            .base_url(name)
            .ok_or_else(|| unsupported("base_url is required"))?;
        let url = format!("{}/chat/completions", base.trim_end_matches('/'));
        let url = reqwest::Url::parse(&url).map_err(|e| unsupported(&format!("base_url: {e}")))?;
        let authorization = p
            .api_key
            .as_ref()
            .map(|key| {
                bearer(key).ok_or_else(|| unsupported("API key is not a valid header value"))
            })
            .transpose()?;
        Ok(Self {
            flavor,
            clients: http::Clients::new(p)?,
            url,
            authorization,
            stream_idle: p.stream_idle_timeout,
            max_response: p.max_response_bytes,
        })
    }

    async fn send(
        &self,
        client: &http::Lease,
        req: &CompletionRequest,
        stream: bool,
    ) -> Result<reqwest::Response, ProviderError> {
        let mut builder =
            client
                .client()
                .post(self.url.clone())
                .json(&wire(self.flavor, req, stream));
        // Local servers (Ollama, llama.cpp) often run without a key.
        if let Some(value) = &self.authorization {
            builder = builder.header(reqwest::header::AUTHORIZATION, value.clone());
        }
        if stream {
            builder = builder.header(reqwest::header::ACCEPT, "text/event-stream");
        }
        client.checked(http::send(http::with_trace(builder, req), req.deadline).await)
    }
}

#[async_trait::async_trait]
impl Provider for OpenAiProvider {
    async fn complete(&self, req: CompletionRequest) -> Result<Completion, ProviderError> {
        let lease = self.clients.lease();
        let response = self.send(&lease, &req, false).await?;
        let wire: WireResponse =
            lease.checked(http::json(response, req.deadline, self.max_response).await)?;
        completion(self.flavor, wire)
    }

    async fn stream(&self, req: CompletionRequest) -> Result<CompletionStream, ProviderError> {
        let lease = self.clients.lease();
        let response = self.send(&lease, &req, true).await?;
        let mut events = Box::pin(sse::events(
            response,
            self.stream_idle,
            req.deadline,
            self.max_response,
        ));
        let mut state = StreamState::new(self.flavor, self.max_response);
        Ok(Box::pin(async_stream::stream! {
            // The stream holds its place on the connection until it ends.
            let lease = lease;
            let mut saw_done = false;
            while let Some(event) = events.next().await {
                let step = lease.checked(event).and_then(|e| state.on_data(&e.data));
                match step {
                    Ok(Step::Delta(text)) => yield Ok(StreamEvent::Delta(text)),
                    Ok(Step::Nothing) => {}
                    Ok(Step::Done) => { saw_done = true; break; }
                    Err(e) => { yield Err(e); return; }
                }
            }
            yield state.finish(saw_done).map(StreamEvent::Done);
        }))
    }
}

/// The `Authorization` value for `key`, sensitive; `None` when the key
/// cannot be a header value.
fn bearer(key: &Secret) -> Option<HeaderValue> {
    let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose())).ok()?;
    value.set_sensitive(true);
    Some(value)
}

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<Value>,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Cow<'a, str>,
}

/// The request body for `req` in `flavor`.
fn wire(flavor: Flavor, req: &CompletionRequest, stream: bool) -> WireRequest<'_> {
    let system = match flavor {
        Flavor::Compatible => system_with_schema(req),
        Flavor::Openai | Flavor::Perplexity => req.system.clone(),
    };
    let response_format = req.response_format.as_ref().map(|f| match flavor {
        Flavor::Openai => json!({"type": "json_schema",
            "json_schema": {"name": f.name, "schema": f.schema, "strict": false}}),
        Flavor::Compatible => json!({"type": "json_object"}),
        Flavor::Perplexity => json!({"type": "json_schema", "json_schema": {"schema": f.schema}}),
    });
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = system {
        messages.push(WireMessage {
            role: "system",
            content: Cow::Owned(system),
        });
    }
    messages.extend(req.messages.iter().map(|m| WireMessage {
        role: match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
        },
        content: Cow::Borrowed(&m.content),
    }));
    WireRequest {
        model: &req.model,
        messages,
        max_tokens: req.max_tokens,
        temperature: req.temperature,
        response_format,
        stream,
        stream_options: (stream && flavor != Flavor::Compatible)
            .then(|| json!({"include_usage": true})),
    }
}

#[derive(Deserialize)]
struct WireResponse {
    choices: Vec<WireChoice>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    citations: Option<Value>,
    #[serde(default)]
    search_results: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    message: Option<WireContent>,
    #[serde(default)]
    delta: Option<WireContent>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireContent {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

impl From<WireUsage> for TokenUsage {
    fn from(u: WireUsage) -> Self {
        TokenUsage {
            input_tokens: u.prompt_tokens.unwrap_or(0),
            output_tokens: u.completion_tokens.unwrap_or(0),
        }
    }
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    citations: Option<Value>,
    #[serde(default)]
    search_results: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

fn finish_reason(wire: Option<&str>) -> FinishReason {
    match wire {
        Some("stop") => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        _ => FinishReason::Other,
    }
}

fn citations(flavor: Flavor, citations: Option<&Value>, results: Option<&Value>) -> Vec<Citation> {
    match flavor {
        Flavor::Perplexity => perplexity::citations(citations, results),
        Flavor::Openai | Flavor::Compatible => Vec::new(),
    }
}

fn completion(flavor: Flavor, wire: WireResponse) -> Result<Completion, ProviderError> {
    let choice = wire
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ProviderError::Malformed("no choices".into()))?;
    // `content: null` also covers a structured-output refusal: no usable answer.
    let text = choice
        .message
        .and_then(|m| m.content)
        .ok_or_else(|| ProviderError::Malformed("no message content".into()))?;
    Ok(Completion {
        text,
        usage: wire.usage.map(TokenUsage::from).unwrap_or_default(),
        finish_reason: finish_reason(choice.finish_reason.as_deref()),
        citations: citations(
            flavor,
            wire.citations.as_ref(),
            wire.search_results.as_ref(),
        ),
        model: wire.model,
    })
}

/// What one SSE `data:` payload means for the caller.
#[derive(Debug, PartialEq)]
enum Step {
    /// A piece of answer text to pass on.
    Delta(String),
    /// Nothing to pass on (role-only chunk, usage chunk, keep-alive).
    Nothing,
    /// `[DONE]`: the stream is over.
    Done,
}

/// The answer assembled from stream chunks so far.
struct StreamState {
    flavor: Flavor,
    text: String,
    usage: TokenUsage,
    finish_reason: Option<FinishReason>,
    citations: Option<Value>,
    search_results: Option<Value>,
    /// The answering model, as the chunks name it.
    model: Option<String>,
    /// Most bytes of text it may accumulate.
    limit: usize,
}

impl StreamState {
    fn new(flavor: Flavor, limit: usize) -> Self {
        Self {
            flavor,
            limit,
            text: String::new(),
            usage: TokenUsage::default(),
            finish_reason: None,
            citations: None,
            search_results: None,
            model: None,
        }
    }

    fn on_data(&mut self, data: &str) -> Result<Step, ProviderError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Step::Nothing);
        }
        if data == "[DONE]" {
            return Ok(Step::Done);
        }
        // serde's message can quote the offending value (upstream text), so
        // only its category and position are kept.
        let chunk: WireChunk = serde_json::from_str(data).map_err(|e| {
            ProviderError::Malformed(format!(
                "stream chunk JSON: {:?} error at column {}",
                e.classify(),
                e.column()
            ))
        })?;
        if let Some(error) = &chunk.error {
            return Err(stream_error(error, data));
        }
        // OpenAI sends usage once, in a last chunk with no choices; Perplexity
        // and llama.cpp send running totals. The last report wins either way.
        if let Some(usage) = chunk.usage {
            self.usage = usage.into();
        }
        if chunk.model.is_some() {
            self.model = chunk.model;
        }
        // Perplexity repeats the full (growing) lists in every chunk.
        if chunk.citations.is_some() {
            self.citations = chunk.citations;
        }
        if chunk.search_results.is_some() {
            self.search_results = chunk.search_results;
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(Step::Nothing);
        };
        if let Some(reason) = choice.finish_reason.as_deref() {
            self.finish_reason = Some(finish_reason(Some(reason)));
        }
        match choice.delta.and_then(|d| d.content) {
            Some(piece) if !piece.is_empty() => {
                http::append_limited(&mut self.text, &piece, self.limit)?;
                Ok(Step::Delta(piece))
            }
            _ => Ok(Step::Nothing),
        }
    }

    /// The whole answer once the stream is over, or `Malformed` when it was
    /// cut off (no `[DONE]` and no finish reason).
    fn finish(self, saw_done: bool) -> Result<Completion, ProviderError> {
        if !saw_done && self.finish_reason.is_none() {
            return Err(ProviderError::Malformed(
                "stream ended before the answer was complete".into(),
            ));
        }
        Ok(Completion {
            citations: citations(
                self.flavor,
                self.citations.as_ref(),
                self.search_results.as_ref(),
            ),
            text: self.text,
            usage: self.usage,
            finish_reason: self.finish_reason.unwrap_or(FinishReason::Other),
            model: self.model,
        })
    }
}

/// An in-stream `{"error": ...}` as a status error, keeping only its type.
fn stream_error(error: &Value, data: &str) -> ProviderError {
    let status = ["code", "status"]
        .iter()
        .filter_map(|k| error.get(k).and_then(Value::as_u64))
        .find(|c| (400..=599).contains(c))
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(502);
    ProviderError::Status {
        status,
        retry_after: None,
        summary: format!("in-stream error: {}", http::error_type(data.as_bytes())),
    }
}

#[cfg(test)]
mod tests;
