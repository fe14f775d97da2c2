//! A webhook POST that hangs: retried once `retry.attempt_timeout` gives it
//! up, with the same `Idempotency-Key`, while the tool's timeout allows;
//! without that setting a POST may take the whole timeout.

use super::{
    CALLER, run, spawn,
    webhook::{Answer, Webhook},
};
use ai_orchestrator::api::pb;
use serde_json::json;
use std::time::Duration;

const TOOLS: &str = r#"
[tools."crm.patient"]
kind = "http"
url = "WEBHOOK/webhook/patient"
timeout = "20s"
retry = { max_attempts = 3, initial_backoff = "10ms", attempt_timeout = "1s" }

[tools."crm.waits"]
kind = "http"
url = "WEBHOOK/webhook/waits"
timeout = "5s"
retry = { max_attempts = 3, initial_backoff = "10ms" }
"#;

#[tokio::test]
async fn a_hung_post_is_retried_after_its_attempt_timeout_with_the_same_key() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &TOOLS.replace("WEBHOOK", &hook.url())).await;
    hook.script([
        Answer::status(200).after(Duration::from_secs(30)),
        Answer::status(200).body(r#"{"noted": true}"#),
    ]);
    let started = std::time::Instant::now();
    let inv = run(&app, CALLER, "hung-once", "crm.patient", json!({"n": 1})).await;
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert_eq!(inv.attempts, 2);
    assert!(started.elapsed() < Duration::from_secs(20));
    let posts = hook.received();
    assert_eq!(posts.len(), 2);
    assert_eq!(
        posts[0].headers["idempotency-key"],
        posts[1].headers["idempotency-key"]
    );

    // Every POST hangs: the attempts are spent, and the end is TIMED_OUT.
    hook.script([
        Answer::status(200).after(Duration::from_secs(30)),
        Answer::status(200).after(Duration::from_secs(30)),
        Answer::status(200).after(Duration::from_secs(30)),
    ]);
    let inv = run(&app, CALLER, "hung-always", "crm.patient", json!({"n": 2})).await;
    assert_eq!(inv.status(), pb::InvocationStatus::TimedOut, "{inv:?}");
    assert_eq!(inv.attempts, 3);
    assert_eq!(hook.count(), 5);
    app.stop().await;
}

#[tokio::test]
async fn without_an_attempt_timeout_a_post_may_take_the_whole_timeout() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &TOOLS.replace("WEBHOOK", &hook.url())).await;
    // Answers at 1 s, well past where an attempt timeout would have cut
    // it and inside the tool's 5 s: not cut off and sent again (a
    // workflow still working would run twice).
    hook.script([Answer::status(200)
        .body(r#"{"waited": true}"#)
        .after(Duration::from_secs(1))]);
    let inv = run(&app, CALLER, "slow-ok", "crm.waits", json!({})).await;
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert_eq!(inv.attempts, 1);
    assert_eq!(hook.count(), 1);
    app.stop().await;
}
