//! MCP both ways, against implementations nobody here wrote: our client
//! keeps the reference server's tools (`server-everything`, over stdio and
//! over Streamable HTTP) in the registry and calls them through the entry
//! point; the official Python SDK's client lists and calls our tools
//! through our MCP endpoint, as three different keys. And a misbehaving
//! server (built on the official Rust SDK's server) is reconnected with
//! backoff, not in a loop.

use super::{
    CALLER, MULTI, VIEWER, counterparts, events, invoke, output, spawn, tools, webhook::Webhook,
    with_key,
};
use crate::{
    common::{TestApp, wait_for},
    observability::free_port,
};
use ai_orchestrator::api::pb;
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        Implementation, ListToolsRequestMethod, ListToolsResult, PaginatedRequestParams,
        ServerCapabilities, ServerConfig,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde_json::{Value, json};
use std::{
    path::Path,
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tonic::Code;
use tonic_types::StatusExt;

async fn listed(app: &TestApp, key: &str) -> Vec<String> {
    tools(app)
        .list_tools(with_key(
            key,
            "mcp-list",
            pb::ListToolsRequest {
                context: crate::common::ctx(),
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .tools
        .into_iter()
        .map(|t| format!("{}@{}", t.name, t.version))
        .collect()
}

/// The reference server's tools, called through our entry point.
async fn exercise_everything(app: &TestApp) {
    wait_for(|| async {
        listed(app, CALLER)
            .await
            .contains(&"everything.echo@2.0.0".to_owned())
    })
    .await;
    let all = listed(app, CALLER).await;
    assert!(
        all.contains(&"everything.get-sum@2.0.0".to_owned()),
        "{all:?}"
    );
    assert!(
        !listed(app, VIEWER)
            .await
            .iter()
            .any(|t| t.starts_with("everything.")),
        "a viewer's role does not grant them"
    );

    let echo = tools(app)
        .invoke_tool(with_key(
            CALLER,
            "mcp-echo",
            invoke("everything.echo", json!({"message": "hi"})),
        ))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    assert_eq!(echo.status(), pb::InvocationStatus::Succeeded, "{echo:?}");
    assert_eq!(echo.version, "2.0.0");
    assert_eq!(output(&echo)["content"][0]["text"], "Echo: hi");

    let weather = tools(app)
        .invoke_tool(with_key(
            CALLER,
            "mcp-structured",
            invoke(
                "everything.get-structured-content",
                json!({"location": "Chicago"}),
            ),
        ))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    let weather = output(&weather);
    assert_eq!(weather["temperature"].as_f64(), Some(36.0), "{weather}");
    assert_eq!(weather["conditions"], "Light rain / drizzle");

    // The server's own schema, checked here before anything is sent.
    let err = tools(app)
        .invoke_tool(with_key(
            CALLER,
            "mcp-invalid",
            invoke("everything.get-sum", json!({"a": "one", "b": 2})),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let fields: Vec<String> = err
        .get_details_bad_request()
        .unwrap()
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    assert_eq!(fields, ["/a"]);

    let audited: Vec<(String, String)> = events(app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == "mcp-echo")
        .map(|e| (e.action, e.subject))
        .collect();
    let subject = "everything.echo@2.0.0".to_owned();
    assert_eq!(
        audited,
        [
            ("tool.call".to_owned(), subject.clone()),
            ("tool.result".to_owned(), subject)
        ]
    );
}

#[tokio::test]
async fn the_reference_server_over_stdio_joins_the_registry_and_is_called() {
    let entry = counterparts::server_everything();
    let hook = Webhook::start().await;
    let extra = format!(
        "[mcp_servers.everything]\ncommand = [\"node\", \"{}\", \"stdio\"]\ntimeout = \"20s\"\n",
        entry.display()
    );
    let app = spawn(&hook.url(), &extra).await;
    exercise_everything(&app).await;
    app.stop().await;
}

#[tokio::test]
async fn the_reference_server_over_streamable_http_joins_the_registry_and_is_called() {
    let entry = counterparts::server_everything();
    let port = free_port();
    let _server = tokio::process::Command::new("node")
        .arg(&entry)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    wait_for(|| async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let hook = Webhook::start().await;
    let extra = format!(
        "[mcp_servers.everything]\nurl = \"http://127.0.0.1:{port}/mcp\"\ntimeout = \"20s\"\n"
    );
    let app = spawn(&hook.url(), &extra).await;
    exercise_everything(&app).await;
    app.stop().await;
}

/// Runs the Python SDK's client against `url` as `key` (for `team`, when
/// not empty) with `calls`; its JSON report.
async fn python_client(python: &Path, url: &str, key: &str, team: &str, calls: Value) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/api/tools/mcp_client.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(python)
            .args([script, url, key, team, &calls.to_string()])
            .output(),
    )
    .await
    .expect("the Python client finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn the_python_sdk_client_lists_and_calls_our_tools_through_the_entry_point() {
    let python = counterparts::python_with_mcp();
    let port = free_port();
    let hook = Webhook::start().await;
    let app = spawn(
        &hook.url(),
        &format!("[mcp_endpoint]\nlisten = \"127.0.0.1:{port}\"\n"),
    )
    .await;
    let url = format!("http://127.0.0.1:{port}/mcp");
    wait_for(|| async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;

    let out = python_client(
        &python,
        &url,
        CALLER,
        "",
        json!([
            ["system.echo", {"text": "hi"}],
            ["crm.add_note", {"lead_id": "L-1", "note": "from MCP"}],
            ["crm.add_note", {"lead_id": 5}],
            ["nothing.here", {}]
        ]),
    )
    .await;
    assert_eq!(out["server"], "ai-orchestrator");
    assert_eq!(
        out["tools"],
        json!(["crm.add_note", "system.echo", "system.health"])
    );
    assert_eq!(
        out["schemas"]["crm.add_note"]["required"],
        json!(["lead_id", "note"])
    );
    let calls = &out["calls"];
    assert_eq!(calls[0]["structured"], json!({"text": "hi"}), "{out}");
    assert_eq!(calls[0]["is_error"], false);
    assert_eq!(
        calls[1]["structured"],
        json!({"ok": true, "note_id": "N-1"}),
        "{out}"
    );
    assert!(
        calls[2]["protocol_error"]
            .as_str()
            .is_some_and(|e| e.contains("TOOL_INPUT_INVALID") && e.contains("/lead_id")),
        "{out}"
    );
    assert!(
        calls[3]["protocol_error"]
            .as_str()
            .is_some_and(|e| e.contains("TOOL_NOT_FOUND") && e.contains("`nothing.here`")),
        "{out}"
    );
    assert_eq!(hook.count(), 1);
    assert_eq!(
        hook.received()[0].headers["x-trace-id"],
        "python-mcp-client"
    );
    // The same entry point: audited like gRPC, as the key that called.
    let audited: Vec<(String, String, String)> = events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == "python-mcp-client")
        .map(|e| (e.action, e.reason, e.principal))
        .collect();
    let row = |a: &str, r: &str| (a.to_owned(), r.to_owned(), "crm-key".to_owned());
    assert_eq!(
        audited,
        [
            row("tool.call", ""),
            row("tool.result", ""),
            row("workflow.invoke", ""),
            row("workflow.result", ""),
            row("tool.denied", "TOOL_INPUT_INVALID"),
            row("tool.denied", "TOOL_NOT_FOUND"),
        ]
    );

    // A key of two teams: a tenant tool needs x-team-id, and then runs
    // for that team.
    let note = json!([["crm.add_note", {"lead_id": "L-2", "note": "n"}]]);
    let out = python_client(&python, &url, MULTI, "", note.clone()).await;
    assert!(
        out["calls"][0]["protocol_error"]
            .as_str()
            .is_some_and(|e| e.contains("TENANT_REQUIRED")),
        "{out}"
    );
    let out = python_client(&python, &url, MULTI, "t2", note).await;
    assert_eq!(out["calls"][0]["structured"]["ok"], true, "{out}");
    assert!(
        events(&app, "t2")
            .await
            .iter()
            .any(|e| e.action == "workflow.result" && e.principal == "two-teams")
    );
    // A viewer lists no tool with side effects.
    let out = python_client(&python, &url, VIEWER, "", json!([])).await;
    assert_eq!(out["tools"], json!(["system.echo", "system.health"]));

    // Without a key, or for a team the key is not for: refused at HTTP.
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "curl", "version": "0"}}});
    let no_key = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(no_key.status(), 401);
    let wrong_team = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {CALLER}"))
        .header("x-team-id", "t2")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_team.status(), 403);
    app.stop().await;
}

/// An MCP server that completes the handshake and then refuses every
/// `tools/list` with -32601 (as a server without the tools capability
/// does), recording when each was asked: one per session.
#[derive(Clone, Default)]
struct RefusesToList {
    asked: Arc<Mutex<Vec<Instant>>>,
}

impl ServerHandler for RefusesToList {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("refuses-to-list", "1.0.0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.asked.lock().unwrap().push(Instant::now());
        Err(ErrorData::method_not_found::<ListToolsRequestMethod>())
    }
}

/// Serves `handler` over Streamable HTTP on 127.0.0.1:0; its URL.
async fn serve_mcp(handler: RefusesToList) -> String {
    let service = StreamableHttpService::new(
        move || Ok(handler.clone()),
        LocalSessionManager::default().into(),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/mcp")
}

#[tokio::test]
async fn a_server_that_refuses_tools_list_is_reconnected_with_backoff() {
    let server = RefusesToList::default();
    let asked = server.asked.clone();
    let url = serve_mcp(server).await;
    let hook = Webhook::start().await;
    let app = spawn(
        &hook.url(),
        &format!("[mcp_servers.refuses]\nurl = \"{url}\"\n"),
    )
    .await;

    // Each failed listing ends the session; the next one comes only after
    // the backoff (1 s, then 2 s), not at once.
    wait_for(|| async { asked.lock().unwrap().len() >= 3 }).await;
    let at = asked.lock().unwrap().clone();
    assert!(at[1] - at[0] >= Duration::from_secs(1), "{at:?}");
    assert!(at[2] - at[1] >= Duration::from_secs(2), "{at:?}");
    assert!(
        !listed(&app, CALLER)
            .await
            .iter()
            .any(|t| t.starts_with("refuses.")),
        "nothing listed, nothing registered"
    );
    app.stop().await;
}
