//! Request shape, response mapping and stream folding of the Anthropic
//! adapter. The HTTP error paths are covered by `tests/conformance`.

use super::stream::{State, Step};
use super::*;
use crate::config::Config;
use crate::domain::{ChatMessage, JsonSchemaFormat, ToolSpec, completion::Role};
use crate::providers::turns::OPENING_USER_TURN;
use serde_json::{Value, json};
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

fn msg(role: Role, content: &str) -> ChatMessage {
    ChatMessage {
        role,
        content: content.into(),
        ..Default::default()
    }
}

fn request(messages: Vec<ChatMessage>) -> CompletionRequest {
    CompletionRequest {
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        model: "claude-3-haiku-20240307".into(),
        system: Some("You classify SMS replies.".into()),
        messages,
        temperature: None,
        max_tokens: 150,
        response_format: None,
        trace_id: "0190f2a4c1e27a1b9d3f5e6a7b8c9d0e".into(),
        traceparent: None,
        deadline: tokio::time::Instant::now() + Duration::from_secs(5),
    }
}

/// The JSON exactly as it goes on the wire (f32 temperatures included).
fn wire_json(req: &CompletionRequest, stream: bool) -> Value {
    serde_json::from_slice(&serde_json::to_vec(&body(req, stream)).unwrap()).unwrap()
}

#[test]
fn system_is_top_level_and_carries_the_schema_instruction() {
    let mut req = request(vec![msg(Role::User, "yes please call me")]);
    req.response_format = Some(JsonSchemaFormat {
        name: "sms_classification".into(),
        schema: json!({"type":"object","required":["intent"]}),
    });
    let body = wire_json(&req, false);
    let system = body["system"].as_str().unwrap();
    assert!(system.starts_with("You classify SMS replies."));
    assert!(system.contains(r#"{"required":["intent"],"type":"object"}"#));
    assert_eq!(body["model"], "claude-3-haiku-20240307");
    assert_eq!(body["max_tokens"], 150);
    assert_eq!(
        body["messages"],
        json!([{"role":"user","content":"yes please call me"}])
    );
    // Non-streaming calls send no `stream`, unset temperature is left out.
    assert!(body.get("stream").is_none() && body.get("temperature").is_none());
    assert_eq!(wire_json(&req, true)["stream"], true);
}

#[test]
fn no_system_prompt_means_no_system_field() {
    let mut req = request(vec![msg(Role::User, "hi")]);
    req.system = None;
    assert!(wire_json(&req, false).get("system").is_none());
}

#[test]
fn roles_alternate_starting_with_the_user() {
    let req = request(vec![
        msg(Role::Assistant, "Hi Dana, it's Sam from Acme Roofing."),
        msg(Role::User, "who is this"),
        msg(Role::User, "oh the roof guy"),
    ]);
    assert_eq!(
        wire_json(&req, false)["messages"],
        json!([
            {"role":"user","content": OPENING_USER_TURN},
            {"role":"assistant","content":"Hi Dana, it's Sam from Acme Roofing."},
            {"role":"user","content":"who is this\n\noh the roof guy"},
        ])
    );
}

#[test]
fn temperature_is_sent_exactly_and_clamped_to_anthropics_range() {
    let mut req = request(vec![msg(Role::User, "hi")]);
    req.temperature = Some(0.2);
    assert_eq!(wire_json(&req, false)["temperature"], json!(0.2));
    req.temperature = Some(1.7);
    assert_eq!(wire_json(&req, false)["temperature"], json!(1.0));
}

#[test]
fn tool_choice_is_sent_with_tools_unless_auto() {
    let mut req = request(vec![msg(Role::User, "look up L-1")]);
    req.tools = vec![ToolSpec {
        name: "crm__lookup".into(),
        description: "Find a lead.".into(),
        parameters: json!({"type": "object"}),
    }];
    let sent = |req: &CompletionRequest| wire_json(req, false).get("tool_choice").cloned();
    let cases = [
        (ToolChoice::Auto, None),
        (ToolChoice::None, Some(json!({"type": "none"}))),
        (ToolChoice::Required, Some(json!({"type": "any"}))),
        (
            ToolChoice::Named("crm__lookup".into()),
            Some(json!({"type": "tool", "name": "crm__lookup"})),
        ),
    ];
    for (choice, expected) in cases {
        req.tool_choice = choice;
        assert_eq!(sent(&req), expected, "{:?}", req.tool_choice);
    }
    req.tools.clear();
    req.tool_choice = ToolChoice::Required;
    assert_eq!(sent(&req), None, "no choice without tools");
}

#[test]
fn response_text_blocks_usage_and_stop_reasons() {
    let parse = |v: Value| {
        serde_json::from_value::<MessagesResponse>(v)
            .unwrap()
            .into_completion()
            .unwrap()
    };
    let done = parse(json!({
        "id": "msg_01", "type": "message", "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "x"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "toolu_01", "name": "f", "input": {}},
            {"type": "text", "text": " world"}
        ],
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 10, "cache_creation_input_tokens": 3,
                  "cache_read_input_tokens": null, "output_tokens": 7}
    }));
    assert_eq!(done.text, "Hello world");
    assert_eq!(done.tool_calls.len(), 1, "the tool_use block is a call");
    assert_eq!(done.tool_calls[0].arguments, "{}");
    assert_eq!(done.finish_reason, FinishReason::Length);
    assert_eq!(
        done.usage,
        TokenUsage {
            input_tokens: 13,
            output_tokens: 7
        }
    );
    for (reason, expected) in [
        ("end_turn", FinishReason::Stop),
        ("stop_sequence", FinishReason::Stop),
        ("refusal", FinishReason::ContentFilter),
        ("tool_use", FinishReason::ToolCalls),
        ("pause_turn", FinishReason::Other),
    ] {
        let c = parse(json!({"content": [], "stop_reason": reason}));
        assert_eq!(c.finish_reason, expected, "{reason}");
    }
}

fn fold(state: &mut State, events: &[&str]) -> Vec<Result<Step, ProviderError>> {
    events.iter().map(|data| state.on_event(data)).collect()
}

#[test]
fn stream_events_fold_into_deltas_and_a_final_answer() {
    let mut state = State::default();
    let steps = fold(
        &mut state,
        &[
            r#"{"type":"message_start","message":{"id":"msg_01","model":"claude-3-5-haiku-20241022","content":[],"usage":{"input_tokens":25,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type": "ping"}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"x"}}"#,
            r#"{"type":"some_future_event","x":1}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" there"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"refusal","stop_sequence":null},"usage":{"output_tokens":9}}"#,
            r#"{"type":"message_stop"}"#,
        ],
    );
    let steps: Vec<Step> = steps.into_iter().map(Result::unwrap).collect();
    let deltas: Vec<&Step> = steps.iter().filter(|s| **s != Step::Skip).collect();
    assert_eq!(
        deltas,
        vec![
            &Step::Delta("Hi".into()),
            &Step::Delta(" there".into()),
            &Step::Done(Completion {
                tool_calls: Vec::new(),
                text: "Hi there".into(),
                usage: TokenUsage {
                    input_tokens: 25,
                    output_tokens: 9
                },
                finish_reason: FinishReason::ContentFilter,
                citations: Vec::new(),
                model: Some("claude-3-5-haiku-20241022".into()),
            }),
        ]
    );
}

#[test]
fn error_events_become_statuses_without_the_message() {
    let overloaded =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"canary-secret"}}"#;
    let err = State::default().on_event(overloaded).unwrap_err();
    assert_eq!(err.code(), "OVERLOADED");
    assert!(err.is_retryable() && err.counts_against_breaker());
    assert!(!format!("{err:?}").contains("canary"));

    let rate = r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
    assert!(
        State::default()
            .on_event(rate)
            .unwrap_err()
            .is_rate_limited()
    );

    let unknown = r#"{"type":"error","error":{"type":"brand_new_error","message":"m"}}"#;
    assert!(matches!(
        State::default().on_event(unknown),
        Err(ProviderError::Status { status: 500, .. })
    ));
}

#[test]
fn undecodable_events_are_malformed_without_quoting_them() {
    let err = State::default()
        .on_event(
            r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":42}} canary"#,
        )
        .unwrap_err();
    assert!(matches!(err, ProviderError::Malformed(_)));
    assert!(!err.to_string().contains("canary"));
}

#[test]
fn tool_use_ids_and_names_count_toward_the_response_limit() {
    // No input at all: only IDs and names can fill the answer.
    let mut state = State::new(4096);
    let first_error = (0..100)
        .map(|i| {
            let event = json!({"type": "content_block_start", "index": i,
                "content_block": {"type": "tool_use", "id": format!("toolu_{i:02}"),
                    "name": "n".repeat(200), "input": {}}});
            state.on_event(&event.to_string())
        })
        .enumerate()
        .find_map(|(i, step)| step.err().map(|e| (i, e)));
    // 208 bytes a call: the twentieth passes 4096.
    assert_eq!(
        first_error,
        Some((19, ProviderError::TooLarge { limit: 4096 }))
    );
}

/// The provider, sending to `server` with key `sk-ant-test`.
fn provider(server: &MockServer) -> AnthropicProvider {
    let config = Config::from_toml_str(
        r#"[providers.anthropic]
kind = "anthropic"
api_key_env = "ANTHROPIC_API_KEY""#,
        |_| Some("sk-ant-test".into()),
    )
    .unwrap();
    AnthropicProvider::new(
        &config.providers["anthropic"],
        &format!("{}/v1/", server.uri()),
    )
    .unwrap()
}

#[tokio::test]
async fn a_response_with_too_many_tool_calls_is_too_large() {
    use crate::providers::tool_calls::MAX_TOOL_CALLS;
    let server = MockServer::start().await;
    let blocks: Vec<Value> = (0..=MAX_TOOL_CALLS)
        .map(|i| json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": "f", "input": {}}))
        .collect();
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "msg_01", "type": "message", "role": "assistant",
            "content": blocks, "stop_reason": "tool_use",
            "usage": {"input_tokens": 5, "output_tokens": 1}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let err = provider(&server)
        .complete(request(vec![msg(Role::User, "hi")]))
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::TooLarge { .. }), "{err:?}");
}

/// A redirect from the provider's host is not followed: the key stays
/// with the host it was configured for, and the attempt fails with the
/// redirect's status.
#[tokio::test]
async fn a_redirect_is_not_followed_and_the_key_stays_home() {
    let server = MockServer::start().await;
    let elsewhere = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(
            ResponseTemplate::new(307)
                .insert_header("location", format!("{}/v1/messages", elsewhere.uri())),
        )
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .expect(0)
        .mount(&elsewhere)
        .await;
    let err = provider(&server)
        .complete(request(vec![msg(Role::User, "hi")]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::Status { status: 307, .. }),
        "{err:?}"
    );
    assert!(elsewhere.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn sends_anthropic_headers_trace_and_body_to_messages() {
    let server = MockServer::start().await;
    let provider = provider(&server);
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", "sk-ant-test"))
        .and(header("anthropic-version", "2023-06-01"))
        .and(header("content-type", "application/json"))
        .and(header("x-trace-id", "0190f2a4c1e27a1b9d3f5e6a7b8c9d0e"))
        .and(header(
            "traceparent",
            "00-0190f2a4c1e27a1b9d3f5e6a7b8c9d0e-00f067aa0ba902b7-01",
        ))
        .and(body_partial_json(
            json!({"system": "You classify SMS replies.", "max_tokens": 150}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "msg_01", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 5, "output_tokens": 1}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let mut req = request(vec![msg(Role::User, "hi")]);
    req.traceparent = Some("00-0190f2a4c1e27a1b9d3f5e6a7b8c9d0e-00f067aa0ba902b7-01".into());
    let done = provider.complete(req).await.unwrap();
    assert_eq!(done.text, "ok");
    assert_eq!(done.finish_reason, FinishReason::Stop);
}
