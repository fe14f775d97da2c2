//! A stream under way at shutdown: it runs on through the drain, and once
//! `server.shutdown_grace` is over it ends with an error chunk the SDKs
//! raise (never a silent end that looks whole), and the server stops.

use super::{Edge, KEY};
use crate::common::wait_for;
use serde_json::json;

#[tokio::test]
async fn a_stream_past_the_grace_ends_with_an_error_and_the_server_stops() {
    let mut edge = Edge::start("shutdown_grace = \"300ms\"").await;
    let response = reqwest::Client::new()
        .post(format!("{}/chat/completions", edge.base_url()))
        .bearer_auth(KEY)
        .json(&json!({"model": "slow", "stream": true,
                      "messages": [{"role": "user", "content": "Take your time."}]}))
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    let upstream = &edge.fakes.openai;
    wait_for(|| async {
        !upstream
            .received_requests()
            .await
            .unwrap_or_default()
            .is_empty()
    })
    .await;

    edge.app.trigger_shutdown();
    let body = tokio::time::timeout(std::time::Duration::from_secs(10), response.text())
        .await
        .expect("the stream ends once the grace is over")
        .unwrap();
    assert!(body.contains("\"code\":\"SHUTTING_DOWN\""), "{body}");
    assert!(!body.contains("[DONE]"), "{body}");
    edge.stop().await;
}
