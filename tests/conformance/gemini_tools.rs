//! Tool calling in the Gemini API format (SPEC §11.4), with payloads shaped
//! like recorded generativelanguage.googleapis.com answers:
//! `functionDeclarations`, `functionCall` parts (whole, even in a stream;
//! no IDs), and `functionResponse` parts answering by name.

use crate::gemini::fixture;
use crate::harness::{
    collect, data_events, finished, only_request, provider, request, serve, sse, tool_result,
};
use ai_orchestrator::domain::{ChatMessage, FinishReason, ToolCall, ToolSpec, completion::Role};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

fn lookup() -> ToolSpec {
    ToolSpec {
        name: "crm__lookup".into(),
        description: "Look up a lead in the CRM".into(),
        parameters: json!({"type": "object", "required": ["lead_id"],
                           "properties": {"lead_id": {"type": "string"}},
                           "additionalProperties": false}),
    }
}

fn calls_body() -> Value {
    json!({
        "candidates": [{
            "content": {"parts": [
                {"functionCall": {"name": "crm__lookup", "args": {"lead_id": "L-17"}}},
                {"functionCall": {"name": "crm__lookup", "args": {"lead_id": "L-18"}}}
            ], "role": "model"},
            "finishReason": "STOP",
            "avgLogprobs": -0.0021
        }],
        "usageMetadata": {"promptTokenCount": 61, "candidatesTokenCount": 24,
                          "totalTokenCount": 85,
                          "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 61}]},
        "modelVersion": "gemini-2.0-flash",
        "responseId": "3H7ZZ8bnJZK5mNAPq4fT8Qk"
    })
}

#[tokio::test]
async fn tools_are_declared_and_function_calls_come_back() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(calls_body()),
    )
    .await;
    let mut req = request(&f, "tools");
    req.tools = vec![lookup()];
    let done = provider(&f, &server, true).complete(req).await.unwrap();
    assert_eq!(
        done.finish_reason,
        FinishReason::ToolCalls,
        "STOP with calls"
    );
    assert_eq!(done.text, "");
    let calls: Vec<(&str, &str, Value)> = done
        .tool_calls
        .iter()
        .map(|c| {
            (
                c.id.as_str(),
                c.name.as_str(),
                Value::Object(c.parsed().unwrap()),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("call_0", "crm__lookup", json!({"lead_id": "L-17"})),
            ("call_1", "crm__lookup", json!({"lead_id": "L-18"}))
        ]
    );
    let sent: Value = only_request(&server, "tools").await.body_json().unwrap();
    assert_eq!(
        sent["tools"],
        json!([{"functionDeclarations": [{"name": "crm__lookup",
            "description": "Look up a lead in the CRM",
            "parametersJsonSchema": lookup().parameters}]}])
    );
    assert_eq!(
        sent["contents"][0],
        json!({"role": "user", "parts": [{"text": "Say hello."}]})
    );
}

#[tokio::test]
async fn a_history_of_calls_and_results_goes_back_as_parts() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(&f.success_body),
    )
    .await;
    let mut req = request(&f, "history");
    req.tools = vec![lookup()];
    req.messages.push(ChatMessage {
        role: Role::Assistant,
        tool_calls: vec![
            ToolCall {
                id: "call_0".into(),
                name: "crm__lookup".into(),
                arguments: r#"{"lead_id":"L-17"}"#.into(),
            },
            ToolCall {
                id: "call_1".into(),
                name: "crm__lookup".into(),
                arguments: r#"{"lead_id":"L-18"}"#.into(),
            },
        ],
        ..Default::default()
    });
    for (id, content, is_error) in [
        ("call_0", r#"{"lead":{"name":"Dana"}}"#, false),
        ("call_1", r#""not found""#, true),
    ] {
        req.messages
            .push(tool_result(id, "crm__lookup", content, is_error));
    }
    provider(&f, &server, true).complete(req).await.unwrap();
    let sent: Value = only_request(&server, "history").await.body_json().unwrap();
    let contents = sent["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 3, "{contents:?}");
    assert_eq!(
        contents[1],
        json!({"role": "model", "parts": [
            {"functionCall": {"name": "crm__lookup", "args": {"lead_id": "L-17"}}},
            {"functionCall": {"name": "crm__lookup", "args": {"lead_id": "L-18"}}}]})
    );
    assert_eq!(
        contents[2],
        json!({"role": "user", "parts": [
            {"functionResponse": {"name": "crm__lookup", "response": {"lead": {"name": "Dana"}}}},
            {"functionResponse": {"name": "crm__lookup", "response": {"error": "not found"}}}]})
    );
}

#[tokio::test]
async fn streamed_function_calls_arrive_whole_beside_text() {
    let f = fixture();
    let chunk = |parts: Value, finish: Option<&str>, usage: Option<Value>| {
        let mut c = json!({"candidates": [{"content": {"parts": parts, "role": "model"}}],
                           "modelVersion": "gemini-2.0-flash",
                           "responseId": "fX7ZZ5WcF8-mmNAP7M6b0Qo"});
        if let Some(reason) = finish {
            c["candidates"][0]["finishReason"] = json!(reason);
        }
        if let Some(u) = usage {
            c["usageMetadata"] = u;
        }
        c
    };
    let body = data_events(
        &[
            chunk(json!([{"text": "Checking"}]), None, None),
            chunk(json!([{"text": " the CRM."}]), None, None),
            chunk(
                json!([{"functionCall": {"name": "crm__lookup", "args": {"lead_id": "L-17"}}}]),
                Some("STOP"),
                Some(json!({"promptTokenCount": 61, "candidatesTokenCount": 30,
                            "totalTokenCount": 91})),
            ),
        ],
        false,
    );
    let server = serve(&f.stream_path, sse(&body)).await;
    let mut req = request(&f, "stream-tools");
    req.tools = vec![lookup()];
    let items = collect(&provider(&f, &server, true), req).await.unwrap();
    let (text, done) = finished(&items, "streamed functionCall");
    assert_eq!(text, "Checking the CRM.");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(done.usage.output_tokens, 30);
    assert_eq!(done.tool_calls.len(), 1);
    assert_eq!(done.tool_calls[0].parsed().unwrap()["lead_id"], "L-17");
}
