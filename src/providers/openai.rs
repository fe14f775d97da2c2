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

use super::{
    ChatMessage, Citation, Completion, CompletionRequest, CompletionStream, FinishReason,
    ProbeRequest, Provider, ProviderError, Role, StreamEvent, TokenUsage, ToolCall, ToolChoice,
    http, perplexity, sse, system_with_schema, tool_calls,
};
use crate::config::{Config, ProviderConfig, ProviderKind, Secret};
use futures::StreamExt;
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::{borrow::Cow, time::Duration};
use stream::{Step, StreamState};

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
    /// `{base_url}/models`, the probe's request.
    models_url: reqwest::Url,
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
        let models_url = format!("{}/models", base.trim_end_matches('/'));
        let models_url =
            reqwest::Url::parse(&models_url).map_err(|e| unsupported(&format!("base_url: {e}")))?;
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
            models_url,
            authorization,
            stream_idle: p.stream_idle_timeout,
            max_response: p.max_response_bytes,
        })
    }

    /// Perplexity's API has no tool calling.
    fn check_tools(&self, req: &CompletionRequest) -> Result<(), ProviderError> {
        if self.flavor == Flavor::Perplexity && req.uses_tools() {
            return Err(ProviderError::Unsupported(
                "Perplexity does not support tool calling".into(),
            ));
        }
        Ok(())
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
        self.check_tools(&req)?;
        let lease = self.clients.lease();
        let response = self.send(&lease, &req, false).await?;
        let wire: WireResponse =
            lease.checked(http::json(response, req.deadline, self.max_response).await)?;
        let answer = completion(self.flavor, wire)?;
        // The body cap bounds the parsing; this bounds what is handed on,
        // as for a stream.
        tool_calls::check_count(answer.tool_calls.len(), self.max_response)?;
        Ok(answer)
    }

    async fn stream(&self, req: CompletionRequest) -> Result<CompletionStream, ProviderError> {
        self.check_tools(&req)?;
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

    /// `GET /models` (OpenAI, and the servers that copy it: vLLM, Ollama,
    /// llama.cpp, DeepSeek); Perplexity has no model list, so it gets a
    /// one-token completion of a model the config routes to it.
    async fn probe(&self, probe: ProbeRequest) -> Result<(), ProviderError> {
        if self.flavor == Flavor::Perplexity {
            return self.complete(one_token(probe)?).await.map(drop);
        }
        let request = |client: &reqwest::Client| {
            let builder = client.get(self.models_url.clone());
            match &self.authorization {
                Some(value) => builder.header(reqwest::header::AUTHORIZATION, value.clone()),
                None => builder,
            }
        };
        http::probe(&self.clients, request, &probe, self.max_response).await
    }
}

/// The smallest completion a probe can ask of `probe.model`.
fn one_token(probe: ProbeRequest) -> Result<CompletionRequest, ProviderError> {
    let model = probe.model.ok_or_else(|| {
        ProviderError::Unsupported("no task or agent routes a model to this provider".into())
    })?;
    Ok(CompletionRequest {
        model,
        system: None,
        messages: vec![ChatMessage::text(Role::User, "ping")],
        temperature: None,
        max_tokens: 1,
        response_format: None,
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        trace_id: probe.trace_id,
        traceparent: None,
        deadline: probe.deadline,
    })
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
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<Value>,
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    /// `null` for an assistant message that only calls tools.
    content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

/// One message of ours on the wire: a tool result is role `tool` answering
/// its call's ID; an assistant's tool calls carry their arguments as the
/// JSON text the model wrote.
fn wire_message(m: &ChatMessage) -> WireMessage<'_> {
    if let (Role::Tool, Some(result)) = (m.role, &m.tool_result) {
        return WireMessage {
            role: "tool",
            content: Some(Cow::Borrowed(&result.content)),
            tool_calls: Vec::new(),
            tool_call_id: Some(&result.call_id),
        };
    }
    let tool_calls: Vec<Value> = m
        .tool_calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let content = if m.content.is_empty() && !tool_calls.is_empty() {
        None
    } else {
        Some(Cow::Borrowed(m.content.as_str()))
    };
    WireMessage {
        role: match m.role {
            Role::User | Role::Tool => "user",
            Role::Assistant => "assistant",
        },
        content,
        tool_calls,
        tool_call_id: None,
    }
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
            content: Some(Cow::Owned(system)),
            tool_calls: Vec::new(),
            tool_call_id: None,
        });
    }
    messages.extend(req.messages.iter().map(wire_message));
    let tools = req
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.parameters}})
        })
        .collect();
    WireRequest {
        model: &req.model,
        messages,
        max_tokens: req.max_tokens,
        temperature: req.temperature,
        response_format,
        tools,
        tool_choice: req.tool_choice_to_send().map(wire_tool_choice),
        stream,
        stream_options: (stream && flavor != Flavor::Compatible)
            .then(|| json!({"include_usage": true})),
    }
}

/// `tool_choice` as Chat Completions spells it.
fn wire_tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Named(name) => json!({"type": "function", "function": {"name": name}}),
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
    #[serde(default)]
    tool_calls: Vec<WireToolCall>,
}

/// A tool call in a message, or a piece of one in a stream's delta (where
/// only `index` is sure to be there).
#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
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
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
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
    let message = choice
        .message
        .ok_or_else(|| ProviderError::Malformed("no message".into()))?;
    let tool_calls = message
        .tool_calls
        .into_iter()
        .map(|c| {
            let function = c.function.unwrap_or(WireFunction {
                name: None,
                arguments: None,
            });
            match function.name {
                Some(name) if !name.is_empty() => Ok(ToolCall {
                    id: c.id.unwrap_or_default(),
                    name,
                    arguments: function.arguments.unwrap_or_default(),
                }),
                _ => Err(ProviderError::Malformed("a tool call has no name".into())),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    // `content: null` without tool calls also covers a structured-output
    // refusal: no usable answer.
    let text = match (message.content, tool_calls.is_empty()) {
        (Some(text), _) => text,
        (None, false) => String::new(),
        (None, true) => return Err(ProviderError::Malformed("no message content".into())),
    };
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
        tool_calls,
    })
}

mod stream;

#[cfg(test)]
mod tests;
