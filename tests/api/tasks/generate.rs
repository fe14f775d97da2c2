//! GenerateSms's redraft when the second draft fails: the call failed, and
//! its record says so, whoever served the first draft.

use crate::common::TestApp;
use ai_orchestrator::{api::pb, store::Store, usage::record};
use serde_json::json;
use tonic::Code;
use wiremock::{Mock, MockServer, ResponseTemplate, matchers::method};

/// A Chat Completions success whose content is `content`.
fn completion(content: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "id": "chatcmpl-AbC124",
        "object": "chat.completion",
        "created": 1_732_000_000,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "refusal": null},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 210, "completion_tokens": 140, "total_tokens": 350},
        "system_fingerprint": "fp_0ba0d124f1"
    }))
}

/// OpenAI's 500 body.
fn server_error() -> ResponseTemplate {
    ResponseTemplate::new(500).set_body_json(json!({
        "error": {"message": "The server had an error while processing your request.",
                  "type": "server_error", "param": null, "code": null}
    }))
}

/// A server whose `sms_generate` chain is one OpenAI target at `upstream`
/// (no retries); `task_lines` go under `[tasks.sms_generate]`.
async fn spawn(upstream: &MockServer, task_lines: &str) -> (TestApp, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("generate.db").display());
    let toml = format!(
        r#"
[server]
default_timeout = "10s"
[retry]
max_attempts = 1
[database]
url = "{url}"
[providers.openai]
kind = "openai"
base_url = "{}/v1"
api_key_env = "TEST_OPENAI_KEY"
timeout = "2s"
[tasks.sms_generate]
chain = [{{ provider = "openai", model = "gpt-4o-mini" }}]
{task_lines}
[pricing."gpt-4o-mini"]
input_per_mtok = 0.15
output_per_mtok = 0.60
"#,
        upstream.uri()
    );
    let app = TestApp::spawn_toml_env(&toml, |name| {
        (name == "TEST_OPENAI_KEY").then(|| "sk-test".to_owned())
    })
    .await;
    (app, url, dir)
}

/// The first draft is served (and too long for one segment); every later
/// call fails: the call ends ALL_PROVIDERS_FAILED, and its usage record
/// names no serving provider and no fallback, while still charging both
/// drafts' attempts.
#[tokio::test]
async fn a_failed_redraft_is_a_failed_call_not_the_first_drafts_provider() {
    let upstream = MockServer::start().await;
    let too_long = json!({"reply": "Thanks for reaching out! ".repeat(20),
                          "escalate": false, "escalate_reason": ""});
    Mock::given(method("POST"))
        .respond_with(completion(&too_long.to_string()))
        .up_to_n_times(1)
        .mount(&upstream)
        .await;
    Mock::given(method("POST"))
        .respond_with(server_error())
        .mount(&upstream)
        .await;
    let (app, url, _dir) = spawn(&upstream, "").await;
    let mut request = tonic::Request::new(pb::GenerateSmsRequest {
        context: crate::common::ctx(),
        inbound_message: "Tell me about the offer".into(),
        max_segments: 1,
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("x-trace-id", "failed-redraft".parse().unwrap());
    let status = app.client.clone().generate_sms(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");

    let store = Store::connect(&ai_orchestrator::config::DatabaseConfig {
        url: url.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let records = record::by_trace(&store, "failed-redraft").await.unwrap();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.outcome, "ALL_PROVIDERS_FAILED");
    assert_eq!((r.provider.as_str(), r.model.as_str()), ("", ""));
    assert!(!r.degraded);
    let attempts: Vec<serde_json::Value> = serde_json::from_str(&r.attempts).unwrap();
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(
        (r.input_tokens, r.output_tokens),
        (210, 140),
        "the first draft's tokens are charged"
    );
    store.close().await;
    app.stop().await;
}

/// Smart encoding: a model's curly apostrophe and dash would force UCS-2
/// (three segments for 160 characters); replaced by their GSM-7
/// equivalents the reply fits one. Turned off, the model's characters stay.
#[tokio::test]
async fn typographic_characters_do_not_cost_segments() {
    // 160 characters with a curly apostrophe and an en dash.
    let reply = format!("We\u{2019}re open \u{2013} {}", "a".repeat(147));
    assert_eq!(reply.chars().count(), 160);
    let body = json!({"reply": reply, "escalate": false, "escalate_reason": ""});
    for (smart, lines) in [(true, ""), (false, "smart_encoding = false")] {
        let upstream = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(completion(&body.to_string()))
            .mount(&upstream)
            .await;
        let (app, _url, _dir) = spawn(&upstream, lines).await;
        let r = app
            .client
            .clone()
            .generate_sms(pb::GenerateSmsRequest {
                context: crate::common::ctx(),
                inbound_message: "When are you open?".into(),
                max_segments: 3,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if smart {
            assert_eq!(r.response, format!("We're open - {}", "a".repeat(147)));
            assert_eq!(r.encoding, pb::SmsEncoding::Gsm7 as i32);
            assert_eq!(r.segments, 1);
        } else {
            assert_eq!(r.response, reply);
            assert_eq!(r.encoding, pb::SmsEncoding::Ucs2 as i32);
            assert_eq!(r.segments, 3);
        }
        app.stop().await;
    }
}

/// An opt-out is never answered (SPEC §6.2): a carrier keyword, or a plain
/// request to stop, escalates without a model call. A sentence that only
/// mentions stopping still gets a reply.
#[tokio::test]
async fn a_request_to_stop_is_never_answered_and_never_reaches_a_model() {
    let upstream = MockServer::start().await;
    let body = json!({"reply": "Glad you stopped by!", "escalate": false, "escalate_reason": ""});
    Mock::given(method("POST"))
        .respond_with(completion(&body.to_string()))
        .mount(&upstream)
        .await;
    let (app, _url, _dir) = spawn(&upstream, "").await;
    let generate = |message: &str| {
        let mut client = app.client.clone();
        let request = pb::GenerateSmsRequest {
            context: crate::common::ctx(),
            inbound_message: message.into(),
            ..Default::default()
        };
        async move { client.generate_sms(request).await.unwrap().into_inner() }
    };
    for message in [
        "STOP",
        "Please stop texting me.",
        "Don't contact me again",
        "remove me from this list",
    ] {
        let r = generate(message).await;
        assert!(r.escalate, "{message}: {r:?}");
        assert!(r.response.is_empty(), "{message}: {r:?}");
        assert!(r.escalate_reason.contains("opt-out"), "{message}: {r:?}");
        assert_eq!(r.meta.unwrap().prompt_key, "opt_out_keyword", "{message}");
    }
    assert!(
        upstream.received_requests().await.unwrap().is_empty(),
        "no model call"
    );

    let r = generate("I stopped by your store today").await;
    assert_eq!(r.response, "Glad you stopped by!");
    assert!(!r.escalate);
    assert_eq!(upstream.received_requests().await.unwrap().len(), 1);
    app.stop().await;
}
