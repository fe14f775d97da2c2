//! A fake provider speaking real HTTP: it answers each request with the
//! next scripted reply (an SSE body sent frame by frame, optionally held
//! at a gate until the test opens it) and keeps every request body.
//! Builders write recorded-shape OpenAI Chat Completions and Anthropic
//! Messages streams, tool calls included.

use axum::{
    body::{Body, Bytes},
    http::{StatusCode, header},
    response::IntoResponse,
};
use serde_json::{Value, json};
use std::{
    collections::VecDeque,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};
use tokio::sync::Notify;

/// One scripted reply.
#[derive(Clone)]
pub struct Reply {
    status: u16,
    content_type: &'static str,
    frames: Vec<String>,
    /// Frames from this index on wait for the gate.
    gate: Option<(usize, Arc<Notify>)>,
}

impl Reply {
    /// An SSE body of `frames` (each a whole `data: ...\n\n` frame).
    pub fn sse(frames: Vec<String>) -> Self {
        Self {
            status: 200,
            content_type: "text/event-stream",
            frames,
            gate: None,
        }
    }

    /// A JSON body with `status`.
    pub fn json(status: u16, body: &Value) -> Self {
        Self {
            status,
            content_type: "application/json",
            frames: vec![body.to_string()],
            gate: None,
        }
    }

    /// Holds frames `from` on until `gate` is notified.
    pub fn gated(mut self, from: usize, gate: Arc<Notify>) -> Self {
        self.gate = Some((from, gate));
        self
    }
}

#[derive(Default)]
struct State {
    bodies: Vec<Value>,
    script: VecDeque<Reply>,
}

/// The running fake provider.
#[derive(Clone)]
pub struct Upstream {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl Upstream {
    /// Starts it with `script`.
    pub async fn start(script: impl IntoIterator<Item = Reply>) -> Self {
        let state = Arc::new(Mutex::new(State {
            bodies: Vec::new(),
            script: script.into_iter().collect(),
        }));
        let shared = state.clone();
        let app = axum::Router::new().fallback(move |body: Bytes| {
            let state = shared.clone();
            async move {
                let reply = {
                    let mut s = state.lock().unwrap();
                    s.bodies
                        .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                    s.script.pop_front()
                };
                let Some(reply) = reply else {
                    return (StatusCode::INTERNAL_SERVER_ERROR, "script exhausted").into_response();
                };
                let Reply {
                    status,
                    content_type,
                    frames,
                    gate,
                } = reply;
                let body = async_stream::stream! {
                    for (i, frame) in frames.into_iter().enumerate() {
                        if let Some((from, gate)) = &gate && i == *from {
                            gate.notified().await;
                        }
                        yield Ok::<_, Infallible>(Bytes::from(frame));
                    }
                };
                (
                    StatusCode::from_u16(status).unwrap(),
                    [(header::CONTENT_TYPE, content_type)],
                    Body::from_stream(body),
                )
                    .into_response()
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, state }
    }

    /// Its base URL with `/v1`.
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body so far.
    pub fn bodies(&self) -> Vec<Value> {
        self.state.lock().unwrap().bodies.clone()
    }
}

fn data(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// One OpenAI `chat.completion.chunk`.
fn oa_chunk(delta: &Value, finish: Option<&str>) -> String {
    data(&json!({
        "id": "chatcmpl-AgT1", "object": "chat.completion.chunk", "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0ba0d124f1",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
    }))
}

fn oa_end(finish: &str, prompt: u64, completion: u64) -> Vec<String> {
    vec![
        oa_chunk(&json!({}), Some(finish)),
        data(&json!({
            "id": "chatcmpl-AgT1", "object": "chat.completion.chunk", "created": 1_732_000_000,
            "model": "gpt-4o-mini-2024-07-18", "system_fingerprint": "fp_0ba0d124f1", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        })),
        "data: [DONE]\n\n".to_owned(),
    ]
}

/// An OpenAI stream of text `pieces`.
pub fn openai_text(pieces: &[&str]) -> Vec<String> {
    let mut frames = vec![oa_chunk(
        &json!({"role": "assistant", "content": "", "refusal": null}),
        None,
    )];
    frames.extend(
        pieces
            .iter()
            .map(|p| oa_chunk(&json!({"content": p}), None)),
    );
    frames.extend(oa_end("stop", 90, 12));
    frames
}

/// An OpenAI stream calling tools: `(id, wire name, argument pieces)` each,
/// as parallel calls (`index` 0, 1, ...), the arguments streamed in pieces.
pub fn openai_tool_calls(calls: &[(&str, &str, &[&str])]) -> Vec<String> {
    openai_text_then_tools("", calls)
}

/// An OpenAI stream saying `text` first, then calling tools (see
/// [`openai_tool_calls`]).
pub fn openai_text_then_tools(text: &str, calls: &[(&str, &str, &[&str])]) -> Vec<String> {
    let mut frames = vec![oa_chunk(
        &json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { json!("") }, "refusal": null}),
        None,
    )];
    if !text.is_empty() {
        frames.push(oa_chunk(&json!({"content": text}), None));
    }
    for (index, (id, name, pieces)) in calls.iter().enumerate() {
        frames.push(oa_chunk(
            &json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                                    "function": {"name": name, "arguments": ""}}]}),
            None,
        ));
        for piece in *pieces {
            frames.push(oa_chunk(
                &json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    frames.extend(oa_end("tool_calls", 80, 20));
    frames
}

/// OpenAI's error envelope with `status`.
pub fn openai_error(status: u16) -> Reply {
    Reply::json(
        status,
        &json!({"error": {"message": "The server had an error while processing your request.",
                          "type": "server_error", "param": null, "code": null}}),
    )
}

fn an_event(event: &str, v: &Value) -> String {
    format!("event: {event}\ndata: {v}\n\n")
}

/// An Anthropic Messages stream of text `pieces`.
pub fn anthropic_text(pieces: &[&str]) -> Vec<String> {
    let mut frames = vec![
        an_event(
            "message_start",
            &json!({"type": "message_start", "message": {"id": "msg_01XFDUDYJgAACzvnptvVoYEL",
                "type": "message", "role": "assistant", "model": "claude-3-haiku-20240307",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 120, "output_tokens": 1}}}),
        ),
        an_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
    ];
    frames.extend(pieces.iter().map(|p| {
        an_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}),
        )
    }));
    frames.push(an_event(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": 0}),
    ));
    frames.push(an_event(
        "message_delta",
        &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 15}}),
    ));
    frames.push(an_event("message_stop", &json!({"type": "message_stop"})));
    frames
}
