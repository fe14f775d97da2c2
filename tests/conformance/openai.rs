//! OpenAI Chat Completions (`kind = "openai"`), with payloads shaped like
//! recorded api.openai.com answers.

use crate::harness::{
    self, CANARY, Fixture, collect, data_events, only_request, provider, request, serve, sse,
};
use ai_orchestrator::domain::{JsonSchemaFormat, ProviderError, StreamEvent};
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

/// An h2c upstream allowing `max_streams` streams per connection; each call
/// waits while the gate is closed. Returns its address, the calls that
/// arrived, the connections accepted and the gate.
async fn gated_h2c_upstream(
    max_streams: u32,
    body: String,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::sync::watch::Sender<bool>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived, connections) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (gate, open) = tokio::sync::watch::channel(true);
    let (arrived_in, connections_in) = (arrived.clone(), connections.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            connections_in.fetch_add(1, Ordering::SeqCst);
            let (arrived, open, body) = (arrived_in.clone(), open.clone(), body.clone());
            let service = hyper::service::service_fn(move |_req| {
                let (arrived, mut open, body) = (arrived.clone(), open.clone(), body.clone());
                async move {
                    arrived.fetch_add(1, Ordering::SeqCst);
                    let _ = open.wait_for(|open| *open).await;
                    hyper::Response::builder()
                        .header("content-type", "application/json")
                        .body(body)
                }
            });
            tokio::spawn(
                hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(max_streams)
                    .serve_connection(TokioIo::new(tcp), service),
            );
        }
    });
    (addr, arrived, connections, gate)
}

/// An HTTP/2 server caps the calls one connection carries (here 2, as
/// `SETTINGS_MAX_CONCURRENT_STREAMS`) and the HTTP client never opens a
/// second connection by itself. With `streams_per_connection = 2` the four
/// calls held at the upstream at once travel over two connections; with
/// one connection for all four (the control), only two reach the upstream
/// and the others wait inside the client until those end.
#[tokio::test]
async fn calls_past_the_stream_limit_open_another_connection() {
    use ai_orchestrator::{config::Config, providers::Providers};
    use std::{sync::atomic::Ordering, time::Duration};

    let f = fixture();
    for (per_connection, reach_at_once, connections_used) in [(2, 4, 2), (4, 2, 1)] {
        let (addr, arrived, connections, gate) =
            gated_h2c_upstream(2, f.success_body.to_string()).await;
        let toml = format!(
            "[providers.p]\nkind = \"openai\"\nbase_url = \"http://{addr}/v1\"\n\
             api_key_env = \"TEST_KEY\"\nhttp2_prior_knowledge = true\n\
             max_concurrency = 4\nstreams_per_connection = {per_connection}\n"
        );
        let env = |var: &str| (var == "TEST_KEY").then(|| harness::TEST_KEY.to_owned());
        let providers =
            Providers::from_config(&Config::from_toml_str(&toml, env).unwrap()).unwrap();
        let provider = providers.get("p").unwrap();
        // One call first, so the client knows the server's stream limit.
        provider.complete(request(&f, "p")).await.unwrap();
        arrived.store(0, Ordering::SeqCst);
        gate.send_replace(false);

        let calls: Vec<_> = (0..4)
            .map(|_| {
                let (provider, req) = (provider.clone(), request(&f, "p"));
                tokio::spawn(async move { provider.complete(req).await })
            })
            .collect();
        tokio::time::timeout(Duration::from_secs(10), async {
            while arrived.load(Ordering::SeqCst) < reach_at_once {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{reach_at_once} calls should reach the upstream"));
        // The stream limit is the protocol's: no more arrive while held.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            arrived.load(Ordering::SeqCst),
            reach_at_once,
            "streams_per_connection = {per_connection}"
        );

        gate.send_replace(true);
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap().text, TEXT);
        }
        assert_eq!(arrived.load(Ordering::SeqCst), 4);
        assert_eq!(
            connections.load(Ordering::SeqCst),
            connections_used,
            "streams_per_connection = {per_connection}"
        );
    }
}
