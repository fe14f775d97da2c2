//! An agent turn over the edge's Server-Sent Events, read by an SSE client
//! library nobody here wrote (`httpx-sse` over `httpx`, driven by
//! `sse_agent.py`): event names, framing and JSON data as a real consumer
//! parses them. Then the turn's conversation is read and erased over plain
//! HTTP (reqwest), as a caller's backend would.

use super::{Edge, KEY, fakes::OPENAI_TEXT, report, script};
use crate::tools::counterparts;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::Command;

#[tokio::test]
async fn an_agent_turn_reaches_an_sse_client_and_its_conversation_is_read_then_erased() {
    let python = counterparts::python_with_openai();
    let edge = Edge::start("").await;
    let out = report(
        Command::new(python)
            .arg(script("sse_agent.py"))
            .args([edge.base_url().as_str(), "helper", "Hi"])
            .env("AIO_API_KEY", KEY),
    )
    .await;
    assert_eq!(out["status"], 200, "{out}");
    assert!(
        out["content_type"]
            .as_str()
            .is_some_and(|t| t.starts_with("text/event-stream")),
        "{out}"
    );

    let events = out["events"].as_array().unwrap();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    let n = names.len();
    assert!(n >= 3, "{names:?}");
    assert_eq!(names[0], "message.start", "{names:?}");
    assert_eq!(names[n - 2..], ["message.complete", "done"], "{names:?}");
    assert!(
        names[1..n - 2].iter().all(|name| *name == "message.delta"),
        "no tools, so only text between: {names:?}"
    );

    let start = &events[0]["data"];
    assert!(
        start["trace_id"].as_str().is_some_and(|t| !t.is_empty()),
        "{start}"
    );
    let id = start["conversation_id"].as_str().unwrap().to_owned();
    assert!(!id.is_empty(), "{start}");
    let streamed: String = events[1..n - 2]
        .iter()
        .map(|e| e["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, OPENAI_TEXT);
    let complete = &events[n - 2]["data"];
    assert_eq!(complete["text"], OPENAI_TEXT, "{complete}");
    assert_eq!(complete["stop_reason"], "FINAL_ANSWER", "{complete}");
    assert_eq!(complete["usage"]["input_tokens"], 7, "{complete}");
    assert_eq!(complete["usage"]["output_tokens"], 3, "{complete}");
    assert!(
        complete["usage"]["cost_usd"]
            .as_f64()
            .is_some_and(|c| c > 0.0),
        "{complete}"
    );
    assert_eq!(events[n - 1]["data"], json!({}));

    // The conversation as a caller's backend reads and erases it.
    let http = reqwest::Client::new();
    let url = format!("{}/conversations/{id}", edge.base_url());
    let read = http.get(&url).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    assert!(read.headers().contains_key("x-trace-id"));
    let conversation: Value = read.json().await.unwrap();
    assert_eq!(
        conversation["conversation_id"],
        id.as_str(),
        "{conversation}"
    );
    assert_eq!(conversation["agent"], "helper", "{conversation}");
    let messages: Vec<(&str, &str)> = conversation["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default(),
                m["content"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        messages,
        [("user", "Hi"), ("assistant", OPENAI_TEXT)],
        "{conversation}"
    );

    let erased = http.delete(&url).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(erased.status(), StatusCode::OK);
    assert_eq!(
        erased.json::<Value>().await.unwrap(),
        json!({"messages_deleted": 2})
    );

    let gone = http.get(&url).bearer_auth(KEY).send().await.unwrap();
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    let body: Value = gone.json().await.unwrap();
    assert_eq!(body["error"]["code"], "NOT_FOUND", "{body}");
    edge.stop().await;
}

/// Sections after `[server]`: an agent whose model calls `system.echo`,
/// which always waits for a person.
const HELD_ECHO: &str = r#"
[providers.scripted]
kind = "mock"
[providers.scripted.mock]
tool_script = [[{ tool = "system.echo", arguments = '{"text":"hi"}' }]]

[agents.asker]
chain = [{ provider = "scripted", model = "gpt-4o-mini" }]
core_prompt = "You echo."
tools = ["system.*"]

[tools."system.echo"]
kind = "builtin"
approval = "always"
"#;

#[tokio::test]
async fn a_held_tool_call_reaches_an_sse_client_as_approval_required() {
    let python = counterparts::python_with_openai();
    let edge = Edge::start(HELD_ECHO).await;
    let out = report(
        Command::new(python)
            .arg(script("sse_agent.py"))
            .args([edge.base_url().as_str(), "asker", "Echo hi"])
            .env("AIO_API_KEY", KEY),
    )
    .await;
    assert_eq!(out["status"], 200, "{out}");
    let events = out["events"].as_array().unwrap();
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "message.start",
            "tool.start",
            "approval.required",
            "message.complete",
            "done"
        ],
        "{out}"
    );
    let held = &events[2]["data"];
    assert_eq!(held["tool"], "system.echo", "{held}");
    assert_eq!(held["call_id"], "call_mock_0_0", "{held}");
    assert!(
        held["approval_id"].as_str().is_some_and(|a| !a.is_empty()),
        "{held}"
    );
    assert_eq!(
        events[3]["data"]["stop_reason"], "APPROVAL_REQUIRED",
        "{out}"
    );
    edge.stop().await;
}
