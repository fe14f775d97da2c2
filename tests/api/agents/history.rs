//! History overflow (SPEC §15): with `history_overflow = "summarize"` the
//! oldest messages that no longer fit layer 5's budget are replaced by one
//! summary from the agent's `summary_task` (a metered call of its own),
//! stored on the conversation, and the next overflow summarizes the old
//! summary with what follows; `drop` leaves them out. Both are counted.

use super::{
    completed, conversation_id, converse, env, toml, turn,
    upstream::{Reply, Upstream, openai_text},
};
use crate::{
    common::TestApp,
    observability::{counter, free_port, scrape},
    tools::{CALLER, usage_totals, with_key},
};
use ai_orchestrator::api::pb;
use prometheus_parse::Scrape;
use serde_json::{Value, json};

const EXTRA: &str = r#"
[tasks.summarize_history]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]

[agents.summarizer]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]
core_prompt = "You help with orders."
history_token_budget = 100
history_overflow = "summarize"
summary_task = "summarize_history"

[agents.dropper]
chain = [{ provider = "openai", model = "gpt-4o-mini" }]
core_prompt = "You help with orders."
history_token_budget = 100
"#;

/// A message of some 55 tokens, marked by `word`: two of them never fit
/// the budget of 100 together.
fn long(word: &str) -> String {
    let filler = "please note the order details carefully ".repeat(9);
    format!("{word}: {filler}")
}

/// A non-streamed OpenAI answer (the summary task's call).
fn summary(text: &str) -> Reply {
    Reply::json(
        200,
        &json!({
            "id": "chatcmpl-s", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 80, "completion_tokens": 10, "total_tokens": 90}
        }),
    )
}

async fn spawn(upstream: &Upstream, port: u16) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("agents.db").display());
    let config = toml(&url, &upstream.url(), &upstream.url(), EXTRA).replacen(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:{port}\""),
        1,
    );
    let mut app = TestApp::spawn_toml_env(&config, env).await;
    app.keep(dir);
    app
}

/// `agent_history_truncated_total{agent,mode}` counted between two scrapes.
fn truncated(before: &Scrape, after: &Scrape, agent: &str, mode: &str) -> f64 {
    let labels = [("agent", agent), ("mode", mode)];
    counter(after, "agent_history_truncated_total", &labels)
        - counter(before, "agent_history_truncated_total", &labels)
}

fn system(body: &Value) -> String {
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn the_oldest_messages_are_replaced_by_a_stored_summary_of_the_summary_and_what_followed() {
    let upstream = Upstream::start([
        Reply::sse(openai_text(&["Noted."])),
        summary("Ann from Berlin is ordering chairs."),
        Reply::sse(openai_text(&["Forty chairs."])),
        summary("Ann from Berlin ordered forty chairs and asked about delivery."),
        Reply::sse(openai_text(&["Tuesday."])),
    ])
    .await;
    let port = free_port();
    let app = spawn(&upstream, port).await;
    let before = scrape(port).await;
    let first = turn(
        &app,
        CALLER,
        "sum-1",
        converse("summarizer", &long("ALPHA"), None),
    )
    .await
    .unwrap();
    let id = conversation_id(&first);
    for (trace, word) in [("sum-2", "BRAVO"), ("sum-3", "CHARLIE")] {
        let events = turn(
            &app,
            CALLER,
            trace,
            converse("summarizer", &long(word), Some(&id)),
        )
        .await
        .unwrap();
        assert!(!completed(&events).text.is_empty());
    }

    let bodies = upstream.bodies();
    assert_eq!(bodies.len(), 5);
    // The first overflow: turn 1's messages summarized, then left out.
    let asked = bodies[1].to_string();
    assert!(
        asked.contains("ALPHA") && asked.contains("Noted."),
        "{asked}"
    );
    let second = &bodies[2];
    assert!(
        system(second).contains("Ann from Berlin is ordering chairs."),
        "{}",
        system(second)
    );
    assert!(!second.to_string().contains("ALPHA"), "{second}");
    assert_eq!(
        second["messages"].as_array().unwrap().len(),
        2,
        "system and the message"
    );
    // The second: the stored summary and turn 2, summarized together.
    let asked = bodies[3].to_string();
    assert!(
        asked.contains("Ann from Berlin is ordering chairs.") && asked.contains("BRAVO"),
        "{asked}"
    );
    assert!(
        !asked.contains("ALPHA"),
        "turn 1 is in the summary only: {asked}"
    );
    let third = &bodies[4];
    assert!(
        system(third).contains("asked about delivery"),
        "{}",
        system(third)
    );
    assert!(!third.to_string().contains("BRAVO"), "{third}");

    // Every message stays stored; each summary was a metered call.
    let stored = super::agents(&app)
        .get_conversation(with_key(
            CALLER,
            "sum-get",
            pb::GetConversationRequest {
                context: crate::common::ctx(),
                conversation_id: id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stored.messages.len(), 6);
    assert_eq!(
        stored.summary,
        "Ann from Berlin ordered forty chairs and asked about delivery."
    );
    assert_eq!(usage_totals(&app).await.requests, 5);
    let after = scrape(port).await;
    assert_eq!(truncated(&before, &after, "summarizer", "summarize"), 2.0);
    app.stop().await;
}

#[tokio::test]
async fn dropping_leaves_the_oldest_messages_out_and_counts_it() {
    let upstream = Upstream::start([
        Reply::sse(openai_text(&["Noted."])),
        Reply::sse(openai_text(&["Forty chairs."])),
    ])
    .await;
    let port = free_port();
    let app = spawn(&upstream, port).await;
    let before = scrape(port).await;
    let first = turn(
        &app,
        CALLER,
        "drop-1",
        converse("dropper", &long("ALPHA"), None),
    )
    .await
    .unwrap();
    let id = conversation_id(&first);
    turn(
        &app,
        CALLER,
        "drop-2",
        converse("dropper", &long("BRAVO"), Some(&id)),
    )
    .await
    .unwrap();
    let bodies = upstream.bodies();
    assert_eq!(bodies.len(), 2, "no summary call");
    assert!(!bodies[1].to_string().contains("ALPHA"), "{}", bodies[1]);
    let after = scrape(port).await;
    assert_eq!(truncated(&before, &after, "dropper", "drop"), 1.0);
    app.stop().await;
}
