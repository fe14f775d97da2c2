//! A conversation that falls back from one provider to another mid-turn
//! (SPEC §11.4): OpenAI's tool calls, kept in our neutral types, go to
//! Anthropic and to Gemini in their own shapes, ids and arguments intact.

use crate::harness::{only_request, provider, request, serve, tool_result};
use ai_orchestrator::domain::{ChatMessage, ToolSpec, completion::Role};
use serde_json::{Value, json};
use wiremock::ResponseTemplate;

#[tokio::test]
async fn openai_tool_history_translates_to_anthropic_and_gemini() {
    let spec = ToolSpec {
        name: "crm__lookup".into(),
        description: "Look up a lead".into(),
        parameters: json!({"type": "object", "properties": {"lead_id": {"type": "string"}}}),
    };
    // OpenAI answers with two calls.
    let openai = crate::openai::fixture();
    let answer = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1743082350,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null,
            "message": {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
                {"id": "call_Xd7bB0nqpRJ9Vn4hZCpQx0dB", "type": "function",
                 "function": {"name": "crm__lookup", "arguments": "{\"lead_id\":\"L-17\"}"}},
                {"id": "call_5pA0V2Qy3gbKSHoOczt8Kw3W", "type": "function",
                 "function": {"name": "crm__lookup", "arguments": "{\"lead_id\":\"L-18\"}"}}]}}],
        "usage": {"prompt_tokens": 80, "completion_tokens": 40, "total_tokens": 120}
    });
    let server = serve(
        &openai.complete_path,
        ResponseTemplate::new(200).set_body_json(answer),
    )
    .await;
    let mut req = request(&openai, "fallback");
    req.tools = vec![spec.clone()];
    let first = provider(&openai, &server, true)
        .complete(req.clone())
        .await
        .unwrap();
    // The loop appends the calls and their results...
    req.messages.push(ChatMessage {
        role: Role::Assistant,
        tool_calls: first.tool_calls.clone(),
        ..Default::default()
    });
    for (call, content) in first
        .tool_calls
        .iter()
        .zip(["{\"name\":\"Dana\"}", "{\"name\":\"Eli\"}"])
    {
        req.messages
            .push(tool_result(&call.id, &call.name, content, false));
    }
    // ...then OpenAI fails and the next target is Anthropic.
    let anthropic = crate::anthropic::fixture();
    let server = serve(
        &anthropic.complete_path,
        ResponseTemplate::new(200).set_body_json(&anthropic.success_body),
    )
    .await;
    let mut to_anthropic = req.clone();
    to_anthropic.model = anthropic.model.into();
    provider(&anthropic, &server, true)
        .complete(to_anthropic)
        .await
        .unwrap();
    let sent: Value = only_request(&server, "anthropic")
        .await
        .body_json()
        .unwrap();
    assert_eq!(
        sent["messages"][1]["content"],
        json!([
            {"type": "tool_use", "id": "call_Xd7bB0nqpRJ9Vn4hZCpQx0dB", "name": "crm__lookup",
             "input": {"lead_id": "L-17"}},
            {"type": "tool_use", "id": "call_5pA0V2Qy3gbKSHoOczt8Kw3W", "name": "crm__lookup",
             "input": {"lead_id": "L-18"}}
        ])
    );
    assert_eq!(
        sent["messages"][2]["content"][1],
        json!({"type": "tool_result", "tool_use_id": "call_5pA0V2Qy3gbKSHoOczt8Kw3W",
               "content": "{\"name\":\"Eli\"}", "is_error": false})
    );
    assert_eq!(sent["tools"][0]["name"], "crm__lookup");

    // Or Gemini.
    let gemini = crate::gemini::fixture();
    let server = serve(
        &gemini.complete_path,
        ResponseTemplate::new(200).set_body_json(&gemini.success_body),
    )
    .await;
    let mut to_gemini = req;
    to_gemini.model = gemini.model.into();
    provider(&gemini, &server, true)
        .complete(to_gemini)
        .await
        .unwrap();
    let sent: Value = only_request(&server, "gemini").await.body_json().unwrap();
    assert_eq!(
        sent["contents"][1]["parts"][1],
        json!({"functionCall": {"name": "crm__lookup", "args": {"lead_id": "L-18"}}})
    );
    assert_eq!(
        sent["contents"][2]["parts"][0],
        json!({"functionResponse": {"name": "crm__lookup", "response": {"name": "Dana"}}})
    );
}
