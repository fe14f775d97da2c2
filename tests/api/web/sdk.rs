//! OpenAI's official SDKs (Python and Node, pinned in
//! `tools/counterparts.rs`) against the edge: what a team's existing code
//! sees when it points `base_url` at us. Each test runs one scenario of a
//! driver (`openai_sdk.py`, `openai_sdk.mjs`: same scenarios, same report)
//! against a fresh server, and one check per scenario holds for both SDKs:
//! the SDKs' own parsing (types, stream accumulation, error classes,
//! retry-after handling) is what is under test, not ours.

use super::fakes::{
    ANTHROPIC_TEXT, COMPLETION_TOKENS, OPENAI_TEXT, PROMPT_TOKENS, TOOL_NAME, UPSTREAM_SECRET,
    WEATHER_TEXT,
};
use super::{Edge, KEY, report, script};
use crate::tools::counterparts;
use serde_json::{Value, json};
use tokio::process::Command;
use wiremock::MockServer;

#[derive(Clone, Copy)]
enum Sdk {
    Python,
    Node,
}

/// Runs `scenario` of `sdk`'s driver against a fresh server (`server`
/// lines added to its `[server]`): the driver's report and the server, to
/// read its fakes and stop it.
async fn run(sdk: Sdk, scenario: &str, server: &str) -> (Value, Edge) {
    // Installed (when missing) before the server starts.
    let mut command = match sdk {
        Sdk::Python => {
            let mut c = Command::new(counterparts::python_with_openai());
            c.arg(script("openai_sdk.py"));
            c
        }
        Sdk::Node => {
            let mut c = Command::new("node");
            c.arg(script("openai_sdk.mjs"))
                .env("AIO_OPENAI_NODE", counterparts::node_openai());
            c
        }
    };
    let edge = Edge::start(server).await;
    let out = report(
        command
            .arg(scenario)
            .env("AIO_BASE_URL", edge.base_url())
            .env("AIO_API_KEY", KEY),
    )
    .await;
    (out, edge)
}

/// The JSON bodies `server` received, in order.
async fn bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| r.body_json().unwrap_or(Value::Null))
        .collect()
}

fn usage() -> Value {
    json!({"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS,
           "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS})
}

/// A plain completion: the SDK's typed result, usage, our trace header.
async fn chat(sdk: Sdk) {
    let (v, edge) = run(sdk, "chat", "").await;
    assert_eq!(v["content"], OPENAI_TEXT, "{v}");
    assert_eq!(v["finish_reason"], "stop");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "chat", "the task's name, as the caller asked");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"], usage());
    assert_eq!(v["trace_header"], "sdk-chat-1", "the caller's trace ID");
    // The caller's messages go to the provider as given.
    let sent = bodies(&edge.fakes.openai).await;
    assert_eq!(sent.len(), 1, "{sent:?}");
    let messages: Vec<(&str, &str)> = sent[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default(),
                m["content"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(messages, [("system", "Be brief."), ("user", "Hi")]);
    edge.stop().await;
}

/// A stream with usage: the SDK's chunk types and accumulation.
async fn stream(sdk: Sdk) {
    let (v, edge) = run(sdk, "stream", "").await;
    assert_eq!(v["content"], OPENAI_TEXT, "{v}");
    assert_eq!(v["first_role"], "assistant");
    assert_eq!(v["finish_reason"], "stop");
    for (field, expected) in usage().as_object().unwrap() {
        assert_eq!(&v["usage"][field], expected, "{v}");
    }
    assert_eq!(
        v["usage_chunk_choices"], 0,
        "usage comes in a chunk of its own"
    );
    // The role, a finish and the usage at least, whatever the pieces.
    assert!(v["chunks"].as_u64().unwrap() >= 3, "{v}");
    edge.stop().await;
}

/// The arguments of a reported tool call, parsed.
fn arguments(call: &Value) -> Value {
    serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap()
}

/// Tools pass through both ways: the model's call, the caller's result.
async fn tools(sdk: Sdk) {
    let (v, edge) = run(sdk, "tools", "").await;
    assert_eq!(v["finish_reason"], "tool_calls", "{v}");
    let calls = v["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    let call = &calls[0];
    assert!(call["id"].as_str().is_some_and(|id| !id.is_empty()), "{v}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["name"], TOOL_NAME);
    assert_eq!(arguments(call), json!({"city": "Paris"}));
    assert_eq!(v["answer"], WEATHER_TEXT);

    // Streamed, the same call once the SDK merged its deltas.
    assert_eq!(v["stream_finish_reason"], "tool_calls", "{v}");
    let streamed = v["stream_tool_calls"].as_array().unwrap();
    assert_eq!(streamed.len(), 1, "{v}");
    for field in ["id", "type", "name"] {
        assert_eq!(streamed[0][field], call[field], "{field}: {v}");
    }
    assert_eq!(arguments(&streamed[0]), json!({"city": "Paris"}));

    // The provider got the tool, then the call and its result back.
    let sent = bodies(&edge.fakes.openai).await;
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[0]["tools"][0]["function"]["name"], TOOL_NAME);
    let messages = sent[1]["messages"].as_array().unwrap();
    let result = messages.last().unwrap();
    assert_eq!(result["role"], "tool", "{result}");
    assert_eq!(result["content"], "{\"temp_c\": 21}");
    let asked = &messages[messages.len() - 2];
    assert_eq!(asked["role"], "assistant", "{asked}");
    assert_eq!(asked["tool_calls"][0]["id"], result["tool_call_id"]);
    edge.stop().await;
}

/// One reported error: its SDK class, status and our stable reason.
fn refused(v: &Value, class: &str, status: u16, code: &str) {
    assert_eq!(v["class"], class, "{v}");
    assert_eq!(v["status"], status, "{v}");
    assert_eq!(v["code"], code, "{v}");
    assert!(v["type"].is_string(), "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(!message.is_empty(), "{v}");
    assert!(
        !message.contains(UPSTREAM_SECRET),
        "no upstream detail: {v}"
    );
}

/// Each error class the SDKs map from our statuses and bodies.
async fn errors(sdk: Sdk) {
    let (v, edge) = run(sdk, "errors", "").await;
    refused(&v["auth"], "AuthenticationError", 401, "API_KEY_INVALID");
    refused(
        &v["permission"],
        "PermissionDeniedError",
        403,
        "TEAM_NOT_ALLOWED",
    );
    refused(&v["not_found"], "NotFoundError", 404, "NOT_FOUND");
    refused(&v["bad_request"], "BadRequestError", 400, "TASK_UNKNOWN");
    assert_eq!(v["bad_request"]["param"], "model", "{v}");
    refused(
        &v["unavailable"],
        "InternalServerError",
        503,
        "ALL_PROVIDERS_FAILED",
    );
    assert_eq!(v["unavailable"]["retry_after"], "1", "{v}");
    assert!(
        edge.fakes
            .openai
            .received_requests()
            .await
            .unwrap()
            .is_empty(),
        "nothing refused reached a provider"
    );
    edge.stop().await;
}

/// Refused while one request holds the only slot; the SDK's own retries
/// (honouring `retry-after-ms`) get through once it is free.
async fn rate_limit(sdk: Sdk) {
    let (v, edge) = run(sdk, "rate_limit", "max_concurrent_requests = 1").await;
    refused(&v["refused"], "RateLimitError", 429, "OVERLOADED");
    assert_eq!(v["refused"]["retry_after_ms"], "200", "{v}");
    assert_eq!(v["refused"]["retry_after"], "1", "{v}");
    assert!(v["retried"]["retries_taken"].as_u64().unwrap() >= 1, "{v}");
    assert_eq!(v["retried"]["content"], OPENAI_TEXT);
    assert_eq!(v["slow_content"], OPENAI_TEXT, "{v}");
    edge.stop().await;
}

/// The OpenAI-wire provider fails, the Anthropic-wire one answers: the
/// caller sees OpenAI's format either way, plain and streamed.
async fn fallback(sdk: Sdk) {
    let (v, edge) = run(sdk, "fallback", "").await;
    assert_eq!(v["content"], ANTHROPIC_TEXT, "{v}");
    assert_eq!(v["stream_content"], ANTHROPIC_TEXT, "{v}");
    assert!(
        !edge
            .fakes
            .broken
            .received_requests()
            .await
            .unwrap()
            .is_empty()
    );
    let answered = bodies(&edge.fakes.anthropic).await;
    assert_eq!(answered.len(), 2, "one call each: {answered:?}");
    edge.stop().await;
}

/// Every task, and the agent, as a model.
async fn models(sdk: Sdk) {
    let (v, edge) = run(sdk, "models", "").await;
    let ids: Vec<&str> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap())
        .collect();
    for id in [
        "chat",
        "chat_tools",
        "down",
        "slow",
        "fallback",
        "agent/helper",
    ] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    edge.stop().await;
}

#[tokio::test]
async fn the_python_sdk_chats() {
    chat(Sdk::Python).await;
}

#[tokio::test]
async fn the_node_sdk_chats() {
    chat(Sdk::Node).await;
}

#[tokio::test]
async fn the_python_sdk_streams_with_usage() {
    stream(Sdk::Python).await;
}

#[tokio::test]
async fn the_node_sdk_streams_with_usage() {
    stream(Sdk::Node).await;
}

#[tokio::test]
async fn the_python_sdk_runs_its_own_tools() {
    tools(Sdk::Python).await;
}

#[tokio::test]
async fn the_node_sdk_runs_its_own_tools() {
    tools(Sdk::Node).await;
}

#[tokio::test]
async fn the_python_sdk_raises_its_error_classes() {
    errors(Sdk::Python).await;
}

#[tokio::test]
async fn the_node_sdk_throws_its_error_classes() {
    errors(Sdk::Node).await;
}

#[tokio::test]
async fn the_python_sdk_is_refused_then_retries_after_the_advised_wait() {
    rate_limit(Sdk::Python).await;
}

#[tokio::test]
async fn the_node_sdk_is_refused_then_retries_after_the_advised_wait() {
    rate_limit(Sdk::Node).await;
}

#[tokio::test]
async fn the_python_sdk_gets_the_fallback_providers_answer() {
    fallback(Sdk::Python).await;
}

#[tokio::test]
async fn the_node_sdk_gets_the_fallback_providers_answer() {
    fallback(Sdk::Node).await;
}

#[tokio::test]
async fn the_python_sdk_lists_tasks_and_agents_as_models() {
    models(Sdk::Python).await;
}

#[tokio::test]
async fn the_node_sdk_lists_tasks_and_agents_as_models() {
    models(Sdk::Node).await;
}
