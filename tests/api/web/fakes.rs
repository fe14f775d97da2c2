//! The providers behind the edge, as real HTTP servers (wiremock) with
//! recorded-shape payloads: OpenAI Chat Completions and Anthropic Messages,
//! each plain or as an SSE stream as the request asks, and an OpenAI-wire
//! provider that always fails with 500. The OpenAI fake reads each request:
//! with `tools` and the user's message last it calls `get_weather`; with a
//! tool result last it answers from it; the `*-slow` model answers late.

use serde_json::{Value, json};
use std::time::Duration;
use wiremock::{
    Mock, MockServer, Request, ResponseTemplate,
    matchers::{method, path},
};

/// What the OpenAI fake says.
pub const OPENAI_TEXT: &str = "Hello from the fake OpenAI.";
/// The same, in the pieces its streams send.
const OPENAI_PIECES: [&str; 3] = ["Hello", " from the fake", " OpenAI."];
/// What the Anthropic fake says.
pub const ANTHROPIC_TEXT: &str = "Hello from the fake Anthropic.";
const ANTHROPIC_PIECES: [&str; 2] = ["Hello from", " the fake Anthropic."];
/// The OpenAI fake's answer once the caller sent its tool's result.
pub const WEATHER_TEXT: &str = "21 degrees in Paris";
/// The tool call the OpenAI fake makes.
pub const TOOL_CALL_ID: &str = "call_Wx1Lq8fK2b";
pub const TOOL_NAME: &str = "get_weather";
const TOOL_ARGUMENT_PIECES: [&str; 2] = ["{\"city\":", "\"Paris\"}"];
/// The broken provider's error message, which must never reach a caller.
pub const UPSTREAM_SECRET: &str = "canary-upstream-secret";
/// The usage every fake reports.
pub const PROMPT_TOKENS: u64 = 7;
pub const COMPLETION_TOKENS: u64 = 3;
/// The model whose answers take [`SLOW`].
pub const SLOW_MODEL: &str = "gpt-4o-mini-slow";
pub const SLOW: Duration = Duration::from_millis(1500);

/// The three fakes, started.
pub struct Fakes {
    pub openai: MockServer,
    pub anthropic: MockServer,
    pub broken: MockServer,
}

impl Fakes {
    pub async fn start() -> Self {
        let openai = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(openai_answer)
            .mount(&openai)
            .await;
        let anthropic = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/messages"))
            .respond_with(anthropic_answer)
            .mount(&anthropic)
            .await;
        let broken = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(500).set_body_json(json!({
                "error": {"message": UPSTREAM_SECRET, "type": "server_error",
                          "param": null, "code": null}
            })))
            .mount(&broken)
            .await;
        Self {
            openai,
            anthropic,
            broken,
        }
    }
}

/// Base URLs as the providers' `base_url` (with `/v1`).
pub fn base_url(server: &MockServer) -> String {
    format!("{}/v1", server.uri())
}

fn sse(frames: Vec<String>) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(frames.concat(), "text/event-stream")
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn usage() -> Value {
    json!({"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
           "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS})
}

/// The OpenAI fake: a tool call, the answer from a tool's result, or text.
fn openai_answer(request: &Request) -> ResponseTemplate {
    let body: Value = request.body_json().unwrap_or(Value::Null);
    let stream = body["stream"] == true;
    let last_role = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["role"].as_str())
        .unwrap_or_default()
        .to_owned();
    let offers_tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let reply = if offers_tools && last_role == "user" {
        if stream {
            sse(openai_tool_call_stream())
        } else {
            let call = json!({"id": TOOL_CALL_ID, "type": "function",
                "function": {"name": TOOL_NAME, "arguments": TOOL_ARGUMENT_PIECES.concat()}});
            openai_completion(
                json!({"role": "assistant", "content": null, "refusal": null, "tool_calls": [call]}),
                "tool_calls",
            )
        }
    } else {
        let pieces: &[&str] = if last_role == "tool" {
            &[WEATHER_TEXT]
        } else {
            &OPENAI_PIECES
        };
        if stream {
            sse(openai_text_stream(pieces))
        } else {
            openai_completion(
                json!({"role": "assistant", "content": pieces.concat(), "refusal": null}),
                "stop",
            )
        }
    };
    if body["model"] == SLOW_MODEL {
        reply.set_delay(SLOW)
    } else {
        reply
    }
}

fn openai_completion(message: Value, finish: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-AgT1", "object": "chat.completion", "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0ba0d124f1",
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
        "usage": usage()
    }))
}

/// One OpenAI `chat.completion.chunk`.
fn oa_chunk(delta: &Value, finish: Option<&str>) -> String {
    data(&json!({
        "id": "chatcmpl-AgT1", "object": "chat.completion.chunk", "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0ba0d124f1",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
    }))
}

/// The finish chunk, the usage chunk (no choices) and `[DONE]`.
fn oa_end(finish: &str) -> Vec<String> {
    vec![
        oa_chunk(&json!({}), Some(finish)),
        data(&json!({
            "id": "chatcmpl-AgT1", "object": "chat.completion.chunk", "created": 1_732_000_000,
            "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0ba0d124f1",
            "choices": [], "usage": usage()
        })),
        "data: [DONE]\n\n".to_owned(),
    ]
}

fn openai_text_stream(pieces: &[&str]) -> Vec<String> {
    let mut frames = vec![oa_chunk(
        &json!({"role": "assistant", "content": "", "refusal": null}),
        None,
    )];
    frames.extend(
        pieces
            .iter()
            .map(|p| oa_chunk(&json!({"content": p}), None)),
    );
    frames.extend(oa_end("stop"));
    frames
}

/// `get_weather` called as OpenAI streams it: the call's head, then its
/// arguments in pieces.
fn openai_tool_call_stream() -> Vec<String> {
    let mut frames = vec![
        oa_chunk(
            &json!({"role": "assistant", "content": null, "refusal": null}),
            None,
        ),
        oa_chunk(
            &json!({"tool_calls": [{"index": 0, "id": TOOL_CALL_ID, "type": "function",
                                    "function": {"name": TOOL_NAME, "arguments": ""}}]}),
            None,
        ),
    ];
    frames.extend(TOOL_ARGUMENT_PIECES.iter().map(|piece| {
        oa_chunk(
            &json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}),
            None,
        )
    }));
    frames.extend(oa_end("tool_calls"));
    frames
}

/// The Anthropic fake: text, plain or streamed.
fn anthropic_answer(request: &Request) -> ResponseTemplate {
    let body: Value = request.body_json().unwrap_or(Value::Null);
    if body["stream"] == true {
        return sse(anthropic_stream());
    }
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
        "model": "claude-3-haiku-20240307",
        "content": [{"type": "text", "text": ANTHROPIC_TEXT}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": COMPLETION_TOKENS}
    }))
}

fn an_event(event: &str, v: &Value) -> String {
    format!("event: {event}\ndata: {v}\n\n")
}

fn anthropic_stream() -> Vec<String> {
    let mut frames = vec![
        an_event(
            "message_start",
            &json!({"type": "message_start", "message": {"id": "msg_01XFDUDYJgAACzvnptvVoYEL",
                "type": "message", "role": "assistant", "model": "claude-3-haiku-20240307",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1}}}),
        ),
        an_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    frames.extend(ANTHROPIC_PIECES.iter().map(|p| {
        an_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": p}}),
        )
    }));
    frames.push(an_event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    frames.push(an_event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": COMPLETION_TOKENS}}),
    ));
    frames.push(an_event("message_stop", &json!({"type": "message_stop"})));
    frames
}
