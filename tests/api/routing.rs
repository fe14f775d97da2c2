//! Routing end to end: the real server, fake providers speaking the OpenAI
//! wire format over real HTTP, exact upstream call counts.

use crate::common::{TestApp, brief_events, ctx};
use ai_orchestrator::api::pb::{self, execute_event::Event};
use serde_json::json;
use std::time::{Duration, Instant};
use tonic::Code;
use tonic_types::StatusExt;
use wiremock::{
    Mock, MockServer, ResponseTemplate,
    matchers::{method, path},
};

/// A Chat Completions success whose content is `content`.
pub(crate) fn completion(content: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-AbC123",
        "object": "chat.completion",
        "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": null},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 18, "total_tokens": 138},
        "system_fingerprint": "fp_0ba0d124f1"
    }))
}

pub(crate) fn classification() -> ResponseTemplate {
    completion(r#"{"intent":"QUESTION","confidence":0.88,"reason":"asks about pricing"}"#)
}

fn error(status: u16) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_json(json!({
        "error": {"message": "canary-upstream-secret", "type": "server_error", "param": null, "code": null}
    }))
}

/// Config with `primary` (openai) and `fallback` (openai_compatible) at the
/// given fake servers' base URIs; `retry` lines added to the `[retry]` table.
fn toml(db: &str, primary: &str, fallback: &str, retry: &str) -> String {
    format!(
        r#"
[server]
default_timeout = "10s"
health_probe_interval = "1s"
[database]
url = "sqlite://{db}"
max_connections = 1
[providers.primary]
kind = "openai"
base_url = "{primary}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "2s"
[providers.fallback]
kind = "openai_compatible"
base_url = "{fallback}/v1"
timeout = "2s"
[tasks.sms_classify]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "fallback", model = "llama3" }}]
[tasks.meeting_brief]
chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "fallback", model = "llama3" }}]
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
[pricing.llama3]
price = "unknown"
[retry]
base_backoff = "20ms"
max_backoff = "80ms"
interactive_max_wait = "0ms"
{retry}
"#
    )
}

async fn spawn(primary: &MockServer, fallback: &MockServer, retry: &str) -> TestApp {
    spawn_at(&primary.uri(), &fallback.uri(), retry).await
}

/// The server with `primary` and `fallback` at these base URIs (see [`toml`]).
pub(crate) async fn spawn_at(primary: &str, fallback: &str, retry: &str) -> TestApp {
    // Its own SQLite file, kept until the app is dropped.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("routing.db");
    let mut app = TestApp::spawn_toml_env(
        &toml(&db.display().to_string(), primary, fallback, retry),
        |name| (name == "TEST_OPENAI_KEY").then(|| "sk-test".to_owned()),
    )
    .await;
    app.keep(dir);
    app
}

pub(crate) fn classify(priority: pb::Priority) -> pb::ClassifySmsRequest {
    let mut context = ctx().unwrap();
    context.priority = priority as i32;
    pb::ClassifySmsRequest {
        context: Some(context),
        message: "How much does it cost?".into(),
        ..Default::default()
    }
}

/// Each attempt of a call as `(provider, retry, error code)`.
fn tries(meta: &pb::ResponseMeta) -> Vec<(String, u32, String)> {
    meta.attempts
        .iter()
        .map(|a| (a.provider.clone(), a.retry, a.error_code.clone()))
        .collect()
}

pub(crate) async fn calls(server: &MockServer) -> usize {
    server.received_requests().await.map_or(0, |r| r.len())
}

#[tokio::test]
async fn background_retries_the_primary_then_falls_back() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(error(500))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "").await;

    let reply = app
        .client
        .clone()
        .classify_sms(classify(pb::Priority::Background))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.intent, pb::SmsIntent::Question as i32);
    let meta = reply.meta.unwrap();
    assert!(meta.degraded);
    assert_eq!(
        (meta.provider.as_str(), meta.model.as_str()),
        ("fallback", "llama3")
    );
    assert_eq!(calls(&primary).await, 3, "max_attempts = 3 at the primary");
    assert_eq!(calls(&fallback).await, 1);
    assert_eq!(
        tries(&meta),
        [
            ("primary".into(), 0, "HTTP_500".into()),
            ("primary".into(), 1, "HTTP_500".into()),
            ("primary".into(), 2, "HTTP_500".into()),
            ("fallback".into(), 0, String::new()),
        ]
    );
    // The trace ID travelled upstream; the key only to its own provider.
    let sent = &primary.received_requests().await.unwrap()[0];
    assert_eq!(
        sent.headers.get("x-trace-id").unwrap().to_str().unwrap(),
        meta.trace_id
    );
    assert_eq!(
        sent.headers.get("authorization").unwrap().to_str().unwrap(),
        "Bearer sk-test"
    );
    let to_fallback = &fallback.received_requests().await.unwrap()[0];
    assert!(
        to_fallback.headers.get("authorization").is_none(),
        "no key leaks to another provider"
    );
    app.stop().await;
}

#[tokio::test]
async fn interactive_fails_over_instead_of_waiting_and_client_errors_are_not_retried() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(400))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "").await;
    let meta = app
        .client
        .clone()
        .classify_sms(classify(pb::Priority::Background))
        .await
        .unwrap()
        .into_inner()
        .meta
        .unwrap();
    assert_eq!(calls(&primary).await, 1, "a 400 is never retried");
    assert_eq!(meta.attempts[0].error_code, "HTTP_400");
    app.stop().await;

    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(503))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "").await;
    app.client
        .clone()
        .classify_sms(classify(pb::Priority::Interactive))
        .await
        .unwrap();
    assert_eq!(
        calls(&primary).await,
        1,
        "INTERACTIVE moves on rather than sleeping"
    );
    app.stop().await;
}

#[tokio::test]
async fn breaker_opens_after_five_failures_and_skips_without_calling() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(502))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "max_attempts = 1").await;
    let mut c = app.client.clone();
    for _ in 0..5 {
        c.classify_sms(classify(pb::Priority::Interactive))
            .await
            .unwrap();
    }
    assert_eq!(calls(&primary).await, 5);
    let meta = c
        .classify_sms(classify(pb::Priority::Interactive))
        .await
        .unwrap()
        .into_inner()
        .meta
        .unwrap();
    assert_eq!(calls(&primary).await, 5, "an open breaker makes no call");
    assert_eq!(
        meta.attempts[0].outcome,
        pb::AttemptOutcome::SkippedCircuitOpen as i32
    );
    assert_eq!(meta.attempts[0].error_code, "CIRCUIT_OPEN");

    let health = c
        .get_provider_health(pb::GetProviderHealthRequest {})
        .await
        .unwrap()
        .into_inner();
    let p = health
        .providers
        .iter()
        .find(|p| p.provider == "primary")
        .unwrap();
    assert_eq!(p.state, pb::BreakerState::Open as i32);
    assert_eq!(p.consecutive_failures, 5);
    assert!(p.opened_at.is_some());
    assert_eq!(p.recent_error_rate, 1.0);
    let f = health
        .providers
        .iter()
        .find(|p| p.provider == "fallback")
        .unwrap();
    assert_eq!(
        (f.state, f.recent_error_rate),
        (pb::BreakerState::Closed as i32, 0.0)
    );
    app.stop().await;
}

/// A 429 without `Retry-After` cools the primary down for a second; a
/// BACKGROUND call waits that out and retries it, rather than have the
/// retry skipped and the fallback serve.
#[tokio::test]
async fn background_retries_a_429_without_retry_after_once_the_cooldown_ends() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(429))
        .up_to_n_times(1)
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "").await;
    let meta = app
        .client
        .clone()
        .classify_sms(classify(pb::Priority::Background))
        .await
        .unwrap()
        .into_inner()
        .meta
        .unwrap();
    assert_eq!(
        tries(&meta),
        [
            ("primary".into(), 0, "RATE_LIMITED".into()),
            ("primary".into(), 1, String::new()),
        ]
    );
    assert!(!meta.degraded);
    assert_eq!((calls(&primary).await, calls(&fallback).await), (2, 0));
    app.stop().await;
}

#[tokio::test]
async fn rate_limited_provider_cools_down_until_retry_after() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(429).insert_header("retry-after", "30"))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "").await;
    let mut c = app.client.clone();
    let first = c
        .classify_sms(classify(pb::Priority::Interactive))
        .await
        .unwrap()
        .into_inner()
        .meta
        .unwrap();
    assert_eq!(first.attempts[0].error_code, "RATE_LIMITED");
    let second = c
        .classify_sms(classify(pb::Priority::Interactive))
        .await
        .unwrap()
        .into_inner()
        .meta
        .unwrap();
    assert_eq!(calls(&primary).await, 1, "cooling down: no second call");
    assert_eq!(
        second.attempts[0].outcome,
        pb::AttemptOutcome::SkippedRateLimited as i32
    );
    let health = c
        .get_provider_health(pb::GetProviderHealthRequest {})
        .await
        .unwrap()
        .into_inner();
    let p = health
        .providers
        .iter()
        .find(|p| p.provider == "primary")
        .unwrap();
    assert_eq!(
        p.state,
        pb::BreakerState::Closed as i32,
        "a 429 is not a breaker failure"
    );
    assert!(p.cooldown_until.is_some());
    app.stop().await;
}

#[tokio::test]
async fn a_hanging_primary_is_cut_at_its_timeout_and_the_fallback_answers() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(classification().set_delay(Duration::from_secs(10)))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "max_attempts = 1").await;
    let started = Instant::now();
    let meta = app
        .client
        .clone()
        .classify_sms(classify(pb::Priority::Interactive))
        .await
        .unwrap()
        .into_inner()
        .meta
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(3500),
        "provider timeout is 2 s; took {took:?}"
    );
    assert_eq!(meta.attempts[0].outcome, pb::AttemptOutcome::Timeout as i32);
    assert!(meta.degraded);
    app.stop().await;
}

#[tokio::test]
async fn the_grpc_deadline_bounds_the_whole_chain() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    let slow = classification().set_delay(Duration::from_secs(10));
    Mock::given(method("POST"))
        .respond_with(slow.clone())
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(slow)
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "").await;
    let mut request = tonic::Request::new(classify(pb::Priority::Background));
    request.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let status = app.client.clone().classify_sms(request).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "answered after {took:?}"
    );
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.reason, "DEADLINE_EXCEEDED");
    assert!(
        info.metadata["attempts"].contains("primary/gpt-4o-mini:DEADLINE_EXCEEDED"),
        "{:?}",
        info.metadata
    );
    assert_eq!(
        calls(&fallback).await,
        0,
        "nothing starts after the deadline"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_malformed_model_answer_falls_back() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(completion("Sure! The intent is QUESTION."))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(classification())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "").await;
    let reply = app
        .client
        .clone()
        .classify_sms(classify(pb::Priority::Interactive))
        .await
        .unwrap()
        .into_inner();
    let meta = reply.meta.unwrap();
    assert_eq!(
        meta.attempts[0].outcome,
        pb::AttemptOutcome::Malformed as i32
    );
    assert_eq!(meta.attempts[0].error_code, "MALFORMED_RESPONSE");
    assert_eq!(
        calls(&primary).await,
        1,
        "a malformed answer is not re-rolled at the same target"
    );
    assert!(meta.degraded);
    // The malformed answer still consumed tokens, and they are counted.
    assert_eq!(meta.usage.unwrap().input_tokens, 240);
    // The request asked for structured output in OpenAI's format.
    let body: serde_json::Value = primary.received_requests().await.unwrap()[0]
        .body_json()
        .unwrap();
    assert_eq!(body["response_format"]["type"], "json_schema");
    app.stop().await;
}

#[tokio::test]
async fn all_down_is_all_providers_failed_without_upstream_bodies() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(500))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(error(503))
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "max_attempts = 2").await;
    let status = app
        .client
        .clone()
        .classify_sms(classify(pb::Priority::Background))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.get_details_error_info().unwrap().reason,
        "ALL_PROVIDERS_FAILED"
    );
    assert_eq!((calls(&primary).await, calls(&fallback).await), (2, 2));
    let everything = format!("{status:?}");
    assert!(
        !everything.contains("canary-upstream-secret"),
        "raw upstream body leaked: {everything}"
    );
    app.stop().await;
}

/// A Chat Completions stream answering "Meet Ann at 10." in two deltas,
/// with its usage (6 output tokens) and `[DONE]`.
fn streamed_answer() -> ResponseTemplate {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1_732_000_000, "model": "llama3",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    let mut sse = String::new();
    for (delta, finish) in [
        (json!({"role": "assistant", "content": ""}), json!(null)),
        (json!({"content": "Meet "}), json!(null)),
        (json!({"content": "Ann at 10."}), json!(null)),
        (json!({}), json!("stop")),
    ] {
        sse.push_str(&format!("data: {}\n\n", chunk(delta, finish)));
    }
    sse.push_str(&format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1_732_000_000, "model": "llama3",
               "choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 6, "total_tokens": 56}})
    ));
    sse.push_str("data: [DONE]\n\n");
    ResponseTemplate::new(200)
        .insert_header("content-type", "text/event-stream")
        .set_body_string(sse)
}

/// BACKGROUND uses the full retry schedule in a stream too: a primary that
/// fails before any output is retried in place (each try a `started`), not
/// left for the fallback.
#[tokio::test]
async fn execute_stream_background_retries_the_primary_before_any_output() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(500))
        .up_to_n_times(1)
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(streamed_answer())
        .mount(&primary)
        .await;
    let app = spawn(&primary, &fallback, "").await;
    let mut context = ctx().unwrap();
    context.priority = pb::Priority::Background as i32;
    let events = brief_events(&app, context).await;
    let kinds: Vec<String> = events
        .iter()
        .map(|e| match e {
            Event::Started(s) => format!("started {}", s.provider),
            Event::Fallback(f) => format!("fallback {}", f.to),
            Event::Delta(_) => "delta".into(),
            Event::Completed(_) => "completed".into(),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "started primary",
            "started primary",
            "delta",
            "delta",
            "completed"
        ]
    );
    let Some(Event::Completed(done)) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(done.text, "Meet Ann at 10.");
    let meta = done.meta.as_ref().unwrap();
    assert!(!meta.degraded);
    assert_eq!(
        tries(meta),
        [
            ("primary".into(), 0, "HTTP_500".into()),
            ("primary".into(), 1, String::new())
        ]
    );
    assert_eq!((calls(&primary).await, calls(&fallback).await), (2, 0));
    app.stop().await;
}

#[tokio::test]
async fn execute_stream_falls_back_before_the_first_delta_and_passes_sse_through() {
    let (primary, fallback) = (MockServer::start().await, MockServer::start().await);
    Mock::given(method("POST"))
        .respond_with(error(503))
        .mount(&primary)
        .await;
    Mock::given(method("POST"))
        .respond_with(streamed_answer())
        .mount(&fallback)
        .await;
    let app = spawn(&primary, &fallback, "max_attempts = 1").await;
    let events = brief_events(&app, ctx().unwrap()).await;
    assert!(matches!(&events[0], Event::Started(s) if s.provider == "primary"));
    assert!(
        matches!(&events[1], Event::Fallback(f) if f.to == "fallback" && f.reason == "HTTP_503")
    );
    assert!(matches!(&events[2], Event::Started(s) if s.provider == "fallback"));
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| {
            if let Event::Delta(d) = e {
                Some(d.text.as_str())
            } else {
                None
            }
        })
        .collect();
    assert_eq!(deltas, ["Meet ", "Ann at 10."]);
    let Some(Event::Completed(done)) = events.last() else {
        panic!("{events:?}")
    };
    assert_eq!(done.text, "Meet Ann at 10.");
    let meta = done.meta.as_ref().unwrap();
    assert!(meta.degraded);
    assert_eq!(meta.usage.as_ref().unwrap().output_tokens, 6);
    let body: serde_json::Value = fallback.received_requests().await.unwrap()[0]
        .body_json()
        .unwrap();
    assert_eq!(body["stream"], true);
    app.stop().await;
}
