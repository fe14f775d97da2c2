//! Workflows that call back (SPEC §16, `completion = "callback"`): the
//! webhook's 2xx only accepts the work, told which invocation it is and
//! where to report; the workflow POSTs the end to the HTTP edge, signed
//! with HMAC-SHA256 of the raw body. Against the fake webhook as an
//! n8n-like counterpart and the real server's HTTP port.

use super::{
    CALLER, WEBHOOK_SECRET, events, fetch, invoke, output, run, tools, tools_extra,
    webhook::{Answer, Webhook},
    with_key,
};
use crate::{
    common::{TestApp, TestPostgres, config_toml_with, wait_for},
    observability::free_port,
};
use ai_orchestrator::api::pb;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

/// The key the workflow signs its callbacks with.
const CALLBACK_SECRET: &str = "crm-callback-secret";

/// What the edge is told it is reached at.
const PUBLIC_URL: &str = "https://ai.internal.example";

fn env(name: &str) -> Option<String> {
    match name {
        "N8N_API_KEY" => Some(WEBHOOK_SECRET.into()),
        "CRM_CALLBACK_SECRET" => Some(CALLBACK_SECRET.into()),
        _ => None,
    }
}

/// The server with `crm.sync_lead`, a workflow that calls back within
/// `wait`, and the HTTP edge, on a fresh SQLite file; its HTTP base URL.
async fn spawn(hook: &Webhook, wait: &str) -> (TestApp, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("tools.db").display());
    let (mut app, base) = spawn_on(&url, hook, wait).await;
    app.keep(dir);
    (app, base)
}

/// [`spawn`] on `url`.
async fn spawn_on(url: &str, hook: &Webhook, wait: &str) -> (TestApp, String) {
    let port = free_port();
    let extra = format!(
        r#"{tools}
[http]
listen = "127.0.0.1:{port}"
public_url = "{PUBLIC_URL}/"

[tools."crm.sync_lead"]
kind = "http"
url = "{hook}/webhook/crm-sync"
completion = "callback"
callback_secret_env = "CRM_CALLBACK_SECRET"
callback_timeout = "{wait}"
input_schema = {{ type = "object", required = ["lead_id"] }}
output_schema = {{ type = "object", required = ["synced"] }}
cost = {{ fixed_usd = 0.002 }}
"#,
        tools = tools_extra(&hook.url()),
        hook = hook.url(),
    );
    let toml = config_toml_with(url, "latency = \"1ms\"", "latency = \"1ms\"", &extra);
    let app = TestApp::spawn_toml_env(&toml, env).await;
    wait_for(|| async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    (app, format!("http://127.0.0.1:{port}"))
}

fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// POSTs `body` as the callback of invocation `id`, with `signature`.
async fn call_back(base: &str, id: &str, body: &Value, signature: Option<&str>) -> (u16, Value) {
    let bytes = serde_json::to_vec(body).unwrap();
    let mut req = reqwest::Client::new()
        .post(format!("{base}/v1/tool-invocations/{id}/complete"))
        .header("content-type", "application/json")
        .body(bytes.clone());
    if let Some(s) = signature {
        req = req.header("x-signature", s);
    }
    let response = req.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Signed with the tool's secret.
async fn signed(base: &str, id: &str, body: &Value) -> (u16, Value) {
    let signature = sign(CALLBACK_SECRET, &serde_json::to_vec(body).unwrap());
    call_back(base, id, body, Some(&signature)).await
}

fn accepted() -> Answer {
    Answer::status(202).header("x-n8n-execution-id", "exec-77")
}

#[tokio::test]
async fn a_signed_callback_ends_the_invocation_and_only_the_same_body_is_taken_again() {
    let hook = Webhook::start().await;
    hook.script([accepted()]);
    let (app, base) = spawn(&hook, "1h").await;
    let inv = run(
        &app,
        CALLER,
        "cb-sync",
        "crm.sync_lead",
        json!({"lead_id": "L-9"}),
    )
    .await;
    // Accepted, not done: the workflow goes on and reports back.
    assert_eq!(inv.status(), pb::InvocationStatus::Running, "{inv:?}");
    assert_eq!(inv.execution_id, "exec-77");
    let id = inv.invocation_id.clone();
    let sent = &hook.received()[0];
    assert_eq!(sent.headers["x-tool-invocation-id"], id.as_str());
    assert_eq!(
        sent.headers["x-callback-url"],
        format!("{PUBLIC_URL}/v1/tool-invocations/{id}/complete").as_str()
    );
    assert_eq!(
        fetch(&app, &id).await.status(),
        pb::InvocationStatus::Running
    );

    let report = json!({"status": "succeeded", "output": {"synced": true, "crm_id": "C-1"}});
    let (code, body) = signed(&base, &id, &report).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "SUCCEEDED");
    assert_eq!(body["repeated"], false);
    let done = fetch(&app, &id).await;
    assert_eq!(done.status(), pb::InvocationStatus::Succeeded);
    assert_eq!(output(&done), json!({"synced": true, "crm_id": "C-1"}));
    assert_eq!(done.execution_id, "exec-77");

    // n8n retries a callback it saw fail: the same body is answered again.
    let (code, body) = signed(&base, &id, &report).await;
    assert_eq!((code, &body["repeated"]), (200, &json!(true)), "{body}");
    let other = json!({"status": "failed", "error": "changed its mind"});
    let (code, body) = signed(&base, &id, &other).await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["error"]["code"], "CALLBACK_CONFLICT");
    assert_eq!(
        fetch(&app, &id).await.status(),
        pb::InvocationStatus::Succeeded
    );

    let results: Vec<(String, String)> = events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.action == "workflow.result" && e.trace_id == "cb-sync")
        .map(|e| (e.decision, e.reason))
        .collect();
    assert_eq!(
        results,
        [
            ("accepted".into(), String::new()),
            ("ok".into(), String::new())
        ]
    );
}

#[tokio::test]
async fn a_badly_signed_callback_is_401_audited_and_changes_nothing() {
    let hook = Webhook::start().await;
    hook.script([accepted(), accepted()]);
    let (app, base) = spawn(&hook, "1h").await;
    let inv = run(
        &app,
        CALLER,
        "cb-bad",
        "crm.sync_lead",
        json!({"lead_id": "L-1"}),
    )
    .await;
    let id = inv.invocation_id;
    let report = json!({"status": "succeeded", "output": {"synced": true}});
    let bytes = serde_json::to_vec(&report).unwrap();
    let forged = sign("not-the-secret", &bytes);
    for signature in [
        Some(forged.as_str()),
        None,
        Some("sha256=zz"),
        Some("md5=00"),
    ] {
        let (code, body) = call_back(&base, &id, &report, signature).await;
        assert_eq!(code, 401, "{signature:?}: {body}");
        assert_eq!(body["error"]["code"], "SIGNATURE_INVALID");
    }
    assert_eq!(
        fetch(&app, &id).await.status(),
        pb::InvocationStatus::Running
    );
    // Audited, once a minute per invocation: a holder of the ID cannot
    // flood the team's chain.
    let denied = events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.action == "workflow.callback")
        .collect::<Vec<_>>();
    assert_eq!(denied.len(), 1, "{denied:#?}");
    assert_eq!(
        (denied[0].decision.as_str(), denied[0].reason.as_str()),
        ("deny", "SIGNATURE_INVALID")
    );

    // An unknown invocation gets a bad signature's answer: an ID is not
    // confirmed to whoever lacks the secret. A body that is not a report.
    let (code, body) = signed(&base, "0190aaaa-0000-7000-8000-000000000000", &report).await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (401, &json!("SIGNATURE_INVALID"))
    );
    let (code, body) = signed(&base, &id, &json!({"status": "done"})).await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (400, &json!("INVALID_INPUT"))
    );

    // An output that breaks the tool's output schema fails the invocation.
    let (code, body) = signed(&base, &id, &json!({"status": "succeeded", "output": {}})).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "FAILED");
    assert_eq!(body["error"]["code"], "OUTPUT_INVALID");

    // A workflow's own failure, with its code.
    let second = run(
        &app,
        CALLER,
        "cb-fail",
        "crm.sync_lead",
        json!({"lead_id": "L-2"}),
    )
    .await;
    let failed =
        json!({"status": "failed", "error": {"code": "CRM_DOWN", "message": "503 from the CRM"}});
    let (code, _) = signed(&base, &second.invocation_id, &failed).await;
    assert_eq!(code, 200);
    let ended = fetch(&app, &second.invocation_id).await;
    assert_eq!(ended.status(), pb::InvocationStatus::Failed);
    assert_eq!(ended.error.expect("an error").code, "CRM_DOWN");
}

#[tokio::test]
async fn an_invocation_without_its_callback_in_time_ends_timed_out() {
    let hook = Webhook::start().await;
    hook.script([accepted()]);
    let (app, base) = spawn(&hook, "300ms").await;
    let mut req = invoke("crm.sync_lead", json!({"lead_id": "L-3"}));
    req.mode = pb::InvocationMode::Async as i32;
    let id = tools(&app)
        .invoke_tool(with_key(CALLER, "cb-late", req))
        .await
        .expect("InvokeTool")
        .into_inner()
        .invocation
        .expect("an invocation")
        .invocation_id;
    wait_for(|| async { fetch(&app, &id).await.status() == pb::InvocationStatus::TimedOut }).await;
    let ended = fetch(&app, &id).await;
    assert_eq!(ended.error.expect("an error").code, "TIMED_OUT");
    assert_eq!(hook.count(), 1, "the webhook was called once");
    let timed_out = events(&app, "t1")
        .await
        .into_iter()
        .any(|e| e.action == "workflow.result" && e.decision == "error" && e.reason == "TIMED_OUT");
    assert!(timed_out, "the end is audited");
    // The workflow reports after all: too late.
    let report = json!({"status": "succeeded", "output": {"synced": true}});
    let (code, body) = signed(&base, &id, &report).await;
    assert_eq!(code, 409, "{body}");
}

/// Replica A POSTs the work; the workflow's callback reaches replica B (the
/// Service balances it anywhere); both callbacks of a retrying workflow,
/// one per replica, are answered and the invocation ends once.
#[tokio::test]
async fn a_callback_to_another_replica_ends_what_the_first_one_started() {
    let hook = Webhook::start().await;
    hook.script([accepted()]);
    let db = TestPostgres::create().await;
    let (a, _) = spawn_on(&db.url, &hook, "1h").await;
    let (b, base_b) = spawn_on(&db.url, &hook, "1h").await;
    let inv = run(
        &a,
        CALLER,
        "cb-fleet",
        "crm.sync_lead",
        json!({"lead_id": "L-5"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Running);
    let report = json!({"status": "succeeded", "output": {"synced": true}});
    let (code, body) = signed(&base_b, &inv.invocation_id, &report).await;
    assert_eq!(
        (code, &body["status"]),
        (200, &json!("SUCCEEDED")),
        "{body}"
    );
    let ended = fetch(&a, &inv.invocation_id).await;
    assert_eq!(ended.status(), pb::InvocationStatus::Succeeded);
    assert_eq!(output(&ended), json!({"synced": true}));
    let ok_results = events(&a, "t1")
        .await
        .into_iter()
        .filter(|e| e.action == "workflow.result" && e.decision == "ok")
        .count();
    assert_eq!(ok_results, 1);
    a.stop().await;
    b.stop().await;
    db.drop_now().await;
}

/// n8n may answer the POST and call back at once: a callback that arrives
/// while the webhook's answer is still on its way ends the invocation, and
/// the SYNC caller gets that end, not RUNNING.
#[tokio::test]
async fn a_callback_before_the_acceptance_is_recorded_ends_the_invocation() {
    let hook = Webhook::start().await;
    hook.script([accepted().after(std::time::Duration::from_secs(2))]);
    let (app, base) = spawn(&hook, "1h").await;
    let caller = {
        let channel = app.channel.clone();
        tokio::spawn(async move {
            let req = invoke("crm.sync_lead", json!({"lead_id": "L-7"}));
            pb::tool_service_client::ToolServiceClient::new(channel)
                .invoke_tool(with_key(CALLER, "cb-early", req))
                .await
                .expect("InvokeTool")
                .into_inner()
                .invocation
                .expect("an invocation")
        })
    };
    wait_for(|| async { hook.count() == 1 }).await;
    let id = hook.received()[0].headers["x-tool-invocation-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let report = json!({"status": "succeeded", "output": {"synced": true}});
    let (code, body) = signed(&base, &id, &report).await;
    assert_eq!(
        (code, &body["status"]),
        (200, &json!("SUCCEEDED")),
        "{body}"
    );
    let inv = caller.await.unwrap();
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert_eq!(output(&inv), json!({"synced": true}));
    assert_eq!(
        fetch(&app, &id).await.status(),
        pb::InvocationStatus::Succeeded
    );
}

/// The same race on the worker: the callback ends the row, and the run
/// that recorded the acceptance late leaves it so (and still audits the
/// acceptance, which happened).
#[tokio::test]
async fn an_async_invocation_called_back_before_its_acceptance_stays_ended() {
    let hook = Webhook::start().await;
    hook.script([accepted().after(std::time::Duration::from_secs(2))]);
    let (app, base) = spawn(&hook, "1h").await;
    let mut req = invoke("crm.sync_lead", json!({"lead_id": "L-8"}));
    req.mode = pb::InvocationMode::Async as i32;
    let id = tools(&app)
        .invoke_tool(with_key(CALLER, "cb-early-async", req))
        .await
        .expect("InvokeTool")
        .into_inner()
        .invocation
        .expect("an invocation")
        .invocation_id;
    wait_for(|| async { hook.count() == 1 }).await;
    let report = json!({"status": "succeeded", "output": {"synced": true}});
    let (code, body) = signed(&base, &id, &report).await;
    assert_eq!(
        (code, &body["status"]),
        (200, &json!("SUCCEEDED")),
        "{body}"
    );
    wait_for(|| async {
        events(&app, "t1").await.iter().any(|e| {
            e.trace_id == "cb-early-async"
                && e.action == "workflow.result"
                && e.decision == "accepted"
        })
    })
    .await;
    let ended = fetch(&app, &id).await;
    assert_eq!(ended.status(), pb::InvocationStatus::Succeeded, "{ended:?}");
    assert_eq!(output(&ended), json!({"synced": true}));
}
