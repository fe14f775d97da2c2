//! The `anthropic` provider: the Messages API (`POST /v1/messages`), plain and streamed.
//! No native structured output: a JSON request's schema goes into `system`. Turns must alternate
//! starting with the user ([`turns::alternating_parts`]). Tools are `tools` with an
//! `input_schema`; calls are `tool_use` blocks (`input_json_delta` pieces when streamed),
//! results `tool_result` blocks of the next user turn. Stream parsing is in [`stream`].

mod stream;
#[cfg(test)]
mod tests;

use super::{
    Completion, CompletionRequest, CompletionStream, FinishReason, ProbeRequest, Provider,
    ProviderError, StreamEvent, TokenUsage, ToolCall, ToolChoice, http, sse, system_with_schema,
    tool_calls,
    turns::{self, Part},
};
use crate::config::ProviderConfig;
use futures::StreamExt;
use reqwest::header::HeaderValue;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::time::Duration;

/// The API version whose event and field names we speak.
const API_VERSION: &str = "2023-06-01";

/// Anthropic accepts [0, 1]; our config allows up to 2 (OpenAI's range), so clamp, not refuse.
const MAX_TEMPERATURE: f32 = 1.0;

/// A provider speaking the Anthropic Messages API.
pub struct AnthropicProvider {
    clients: http::Clients,
    url: String,
    models_url: String,
    /// `x-api-key`, marked sensitive so it never shows in debug output.
    api_key: Option<HeaderValue>,
    stream_idle: Duration,
    max_response: usize,
}

impl AnthropicProvider {
    /// A provider calling `{base_url}/messages` with the config's key and timeouts.
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
            url: format!("{}/messages", base_url.trim_end_matches('/')),
            models_url: format!("{}/models?limit=1", base_url.trim_end_matches('/')),
            api_key,
            stream_idle: config.stream_idle_timeout,
            max_response: config.max_response_bytes,
        })
    }

    async fn send(
        &self,
        client: &http::Lease,
        req: &CompletionRequest,
        stream: bool,
    ) -> Result<reqwest::Response, ProviderError> {
        let mut builder = client
            .client()
            .post(&self.url)
            .header("anthropic-version", API_VERSION)
            .json(&body(req, stream));
        if let Some(key) = &self.api_key {
            builder = builder.header("x-api-key", key.clone());
        }
        client.checked(http::send(http::with_trace(builder, req), req.deadline).await)
    }
}

#[async_trait::async_trait]
impl Provider for AnthropicProvider {
    async fn complete(&self, req: CompletionRequest) -> Result<Completion, ProviderError> {
        let lease = self.clients.lease();
        let response = self.send(&lease, &req, false).await?;
        let message: MessagesResponse =
            lease.checked(http::json(response, req.deadline, self.max_response).await)?;
        let answer = message.into_completion()?;
        // The body cap bounds parsing; this bounds what is handed on, as for a stream.
        tool_calls::check_count(answer.tool_calls.len(), self.max_response)?;
        Ok(answer)
    }

    async fn stream(&self, req: CompletionRequest) -> Result<CompletionStream, ProviderError> {
        let lease = self.clients.lease();
        let response = self.send(&lease, &req, true).await?;
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
            let mut state = stream::State::new(limit);
            while let Some(event) = events.next().await {
                match lease.checked(event).and_then(|e| state.on_event(&e.data)) {
                    Err(err) => {
                        yield Err(err);
                        return;
                    }
                    Ok(stream::Step::Skip) => {}
                    Ok(stream::Step::Delta(text)) => yield Ok(StreamEvent::Delta(text)),
                    Ok(stream::Step::Done(done)) => {
                        yield Ok(StreamEvent::Done(done));
                        return;
                    }
                }
            }
            yield Err(ProviderError::Malformed("stream ended before message_stop".into()));
        }))
    }

    /// `GET /models?limit=1`: the Models API, nothing generated.
    async fn probe(&self, probe: ProbeRequest) -> Result<(), ProviderError> {
        let request = |client: &reqwest::Client| {
            let builder = (client.get(&self.models_url)).header("anthropic-version", API_VERSION);
            match &self.api_key {
                Some(key) => builder.header("x-api-key", key.clone()),
                None => builder,
            }
        };
        http::probe(&self.clients, request, &probe, self.max_response).await
    }
}

#[derive(Debug, Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    /// Required by Anthropic (no server-side default).
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<String>,
    messages: Vec<WireMessage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
}

#[derive(Debug, Serialize)]
struct WireMessage {
    role: &'static str,
    /// A string for a text-only turn, else content blocks.
    content: Value,
}

/// A turn's content: a plain string when it is only text, else blocks; `tool_use` input as the
/// object Anthropic wants (malformed arguments as `{}`: the call's result says why).
fn content(parts: Vec<Part>) -> Value {
    if let [Part::Text(text)] = parts.as_slice() {
        return Value::String(text.clone());
    }
    Value::Array(
        parts
            .into_iter()
            .map(|p| match p {
                Part::Text(text) => json!({"type": "text", "text": text}),
                Part::Call(c) => json!({"type": "tool_use", "id": c.id, "name": c.name,
                    "input": c.arguments_object()}),
                Part::Result(r) => json!({"type": "tool_result", "tool_use_id": r.call_id,
                    "content": r.content, "is_error": r.is_error}),
            })
            .collect(),
    )
}

/// The request body, apart from sending so tests can inspect the exact JSON.
fn body(req: &CompletionRequest, stream: bool) -> MessagesRequest<'_> {
    let messages = turns::alternating_parts(&req.messages)
        .into_iter()
        .map(|(role, parts)| WireMessage {
            role: match role {
                super::Role::User | super::Role::Tool => "user",
                super::Role::Assistant => "assistant",
            },
            content: content(parts),
        })
        .collect();
    let tools = req
        .tools
        .iter()
        .map(
            |t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}),
        )
        .collect();
    MessagesRequest {
        model: &req.model,
        max_tokens: req.max_tokens,
        system: system_with_schema(req),
        messages,
        temperature: req.temperature.map(|t| t.clamp(0.0, MAX_TEMPERATURE)),
        tools,
        tool_choice: req.tool_choice_to_send().map(wire_tool_choice),
        stream,
    }
}

/// `tool_choice` as Anthropic spells it: `required` is `any`, a named tool is `tool`.
fn wire_tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => json!({"type": "auto"}),
        ToolChoice::None => json!({"type": "none"}),
        ToolChoice::Required => json!({"type": "any"}),
        ToolChoice::Named(name) => json!({"type": "tool", "name": name}),
    }
}

#[derive(Debug, Deserialize)]
struct MessagesResponse {
    content: Vec<ContentBlock>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// The `message` of `message_start`: an empty answer with the prompt usage.
#[derive(Debug, Deserialize)]
struct MessagesResponseHead {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// One `content[]` block: `text` or `tool_use`; others (`thinking`, …) are skipped.
#[derive(Debug, Deserialize)]
struct ContentBlock {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

/// `usage` of a response, `message_start` or `message_delta`; any field may be absent or null.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Prompt tokens: `input_tokens` excludes cache writes and reads, zero as we never set
    /// `cache_control`, but added so no prompt token goes unmetered.
    fn prompt_tokens(&self) -> Option<u64> {
        let parts = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ];
        parts
            .iter()
            .any(Option::is_some)
            // Saturating: upstream numbers must not be able to panic us.
            .then(|| {
                parts
                    .iter()
                    .flatten()
                    .fold(0, |a: u64, b| a.saturating_add(*b))
            })
    }
}

impl MessagesResponse {
    fn into_completion(self) -> Result<Completion, ProviderError> {
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for block in self.content {
            match block.kind.as_str() {
                "text" => text.push_str(block.text.as_deref().unwrap_or_default()),
                "tool_use" => tool_calls.push(ToolCall {
                    id: block.id.unwrap_or_default(),
                    name: block
                        .name
                        .filter(|n| !n.is_empty())
                        .ok_or_else(|| ProviderError::Malformed("a tool_use has no name".into()))?,
                    arguments: block.input.map_or_else(String::new, |v| v.to_string()),
                }),
                _ => {}
            }
        }
        let usage = self.usage.unwrap_or_default();
        Ok(Completion {
            tool_calls,
            text,
            usage: TokenUsage {
                input_tokens: usage.prompt_tokens().unwrap_or(0),
                output_tokens: usage.output_tokens.unwrap_or(0),
            },
            finish_reason: finish_reason(self.stop_reason.as_deref()),
            citations: Vec::new(),
            model: self.model,
        })
    }
}

fn finish_reason(stop_reason: Option<&str>) -> FinishReason {
    match stop_reason {
        Some("end_turn" | "stop_sequence") => FinishReason::Stop,
        // Both mean the output was cut off for lack of room.
        Some("max_tokens" | "model_context_window_exceeded") => FinishReason::Length,
        Some("refusal") => FinishReason::ContentFilter,
        Some("tool_use") => FinishReason::ToolCalls,
        // pause_turn, absent, anything added later.
        _ => FinishReason::Other,
    }
}
