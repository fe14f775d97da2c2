//! OpenAI Chat Completions (`kind = "openai"`), with payloads shaped like
//! recorded api.openai.com answers.

use crate::harness::{
    self, CANARY, Fixture, collect, data_events, only_request, provider, request, serve, sse,
};
use ai_orchestrator::providers::{JsonSchemaFormat, ProviderError, StreamEvent};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

const MODEL: &str = "gpt-4o-mini";
const TEXT: &str = "Hello! How can I help you today?";
const PIECES: [&str; 9] = [
    "Hello", "!", " How", " can", " I", " help", " you", " today", "?",
];

/// One streamed chunk as OpenAI sends it (`usage: null` until the last one).
fn chunk(delta: Value, finish: Value) -> Value {
    json!({
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion.chunk",
        "created": 1741570283,
        "model": "gpt-4o-mini-2024-07-18",
        "service_tier": "default",
        "system_fingerprint": "fp_06737a9306",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        "usage": null
    })
}

fn usage() -> Value {
    json!({
        "prompt_tokens": 19,
        "completion_tokens": 10,
        "total_tokens": 29,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0
        }
    })
}

/// The chunks of a stream: role, content pieces, finish, and (when asked
/// for with `stream_options.include_usage`) a usage chunk without choices.
fn chunks(pieces: &[&str], finish: bool, with_usage: bool) -> Vec<Value> {
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": "", "refusal": null}),
        Value::Null,
    )];
    out.extend(
        pieces
            .iter()
            .map(|p| chunk(json!({"content": p}), Value::Null)),
    );
    if finish {
        out.push(chunk(json!({}), json!("stop")));
    }
    if with_usage {
        let mut last = chunk(json!({}), Value::Null);
        last["choices"] = json!([]);
        last["usage"] = usage();
        out.push(last);
    }
    out
}

fn error_body(status: u16) -> Value {
    let (kind, code) = match status {
        400 => ("invalid_request_error", Value::Null),
        401 => ("invalid_request_error", json!("invalid_api_key")),
        429 => ("requests", json!("rate_limit_exceeded")),
        _ => ("server_error", Value::Null),
    };
    json!({"error": {
        "message": format!("{CANARY}: something about your request or account"),
        "type": kind, "param": null, "code": code
    }})
}

pub fn fixture() -> Fixture {
    Fixture {
        name: "openai",
        kind: "openai",
        model: MODEL,
        base_path: "/v1",
        complete_path: "/v1/chat/completions".into(),
        stream_path: "/v1/chat/completions".into(),
        auth_header: ("authorization", "Bearer test-key"),
        success_body: json!({
            "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
            "object": "chat.completion",
            "created": 1741569952,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": TEXT, "refusal": null, "annotations": []},
                "logprobs": null,
                "finish_reason": "stop"
            }],
            "usage": usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_06737a9306"
        }),
        expected_text: TEXT,
        expected_usage: (19, 10),
        stream_body: data_events(&chunks(&PIECES, true, true), true),
        stream_missing_usage_body: data_events(&chunks(&PIECES, true, false), true),
        truncated_stream_body: data_events(&chunks(&PIECES[..4], false, false), false),
        error_body,
        overloaded_status: None,
    }
}

#[tokio::test]
async fn conformance() {
    harness::run_suite(fixture()).await;
}

#[tokio::test]
async fn stream_asks_for_usage() {
    let f = fixture();
    let server = serve(&f.stream_path, sse(&f.stream_body)).await;
    let items = collect(&provider(&f, &server, true), request(&f, "t")).await;
    assert!(matches!(
        items.as_deref(),
        Ok([.., Ok(StreamEvent::Done(_))])
    ));
    let body: Value = only_request(&server, "stream").await.body_json().unwrap();
    assert_eq!(body["stream"], json!(true));
    assert_eq!(body["stream_options"]["include_usage"], json!(true));
    assert_eq!(
        body["messages"][0],
        json!({"role": "system", "content": "You are a terse assistant."})
    );
    assert_eq!(body["messages"][1]["role"], "user");
    assert_eq!(body["max_tokens"], json!(64));
}

#[tokio::test]
async fn schema_uses_native_json_schema_output() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(&f.success_body),
    )
    .await;
    let schema = json!({"type": "object", "properties": {"intent": {"type": "string"}}});
    let mut req = request(&f, "t");
    req.response_format = Some(JsonSchemaFormat {
        name: "sms_classification".into(),
        schema: schema.clone(),
    });
    provider(&f, &server, true).complete(req).await.unwrap();
    let body: Value = only_request(&server, "schema").await.body_json().unwrap();
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(
        body["response_format"]["json_schema"],
        json!({"name": "sms_classification", "schema": schema, "strict": false})
    );
    assert_eq!(
        body["messages"][0]["content"], "You are a terse assistant.",
        "native structured output leaves the system prompt alone"
    );
}

#[tokio::test]
async fn error_object_mid_stream_is_a_server_error() {
    let f = fixture();
    let mut events = chunks(&PIECES[..3], false, false);
    events.push(json!({"error": {
        "message": format!("{CANARY}: The server had an error while processing your request."),
        "type": "server_error", "param": null, "code": null
    }}));
    let server = serve(&f.stream_path, sse(&data_events(&events, false))).await;
    let items = collect(&provider(&f, &server, true), request(&f, "t"))
        .await
        .unwrap();
    let deltas = items
        .iter()
        .filter(|i| matches!(i, Ok(StreamEvent::Delta(_))))
        .count();
    assert_eq!(deltas, 3);
    let Some(Err(err)) = items.last() else {
        panic!("must end with an error: {items:?}")
    };
    assert!(
        matches!(err, ProviderError::Status { status: 502, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable() && err.counts_against_breaker());
    assert!(!format!("{err:?} {err}").contains(CANARY));
    only_request(&server, "mid-stream error").await;
}

/// `http2_prior_knowledge = true` speaks HTTP/2 from the first byte to a
/// plaintext upstream (h2c, as a sidecar or internal gateway serves it);
/// without it the same `http://` upstream is called over HTTP/1.1.
#[tokio::test]
async fn http2_prior_knowledge_speaks_h2c() {
    use ai_orchestrator::{config::Config, providers::Providers};
    use axum::{
        extract::State,
        http::{Version, header::CONTENT_TYPE},
        routing::post,
    };
    use std::sync::{Arc, Mutex};

    let f = fixture();
    let seen: Arc<Mutex<Vec<Version>>> = Arc::default();
    let body = f.success_body.to_string();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(
                move |State(seen): State<Arc<Mutex<Vec<Version>>>>, req: axum::extract::Request| {
                    let body = body.clone();
                    async move {
                        seen.lock().unwrap().push(req.version());
                        ([(CONTENT_TYPE, "application/json")], body)
                    }
                },
            ),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let toml = format!(
        "[providers.h2c]\nkind = \"openai\"\nbase_url = \"http://{addr}/v1\"\n\
         api_key_env = \"TEST_KEY\"\nhttp2_prior_knowledge = true\n\
         [providers.h1]\nkind = \"openai\"\nbase_url = \"http://{addr}/v1\"\n\
         api_key_env = \"TEST_KEY\"\n"
    );
    let env = |var: &str| (var == "TEST_KEY").then(|| harness::TEST_KEY.to_owned());
    let providers = Providers::from_config(&Config::from_toml_str(&toml, env).unwrap()).unwrap();
    for name in ["h2c", "h1"] {
        let answer = providers
            .get(name)
            .unwrap()
            .complete(request(&f, name))
            .await
            .unwrap();
        assert_eq!(answer.text, TEXT);
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [Version::HTTP_2, Version::HTTP_11],
        "h2c with prior knowledge, HTTP/1.1 otherwise"
    );
}
