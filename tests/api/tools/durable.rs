//! Invocations in flight when the process dies (SIGKILL, the real binary):
//! an ASYNC one runs again under the same idempotency key after a restart;
//! a SYNC one is marked FAILED (`INTERRUPTED`). Neither is lost or left
//! RUNNING.

use super::{
    CALLER, invoke,
    webhook::{Answer, Webhook},
    with_key,
};
use crate::common::{connect, wait_for};
use ai_orchestrator::api::pb;
use serde_json::json;
use std::{net::SocketAddr, path::Path, process::Stdio, time::Duration};
use tokio::process::{Child, Command};

/// A quick tool, so that a dead runner's lease (its timeout and the
/// config's 1 s slack) runs out soon.
const QUICK: &str = r#"
[tools."crm.quick_note"]
kind = "http"
url = "WEBHOOK/webhook/quick-note"
side_effects = true
timeout = "2s"
retry = { max_attempts = 1 }
"#;

/// A free local address for a server binary.
pub(super) fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The config of [`QUICK`], its tool's timeout `timeout`.
fn write_config(dir: &Path, addr: SocketAddr, hook: &Webhook, timeout: &str) -> std::path::PathBuf {
    let tool = QUICK
        .replace("WEBHOOK", &hook.url())
        .replace("timeout = \"2s\"", &format!("timeout = \"{timeout}\""));
    let url = format!("sqlite://{}", dir.join("tools.db").display());
    let toml = super::toml(&url, &hook.url(), &tool)
        .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{addr}\""));
    let path = dir.join("config.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Starts the server binary on `config`; answers once `addr` accepts.
pub(super) async fn start(config: &Path, addr: SocketAddr) -> Child {
    let child = Command::new(env!("CARGO_BIN_EXE_ai-orchestrator"))
        .args(["--config", config.to_str().unwrap(), "serve"])
        .env("RUST_LOG", "warn")
        .env("N8N_API_KEY", super::WEBHOOK_SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the server binary");
    connect(addr).await;
    child
}

/// SIGKILL: no drain.
pub(super) async fn kill(mut server: Child) {
    server.start_kill().unwrap(); // SIGKILL: no drain
    server.wait().await.unwrap();
}

async fn get(addr: SocketAddr, id: &str) -> pb::ToolInvocation {
    super::fetch_on(connect(addr).await, id).await
}

/// Starts the server on `config`, has it accept an ASYNC invocation for
/// `lead` traced `trace`, and kills it (SIGKILL) once its run has POSTed.
async fn accept_then_die(
    config: &Path,
    addr: SocketAddr,
    hook: &Webhook,
    lead: &str,
    trace: &str,
) -> pb::ToolInvocation {
    let server = start(config, addr).await;
    let mut client = pb::tool_service_client::ToolServiceClient::new(connect(addr).await);
    let mut req = invoke("crm.quick_note", json!({"lead_id": lead, "note": "n"}));
    req.mode = pb::InvocationMode::Async as i32;
    let accepted = client
        .invoke_tool(with_key(CALLER, trace, req))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    wait_for(|| async { hook.count() == 1 }).await;
    kill(server).await;
    accepted
}

#[tokio::test]
async fn an_async_invocation_in_flight_at_sigkill_runs_again_under_its_key() {
    let hook = Webhook::start().await;
    // The first POST never gets its answer: the process dies first.
    hook.script([Answer::status(200).after(Duration::from_secs(60))]);
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let config = write_config(dir.path(), addr, &hook, "2s");
    let accepted = accept_then_die(&config, addr, &hook, "L-9", "async-crash").await;

    let server = start(&config, addr).await;
    wait_for(|| async {
        get(addr, &accepted.invocation_id).await.status() == pb::InvocationStatus::Succeeded
    })
    .await;
    let got = hook.received();
    assert_eq!(got.len(), 2, "run again once");
    assert_eq!(
        got[0].headers["idempotency-key"], got[1].headers["idempotency-key"],
        "under the same idempotency key, so the workflow can tell"
    );
    assert_eq!(got[1].headers["x-trace-id"], "async-crash");
    kill(server).await;
}

/// The run after a restart keeps the timeout the invocation's lease was
/// sized by, though the tool's grew meanwhile: a run past its lease would
/// be taken for dead and run a third time beside it.
#[tokio::test]
async fn a_rerun_keeps_the_timeout_it_was_accepted_with() {
    let hook = Webhook::start().await;
    // Neither POST gets an answer in time.
    hook.script([
        Answer::status(200).after(Duration::from_secs(60)),
        Answer::status(200).after(Duration::from_secs(60)),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let config = write_config(dir.path(), addr, &hook, "2s");
    let accepted = accept_then_die(&config, addr, &hook, "L-11", "async-grown").await;

    // Restarted with a 60 s timeout: the re-run still ends at 2 s, well
    // inside `wait_for`'s 10 s (at 60 s it would not).
    let config = write_config(dir.path(), addr, &hook, "60s");
    let server = start(&config, addr).await;
    wait_for(|| async {
        get(addr, &accepted.invocation_id).await.status() == pb::InvocationStatus::TimedOut
    })
    .await;
    assert_eq!(hook.count(), 2, "run again once");
    kill(server).await;
}

#[tokio::test]
async fn a_sync_invocation_in_flight_at_sigkill_is_marked_failed() {
    let hook = Webhook::start().await;
    hook.script([Answer::status(200).after(Duration::from_secs(60))]);
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let config = write_config(dir.path(), addr, &hook, "2s");
    let server = start(&config, addr).await;
    let input = json!({"lead_id": "L-10", "note": "n"});
    let call = {
        let input = input.clone();
        async move {
            let mut client = pb::tool_service_client::ToolServiceClient::new(connect(addr).await);
            client
                .invoke_tool(with_key(
                    CALLER,
                    "sync-crash",
                    invoke("crm.quick_note", input),
                ))
                .await
        }
    };
    let caller = tokio::spawn(call);
    wait_for(|| async { hook.count() == 1 }).await;
    kill(server).await;
    assert!(caller.await.unwrap().is_err(), "its caller saw the crash");

    // The caller retries the same invocation: it gets the first one back,
    // RUNNING until its lease runs out, then FAILED; never a second POST.
    let server = start(&config, addr).await;
    let retry = || async {
        let mut client = pb::tool_service_client::ToolServiceClient::new(connect(addr).await);
        client
            .invoke_tool(with_key(
                CALLER,
                "sync-retry",
                invoke("crm.quick_note", input.clone()),
            ))
            .await
            .unwrap()
            .into_inner()
            .invocation
            .unwrap()
    };
    wait_for(|| async { retry().await.status() == pb::InvocationStatus::Failed }).await;
    let inv = retry().await;
    assert!(inv.deduplicated);
    assert_eq!(inv.error.unwrap().code, "INTERRUPTED");
    assert_eq!(hook.count(), 1);
    kill(server).await;
}
