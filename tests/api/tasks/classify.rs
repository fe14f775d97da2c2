//! ClassifySms end to end: the review threshold (default and configured per
//! task) and the carrier opt-out fast path, with exact upstream call counts
//! against a fake speaking the OpenAI wire format.

use super::{app_with, classify, replying};
use crate::common::TestApp;
use ai_orchestrator::api::pb;
use serde_json::json;
use wiremock::{
    Mock, MockServer, ResponseTemplate,
    matchers::{body_string_contains, method, path},
};

/// A Chat Completions success whose content is `content`.
fn completion(content: &str) -> ResponseTemplate {
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

/// A server whose `sms_classify` chain is one OpenAI target at `upstream`;
/// `task_lines` are added to `[tasks.sms_classify]`.
async fn spawn_openai(upstream: &MockServer, task_lines: &str) -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        r#"
[server]
default_timeout = "10s"
[database]
url = "sqlite://{}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "2s"
[tasks.sms_classify]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
{task_lines}
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
"#,
        dir.path().join("classify.db").display(),
        upstream.uri()
    );
    let app = TestApp::spawn_toml_env(&toml, |name| {
        (name == "TEST_OPENAI_KEY").then(|| "sk-test".to_owned())
    })
    .await;
    (app, dir)
}

async fn calls(server: &MockServer) -> Vec<String> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect()
}

#[tokio::test]
async fn needs_review_follows_the_threshold() {
    let unsure = replying(
        r#"{"intent":"CALLBACK_LATER","confidence":0.69,"reason":"says maybe next week"}"#,
    );
    let (app, _dir) = app_with(&unsure, "", "").await;
    let r = app
        .client
        .clone()
        .classify_sms(classify("maybe next week?"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.intent, pb::SmsIntent::CallbackLater as i32);
    assert!(r.needs_review, "0.69 < 0.70");
    assert_eq!(r.reason, "says maybe next week");
    app.stop().await;
}

#[tokio::test]
async fn a_configured_review_threshold_moves_needs_review() {
    let upstream = MockServer::start().await;
    for (text, confidence) in [("next week", 0.85), ("Tuesday", 0.9)] {
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .and(body_string_contains(text))
            .respond_with(completion(
                &json!({"intent": "CALLBACK_LATER", "confidence": confidence, "reason": "later"})
                    .to_string(),
            ))
            .mount(&upstream)
            .await;
    }
    let (app, _dir) = spawn_openai(&upstream, "review_threshold = 0.9").await;
    let mut client = app.client.clone();

    let below = client
        .classify_sms(classify("Try me next week"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(below.confidence, 0.85);
    assert!(
        below.needs_review,
        "0.85 < 0.9 (the default 0.70 would not flag it)"
    );
    let at = client
        .classify_sms(classify("Call me Tuesday"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(at.confidence, 0.9);
    assert!(!at.needs_review, "exactly at the threshold needs no review");
    assert_eq!(calls(&upstream).await.len(), 2);
    app.stop().await;
}

/// A bare keyword never reaches a model; a keyword inside a sentence does.
#[tokio::test]
async fn only_a_bare_opt_out_keyword_skips_the_model() {
    let upstream = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(completion(
            r#"{"intent":"OPT_OUT","confidence":0.93,"reason":"asks to stop"}"#,
        ))
        .mount(&upstream)
        .await;
    let (app, _dir) = spawn_openai(&upstream, "").await;
    let mut client = app.client.clone();

    let r = client
        .classify_sms(classify("Stop."))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.intent, r.confidence, r.needs_review),
        (pb::SmsIntent::OptOut as i32, 1.0, false)
    );
    let meta = r.meta.unwrap();
    assert_eq!(meta.prompt_key, "opt_out_keyword");
    assert!(meta.attempts.is_empty() && meta.provider.is_empty());
    assert_eq!(calls(&upstream).await.len(), 0, "`Stop.` needs no model");

    let r = client
        .classify_sms(classify("stop please"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.intent, r.confidence),
        (pb::SmsIntent::OptOut as i32, 0.93)
    );
    let meta = r.meta.unwrap();
    assert_eq!(
        (meta.prompt_key.as_str(), meta.provider.as_str()),
        ("sms_classify", "openai")
    );
    let bodies = calls(&upstream).await;
    assert_eq!(bodies.len(), 1, "`stop please` goes to the model once");
    assert!(bodies[0].contains("stop please"), "{}", bodies[0]);
    app.stop().await;
}
