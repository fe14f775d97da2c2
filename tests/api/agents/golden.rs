//! The golden paths of a turn (SPEC §11.3) against fake providers speaking
//! OpenAI's and Anthropic's streams.

use super::{
    completed, conversation_id, converse, kinds, spawn, turn,
    upstream::{
        Reply, Upstream, anthropic_text, openai_error, openai_text, openai_text_then_tools,
        openai_tool_calls,
    },
};
use crate::tools::{CALLER, VIEWER, events, with_key};
use ai_orchestrator::{
    agent::safety::{SAFETY_CORE, TOOL_GUARDRAIL},
    api::pb::{self, converse_event::Event},
};
use futures::StreamExt;
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};
use tokio::sync::Notify;

/// The agent `short`: OpenAI only, two model calls per turn at most.
const SHORT: &str = r#"
[agents.short]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]
core_prompt = "You are short."
tools = ["system.*"]
max_iterations = 2
"#;

fn messages(body: &Value) -> Vec<Value> {
    body["messages"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn the_model_calls_a_tool_gets_the_result_and_answers() {
    // The arguments arrive in pieces split inside a key and inside an
    // escape: they are buffered and parsed when the call is complete.
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[(
            "call_Qx1",
            "system__echo",
            &["{\"te", "xt\": \"hi \\u00", "e9\"}"],
        )])),
        Reply::sse(openai_text(&["The echo ", "says hi é."])),
    ])
    .await;
    let unused = Upstream::start([]).await;
    let app = spawn(&openai.url(), &unused.url(), "").await;
    let events = turn(
        &app,
        CALLER,
        "agent-golden-1",
        converse("helper", "Echo hi é.", None),
    )
    .await
    .unwrap();
    assert_eq!(
        kinds(&events),
        ["started", "tool_call", "tool_result", "delta", "completed"]
    );
    let Event::ToolCall(call) = &events[1] else {
        unreachable!()
    };
    assert_eq!(
        (call.call_id.as_str(), call.tool.as_str()),
        ("call_Qx1", "system.echo")
    );
    let Event::ToolResult(result) = &events[2] else {
        unreachable!()
    };
    assert_eq!(
        (result.status.as_str(), result.error_code.as_str()),
        ("SUCCEEDED", "")
    );
    let done = completed(&events);
    assert_eq!(done.text, "The echo says hi é.");
    assert_eq!((done.iterations, done.tool_calls), (2, 1));
    assert_eq!(done.stop_reason, pb::StopReason::FinalAnswer as i32);
    let usage = done.meta.as_ref().unwrap().usage.unwrap();
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (80 + 90, 20 + 12)
    );

    // The model was offered the tool under its wire name, with the layered
    // system prompt, and got the result back answering its call.
    let bodies = openai.bodies();
    assert_eq!(bodies.len(), 2, "one model call per iteration");
    let offered: Vec<&str> = bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(offered.contains(&"system__echo"), "{offered:?}");
    let first = messages(&bodies[0]);
    assert_eq!(first[0]["role"], "system");
    // Layer 0, the agent's core, and (it has tools) the tool guardrail last.
    let system = first[0]["content"].as_str().unwrap();
    let core = format!("{SAFETY_CORE}\n\nYou are the test agent.");
    assert!(system.starts_with(&core), "{system}");
    assert!(
        system.ends_with(&format!("\n\n{TOOL_GUARDRAIL}")),
        "{system}"
    );
    let second = messages(&bodies[1]);
    let n = second.len();
    assert_eq!(second[n - 2]["role"], "assistant");
    assert_eq!(second[n - 2]["tool_calls"][0]["id"], "call_Qx1");
    assert_eq!(
        second[n - 2]["tool_calls"][0]["function"]["name"],
        "system__echo"
    );
    assert_eq!(second[n - 1]["role"], "tool");
    assert_eq!(second[n - 1]["tool_call_id"], "call_Qx1");
    let content: Value = serde_json::from_str(second[n - 1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"text": "hi é"}));

    // History: user → tool call → tool result → assistant, in our names.
    let id = conversation_id(&events);
    let conversation = super::agents(&app)
        .get_conversation(with_key(
            CALLER,
            "agent-golden-1-read",
            pb::GetConversationRequest {
                context: crate::common::ctx(),
                conversation_id: id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let roles: Vec<&str> = conversation
        .messages
        .iter()
        .map(|m| m.role.as_str())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(conversation.messages[0].content, "Echo hi é.");
    assert_eq!(conversation.messages[1].tool_calls[0].tool, "system.echo");
    let stored = conversation.messages[2].tool_result.as_ref().unwrap();
    assert_eq!(
        (stored.call_id.as_str(), stored.is_error),
        ("call_Qx1", false)
    );
    assert_eq!(conversation.messages[3].content, "The echo says hi é.");
    assert_eq!(
        (conversation.turns, conversation.agent.as_str()),
        (1, "helper")
    );

    // Each model call is metered with the conversation and its iteration,
    // and so are an iteration's tools (a record of their own).
    let store = app.store().await;
    let records = ai_orchestrator::usage::record::by_trace(&store, "agent-golden-1")
        .await
        .unwrap();
    let tagged: Vec<(&str, &str, i64, &str)> = records
        .iter()
        .map(|r| {
            (
                r.task.as_str(),
                r.conversation_id.as_str(),
                r.iteration,
                r.provider.as_str(),
            )
        })
        .collect();
    let id = id.as_str();
    assert_eq!(
        tagged,
        [
            ("agent:helper", id, 1, "openai"),
            ("agent:helper", id, 1, "tool:builtin"),
            ("agent:helper", id, 2, "openai"),
        ]
    );
}

#[tokio::test]
async fn deltas_stream_before_the_model_has_finished() {
    let gate = Arc::new(Notify::new());
    // Frames: the role, "Hello", then (held) the rest.
    let openai =
        Upstream::start(
            [Reply::sse(openai_text(&["Hello", " there", "!"])).gated(2, gate.clone())],
        )
        .await;
    let unused = Upstream::start([]).await;
    let app = spawn(&openai.url(), &unused.url(), "").await;
    let mut stream = super::agents(&app)
        .converse(with_key(
            CALLER,
            "agent-deltas",
            converse("helper", "Hi", None),
        ))
        .await
        .unwrap()
        .into_inner();
    let first_delta = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.next().await {
                Some(Ok(pb::ConverseEvent {
                    event: Some(Event::Delta(d)),
                })) => break d.text,
                Some(Ok(_)) => continue,
                other => panic!("the stream ended before a delta: {other:?}"),
            }
        }
    })
    .await
    .expect("a delta arrives while the upstream still holds the rest");
    assert_eq!(first_delta, "Hello");
    gate.notify_one();
    let mut rest = Vec::new();
    while let Some(item) = stream.next().await {
        rest.push(item.unwrap().event.unwrap());
    }
    assert_eq!(completed(&rest).text, "Hello there!");
}

#[tokio::test]
async fn a_denied_side_effect_tool_is_audited_and_the_model_sees_the_denial() {
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[(
            "call_D1",
            "crm__add_note",
            &[r#"{"lead_id": "L1", "note": "call back"}"#],
        )])),
        Reply::sse(openai_text(&["I could not add the note."])),
    ])
    .await;
    let unused = Upstream::start([]).await;
    let app = spawn(&openai.url(), &unused.url(), "").await;
    // A viewer may not run a tool with side effects.
    let events = turn(
        &app,
        VIEWER,
        "agent-denied",
        converse("helper", "Note it.", None),
    )
    .await
    .unwrap();
    let Some(Event::ToolResult(result)) = events.iter().find(|e| matches!(e, Event::ToolResult(_)))
    else {
        panic!("no tool result: {events:?}")
    };
    assert_eq!(result.tool, "crm.add_note");
    assert_eq!(
        (result.status.as_str(), result.error_code.as_str()),
        ("DENIED", "SIDE_EFFECTS_FORBIDDEN")
    );
    assert_eq!(completed(&events).text, "I could not add the note.");
    let bodies = openai.bodies();
    let answer = messages(&bodies[1]).pop().unwrap();
    assert_eq!(answer["role"], "tool");
    assert!(
        answer["content"]
            .as_str()
            .unwrap()
            .contains("SIDE_EFFECTS_FORBIDDEN"),
        "{answer}"
    );
    let audit = events_of(&app).await;
    let denied = audit
        .iter()
        .find(|e| e.action == "tool.denied")
        .expect("the denial is audited");
    assert_eq!(
        (
            denied.subject.as_str(),
            denied.decision.as_str(),
            denied.reason.as_str()
        ),
        ("crm.add_note@1.0.0", "deny", "SIDE_EFFECTS_FORBIDDEN")
    );
    assert_eq!(denied.trace_id, "agent-denied");
    let actions: Vec<&str> = audit
        .iter()
        .filter(|e| e.trace_id == "agent-denied")
        .map(|e| e.action.as_str())
        .collect();
    // Each model call leaves its own event, in the order things happened.
    assert_eq!(
        actions,
        [
            "agent.turn.start",
            "call.completed",
            "tool.denied",
            "call.completed",
            "agent.turn.complete"
        ]
    );
}

async fn events_of(app: &crate::common::TestApp) -> Vec<pb::AuditEvent> {
    events(app, "t1").await
}

#[tokio::test]
async fn max_iterations_ends_the_turn_with_its_reason_and_the_text_so_far() {
    let echo: &[(&str, &str, &[&str])] = &[("call_1", "system__echo", &[r#"{"text":"x"}"#])];
    let again: &[(&str, &str, &[&str])] = &[("call_2", "system__echo", &[r#"{"text":"y"}"#])];
    let openai = Upstream::start([
        Reply::sse(openai_text_then_tools("Checking. ", echo)),
        Reply::sse(openai_text_then_tools("Still checking.", again)),
    ])
    .await;
    let unused = Upstream::start([]).await;
    let app = spawn(&openai.url(), &unused.url(), SHORT).await;
    let events = turn(&app, CALLER, "agent-cap", converse("short", "Loop.", None))
        .await
        .unwrap();
    let done = completed(&events);
    assert_eq!(done.stop_reason, pb::StopReason::MaxIterations as i32);
    assert_eq!(done.text, "Checking. Still checking.");
    assert_eq!((done.iterations, done.tool_calls), (2, 2));
    assert_eq!(openai.bodies().len(), 2, "no wrap-up call past the cap");
}

#[tokio::test]
async fn max_tool_calls_refuses_the_calls_past_it_and_ends_the_turn() {
    let unused = Upstream::start([]).await;
    let app = spawn(&unused.url(), &unused.url(), "").await;
    // The scripted model asks for three calls at once; the cap is two.
    let events = turn(
        &app,
        CALLER,
        "agent-tools-cap",
        converse("busy_tools", "Go.", None),
    )
    .await
    .unwrap();
    let results: Vec<(String, String)> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolResult(r) => Some((r.status.clone(), r.error_code.clone())),
            _ => None,
        })
        .collect();
    let refused = results.iter().filter(|r| r.1 == "MAX_TOOL_CALLS").count();
    let ran = results.iter().filter(|r| r.0 == "SUCCEEDED").count();
    assert_eq!((ran, refused), (2, 1), "{results:?}");
    let done = completed(&events);
    assert_eq!(done.stop_reason, pb::StopReason::MaxToolCalls as i32);
    assert_eq!((done.iterations, done.tool_calls), (1, 2));
    // The refusal is a decision like the entry point's: audited.
    let denied: Vec<(String, String)> = events_of(&app)
        .await
        .into_iter()
        .filter(|e| e.trace_id == "agent-tools-cap" && e.action == "tool.denied")
        .map(|e| (e.subject, e.reason))
        .collect();
    assert_eq!(
        denied,
        [("system.echo@1.0.0".into(), "MAX_TOOL_CALLS".into())]
    );
}

#[tokio::test]
async fn sequential_tool_calls_run_one_by_one_and_are_all_answered() {
    let unused = Upstream::start([]).await;
    let app = spawn(&unused.url(), &unused.url(), "").await;
    let events = turn(&app, CALLER, "agent-seq", converse("looper", "Go.", None))
        .await
        .unwrap();
    let order: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::ToolResult(r) => Some(r.call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        order,
        [
            "call_mock_0_0",
            "call_mock_0_1",
            "call_mock_0_2",
            "call_mock_1_0"
        ]
    );
    let done = completed(&events);
    assert_eq!(done.stop_reason, pb::StopReason::MaxIterations as i32);
    assert_eq!((done.iterations, done.tool_calls), (2, 4));
}

#[tokio::test]
async fn a_second_turn_sees_the_first() {
    let openai = Upstream::start([
        Reply::sse(openai_text(&["Nice to meet you, Ada."])),
        Reply::sse(openai_text(&["Your name is Ada."])),
    ])
    .await;
    let unused = Upstream::start([]).await;
    let app = spawn(&openai.url(), &unused.url(), "").await;
    let first = turn(
        &app,
        CALLER,
        "agent-t1",
        converse("helper", "My name is Ada.", None),
    )
    .await
    .unwrap();
    let id = conversation_id(&first);
    let second = turn(
        &app,
        CALLER,
        "agent-t2",
        converse("helper", "What is my name?", Some(&id)),
    )
    .await
    .unwrap();
    assert_eq!(conversation_id(&second), id);
    assert_eq!(completed(&second).text, "Your name is Ada.");
    let sent: Vec<(String, String)> = messages(&openai.bodies()[1])
        .iter()
        .skip(1)
        .map(|m| {
            (
                m["role"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        sent,
        [
            ("user".to_owned(), "My name is Ada.".to_owned()),
            ("assistant".to_owned(), "Nice to meet you, Ada.".to_owned()),
            ("user".to_owned(), "What is my name?".to_owned()),
        ]
    );
}

#[tokio::test]
async fn a_fallback_mid_turn_carries_the_tool_history_to_anthropic() {
    let openai = Upstream::start([
        Reply::sse(openai_tool_calls(&[(
            "call_Qx1",
            "system__echo",
            &[r#"{"text": "hi"}"#],
        )])),
        openai_error(500),
    ])
    .await;
    let anthropic = Upstream::start([Reply::sse(anthropic_text(&["Echoed: ", "hi"]))]).await;
    let app = spawn(&openai.url(), &anthropic.url(), "").await;
    let events = turn(
        &app,
        CALLER,
        "agent-fallback",
        converse("helper", "Echo hi.", None),
    )
    .await
    .unwrap();
    let fallback = events
        .iter()
        .find_map(|e| match e {
            Event::Fallback(f) => Some(f),
            _ => None,
        })
        .expect("a fallback event");
    assert_eq!(
        (fallback.from.as_str(), fallback.to.as_str()),
        ("openai", "anthropic")
    );
    assert_eq!(completed(&events).text, "Echoed: hi");
    let body = &anthropic.bodies()[0];
    let system = body["system"].as_str().unwrap();
    assert!(
        system.starts_with(&format!("{SAFETY_CORE}\n\nYou are the test agent.")),
        "{system}"
    );
    let sent = messages(body);
    assert_eq!(sent.len(), 3, "{sent:?}");
    assert_eq!(sent[0]["role"], "user");
    let tool_use = &sent[1]["content"][0];
    assert_eq!(
        (&tool_use["type"], &tool_use["id"], &tool_use["name"]),
        (
            &json!("tool_use"),
            &json!("call_Qx1"),
            &json!("system__echo")
        )
    );
    assert_eq!(tool_use["input"], json!({"text": "hi"}));
    let result = &sent[2]["content"][0];
    assert_eq!(sent[2]["role"], "user");
    assert_eq!(
        (&result["type"], &result["tool_use_id"]),
        (&json!("tool_result"), &json!("call_Qx1"))
    );
}
