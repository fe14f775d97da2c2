//! Triggers (SPEC §16) end to end: a failed workflow invocation fires
//! `[triggers.on_fail]`, whose outbox row is written with the event; the
//! relay starts `ops.alert` ASYNC as `trigger:on_fail` with the rendered
//! input against the fake n8n webhook, once, audited `trigger.fired`. And a
//! SIGKILL right after the triggering commit loses no trigger.

use super::{
    CALLER, WEBHOOK_SECRET, events, invoke, spawn, toml,
    webhook::{Answer, Webhook},
    with_key,
};
use crate::common::{connect, wait_for};
use ai_orchestrator::{api::pb, audit::outbox};
use serde_json::json;
use std::process::Stdio;
use tokio::process::{Child, Command};

/// `ops.alert` (a webhook, one attempt) and the trigger that calls it when
/// a `crm.*` tool fails, relayed every `poll`.
fn triggers(hook: &Webhook, poll: &str) -> String {
    triggers_for(hook, poll, "filter = { tool = \"crm.*\" }")
}

/// [`triggers`] with the trigger's `filter` line.
/// The `ops.alert` tool (posting to `hook`) that triggers start.
pub fn alert_tool(hook: &Webhook) -> String {
    format!(
        r#"
[tools."ops.alert"]
kind = "http"
url = "{url}/webhook/alert"
input_schema = {{ type = "object", required = ["text", "team"] }}
retry = {{ max_attempts = 1 }}
"#,
        url = hook.url()
    )
}

fn triggers_for(hook: &Webhook, poll: &str, filter: &str) -> String {
    format!(
        r#"{tool}
[triggers.on_fail]
on = "tool.invocation.failed"
{filter}
tool = "ops.alert"
role = "admin"
input = {{ text = "{{{{event.tool}}}} failed: {{{{event.reason}}}}", team = "{{{{event.team}}}}", trace = "{{{{event.trace_id}}}}" }}

[trigger_relay]
poll_interval = "{poll}"
"#,
        tool = alert_tool(hook)
    )
}

/// `crm.add_note` failing: its three attempts answered 500.
async fn fail_a_note(app_channel: tonic::transport::Channel, hook: &Webhook, trace: &str) {
    hook.script([
        Answer::status(500),
        Answer::status(500),
        Answer::status(500),
    ]);
    let inv = pb::tool_service_client::ToolServiceClient::new(app_channel)
        .invoke_tool(with_key(
            CALLER,
            trace,
            invoke(
                "crm.add_note",
                json!({"lead_id": "L-9", "note": "call back"}),
            ),
        ))
        .await
        .expect("InvokeTool")
        .into_inner()
        .invocation
        .expect("an invocation");
    assert_eq!(inv.status(), pb::InvocationStatus::Failed, "{inv:?}");
}

/// Waits until every outbox row is FIRED.
async fn all_fired(store: &ai_orchestrator::store::Store) {
    wait_for(|| async {
        let rows = outbox::rows(store).await.unwrap();
        rows.iter().all(|(_, status, _)| status == "FIRED")
    })
    .await;
}

/// The bodies the fake webhook's alert route received.
pub(super) fn alerts(hook: &Webhook) -> Vec<serde_json::Value> {
    hook.received()
        .into_iter()
        .filter(|r| r.path == "/webhook/alert")
        .map(|r| r.body)
        .collect()
}

#[tokio::test]
async fn a_failed_invocation_starts_the_trigger_tool_once_as_its_principal() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &triggers(&hook, "50ms")).await;
    fail_a_note(app.channel.clone(), &hook, "trig-1").await;
    wait_for(|| async { !alerts(&hook).is_empty() }).await;
    assert_eq!(
        alerts(&hook),
        [json!({"text": "crm.add_note failed: HTTP_500", "team": "t1", "trace": "trig-1"})]
    );
    let store = app.store().await;
    all_fired(&store).await;
    let rows = outbox::rows(&store).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    // As if the relay had died between starting the alert and marking the
    // row: taken again, it finds the invocation its key started.
    let reset = "UPDATE trigger_outbox SET status = 'PENDING', lease_until_ms = 0";
    ai_orchestrator::on_store!(&store, |pool| {
        sqlx::query(reset).execute(pool).await.unwrap();
    });
    all_fired(&store).await;
    assert_eq!(
        outbox::rows(&store).await.unwrap(),
        rows,
        "the same invocation"
    );
    assert_eq!(alerts(&hook).len(), 1, "the webhook saw the trigger once");
    let fired: Vec<_> = events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.action == "trigger.fired")
        .collect();
    assert_eq!(fired.len(), 2, "{fired:?}");
    assert_eq!(
        (
            fired[0].principal.as_str(),
            fired[0].decision.as_str(),
            fired[0].subject.as_str()
        ),
        ("trigger:on_fail", "allow", "ops.alert")
    );
    assert_eq!(fired[0].trace_id, "trig-1");
    // The alert's own result fires nothing, and it ran under the trigger's principal.
    let alert_calls: Vec<_> = events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.subject.starts_with("ops.alert@") && e.action == "workflow.invoke")
        .collect();
    assert_eq!(alert_calls.len(), 1, "{alert_calls:?}");
    assert_eq!(alert_calls[0].principal, "trigger:on_fail");
    app.stop().await;
}

/// Two replicas share PostgreSQL, both relaying: the trigger starts once.
#[tokio::test]
async fn two_relays_on_postgres_start_a_trigger_once() {
    let hook = Webhook::start().await;
    let db = crate::common::TestPostgres::create().await;
    let a = super::spawn_on(&db.url, &hook.url(), &triggers(&hook, "20ms")).await;
    let b = super::spawn_on(&db.url, &hook.url(), &triggers(&hook, "20ms")).await;
    fail_a_note(b.channel.clone(), &hook, "trig-pg").await;
    let store = a.store().await;
    wait_for(|| async { !alerts(&hook).is_empty() }).await;
    all_fired(&store).await;
    let rows = outbox::rows(&store).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let fired = events(&a, "t1").await;
    assert_eq!(
        fired.iter().filter(|e| e.action == "trigger.fired").count(),
        1
    );
    assert_eq!(alerts(&hook).len(), 1);
    a.stop().await;
    b.stop().await;
    db.drop_now().await;
}

/// A trigger on every failure: the alert failing too fires nothing more.
#[tokio::test]
async fn a_trigger_tools_own_failure_fires_nothing() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &triggers_for(&hook, "50ms", "")).await;
    // Queued after the note's three 500s: the alert's one attempt fails too.
    hook.script([Answer::status(500)]);
    fail_a_note(app.channel.clone(), &hook, "trig-loop").await;
    let store = app.store().await;
    all_fired(&store).await;
    let rows = outbox::rows(&store).await.unwrap();
    let alert = rows[0].2.clone().expect("the alert's invocation");
    wait_for(|| async {
        super::fetch(&app, &alert).await.status() == pb::InvocationStatus::Failed
    })
    .await;
    assert_eq!(alerts(&hook).len(), 1);
    // Its workflow.result (error, by trigger:on_fail) is committed with the row's end.
    let results = events(&app, "t1").await;
    assert!(results.iter().any(|e| e.action == "workflow.result"
        && e.principal == "trigger:on_fail"
        && e.decision == "error"));
    assert_eq!(outbox::rows(&store).await.unwrap().len(), 1);
    app.stop().await;
}

/// A config for the real binary on `url`, serving on `addr`.
fn binary_config(
    dir: &std::path::Path,
    url: &str,
    hook: &Webhook,
    poll: &str,
    addr: std::net::SocketAddr,
) -> std::path::PathBuf {
    let text = toml(url, &hook.url(), &triggers(hook, poll)).replacen(
        "listen = \"127.0.0.1:0\"",
        &format!("listen = \"{addr}\""),
        1,
    );
    let path = dir.join(format!("config-{poll}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

async fn start(config: &std::path::Path, addr: std::net::SocketAddr) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("RUST_LOG", "warn")
        .env("N8N_API_KEY", WEBHOOK_SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the server binary");
    connect(addr).await;
    child
}

/// The server is killed with SIGKILL right after the failed invocation's
/// answer (its event committed, the relay not yet run); after a restart
/// the trigger fires, once.
#[tokio::test]
async fn a_sigkill_after_the_triggering_commit_loses_no_trigger() {
    let hook = Webhook::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("trig.db").display());
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // The relay's first round runs at start, then not for an hour.
    let mut server = start(&binary_config(dir.path(), &url, &hook, "1h", addr), addr).await;
    fail_a_note(connect(addr).await, &hook, "trig-kill").await;
    server.start_kill().unwrap();
    server.wait().await.unwrap();
    assert!(alerts(&hook).is_empty());
    let store = ai_orchestrator::store::Store::connect(&ai_orchestrator::config::DatabaseConfig {
        url: url.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let rows = outbox::rows(&store).await.unwrap();
    assert_eq!(rows, [("on_fail".to_owned(), "PENDING".to_owned(), None)]);

    let mut server = start(&binary_config(dir.path(), &url, &hook, "50ms", addr), addr).await;
    wait_for(|| async { !alerts(&hook).is_empty() }).await;
    let store = ai_orchestrator::store::Store::connect(&ai_orchestrator::config::DatabaseConfig {
        url,
        ..Default::default()
    })
    .await
    .unwrap();
    wait_for(|| async { outbox::rows(&store).await.unwrap()[0].1 == "FIRED" }).await;
    assert_eq!(alerts(&hook).len(), 1);
    server.start_kill().unwrap();
    let _ = server.wait().await;
}
