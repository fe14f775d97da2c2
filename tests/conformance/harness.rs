//! One behavioural contract for every provider adapter: each adapter supplies
//! a [`Fixture`] of recorded, realistic payloads and [`run_suite`] checks the
//! same scenarios against a fresh local HTTP server each, including how many
//! upstream calls were made (always exactly one: adapters never retry).
//!
//! Providers are built through the real config path
//! (`Config::from_toml_str` + `Providers::from_config`), so the kind's wiring
//! and key loading are exercised too.

use ai_orchestrator::config::Config;
use ai_orchestrator::{
    domain::{
        ChatMessage, Completion, CompletionRequest, ProviderError, StreamEvent, ToolChoice,
        completion::Role,
    },
    providers::{Provider, Providers},
};
use futures::StreamExt;
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

/// Text every fixture's error bodies carry in their human-readable message;
/// it must never surface in a [`ProviderError`].
pub const CANARY: &str = "canary-upstream-secret";

/// Deadline of calls that are expected to get an answer (generous: the
/// machine may be busy).
const NORMAL: Duration = Duration::from_secs(5);

/// The API key the harness configures (through `TEST_KEY`).
pub const TEST_KEY: &str = "test-key";

/// Everything the suite needs to know about one adapter.
pub struct Fixture {
    /// Provider name in the config, e.g. `"openai"`.
    pub name: &'static str,
    /// Config kind string, e.g. `"openai_compatible"`.
    pub kind: &'static str,
    /// Model sent in every request.
    pub model: &'static str,
    /// Appended to the server URI to form `base_url`, e.g. `"/v1"`.
    pub base_path: &'static str,
    /// Full path of a non-streaming call, e.g. `"/v1/chat/completions"`.
    pub complete_path: String,
    /// Full path of a streaming call, query string excluded.
    pub stream_path: String,
    /// Header (lower-case name, value) expected for key `test-key`.
    pub auth_header: (&'static str, &'static str),
    /// A recorded, realistic non-streaming success.
    pub success_body: Value,
    /// The answer text in `success_body` and in `stream_body`.
    pub expected_text: &'static str,
    /// `(input, output)` tokens in `success_body` and in `stream_body`.
    pub expected_usage: (u64, u64),
    /// A whole successful SSE body, usage included.
    pub stream_body: String,
    /// A successful SSE body (some text) with no usage: Done with zero usage.
    pub stream_missing_usage_body: String,
    /// An SSE body cut off mid-answer: must end in `Err(Malformed)`.
    pub truncated_stream_body: String,
    /// The provider's error envelope for a status; its message must contain
    /// [`CANARY`].
    pub error_body: fn(u16) -> Value,
    /// The provider's "overloaded" status (Anthropic 529), if it has one.
    pub overloaded_status: Option<u16>,
}

/// Runs every scenario, each against its own server.
pub async fn run_suite(f: Fixture) {
    success(&f).await;
    stream_success(&f).await;
    stream_missing_usage(&f).await;
    truncated_stream(&f).await;
    client_error(&f, 400).await;
    client_error(&f, 401).await;
    rate_limited(&f, false).await;
    rate_limited(&f, true).await;
    server_error(&f, 500).await;
    if let Some(status) = f.overloaded_status {
        let err = server_error(&f, status).await;
        assert_eq!(err.code(), "OVERLOADED", "{}: overloaded", f.name);
    }
    malformed_body(&f).await;
    hangs(&f, false).await;
    hangs(&f, true).await;
}

/// A provider of fixture `f` wired to `server`, with or without an API key.
pub fn provider(f: &Fixture, server: &MockServer, with_key: bool) -> Arc<dyn Provider> {
    let key = if with_key {
        "api_key_env = \"TEST_KEY\"\n"
    } else {
        ""
    };
    let toml = format!(
        "[providers.{name}]\nkind = \"{kind}\"\nbase_url = \"{uri}{base}\"\n{key}\
         timeout = \"5s\"\nstream_idle_timeout = \"2s\"\n",
        name = f.name,
        kind = f.kind,
        uri = server.uri(),
        base = f.base_path,
    );
    let env = |var: &str| (var == "TEST_KEY").then(|| TEST_KEY.to_owned());
    let config = Config::from_toml_str(&toml, env).expect("fixture config is valid");
    let providers = Providers::from_config(&config).expect("provider builds");
    providers.get(f.name).expect("provider is registered")
}

/// A typical request to the fixture's model.
pub fn request(f: &Fixture, trace_id: &str) -> CompletionRequest {
    CompletionRequest {
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        model: f.model.into(),
        system: Some("You are a terse assistant.".into()),
        messages: vec![ChatMessage {
            role: Role::User,
            content: "Say hello.".into(),
            ..Default::default()
        }],
        temperature: Some(0.2),
        max_tokens: 64,
        response_format: None,
        trace_id: trace_id.into(),
        traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
        deadline: Instant::now() + NORMAL,
    }
}

/// A server answering `path` with `response`.
pub async fn serve(path_: &str, response: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path(path_))
        .respond_with(response)
        .mount(&server)
        .await;
    server
}

/// An SSE body of `data:` events, one per chunk, ending with `data: [DONE]`
/// when `done`.
pub fn data_events(chunks: &[Value], done: bool) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    body
}

/// A 200 `text/event-stream` answer.
pub fn sse(body: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_raw(body.to_owned(), "text/event-stream")
}

/// The one request `server` received (asserting it got exactly one).
pub async fn only_request(server: &MockServer, what: &str) -> Request {
    let mut all = server.received_requests().await.expect("recording is on");
    assert_eq!(all.len(), 1, "{what}: upstream requests");
    all.remove(0)
}

/// Every item of a stream.
pub async fn collect(
    provider: &Arc<dyn Provider>,
    req: CompletionRequest,
) -> Result<Vec<Result<StreamEvent, ProviderError>>, ProviderError> {
    Ok(provider.stream(req).await?.collect().await)
}

/// The concatenated deltas and the final `Done` of a stream that must succeed.
pub fn finished(items: &[Result<StreamEvent, ProviderError>], what: &str) -> (String, Completion) {
    let mut text = String::new();
    for (i, item) in items.iter().enumerate() {
        match item {
            Ok(StreamEvent::Delta(t)) => text.push_str(t),
            Ok(StreamEvent::Done(c)) => {
                assert_eq!(i + 1, items.len(), "{what}: Done is the last item");
                return (text, c.clone());
            }
            Err(e) => panic!("{what}: stream item {i} failed: {e:?}"),
        }
    }
    panic!("{what}: stream ended without Done: {items:?}")
}

async fn success(f: &Fixture) {
    let what = format!("{}: success", f.name);
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(&f.success_body),
    )
    .await;
    let out = provider(f, &server, true)
        .complete(request(f, "trace-success"))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    assert_eq!(out.text, f.expected_text, "{what}: text");
    let usage = (out.usage.input_tokens, out.usage.output_tokens);
    assert_eq!(usage, f.expected_usage, "{what}: usage");

    let req = only_request(&server, &what).await;
    let header = |name: &str| req.headers.get(name).and_then(|v| v.to_str().ok());
    assert_eq!(
        header(f.auth_header.0),
        Some(f.auth_header.1),
        "{what}: auth"
    );
    assert_eq!(header("x-trace-id"), Some("trace-success"), "{what}: trace");
    let traceparent = request(f, "").traceparent;
    assert_eq!(
        header("traceparent"),
        traceparent.as_deref(),
        "{what}: traceparent"
    );
    let body: Value = req.body_json().expect("request body is JSON");
    // Most formats name the model in the body; Gemini puts it in the path.
    match body.get("model") {
        Some(model) => assert_eq!(model, f.model, "{what}: model in body"),
        None => assert!(req.url.path().contains(f.model), "{what}: model in path"),
    }
}

async fn stream_success(f: &Fixture) {
    let what = format!("{}: stream", f.name);
    let server = serve(&f.stream_path, sse(&f.stream_body)).await;
    let items = collect(&provider(f, &server, true), request(f, "trace-stream"))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let (deltas, done) = finished(&items, &what);
    assert_eq!(deltas, f.expected_text, "{what}: deltas");
    assert_eq!(done.text, f.expected_text, "{what}: Done text");
    let usage = (done.usage.input_tokens, done.usage.output_tokens);
    assert_eq!(usage, f.expected_usage, "{what}: usage");
    let req = only_request(&server, &what).await;
    let trace = req.headers.get("x-trace-id").and_then(|v| v.to_str().ok());
    assert_eq!(trace, Some("trace-stream"), "{what}: trace");
}

async fn stream_missing_usage(f: &Fixture) {
    let what = format!("{}: stream without usage", f.name);
    let server = serve(&f.stream_path, sse(&f.stream_missing_usage_body)).await;
    let items = collect(&provider(f, &server, true), request(f, "trace-no-usage"))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let (deltas, done) = finished(&items, &what);
    assert!(!deltas.is_empty(), "{what}: some text");
    assert_eq!(done.text, deltas, "{what}: Done text");
    assert_eq!(
        (done.usage.input_tokens, done.usage.output_tokens),
        (0, 0),
        "{what}: zero usage"
    );
    only_request(&server, &what).await;
}

async fn truncated_stream(f: &Fixture) {
    let what = format!("{}: truncated stream", f.name);
    let server = serve(&f.stream_path, sse(&f.truncated_stream_body)).await;
    let err = match collect(&provider(f, &server, true), request(f, "trace-cut")).await {
        Err(e) => e,
        Ok(items) => {
            assert!(
                !items.iter().any(|i| matches!(i, Ok(StreamEvent::Done(_)))),
                "{what}: no Done in {items:?}"
            );
            match items.last() {
                Some(Err(e)) => e.clone(),
                _ => panic!("{what}: must end with an error: {items:?}"),
            }
        }
    };
    assert!(
        matches!(err, ProviderError::Malformed(_)),
        "{what}: {err:?}"
    );
    only_request(&server, &what).await;
}

/// Calls `f`'s endpoint (stream or not) against `response` with `timeout`,
/// expecting an error that leaks nothing of the body, after exactly one
/// request.
async fn failing_call(
    f: &Fixture,
    stream: bool,
    response: ResponseTemplate,
    timeout: Duration,
    what: &str,
) -> ProviderError {
    let path_ = if stream {
        &f.stream_path
    } else {
        &f.complete_path
    };
    let server = serve(path_, response).await;
    let p = provider(f, &server, true);
    let mut req = request(f, "trace-failing");
    req.deadline = Instant::now() + timeout;
    let err = if stream {
        match collect(&p, req).await {
            Err(e) => e,
            Ok(items) => panic!("{what}: expected the call to fail, got {items:?}"),
        }
    } else {
        match p.complete(req).await {
            Err(e) => e,
            Ok(c) => panic!("{what}: expected the call to fail, got {c:?}"),
        }
    };
    let shown = format!("{err:?} / {err}");
    assert!(
        !shown.contains(CANARY),
        "{what}: leaks the upstream message: {shown}"
    );
    only_request(&server, what).await;
    err
}

fn error_response(f: &Fixture, status: u16) -> ResponseTemplate {
    let body = (f.error_body)(status);
    assert!(
        body.to_string().contains(CANARY),
        "{}: error_body({status}) must carry {CANARY:?} in its message",
        f.name
    );
    ResponseTemplate::new(status).set_body_json(body)
}

async fn client_error(f: &Fixture, status: u16) {
    let what = format!("{}: HTTP {status}", f.name);
    let err = failing_call(f, false, error_response(f, status), NORMAL, &what).await;
    assert!(
        matches!(err, ProviderError::Status { status: s, .. } if s == status),
        "{what}: {err:?}"
    );
    assert!(!err.is_retryable(), "{what}: not retryable");
    assert!(
        !err.counts_against_breaker(),
        "{what}: not a breaker failure"
    );
}

async fn rate_limited(f: &Fixture, stream: bool) {
    let what = format!("{}: 429 (stream: {stream})", f.name);
    let response = error_response(f, 429).insert_header("retry-after", "7");
    let err = failing_call(f, stream, response, NORMAL, &what).await;
    assert!(err.is_rate_limited(), "{what}: {err:?}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(7)), "{what}");
    assert!(
        err.is_retryable() && !err.counts_against_breaker(),
        "{what}"
    );
}

async fn server_error(f: &Fixture, status: u16) -> ProviderError {
    let what = format!("{}: HTTP {status}", f.name);
    let err = failing_call(f, false, error_response(f, status), NORMAL, &what).await;
    assert!(
        matches!(err, ProviderError::Status { status: s, .. } if s == status),
        "{what}: {err:?}"
    );
    assert!(err.is_retryable(), "{what}: retryable");
    assert!(
        err.counts_against_breaker(),
        "{what}: counts against breaker"
    );
    err
}

async fn malformed_body(f: &Fixture) {
    let what = format!("{}: malformed JSON", f.name);
    let response = ResponseTemplate::new(200).set_body_raw(r#"{"choices": ["#, "application/json");
    let err = failing_call(f, false, response, NORMAL, &what).await;
    assert!(
        matches!(err, ProviderError::Malformed(_)),
        "{what}: {err:?}"
    );
}

async fn hangs(f: &Fixture, stream: bool) {
    let what = format!("{}: hanging server (stream: {stream})", f.name);
    let body = if stream {
        sse(&f.stream_body)
    } else {
        ResponseTemplate::new(200).set_body_json(&f.success_body)
    };
    let started = Instant::now();
    let err = failing_call(
        f,
        stream,
        body.set_delay(Duration::from_secs(3)),
        Duration::from_millis(300),
        &what,
    )
    .await;
    assert_eq!(err, ProviderError::Timeout, "{what}");
    // The 300 ms deadline is honoured, not the 5 s provider timeout.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{what}: {:?}",
        started.elapsed()
    );
}

/// A tool's result message, answering call `id` of tool `name`.
pub fn tool_result(id: &str, name: &str, content: &str, is_error: bool) -> ChatMessage {
    ChatMessage {
        role: Role::Tool,
        tool_result: Some(ai_orchestrator::domain::ToolOutcome {
            call_id: id.into(),
            name: name.into(),
            content: content.into(),
            is_error,
        }),
        ..Default::default()
    }
}
