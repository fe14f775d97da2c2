//! Request bodies and stream-chunk edge cases, without HTTP (the wire-level
//! behaviour is covered by `tests/conformance`).

use super::*;
use crate::domain::{ChatMessage, JsonSchemaFormat, ToolSpec};
use tokio::time::Instant;

fn request(format: bool) -> CompletionRequest {
    CompletionRequest {
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        model: "gpt-4o-mini".into(),
        system: Some("Be brief.".into()),
        messages: vec![
            ChatMessage {
                role: Role::User,
                content: "hi".into(),
                ..Default::default()
            },
            ChatMessage {
                role: Role::Assistant,
                content: "hello".into(),
                ..Default::default()
            },
        ],
        temperature: None,
        max_tokens: 32,
        response_format: format.then(|| JsonSchemaFormat {
            name: "answer".into(),
            schema: json!({"type": "object"}),
        }),
        trace_id: "t".into(),
        traceparent: None,
        deadline: Instant::now(),
    }
}

#[test]
fn body_per_flavor() {
    let body = |flavor, req: &CompletionRequest, stream| {
        serde_json::to_value(wire(flavor, req, stream)).unwrap()
    };
    let openai = body(Flavor::Openai, &request(true), false);
    assert_eq!(
        openai,
        json!({"model": "gpt-4o-mini", "max_tokens": 32,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "hello"}],
            "response_format": {"type": "json_schema", "json_schema":
                {"name": "answer", "schema": {"type": "object"}, "strict": false}}})
    );

    let compat = body(Flavor::Compatible, &request(true), true);
    assert_eq!(compat["response_format"], json!({"type": "json_object"}));
    assert_eq!(compat["stream"], json!(true));
    assert!(compat.get("stream_options").is_none(), "{compat}");
    let system = compat["messages"][0]["content"].as_str().unwrap_or("");
    assert!(system.starts_with("Be brief.") && system.contains(r#"{"type":"object"}"#));

    let pplx = body(Flavor::Perplexity, &request(true), true);
    assert_eq!(
        pplx["response_format"],
        json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}})
    );
    assert_eq!(pplx["stream_options"], json!({"include_usage": true}));

    let mut plain = request(false);
    plain.system = None;
    plain.temperature = Some(0.5);
    let plain = body(Flavor::Openai, &plain, false);
    assert_eq!(plain["messages"][0]["role"], "user");
    assert_eq!(plain["temperature"], json!(0.5));
    assert!(plain.get("response_format").is_none() && plain.get("stream").is_none());
}

#[test]
fn tool_choice_is_sent_with_tools_unless_auto() {
    let mut req = request(false);
    req.tools = vec![ToolSpec {
        name: "crm__lookup".into(),
        description: "Find a lead.".into(),
        parameters: json!({"type": "object"}),
    }];
    let sent = |req: &CompletionRequest| {
        let body = serde_json::to_value(wire(Flavor::Openai, req, false)).unwrap();
        body.get("tool_choice").cloned()
    };
    let cases = [
        (ToolChoice::Auto, None),
        (ToolChoice::None, Some(json!("none"))),
        (ToolChoice::Required, Some(json!("required"))),
        (
            ToolChoice::Named("crm__lookup".into()),
            Some(json!({"type": "function", "function": {"name": "crm__lookup"}})),
        ),
    ];
    for (choice, expected) in cases {
        req.tool_choice = choice;
        assert_eq!(sent(&req), expected, "{:?}", req.tool_choice);
    }
    // OpenAI refuses `tool_choice` without tools.
    req.tools.clear();
    req.tool_choice = ToolChoice::Required;
    assert_eq!(sent(&req), None);
}

#[test]
fn non_streaming_shapes() {
    let parse = |v: Value| completion(Flavor::Openai, serde_json::from_value(v).unwrap());
    let ok = parse(json!({"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]}));
    assert_eq!(
        ok,
        Ok(Completion {
            text: "x".into(),
            finish_reason: FinishReason::Length,
            ..Completion::default()
        }),
        "missing usage is zero usage"
    );
    let refusal = json!({"choices": [{"message": {"content": null, "refusal": "no"}}]});
    assert!(matches!(parse(refusal), Err(ProviderError::Malformed(_))));
    assert!(matches!(
        parse(json!({"choices": []})),
        Err(ProviderError::Malformed(_))
    ));
}

fn run(flavor: Flavor, lines: &[&str]) -> (Vec<Result<Step, ProviderError>>, StreamState) {
    let mut state = StreamState::new(flavor, crate::config::DEFAULT_MAX_RESPONSE_BYTES);
    let steps = lines.iter().map(|l| state.on_data(l)).collect();
    (steps, state)
}

#[test]
fn openai_usage_arrives_in_a_chunk_without_choices() {
    let (steps, state) = run(
        Flavor::Openai,
        &[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"usage":null}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#,
            " [DONE] ",
        ],
    );
    let expected = [
        Step::Nothing,
        Step::Delta("Hi".into()),
        Step::Nothing,
        Step::Nothing,
        Step::Done,
    ];
    assert_eq!(steps, Vec::from(expected.map(Ok)));
    let done = state.finish(true).unwrap();
    assert_eq!(
        (done.text.as_str(), done.finish_reason),
        ("Hi", FinishReason::Stop)
    );
    assert_eq!((done.usage.input_tokens, done.usage.output_tokens), (9, 1));
}

#[test]
fn perplexity_running_totals_and_sources_without_done() {
    let (steps, state) = run(
        Flavor::Perplexity,
        &[
            r#"{"citations":["https://a.example/"],"usage":{"prompt_tokens":5,"completion_tokens":1},"choices":[{"delta":{"content":"A"},"message":{"content":"A"},"finish_reason":null}]}"#,
            r#"{"citations":["https://a.example/","https://b.example/"],"usage":{"prompt_tokens":5,"completion_tokens":2},"choices":[{"delta":{"content":"B"},"finish_reason":"stop"}]}"#,
        ],
    );
    assert!(steps.iter().all(Result::is_ok));
    let done = state.finish(false).unwrap();
    assert_eq!(done.text, "AB");
    assert_eq!(done.usage.output_tokens, 2);
    assert_eq!(done.citations.len(), 2);
}

#[test]
fn truncation_bad_json_and_in_stream_errors() {
    let (_, cut) = run(
        Flavor::Openai,
        &[r#"{"choices":[{"delta":{"content":"A"}}]}"#],
    );
    assert!(matches!(
        cut.finish(false),
        Err(ProviderError::Malformed(_))
    ));

    let (steps, _) = run(
        Flavor::Openai,
        &[
            r#"{"choices":[{"delta""#,
            "42",
            r#"{"choices":"canary-secret"}"#,
            "",
        ],
    );
    for bad in &steps[..3] {
        assert!(
            matches!(bad, Err(ProviderError::Malformed(m)) if !m.contains("canary")),
            "{bad:?}"
        );
    }
    assert_eq!(steps[3], Ok(Step::Nothing), "keep-alive");

    let (steps, _) = run(
        Flavor::Openai,
        &[
            r#"{"error":{"message":"canary-secret","type":"server_error","code":null}}"#,
            r#"{"object":"error","error":{"message":"canary-secret","type":"BadRequestError","code":400}}"#,
        ],
    );
    let first = steps[0].as_ref().unwrap_err();
    assert_eq!(first.code(), "HTTP_502");
    assert!(first.is_retryable());
    assert_eq!(steps[1].as_ref().unwrap_err().code(), "HTTP_400");
    for err in steps.iter().filter_map(|s| s.as_ref().err()) {
        assert!(!format!("{err:?}{err}").contains("canary"), "{err:?}");
    }
}

/// A chunk beginning tool call `index`, with a name of `name_len` bytes.
fn new_call_chunk(index: usize, name_len: usize) -> String {
    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": index, "id": format!("call_{index}"), "type": "function",
        "function": {"name": "n".repeat(name_len), "arguments": ""}}]},
        "finish_reason": null}]})
    .to_string()
}

#[test]
fn tool_call_ids_and_names_count_toward_the_response_limit() {
    // No arguments at all: only IDs and names can fill the answer.
    let mut state = StreamState::new(Flavor::Openai, 4096);
    let first_error = (0..100)
        .map(|i| state.on_data(&new_call_chunk(i, 200)))
        .enumerate()
        .find_map(|(i, step)| step.err().map(|e| (i, e)));
    // About 206 bytes a call: the twentieth passes 4096.
    assert_eq!(
        first_error,
        Some((19, ProviderError::TooLarge { limit: 4096 }))
    );
}

#[test]
fn a_stream_may_make_at_most_max_tool_calls() {
    use crate::providers::tool_calls::MAX_TOOL_CALLS;
    let mut state = StreamState::new(Flavor::Openai, crate::config::DEFAULT_MAX_RESPONSE_BYTES);
    for i in 0..MAX_TOOL_CALLS {
        assert_eq!(state.on_data(&new_call_chunk(i, 8)), Ok(Step::Nothing));
    }
    assert!(matches!(
        state.on_data(&new_call_chunk(MAX_TOOL_CALLS, 8)),
        Err(ProviderError::TooLarge { .. })
    ));
}
