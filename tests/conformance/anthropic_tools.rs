//! Tool calling in Anthropic's Messages format (SPEC §11.4), with payloads
//! shaped like recorded api.anthropic.com answers: `tools` with
//! `input_schema`, `tool_use` blocks whole and streamed as
//! `input_json_delta` pieces, and a history of calls and `tool_result`
//! blocks (`is_error`) in the next user turn.

use crate::anthropic::fixture;
use crate::harness::{collect, finished, only_request, provider, request, serve, sse, tool_result};
use ai_orchestrator::domain::{ChatMessage, FinishReason, ToolCall, ToolSpec, completion::Role};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

fn lookup() -> ToolSpec {
    ToolSpec {
        name: "crm__lookup".into(),
        description: "Look up a lead in the CRM".into(),
        parameters: json!({"type": "object", "required": ["lead_id"],
                           "properties": {"lead_id": {"type": "string"}}}),
    }
}

#[tokio::test]
async fn tools_are_offered_and_tool_use_blocks_come_back() {
    let f = fixture();
    let body = json!({
        "id": "msg_01Aq9w938a90dw8q", "type": "message", "role": "assistant",
        "model": "claude-3-haiku-20240307",
        "content": [
            {"type": "text", "text": "I'll look up both leads."},
            {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9",
             "name": "crm__lookup", "input": {"lead_id": "L-17"}},
            {"type": "tool_use", "id": "toolu_01B19r91rx91mr928946mr0",
             "name": "crm__lookup", "input": {"lead_id": "L-18"}}
        ],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 384, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0, "output_tokens": 92}
    });
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(body),
    )
    .await;
    let mut req = request(&f, "tools");
    req.tools = vec![lookup()];
    let done = provider(&f, &server, true).complete(req).await.unwrap();
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(done.text, "I'll look up both leads.");
    let calls: Vec<(&str, Value)> = done
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), Value::Object(c.parsed().unwrap())))
        .collect();
    assert_eq!(
        calls,
        [
            ("toolu_01A09q90qw90lq917835lq9", json!({"lead_id": "L-17"})),
            ("toolu_01B19r91rx91mr928946mr0", json!({"lead_id": "L-18"}))
        ]
    );
    let sent: Value = only_request(&server, "tools").await.body_json().unwrap();
    assert_eq!(
        sent["tools"],
        json!([{"name": "crm__lookup", "description": "Look up a lead in the CRM",
                "input_schema": {"type": "object", "required": ["lead_id"],
                                 "properties": {"lead_id": {"type": "string"}}}}])
    );
    assert_eq!(
        sent["messages"][0],
        json!({"role": "user", "content": "Say hello."})
    );
}

#[tokio::test]
async fn a_history_of_calls_and_results_goes_back_as_blocks() {
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
        content: "Looking them up.".into(),
        tool_calls: vec![
            ToolCall {
                id: "toolu_1".into(),
                name: "crm__lookup".into(),
                arguments: r#"{"lead_id":"L-17"}"#.into(),
            },
            ToolCall {
                id: "toolu_2".into(),
                name: "crm__lookup".into(),
                // Malformed as the model wrote it (say, from another
                // provider): sent as {}, its result says why.
                arguments: r#"{"lead_id": "#.into(),
            },
        ],
        ..Default::default()
    });
    for (id, content, is_error) in [
        ("toolu_1", r#"{"lead":{"name":"Dana"}}"#, false),
        (
            "toolu_2",
            r#"{"error":{"code":"TOOL_INPUT_INVALID"}}"#,
            true,
        ),
    ] {
        req.messages
            .push(tool_result(id, "crm__lookup", content, is_error));
    }
    provider(&f, &server, true).complete(req).await.unwrap();
    let sent: Value = only_request(&server, "history").await.body_json().unwrap();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "user, assistant, user: {messages:?}");
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Looking them up."},
            {"type": "tool_use", "id": "toolu_1", "name": "crm__lookup", "input": {"lead_id": "L-17"}},
            {"type": "tool_use", "id": "toolu_2", "name": "crm__lookup", "input": {}}]})
    );
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": "{\"lead\":{\"name\":\"Dana\"}}", "is_error": false},
            {"type": "tool_result", "tool_use_id": "toolu_2",
             "content": "{\"error\":{\"code\":\"TOOL_INPUT_INVALID\"}}", "is_error": true}]})
    );
}

fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

#[tokio::test]
async fn streamed_input_json_pieces_are_buffered_until_the_message_stops() {
    let f = fixture();
    let mut body = event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_014p7gG3wDgGV9EUtLvnow3U", "type": "message", "role": "assistant",
            "model": "claude-3-haiku-20240307", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 472, "output_tokens": 2}}}),
    );
    body += &event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 0,
               "content_block": {"type": "text", "text": ""}}),
    );
    body += &event("ping", json!({"type": "ping"}));
    for text in ["Let me", " check that lead."] {
        body += &event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "text_delta", "text": text}}),
        );
    }
    body += &event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    );
    body += &event(
        "content_block_start",
        json!({"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
            "name": "crm__lookup", "input": {}}}),
    );
    // Split mid key and inside a \u escape, as the API does.
    for piece in [
        "",
        "{\"lead",
        "_id\": \"L-",
        "17\", \"note\": \"caf\\u00",
        "e9\"}",
    ] {
        body += &event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "input_json_delta", "partial_json": piece}}),
        );
    }
    body += &event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 1}),
    );
    body += &event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": "tool_use", "stop_sequence": null},
               "usage": {"output_tokens": 89}}),
    );
    body += &event("message_stop", json!({"type": "message_stop"}));
    let server = serve(&f.stream_path, sse(&body)).await;
    let mut req = request(&f, "stream-tools");
    req.tools = vec![lookup()];
    let items = collect(&provider(&f, &server, true), req).await.unwrap();
    let (text, done) = finished(&items, "streamed tool_use");
    assert_eq!(text, "Let me check that lead.");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        (done.usage.input_tokens, done.usage.output_tokens),
        (472, 89)
    );
    assert_eq!(done.tool_calls.len(), 1);
    assert_eq!(done.tool_calls[0].id, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");
    assert_eq!(
        Value::Object(done.tool_calls[0].parsed().unwrap()),
        json!({"lead_id": "L-17", "note": "café"})
    );
}
