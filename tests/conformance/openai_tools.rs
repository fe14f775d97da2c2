//! Tool calling in the Chat Completions format (SPEC §11.4), with payloads
//! shaped like recorded api.openai.com answers: tools offered, parallel
//! tool calls answered whole and streamed in pieces, a history of calls and
//! results sent back, malformed arguments kept for the loop to answer, and
//! the formats that cannot (yet) carry tools refusing them.

use crate::harness::{
    collect, data_events, finished, only_request, request, serve, sse, tool_result,
};
use crate::openai::fixture;
use ai_orchestrator::domain::{
    ChatMessage, FinishReason, ProviderError, ToolCall, ToolSpec, WireNames, completion::Role,
};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

fn tools() -> (WireNames, Vec<ToolSpec>) {
    let names = WireNames::new(["crm.lookup", "sms.segments"]);
    let spec = |ours: &str, description: &str, parameters: Value| ToolSpec {
        name: names.wire(ours).unwrap().to_owned(),
        description: description.into(),
        parameters,
    };
    let specs = vec![
        spec(
            "crm.lookup",
            "Look up a lead in the CRM",
            json!({"type": "object", "required": ["lead_id"],
                   "properties": {"lead_id": {"type": "string"}}}),
        ),
        spec(
            "sms.segments",
            "Count the SMS segments of a text",
            json!({"type": "object", "required": ["text"],
                   "properties": {"text": {"type": "string"}}}),
        ),
    ];
    (names, specs)
}

fn usage() -> Value {
    json!({"prompt_tokens": 142, "completion_tokens": 51, "total_tokens": 193,
           "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
           "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
               "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}})
}

/// Two parallel calls, as gpt-4o-mini answers them: no content, the
/// arguments as JSON text.
fn parallel_calls_body() -> Value {
    json!({
        "id": "chatcmpl-BFnBWq6wXgYV2rbEPTGgmJqr3JGcJ",
        "object": "chat.completion",
        "created": 1743082350,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [
                    {"id": "call_Xd7bB0nqpRJ9Vn4hZCpQx0dB", "type": "function",
                     "function": {"name": "crm__lookup", "arguments": "{\"lead_id\":\"L-17\"}"}},
                    {"id": "call_5pA0V2Qy3gbKSHoOczt8Kw3W", "type": "function",
                     "function": {"name": "sms__segments", "arguments": "{\"text\":\"Can we talk at 5? ☎\"}"}}
                ],
                "refusal": null,
                "annotations": []
            },
            "logprobs": null,
            "finish_reason": "tool_calls"
        }],
        "usage": usage(),
        "service_tier": "default",
        "system_fingerprint": "fp_b376dfbbd5"
    })
}

#[tokio::test]
async fn tools_are_offered_and_parallel_calls_come_back() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(parallel_calls_body()),
    )
    .await;
    let (names, specs) = tools();
    let mut req = request(&f, "tools");
    req.tools = specs;
    let done = crate::harness::provider(&f, &server, true)
        .complete(req)
        .await
        .unwrap();
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(done.text, "");
    assert_eq!(
        (done.usage.input_tokens, done.usage.output_tokens),
        (142, 51)
    );
    assert_eq!(done.tool_calls.len(), 2);
    assert_eq!(done.tool_calls[0].id, "call_Xd7bB0nqpRJ9Vn4hZCpQx0dB");
    assert_eq!(names.ours(&done.tool_calls[0].name), Some("crm.lookup"));
    assert_eq!(done.tool_calls[0].parsed().unwrap()["lead_id"], "L-17");
    assert_eq!(
        done.tool_calls[1].parsed().unwrap()["text"],
        "Can we talk at 5? ☎"
    );

    let body: Value = only_request(&server, "tools").await.body_json().unwrap();
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {
            "name": "crm__lookup", "description": "Look up a lead in the CRM",
            "parameters": {"type": "object", "required": ["lead_id"],
                           "properties": {"lead_id": {"type": "string"}}}}})
    );
    assert_eq!(body["tools"][1]["function"]["name"], "sms__segments");
}

#[tokio::test]
async fn a_history_of_calls_and_results_goes_back_in_openai_shape() {
    let f = fixture();
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(&f.success_body),
    )
    .await;
    let (_, specs) = tools();
    let mut req = request(&f, "history");
    req.tools = specs;
    req.messages.push(ChatMessage {
        role: Role::Assistant,
        tool_calls: vec![
            ToolCall {
                id: "call_1".into(),
                name: "crm__lookup".into(),
                arguments: r#"{"lead_id":"L-17"}"#.into(),
            },
            ToolCall {
                id: "call_2".into(),
                name: "sms__segments".into(),
                // Malformed, as the model wrote it: sent back unchanged.
                arguments: r#"{"text": "hi"#.into(),
            },
        ],
        ..Default::default()
    });
    for (id, name, content, is_error) in [
        (
            "call_1",
            "crm__lookup",
            r#"{"lead":{"name":"Dana"}}"#,
            false,
        ),
        (
            "call_2",
            "sms__segments",
            r#"{"error":{"code":"TOOL_INPUT_INVALID"}}"#,
            true,
        ),
    ] {
        req.messages.push(tool_result(id, name, content, is_error));
    }
    crate::harness::provider(&f, &server, true)
        .complete(req)
        .await
        .unwrap();
    let body: Value = only_request(&server, "history").await.body_json().unwrap();
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5, "{messages:?}");
    assert_eq!(
        messages[2],
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "crm__lookup", "arguments": "{\"lead_id\":\"L-17\"}"}},
            {"id": "call_2", "type": "function",
             "function": {"name": "sms__segments", "arguments": "{\"text\": \"hi"}}]})
    );
    assert_eq!(
        messages[3],
        json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"lead\":{\"name\":\"Dana\"}}"})
    );
    assert_eq!(messages[4]["role"], "tool");
    assert_eq!(messages[4]["tool_call_id"], "call_2");
}

/// One streamed chunk with a tool-call delta.
fn chunk(delta: Value, finish: Value) -> Value {
    json!({
        "id": "chatcmpl-BFnCKmOxg3kGqEJ2d7uJKQe1jW3Tn",
        "object": "chat.completion.chunk",
        "created": 1743082400,
        "model": "gpt-4o-mini-2024-07-18",
        "service_tier": "default",
        "system_fingerprint": "fp_b376dfbbd5",
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        "usage": null
    })
}

fn args(index: u64, piece: &str) -> Value {
    chunk(
        json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
        Value::Null,
    )
}

fn starts(index: u64, id: &str, name: &str) -> Value {
    chunk(
        json!({"tool_calls": [{"index": index, "id": id, "type": "function",
                               "function": {"name": name, "arguments": ""}}]}),
        Value::Null,
    )
}

#[tokio::test]
async fn streamed_argument_pieces_are_buffered_until_the_calls_end() {
    let f = fixture();
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": null, "refusal": null}),
        Value::Null,
    )];
    events.push(starts(0, "call_DdmO9PwR7cXoXr5uSbFAMYp3", "crm__lookup"));
    // Split mid key, mid value and inside a \u escape sequence.
    for piece in [
        "{\"",
        "lead",
        "_id",
        "\":\"",
        "L-",
        "17",
        "\",\"",
        "no",
        "te\":\"caf\\u00",
        "e9\"}",
    ] {
        events.push(args(0, piece));
    }
    events.push(starts(1, "call_h9Gf0xq3tRmDfY4zK2VbN8aA", "sms__segments"));
    for piece in ["{\"text\":", "\"Can we talk", " at 5? ☎\"}"] {
        events.push(args(1, piece));
    }
    events.push(chunk(json!({}), json!("tool_calls")));
    let mut last = chunk(json!({}), Value::Null);
    last["choices"] = json!([]);
    last["usage"] = usage();
    events.push(last);
    let server = serve(&f.stream_path, sse(&data_events(&events, true))).await;
    let (_, specs) = tools();
    let mut req = request(&f, "stream-tools");
    req.tools = specs;
    let items = collect(&crate::harness::provider(&f, &server, true), req)
        .await
        .unwrap();
    let (text, done) = finished(&items, "streamed tool calls");
    assert_eq!(text, "", "no text deltas: the calls are not text");
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(done.usage.output_tokens, 51);
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
            (
                "call_DdmO9PwR7cXoXr5uSbFAMYp3",
                "crm__lookup",
                json!({"lead_id": "L-17", "note": "café"})
            ),
            (
                "call_h9Gf0xq3tRmDfY4zK2VbN8aA",
                "sms__segments",
                json!({"text": "Can we talk at 5? ☎"})
            ),
        ]
    );
}

#[tokio::test]
async fn malformed_arguments_are_kept_for_the_loop_to_answer() {
    let f = fixture();
    let mut body = parallel_calls_body();
    body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] =
        json!("{\"lead_id\": \"L-17\"");
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(body),
    )
    .await;
    let (_, specs) = tools();
    let mut req = request(&f, "malformed");
    req.tools = specs;
    let done = crate::harness::provider(&f, &server, true)
        .complete(req)
        .await
        .unwrap();
    assert_eq!(done.tool_calls[0].arguments, "{\"lead_id\": \"L-17\"");
    assert!(done.tool_calls[0].parsed().is_err());
    assert!(done.tool_calls[1].parsed().is_ok());
}

#[tokio::test]
async fn a_tool_call_without_a_name_is_malformed() {
    let f = fixture();
    let mut body = parallel_calls_body();
    body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = json!("");
    let server = serve(
        &f.complete_path,
        ResponseTemplate::new(200).set_body_json(body),
    )
    .await;
    let (_, specs) = tools();
    let mut req = request(&f, "nameless");
    req.tools = specs;
    let err = crate::harness::provider(&f, &server, true)
        .complete(req)
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Malformed(_)), "{err:?}");
}

/// Perplexity has no tool calling: a request with tools is refused before
/// any HTTP call, rather than sent without them.
#[tokio::test]
async fn perplexity_refuses_tools() {
    for f in [crate::perplexity::fixture()] {
        let server = serve(
            &f.complete_path,
            ResponseTemplate::new(200).set_body_json(&f.success_body),
        )
        .await;
        let (_, specs) = tools();
        let mut req = request(&f, "refused");
        req.tools = specs;
        let err = crate::harness::provider(&f, &server, true)
            .complete(req)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProviderError::Unsupported(_)),
            "{}: {err:?}",
            f.name
        );
        assert!(
            server.received_requests().await.unwrap().is_empty(),
            "{}",
            f.name
        );
    }
}
