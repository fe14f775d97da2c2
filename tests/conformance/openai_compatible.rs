//! OpenAI-compatible servers (`kind = "openai_compatible"`), with payloads
//! shaped like a llama.cpp server's (usage and `timings` in the last stream
//! chunk, no `stream_options` needed) and vLLM's (no usage at all unless
//! asked, top-level error objects).

use crate::harness::{
    self, CANARY, Fixture, collect, data_events, only_request, provider, request, serve, sse,
};
use ai_orchestrator::domain::{JsonSchemaFormat, ProviderError, StreamEvent};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

const MODEL: &str = "qwen2.5-7b-instruct";
const TEXT: &str = "Hello there, how can I help?";
const PIECES: [&str; 7] = ["Hello", " there", ",", " how", " can", " I", " help?"];

fn timings() -> Value {
    json!({
        "prompt_n": 21, "prompt_ms": 45.102, "prompt_per_token_ms": 2.148, "prompt_per_second": 465.6,
        "predicted_n": 8, "predicted_ms": 120.31, "predicted_per_token_ms": 15.04, "predicted_per_second": 66.5
    })
}

fn chunk(delta: Value, finish: Value) -> Value {
    json!({
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1736179035,
        "id": "chatcmpl-9HVJVfyoc4EAl1f0iW2EAwTdwwuymR2T",
        "model": MODEL,
        "system_fingerprint": "b4410-8d59d911",
        "object": "chat.completion.chunk"
    })
}

/// llama.cpp puts usage and timings into the chunk that finishes.
fn chunks(pieces: &[&str], finish: bool, with_usage: bool) -> Vec<Value> {
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": null}),
        Value::Null,
    )];
    out.extend(
        pieces
            .iter()
            .map(|p| chunk(json!({"content": p}), Value::Null)),
    );
    if finish {
        let mut last = chunk(json!({}), json!("stop"));
        if with_usage {
            last["usage"] =
                json!({"completion_tokens": 8, "prompt_tokens": 21, "total_tokens": 29});
            last["timings"] = timings();
        }
        out.push(last);
    }
    out
}

/// llama.cpp's error envelope.
fn error_body(status: u16) -> Value {
    let kind = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        429 => "rate_limit_error",
        503 => "unavailable_error",
        _ => "server_error",
    };
    json!({"error": {"code": status, "message": format!("{CANARY}: Invalid API Key"), "type": kind}})
}

pub fn fixture() -> Fixture {
    Fixture {
        name: "local_llm",
        kind: "openai_compatible",
        model: MODEL,
        base_path: "/v1",
        complete_path: "/v1/chat/completions".into(),
        stream_path: "/v1/chat/completions".into(),
        auth_header: ("authorization", "Bearer test-key"),
        success_body: json!({
            "choices": [{"finish_reason": "stop", "index": 0,
                         "message": {"role": "assistant", "content": TEXT}}],
            "created": 1736179035,
            "model": MODEL,
            "system_fingerprint": "b4410-8d59d911",
            "object": "chat.completion",
            "usage": {"completion_tokens": 8, "prompt_tokens": 21, "total_tokens": 29},
            "id": "chatcmpl-9HVJVfyoc4EAl1f0iW2EAwTdwwuymR2T",
            "timings": timings()
        }),
        expected_text: TEXT,
        expected_usage: (21, 8),
        stream_body: data_events(&chunks(&PIECES, true, true), true),
        stream_missing_usage_body: data_events(&chunks(&PIECES, true, false), true),
        truncated_stream_body: data_events(&chunks(&PIECES[..2], false, false), false),
        error_body,
        overloaded_status: None,
    }
}

#[tokio::test]
async fn conformance() {
    harness::run_suite(fixture()).await;
}

#[tokio::test]
async fn no_key_means_no_authorization_header() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(&f.success_body),
    )
    .await;
    let out = provider(&f, &server, false)
        .complete(request(&f, "t"))
        .await
        .unwrap();
    assert_eq!(out.text, TEXT);
    let req = only_request(&server, "keyless").await;
    assert!(req.headers.get("authorization").is_none());
}

#[tokio::test]
async fn schema_goes_into_the_system_prompt_with_json_mode() {
    let f = fixture();
    let server = serve(&f.stream_path, sse(&f.stream_body)).await;
    let mut req = request(&f, "t");
    req.response_format = Some(JsonSchemaFormat {
        name: "sms_classification".into(),
        schema: json!({"type": "object", "required": ["intent"]}),
    });
    let items = collect(&provider(&f, &server, true), req).await.unwrap();
    assert!(matches!(items.last(), Some(Ok(StreamEvent::Done(_)))));
    let body: Value = only_request(&server, "schema").await.body_json().unwrap();
    assert_eq!(body["response_format"], json!({"type": "json_object"}));
    assert!(
        body.get("stream_options").is_none(),
        "not every server accepts stream_options"
    );
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(system.starts_with("You are a terse assistant."), "{system}");
    assert!(system.contains(r#""required":["intent"]"#), "{system}");
}

#[tokio::test]
async fn vllm_top_level_error_keeps_only_its_type() {
    let f = fixture();
    let body = json!({"object": "error", "message": format!("{CANARY}: max_tokens is too large"),
                      "type": "BadRequestError", "param": null, "code": 400});
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(400).set_body_json(body),
    )
    .await;
    let err = provider(&f, &server, true)
        .complete(request(&f, "t"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ProviderError::Status { status: 400, summary, .. } if summary == "BadRequestError"),
        "{err:?}"
    );
    assert!(!format!("{err:?} {err}").contains(CANARY));
    only_request(&server, "vllm error").await;
}
