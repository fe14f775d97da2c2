//! Request shape, response mapping and chunk folding of the Gemini adapter.
//! The HTTP error paths are covered by `tests/conformance`.

use super::*;
use crate::config::Config;
use crate::domain::{ChatMessage, JsonSchemaFormat, ToolSpec};
use crate::providers::turns::OPENING_USER_TURN;
use serde_json::{Value, json};
use wiremock::matchers::{body_partial_json, header, method, path, query_param};
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
        model: "gemini-2.0-flash".into(),
        system: Some("You classify SMS replies.".into()),
        messages,
        temperature: Some(0.2),
        max_tokens: 150,
        response_format: None,
        trace_id: "0190f2a4c1e27a1b9d3f5e6a7b8c9d0e".into(),
        traceparent: None,
        deadline: tokio::time::Instant::now() + Duration::from_secs(5),
    }
}

/// The JSON exactly as it goes on the wire (f32 temperatures included).
fn wire_json(req: &CompletionRequest) -> Value {
    serde_json::from_slice(&serde_json::to_vec(&body(req)).unwrap()).unwrap()
}

#[test]
fn body_has_contents_system_instruction_and_generation_config() {
    let req = request(vec![
        msg(Role::Assistant, "Hi Dana, it's Sam from Acme Roofing."),
        msg(Role::User, "who is this"),
        msg(Role::User, "oh the roof guy"),
    ]);
    assert_eq!(
        wire_json(&req),
        json!({
            "contents": [
                {"role": "user", "parts": [{"text": OPENING_USER_TURN}]},
                {"role": "model", "parts": [{"text": "Hi Dana, it's Sam from Acme Roofing."}]},
                {"role": "user", "parts": [{"text": "who is this\n\noh the roof guy"}]},
            ],
            "systemInstruction": {"parts": [{"text": "You classify SMS replies."}]},
            "generationConfig": {"maxOutputTokens": 150, "temperature": 0.2},
        })
    );
}

#[test]
fn json_requests_ask_for_json_and_carry_the_schema_instruction() {
    let mut req = request(vec![msg(Role::User, "yes")]);
    req.system = None;
    req.temperature = None;
    req.response_format = Some(JsonSchemaFormat {
        name: "sms_classification".into(),
        schema: json!({"type":"object"}),
    });
    let body = wire_json(&req);
    assert_eq!(
        body["generationConfig"],
        json!({"maxOutputTokens": 150, "responseMimeType": "application/json"})
    );
    let system = body["systemInstruction"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(system.contains(r#"{"type":"object"}"#));
}

#[test]
fn tool_choice_is_a_tool_config_with_tools_unless_auto() {
    let mut req = request(vec![msg(Role::User, "look up L-1")]);
    req.tools = vec![ToolSpec {
        name: "crm__lookup".into(),
        description: "Find a lead.".into(),
        parameters: json!({"type": "object"}),
    }];
    let sent = |req: &CompletionRequest| wire_json(req).get("toolConfig").cloned();
    let mode = |config: Value| Some(json!({ "functionCallingConfig": config }));
    let cases = [
        (ToolChoice::Auto, None),
        (ToolChoice::None, mode(json!({"mode": "NONE"}))),
        (ToolChoice::Required, mode(json!({"mode": "ANY"}))),
        (
            ToolChoice::Named("crm__lookup".into()),
            mode(json!({"mode": "ANY", "allowedFunctionNames": ["crm__lookup"]})),
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

fn fold(chunks: &[Value]) -> (StreamState, Vec<String>) {
    let mut state = StreamState::default();
    let texts = chunks
        .iter()
        .map(|c| {
            state
                .on_chunk(serde_json::from_value(c.clone()).unwrap())
                .unwrap()
        })
        .collect();
    (state, texts)
}

#[test]
fn chunks_fold_text_skip_thoughts_and_keep_the_last_usage() {
    let (state, texts) = fold(&[
        json!({"candidates":[{"content":{"role":"model","parts":[
            {"text":"planning...","thought":true},{"text":"Sure"}]}}],
            "usageMetadata":{"promptTokenCount":12,"totalTokenCount":12}}),
        json!({"usageMetadata":{"promptTokenCount":12}}),
        json!({"candidates":[{"content":{"role":"model","parts":[{"text":", 2pm works."}]},
            "finishReason":"MAX_TOKENS"}],
            "usageMetadata":{"promptTokenCount":12,"candidatesTokenCount":5,
                "thoughtsTokenCount":30,"totalTokenCount":47}}),
    ]);
    assert_eq!(texts, ["Sure", "", ", 2pm works."]);
    let done = state.finish();
    assert_eq!(done.text, "Sure, 2pm works.");
    assert_eq!(done.finish_reason, FinishReason::Length);
    assert_eq!(
        done.usage,
        TokenUsage {
            input_tokens: 12,
            output_tokens: 35
        }
    );
}

/// A chunk of one candidate whose parts are `parts`.
fn parts_chunk(parts: Vec<Value>) -> GenerateResponse {
    serde_json::from_value(json!({"candidates": [{"content": {"role": "model", "parts": parts}}]}))
        .unwrap()
}

#[test]
fn function_calls_without_args_still_count_toward_the_limit() {
    // No `args` at all: only our IDs and the names can fill the answer.
    let mut state = StreamState::new(4096);
    let first_error = (0..100)
        .map(|_| {
            state.on_chunk(parts_chunk(vec![
                json!({"functionCall": {"name": "n".repeat(200)}}),
            ]))
        })
        .enumerate()
        .find_map(|(i, step)| step.err().map(|e| (i, e)));
    // `call_0`.. IDs plus 200-byte names: the twentieth call passes 4096.
    assert_eq!(
        first_error,
        Some((19, ProviderError::TooLarge { limit: 4096 }))
    );
}

#[test]
fn one_answer_holds_at_most_max_tool_calls() {
    use crate::providers::tool_calls::MAX_TOOL_CALLS;
    let call = json!({"functionCall": {"name": "f"}});
    let mut state = StreamState::default();
    state
        .on_chunk(parts_chunk(vec![call.clone(); MAX_TOOL_CALLS]))
        .unwrap();
    assert_eq!(state.calls.len(), MAX_TOOL_CALLS);
    assert!(matches!(
        state.on_chunk(parts_chunk(vec![call])),
        Err(ProviderError::TooLarge { .. })
    ));
}

#[test]
fn finish_reasons_map() {
    for (reason, expected) in [
        ("STOP", FinishReason::Stop),
        ("MAX_TOKENS", FinishReason::Length),
        ("SAFETY", FinishReason::ContentFilter),
        ("RECITATION", FinishReason::ContentFilter),
        ("BLOCKLIST", FinishReason::ContentFilter),
        ("PROHIBITED_CONTENT", FinishReason::ContentFilter),
        ("OTHER", FinishReason::Other),
    ] {
        assert_eq!(finish_reason(reason), expected, "{reason}");
    }
}

#[test]
fn a_blocked_prompt_is_a_non_retryable_error() {
    let blocked: GenerateResponse = serde_json::from_value(json!({
        "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": []},
        "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
        "modelVersion": "gemini-2.0-flash"
    }))
    .unwrap();
    let err = StreamState::default().on_chunk(blocked).unwrap_err();
    assert!(matches!(&err, ProviderError::Malformed(m) if m.contains("SAFETY")));
    assert!(!err.is_retryable());
}

#[test]
fn an_error_chunk_mid_stream_keeps_its_code_but_not_its_message() {
    let chunk =
        parse_chunk(r#"{"error":{"code":503,"message":"canary-secret","status":"UNAVAILABLE"}}"#)
            .unwrap()
            .unwrap();
    let err = StreamState::default().on_chunk(chunk).unwrap_err();
    assert_eq!(
        err,
        ProviderError::Status {
            status: 503,
            retry_after: None,
            summary: "UNAVAILABLE".into()
        }
    );
    // A code outside HTTP's error range is a 500, not a new metric label.
    for code in [600, 9_999, 65_535, 399] {
        let chunk = parse_chunk(&format!(r#"{{"error":{{"code":{code},"status":"X"}}}}"#))
            .unwrap()
            .unwrap();
        let err = StreamState::default().on_chunk(chunk).unwrap_err();
        assert!(
            matches!(err, ProviderError::Status { status: 500, .. }),
            "{code}: {err:?}"
        );
    }
    assert!(matches!(
        parse_chunk(r#"{"candidates": "canary"#),
        Err(ProviderError::Malformed(m)) if !m.contains("canary")
    ));
}

fn provider(server: &MockServer) -> GeminiProvider {
    let config = Config::from_toml_str(
        r#"[providers.gemini]
kind = "gemini"
api_key_env = "GEMINI_API_KEY""#,
        |_| Some("AIza-test".into()),
    )
    .unwrap();
    GeminiProvider::new(
        &config.providers["gemini"],
        &format!("{}/v1beta", server.uri()),
    )
    .unwrap()
}

#[tokio::test]
async fn sends_the_key_header_trace_and_body_to_generate_content() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.0-flash:generateContent"))
        .and(header("x-goog-api-key", "AIza-test"))
        .and(header("content-type", "application/json"))
        .and(header("x-trace-id", "0190f2a4c1e27a1b9d3f5e6a7b8c9d0e"))
        .and(body_partial_json(
            json!({"generationConfig": {"maxOutputTokens": 150}}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]},
                "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 1}
        })))
        .expect(1)
        .mount(&server)
        .await;
    let mut req = request(vec![msg(Role::User, "hi")]);
    req.model = "models/gemini-2.0-flash".into();
    let done = provider(&server).complete(req).await.unwrap();
    assert_eq!(done.text, "ok");
    assert_eq!(done.usage.output_tokens, 1);
}

#[tokio::test]
async fn streams_from_stream_generate_content_with_alt_sse() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.0-flash:streamGenerateContent"))
        .and(query_param("alt", "sse"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"ok\"}]},\"finishReason\":\"STOP\"}]}\r\n\r\n",
            "text/event-stream",
        ))
        .expect(1)
        .mount(&server)
        .await;
    let events: Vec<_> = provider(&server)
        .stream(request(vec![msg(Role::User, "hi")]))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], Ok(StreamEvent::Delta("ok".into())));
}
