//! Workflow (http) tools: what the webhook receives, idempotency under
//! concurrency (one SQLite server, and two servers sharing PostgreSQL),
//! retries, timeouts, output schemas and ASYNC invocations.

use super::{
    ADMIN, CALLER, WEBHOOK_SECRET, events, fetch, invoke, output, run, spawn, spawn_on, tools,
    usage_totals,
    webhook::{Answer, Webhook},
    with_key,
};
use crate::common::{TestPostgres, wait_for};
use ai_orchestrator::api::pb;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::time::Duration;

/// A tool whose answers must match an output schema, and a slow one.
const EXTRA_TOOLS: &str = r#"
[tools."crm.lookup"]
kind = "http"
url = "WEBHOOK/webhook/crm-lookup"
input_schema = { type = "object", required = ["lead_id"] }
output_schema = { type = "object", required = ["lead"] }

[tools."crm.slow"]
kind = "http"
url = "WEBHOOK/webhook/crm-slow"
timeout = "400ms"
retry = { max_attempts = 2, initial_backoff = "10ms" }
"#;

fn extra(hook: &Webhook) -> String {
    EXTRA_TOOLS.replace("WEBHOOK", &hook.url())
}

fn note() -> Value {
    json!({"note": "call back at 5", "lead_id": "L-17"})
}

/// The idempotency key the spec derives, by hand: SHA-256 of the RFC 8785
/// canonical JSON (keys sorted, no spaces) of the invocation's identity.
fn derived_key(input: &Value, window_ms: i64) -> String {
    let canonical = format!(
        r#"{{"input":{},"team":"t1","tool":"crm.add_note","triggered_by":"crm-key","version":"1.0.0","window":{window_ms}}}"#,
        // serde_json sorts keys (no preserve_order) and writes no spaces.
        serde_json::to_string(input).unwrap()
    );
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

fn window_now() -> i64 {
    let now = chrono::Utc::now().timestamp_millis();
    now - now.rem_euclid(300_000)
}

/// A caller's key becomes the webhook's `Idempotency-Key` header: one that
/// no header can carry is the caller's INVALID_ARGUMENT, and nothing is
/// sent, stored or charged.
#[tokio::test]
async fn an_idempotency_key_no_header_can_carry_is_invalid_input() {
    use tonic_types::StatusExt;
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    let long = "k".repeat(256);
    let refused: [&str; 5] = ["line\nbreak", "with space", "nul\0", "caf\u{e9}", &long];
    for (n, bad) in refused.into_iter().enumerate() {
        let mut req = invoke("crm.add_note", note());
        req.idempotency_key = bad.to_owned();
        let status = tools(&app)
            .invoke_tool(with_key(CALLER, &format!("bad-key-{n}"), req))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{bad:?}: {status:?}"
        );
        let info = status.get_details_error_info().unwrap();
        assert_eq!(info.reason, "INVALID_INPUT");
        let bad_request = status.get_details_bad_request().unwrap();
        assert_eq!(bad_request.field_violations[0].field, "idempotency_key");
    }
    let mut req = invoke("crm.add_note", note());
    req.idempotency_key = "order-42/note=1;v2".into();
    tools(&app)
        .invoke_tool(with_key(CALLER, "good-key", req))
        .await
        .unwrap();
    assert_eq!(hook.count(), 1, "only the valid key reached the webhook");
    assert_eq!(
        hook.received()[0].headers["idempotency-key"],
        "order-42/note=1;v2"
    );
    let invoked = events(&app, "t1")
        .await
        .iter()
        .filter(|e| e.action == "workflow.invoke")
        .count();
    assert_eq!(invoked, 1, "refused keys are not invocations");
}

#[tokio::test]
async fn a_webhook_gets_the_input_its_secret_the_trace_and_the_idempotency_key() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    let before = window_now();
    let inv = run(&app, CALLER, "workflow-trace", "crm.add_note", note()).await;
    let after = window_now();
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert_eq!(output(&inv), json!({"ok": true, "note_id": "N-1"}));
    assert_eq!(inv.execution_id, "exec-1", "the n8n execution ID is kept");
    assert_eq!(inv.attempts, 1);
    assert!((inv.cost_usd - 0.001).abs() < 1e-12, "{inv:?}");

    let got = hook.received();
    assert_eq!(got.len(), 1);
    let post = &got[0];
    assert_eq!(post.path, "/webhook/crm-add-note");
    assert_eq!(post.body, note(), "the body is the input object itself");
    assert_eq!(post.headers["content-type"], "application/json");
    assert_eq!(post.headers["x-n8n-api-key"], WEBHOOK_SECRET);
    assert_eq!(post.headers["x-trace-id"], "workflow-trace");
    let key = post.headers["idempotency-key"].to_str().unwrap();
    assert!(
        key == derived_key(&note(), before) || key == derived_key(&note(), after),
        "the key is the documented derivation"
    );

    // Audited as a workflow, with the key; the cost went through the ledger.
    let all = events(&app, "t1").await;
    let traced: Vec<&pb::AuditEvent> = all
        .iter()
        .filter(|e| e.trace_id == "workflow-trace")
        .collect();
    let actions: Vec<&str> = traced.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["workflow.invoke", "workflow.result"]);
    assert!(traced.iter().all(|e| e.category == "workflow"));
    assert!(traced.iter().all(|e| e.idempotency_key == key));
    assert_eq!(traced[1].actual_cost_usd, Some(0.001));
    let totals = usage_totals(&app).await;
    assert_eq!(totals.requests, 1);
    assert!((totals.cost_usd - 0.001).abs() < 1e-12, "{totals:?}");

    // By ID, for its team only.
    let got = tools(&app)
        .get_tool_invocation(with_key(
            CALLER,
            "get",
            pb::GetToolInvocationRequest {
                context: crate::common::ctx(),
                invocation_id: inv.invocation_id.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.status(), pb::InvocationStatus::Succeeded);
    assert_eq!(got.execution_id, "exec-1");
    let other_team = tools(&app)
        .get_tool_invocation(with_key(
            ADMIN,
            "get-other",
            pb::GetToolInvocationRequest {
                context: Some(pb::RequestContext {
                    team_id: "t2".into(),
                    ..Default::default()
                }),
                invocation_id: inv.invocation_id.clone(),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(other_team.code(), tonic::Code::NotFound);
    app.stop().await;
}

/// Fires `n` identical invocations at once, spread over `apps`.
async fn identical_at_once(apps: &[&crate::common::TestApp], n: usize) -> Vec<pb::ToolInvocation> {
    let calls = (0..n).map(|i| {
        run(
            apps[i % apps.len()],
            CALLER,
            "same-note",
            "crm.add_note",
            note(),
        )
    });
    futures::future::join_all(calls).await
}

fn assert_ran_once(hook: &Webhook, invs: &[pb::ToolInvocation]) {
    assert_eq!(hook.count(), 1, "the webhook is called exactly once");
    let first: Vec<&pb::ToolInvocation> = invs.iter().filter(|i| !i.deduplicated).collect();
    assert_eq!(first.len(), 1, "one caller ran it: {invs:?}");
    assert_eq!(first[0].status(), pb::InvocationStatus::Succeeded);
    for inv in invs {
        assert_eq!(
            inv.invocation_id, first[0].invocation_id,
            "all get the first"
        );
        assert!(
            matches!(
                inv.status(),
                pb::InvocationStatus::Running | pb::InvocationStatus::Succeeded
            ),
            "{inv:?}"
        );
    }
}

#[tokio::test]
async fn concurrent_identical_invocations_reach_the_webhook_once() {
    let hook = Webhook::start().await;
    hook.slow(Duration::from_millis(300));
    let app = spawn(&hook.url(), "").await;
    let invs = identical_at_once(&[&app], 16).await;
    assert_ran_once(&hook, &invs);
    // A later one in the window gets the finished first, not a second POST.
    let again = identical_at_once(&[&app], 1).await;
    assert!(again[0].deduplicated);
    assert_eq!(again[0].status(), pb::InvocationStatus::Succeeded);
    assert_eq!(output(&again[0]), json!({"ok": true, "note_id": "N-1"}));
    assert_eq!(hook.count(), 1);
    // Charged once; the duplicates are audited as such.
    let all = events(&app, "t1").await;
    let results = all.iter().filter(|e| e.action == "workflow.result").count();
    let dedups = all
        .iter()
        .filter(|e| e.action == "workflow.invoke" && e.decision == "deduplicated")
        .count();
    assert_eq!((results, dedups), (1, 16));

    // A caller's key replaces the derived one: another input, same key.
    let keyed = |input: Value| {
        let mut req = invoke("crm.add_note", input);
        req.idempotency_key = "order-42-note".into();
        req
    };
    let first = tools(&app)
        .invoke_tool(with_key(CALLER, "keyed-1", keyed(note())))
        .await
        .unwrap()
        .into_inner();
    let second = tools(&app)
        .invoke_tool(with_key(
            CALLER,
            "keyed-2",
            keyed(json!({"lead_id": "L-17", "note": "changed"})),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!first.invocation.unwrap().deduplicated);
    assert!(second.invocation.unwrap().deduplicated);
    assert_eq!(hook.count(), 2);
    assert_eq!(
        hook.received()[1].headers["idempotency-key"],
        "order-42-note"
    );
    // Another input without a key is another invocation.
    run(
        &app,
        CALLER,
        "other",
        "crm.add_note",
        json!({"lead_id": "L-18", "note": "x"}),
    )
    .await;
    assert_eq!(hook.count(), 3);
    app.stop().await;
}

#[tokio::test]
async fn two_replicas_on_postgres_reach_the_webhook_once() {
    let hook = Webhook::start().await;
    hook.slow(Duration::from_millis(300));
    let db = TestPostgres::create().await;
    let a = spawn_on(&db.url, &hook.url(), "").await;
    let b = spawn_on(&db.url, &hook.url(), "").await;
    let invs = identical_at_once(&[&a, &b], 16).await;
    assert_ran_once(&hook, &invs);
    a.stop().await;
    b.stop().await;
    db.drop_now().await;
}

#[tokio::test]
async fn retries_back_off_honour_retry_after_and_never_pass_the_deadline() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &extra(&hook)).await;
    // 503, then 429 asking for a second, then the default 200.
    hook.script([
        Answer::status(503),
        Answer::status(429).header("retry-after", "1"),
    ]);
    let inv = run(&app, CALLER, "retried", "crm.add_note", note()).await;
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert_eq!(inv.attempts, 3);
    let got = hook.received();
    assert_eq!(got.len(), 3);
    let keys: Vec<&str> = got
        .iter()
        .map(|r| r.headers["idempotency-key"].to_str().unwrap())
        .collect();
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "every retry has the same key"
    );
    assert!(
        got[2].at - got[1].at >= Duration::from_secs(1),
        "Retry-After is honoured"
    );

    // A Retry-After past the deadline: no wait, the last answer.
    hook.script([Answer::status(429).header("retry-after", "120")]);
    let started = std::time::Instant::now();
    let inv = run(
        &app,
        CALLER,
        "retry-after-too-long",
        "crm.add_note",
        json!({"lead_id": "L-2", "note": "n"}),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(5), "stopped early");
    assert_eq!(inv.status(), pb::InvocationStatus::Failed);
    assert_eq!(inv.error.unwrap().code, "HTTP_429");
    assert_eq!(hook.count(), 4);

    // A Retry-After no clock can add: a long wait, so the last answer.
    hook.script([Answer::status(503).header("retry-after", "18446744073709551615")]);
    let inv = run(
        &app,
        CALLER,
        "retry-after-absurd",
        "crm.add_note",
        json!({"lead_id": "L-2", "note": "m"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Failed);
    assert_eq!(inv.error.unwrap().code, "HTTP_503");
    assert_eq!(hook.count(), 5);

    // A 4xx is the workflow's answer: no retry. Its execution is kept.
    hook.script([Answer::status(422)
        .header("x-n8n-execution-id", "e-422")
        .body(r#"{"error": "lead is closed"}"#)]);
    let inv = run(
        &app,
        CALLER,
        "rejected",
        "crm.add_note",
        json!({"lead_id": "L-3", "note": "n"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Failed);
    assert_eq!(inv.execution_id, "e-422");
    assert_eq!(inv.error.unwrap().code, "HTTP_422");
    assert_eq!(hook.count(), 6);

    // A redirect is an answer too: not followed (it would carry the
    // secret elsewhere, as a GET without the input).
    hook.script([Answer::status(302).header("location", &format!("{}/elsewhere", hook.url()))]);
    let inv = run(
        &app,
        CALLER,
        "redirected",
        "crm.add_note",
        json!({"lead_id": "L-4", "note": "n"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Failed);
    assert_eq!(inv.error.unwrap().code, "HTTP_302");
    assert_eq!(hook.count(), 7);

    // Slower than its timeout: TIMED_OUT, within the timeout.
    hook.script([
        Answer::status(200).after(Duration::from_secs(5)),
        Answer::status(200).after(Duration::from_secs(5)),
    ]);
    let started = std::time::Instant::now();
    let inv = run(&app, CALLER, "slow", "crm.slow", json!({})).await;
    assert_eq!(inv.status(), pb::InvocationStatus::TimedOut, "{inv:?}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // An answer that breaks the output schema is a failed invocation.
    let inv = run(
        &app,
        CALLER,
        "bad-output",
        "crm.lookup",
        json!({"lead_id": "L-1"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Failed);
    assert_eq!(inv.error.unwrap().code, "OUTPUT_INVALID");
    assert!(inv.output.is_none());
    app.stop().await;
}

#[tokio::test]
async fn an_async_invocation_returns_at_once_and_is_polled_to_its_end() {
    let hook = Webhook::start().await;
    hook.slow(Duration::from_millis(200));
    let app = spawn(&hook.url(), "").await;
    let mut req = invoke("crm.add_note", note());
    req.mode = pb::InvocationMode::Async as i32;
    let accepted = tools(&app)
        .invoke_tool(with_key(CALLER, "async-trace", req))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    assert_eq!(accepted.status(), pb::InvocationStatus::Pending);
    assert!(accepted.output.is_none());
    let poll = || fetch(&app, &accepted.invocation_id);
    wait_for(|| async { poll().await.status() == pb::InvocationStatus::Succeeded }).await;
    let done = poll().await;
    assert_eq!(output(&done), json!({"ok": true, "note_id": "N-1"}));
    assert_eq!(hook.count(), 1);
    assert_eq!(hook.received()[0].headers["x-trace-id"], "async-trace");
    // Its result is audited once the worker has it.
    wait_for(|| async {
        events(&app, "t1")
            .await
            .iter()
            .any(|e| e.trace_id == "async-trace" && e.action == "workflow.result")
    })
    .await;
    app.stop().await;
}

/// A workflow a team may run once at a time.
const ONE_AT_A_TIME: &str = r#"
[tools."crm.serial"]
kind = "http"
url = "WEBHOOK/webhook/crm-serial"
quota = { max_concurrent = 1 }
"#;

#[tokio::test]
async fn async_invocations_wait_for_their_tools_concurrency_slot() {
    let hook = Webhook::start().await;
    hook.slow(Duration::from_millis(300));
    let app = spawn(&hook.url(), &ONE_AT_A_TIME.replace("WEBHOOK", &hook.url())).await;
    // Five at once, each its own input: all accepted, none refused for the
    // tool being busy (the worker may already be running the first).
    let calls = (0..5).map(|i| {
        let mut client = tools(&app);
        let mut req = invoke("crm.serial", json!({"lead_id": format!("L-{i}")}));
        req.mode = pb::InvocationMode::Async as i32;
        async move {
            client
                .invoke_tool(with_key(CALLER, &format!("serial-{i}"), req))
                .await
                .unwrap_or_else(|e| panic!("ASYNC call {i} refused: {e:?}"))
                .into_inner()
                .invocation
                .unwrap()
        }
    });
    let accepted = futures::future::join_all(calls).await;
    assert!(
        accepted
            .iter()
            .all(|inv| inv.status() == pb::InvocationStatus::Pending),
        "{accepted:?}"
    );
    wait_for(|| async {
        for inv in &accepted {
            if fetch(&app, &inv.invocation_id).await.status() != pb::InvocationStatus::Succeeded {
                return false;
            }
        }
        true
    })
    .await;
    assert_eq!(hook.count(), 5, "each ran once");
    assert_eq!(
        hook.peak_in_flight(),
        1,
        "one at a time, as max_concurrent = 1"
    );
    app.stop().await;
}

/// A busy tool's backlog deeper than a worker round never holds up other
/// work queued behind it.
#[tokio::test]
async fn a_busy_tools_backlog_does_not_hold_up_other_async_work() {
    let hook = Webhook::start().await;
    hook.slow(Duration::from_secs(2));
    let app = spawn(&hook.url(), &ONE_AT_A_TIME.replace("WEBHOOK", &hook.url())).await;
    let mut client = tools(&app);
    let asynchronous = |tool: &str, input: Value| {
        let mut req = invoke(tool, input);
        req.mode = pb::InvocationMode::Async as i32;
        req
    };
    // 150 of the one-at-a-time workflow: 300 s of work at the queue's head,
    // more than a worker round could look past.
    for i in 0..150 {
        let req = asynchronous("crm.serial", json!({"lead_id": format!("B-{i}")}));
        client
            .invoke_tool(with_key(CALLER, &format!("backlog-{i}"), req))
            .await
            .unwrap();
    }
    let req = asynchronous("system.echo", json!({"text": "behind"}));
    let behind = client
        .invoke_tool(with_key(CALLER, "behind-backlog", req))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    wait_for(|| async {
        fetch(&app, &behind.invocation_id).await.status() == pb::InvocationStatus::Succeeded
    })
    .await;
    assert!(hook.peak_in_flight() <= 1);
}
