//! One pipeline, two edges (SPEC §13): the same agent turn through gRPC's
//! `Converse` and through `POST /v1/agents/{agent}/turns` leaves the same
//! usage records and the same audit events, but for what names the
//! request (trace and conversation IDs, times, hashes of the chain).

use super::{Edge, KEY};
use crate::{agents::converse, tools::with_key};
use ai_orchestrator::{api::pb::agent_service_client::AgentServiceClient, store::Store};
use futures::StreamExt;
use serde_json::Value;
use sqlx::Row;

/// The usage records of `trace`, as comparable rows: everything but the
/// record's ID, time, trace and latencies.
async fn usage(store: &Store, trace: &str) -> Vec<Value> {
    let Store::Sqlite(pool) = store else {
        unreachable!("the test app runs on SQLite")
    };
    let rows = sqlx::query(
        "SELECT team_id, user_id, task, provider, model, prompt_key, prompt_version, \
         input_tokens, output_tokens, cost_micros, outcome, attempts, degraded, channel, \
         priority FROM usage_records WHERE trace_id = ? ORDER BY id",
    )
    .bind(trace)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.iter()
        .map(|r| {
            let mut attempts: Value = serde_json::from_str(r.get::<&str, _>("attempts")).unwrap();
            for a in attempts.as_array_mut().unwrap() {
                let a = a.as_object_mut().unwrap();
                a.retain(|k, _| !k.contains("latency") && !k.contains("waited"));
            }
            serde_json::json!({
                "team": r.get::<String, _>("team_id"),
                "user": r.get::<String, _>("user_id"),
                "task": r.get::<String, _>("task"),
                "provider": r.get::<String, _>("provider"),
                "model": r.get::<String, _>("model"),
                "prompt": [r.get::<String, _>("prompt_key"), r.get::<i64, _>("prompt_version")],
                "tokens": [r.get::<i64, _>("input_tokens"), r.get::<i64, _>("output_tokens")],
                "cost": r.get::<Option<i64>, _>("cost_micros"),
                "outcome": r.get::<String, _>("outcome"),
                "attempts": attempts,
                "degraded": r.get::<i64, _>("degraded"),
                "channel": r.get::<String, _>("channel"),
                "priority": r.get::<String, _>("priority"),
            })
        })
        .collect()
}

/// The digest a turn's start records for `message` in `conversation`:
/// the conversation's ID is part of it, so it stands for the ID.
fn start_digest(conversation: &str, message: &str) -> String {
    let input = serde_json::json!({"conversation_id": conversation, "message": message});
    ai_orchestrator::audit::digest::digest(&input).0
}

/// The audit events of `trace`, with `conversation` (and its start's
/// digest of `message`) written as `<conv>`.
async fn audit(store: &Store, trace: &str, conversation: &str, message: &str) -> Vec<Value> {
    let start = start_digest(conversation, message);
    let Store::Sqlite(pool) = store else {
        unreachable!("the test app runs on SQLite")
    };
    let rows = sqlx::query(
        "SELECT principal, category, action, subject, decision, reason, input_sha256, \
         output_sha256, input_bytes, output_bytes, estimated_cost_micros, actual_cost_micros \
         FROM audit_events WHERE trace_id = ? ORDER BY seq",
    )
    .bind(trace)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.iter()
        .map(|r| {
            let text = |c: &str| {
                r.get::<Option<String>, _>(c)
                    .map(|s| s.replace(conversation, "<conv>").replace(&start, "<conv start>"))
            };
            serde_json::json!({
                "principal": text("principal"),
                "category": text("category"),
                "action": text("action"),
                "subject": text("subject"),
                "decision": text("decision"),
                "reason": text("reason"),
                "input_sha256": text("input_sha256"),
                "output_sha256": text("output_sha256"),
                "bytes": [r.get::<Option<i64>, _>("input_bytes"), r.get::<Option<i64>, _>("output_bytes")],
                "cost": [r.get::<Option<i64>, _>("estimated_cost_micros"), r.get::<Option<i64>, _>("actual_cost_micros")],
            })
        })
        .collect()
}

#[tokio::test]
async fn a_turn_through_http_and_through_grpc_leaves_the_same_records() {
    let edge = Edge::start("").await;

    // gRPC.
    let mut stream = AgentServiceClient::new(edge.app.channel.clone())
        .converse(with_key(
            KEY,
            "same-grpc",
            converse("helper", "Hello there", None),
        ))
        .await
        .unwrap()
        .into_inner();
    let mut grpc_conversation = String::new();
    while let Some(event) = stream.next().await {
        use ai_orchestrator::api::pb::converse_event::Event;
        if let Some(Event::Started(s)) = event.unwrap().event {
            grpc_conversation = s.conversation_id;
        }
    }

    // HTTP.
    let body = reqwest::Client::new()
        .post(format!("{}/agents/helper/turns", edge.base_url()))
        .bearer_auth(KEY)
        .header("x-trace-id", "same-http")
        .json(&serde_json::json!({"message": "Hello there"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("event: done"), "{body}");
    let start = body
        .lines()
        .skip_while(|l| *l != "event: message.start")
        .nth(1)
        .and_then(|l| l.strip_prefix("data: "))
        .unwrap();
    let start: Value = serde_json::from_str(start).unwrap();
    let http_conversation = start["conversation_id"].as_str().unwrap().to_owned();

    let store = edge.app.store().await;
    let (grpc, http) = (
        usage(&store, "same-grpc").await,
        usage(&store, "same-http").await,
    );
    assert!(!grpc.is_empty());
    assert_eq!(grpc, http);
    let grpc = audit(&store, "same-grpc", &grpc_conversation, "Hello there").await;
    let http = audit(&store, "same-http", &http_conversation, "Hello there").await;
    assert!(grpc.len() >= 2, "{grpc:?}");
    assert_eq!(grpc[0]["input_sha256"], "<conv start>", "{grpc:?}");
    assert_eq!(grpc, http);
    edge.stop().await;
}
