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
