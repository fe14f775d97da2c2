//! Our MCP client against a server built on the official Python SDK
//! (`mcp_server.py`, over stdio): an `isError` result and a JSON-RPC error
//! are FAILED invocations, with the server's text cut to 500 characters, a `serverInfo.version` that is not semver registers its
//! tools at `0.0.0`, and a tool the server adds later joins the registry on
//! `notifications/tools/list_changed` or at the next `refresh_interval`.

use super::{ADMIN, counterparts, events, invoke, output, run, spawn, tools, with_key};
use crate::common::{TestApp, wait_for};
use ai_orchestrator::api::pb;
use serde_json::{Value, json};
use tonic::Code;

/// `[mcp_servers.<name>]` running `mcp_server.py` reporting `version`,
/// with `more` config lines.
fn server(name: &str, version: &str, more: &str) -> String {
    let python = counterparts::python_with_mcp();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/api/tools/mcp_server.py");
    format!(
        "[mcp_servers.{name}]\ncommand = [\"{}\", \"{script}\", \"{version}\"]\ntimeout = \"20s\"\n{more}",
        python.display()
    )
}

/// The server's tools (`<server>.*`) as the admin key lists them (`tool:*`).
async fn listed(app: &TestApp, server: &str) -> Vec<pb::Tool> {
    let prefix = format!("{server}.");
    tools(app)
        .list_tools(with_key(
            ADMIN,
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
        .filter(|t| t.name.starts_with(&prefix))
        .collect()
}

/// `name@version` of each of the server's tools, sorted.
async fn names(app: &TestApp, server: &str) -> Vec<String> {
    let mut all: Vec<String> = listed(app, server)
        .await
        .into_iter()
        .map(|t| format!("{}@{}", t.name, t.version))
        .collect();
    all.sort();
    all
}

/// Waits until `tool` (`name@version`) is registered.
async fn wait_listed(app: &TestApp, server: &str, tool: &str) {
    wait_for(|| async { names(app, server).await.iter().any(|t| t == tool) }).await;
}

#[tokio::test]
async fn an_is_error_result_is_a_failed_invocation_with_tool_error() {
    let hook = super::webhook::Webhook::start().await;
    let app = spawn(&hook.url(), &server("probe", "1.2.3", "")).await;
    wait_listed(&app, "probe", "probe.fail@1.2.3").await;

    let inv = run(
        &app,
        ADMIN,
        "mcp-is-error",
        "probe.fail",
        json!({"reason": "the CRM is down"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Failed, "{inv:?}");
    assert!(inv.output.is_none(), "{inv:?}");
    let error = inv.error.clone().expect("an error");
    assert_eq!(error.code, "TOOL_ERROR");
    // The result's own text, so the failure is the isError result and not
    // a broken call.
    assert!(error.message.contains("the CRM is down"), "{error:?}");

    // Audited with the code as the reason (a SYNC MCP invocation has no
    // stored row: docs/tools.md).
    let audited: Vec<(String, String, String)> = events(&app, "t1")
        .await
        .into_iter()
        .filter(|e| e.trace_id == "mcp-is-error")
        .map(|e| (e.action, e.subject, e.reason))
        .collect();
    let subject = "probe.fail@1.2.3".to_owned();
    assert_eq!(
        audited,
        [
            ("tool.call".to_owned(), subject.clone(), String::new()),
            ("tool.result".to_owned(), subject, "TOOL_ERROR".to_owned()),
        ]
    );

    // A failure of one call, not of the session: the next call succeeds.
    let echo = run(
        &app,
        ADMIN,
        "mcp-after",
        "probe.echo",
        json!({"text": "still here"}),
    )
    .await;
    assert_eq!(echo.status(), pb::InvocationStatus::Succeeded, "{echo:?}");
    assert_eq!(output(&echo), json!({"text": "still here"}));
    app.stop().await;
}

#[tokio::test]
async fn a_json_rpc_error_is_a_failed_invocation_and_its_text_is_cut() {
    let hook = super::webhook::Webhook::start().await;
    let app = spawn(&hook.url(), &server("probe", "1.2.3", "")).await;
    wait_listed(&app, "probe", "probe.refuse@1.2.3").await;

    let failed = |inv: pb::ToolInvocation| {
        assert_eq!(inv.status(), pb::InvocationStatus::Failed, "{inv:?}");
        let error = inv.error.expect("an error");
        assert_eq!(error.code, "TOOL_ERROR");
        error.message
    };
    let reason = "lead_id is not a lead";
    let refused = run(
        &app,
        ADMIN,
        "mcp-refused",
        "probe.refuse",
        json!({ "reason": reason }),
    )
    .await;
    let message = failed(refused);
    assert!(message.starts_with("the MCP call failed: "), "{message}");
    assert!(message.ends_with(reason), "{message}");

    // The server's text is stored, returned and shown to agents' models:
    // 500 characters of what the client reports are kept, whatever the
    // server sends (here 40,000 bytes). Two-byte characters, so a cut by
    // bytes would show.
    let refused = run(
        &app,
        ADMIN,
        "mcp-refused-long",
        "probe.refuse",
        json!({ "reason": "é", "repeat": 20_000 }),
    )
    .await;
    let message = failed(refused);
    let why = message
        .strip_prefix("the MCP call failed: ")
        .expect("the failure's prefix");
    assert_eq!(why.chars().count(), 500, "{}", why.len());
    assert!(why.ends_with("ééé"), "{why}");
    app.stop().await;
}

#[tokio::test]
async fn a_server_version_that_is_not_semver_registers_its_tools_at_0_0_0() {
    let hook = super::webhook::Webhook::start().await;
    // The same script reporting a semver version: the version is read from
    // serverInfo, not always 0.0.0.
    let extra = format!(
        "{}{}",
        server("devbuild", "dev-build", ""),
        server("release", "3.1.4", "")
    );
    let app = spawn(&hook.url(), &extra).await;
    wait_listed(&app, "devbuild", "devbuild.echo@0.0.0").await;
    wait_listed(&app, "release", "release.echo@3.1.4").await;

    assert_eq!(
        names(&app, "devbuild").await,
        [
            "devbuild.add_tool@0.0.0",
            "devbuild.echo@0.0.0",
            "devbuild.fail@0.0.0",
            "devbuild.refuse@0.0.0"
        ]
    );
    assert!(
        listed(&app, "devbuild")
            .await
            .iter()
            .all(|t| t.kind() == pb::ToolKind::Mcp)
    );
    assert_eq!(
        names(&app, "release").await,
        [
            "release.add_tool@3.1.4",
            "release.echo@3.1.4",
            "release.fail@3.1.4",
            "release.refuse@3.1.4"
        ]
    );

    // Called by that version, explicitly; the server's own string is no
    // version of ours.
    let echo = run(
        &app,
        ADMIN,
        "mcp-zero-version",
        "devbuild.echo@0.0.0",
        json!({"text": "hi"}),
    )
    .await;
    assert_eq!(echo.status(), pb::InvocationStatus::Succeeded, "{echo:?}");
    assert_eq!(echo.version, "0.0.0");
    assert_eq!(output(&echo), json!({"text": "hi"}));
    let wrong = tools(&app)
        .invoke_tool(with_key(
            ADMIN,
            "mcp-wrong-version",
            invoke("devbuild.echo@dev-build", json!({"text": "hi"})),
        ))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::NotFound, "{wrong:?}");
    app.stop().await;
}

/// `probe.late`'s input schema as `mcp_server.py` lists it.
fn late_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"n": {"type": "number", "minimum": 0}},
        "required": ["n"]
    })
}

#[tokio::test]
async fn a_tool_added_with_tools_list_changed_is_listed_and_invoked() {
    let hook = super::webhook::Webhook::start().await;
    // The default refresh_interval (5 min): only the notification can bring
    // the new tool within the wait.
    let app = spawn(&hook.url(), &server("probe", "1.2.3", "")).await;
    wait_listed(&app, "probe", "probe.add_tool@1.2.3").await;
    assert!(
        !names(&app, "probe")
            .await
            .contains(&"probe.late@1.2.3".to_owned())
    );

    let added = run(&app, ADMIN, "mcp-add", "probe.add_tool", json!({})).await;
    assert_eq!(output(&added), json!({"added": "late", "notified": true}));
    wait_listed(&app, "probe", "probe.late@1.2.3").await;

    // Registered with the server's input schema, which is enforced.
    let late = listed(&app, "probe")
        .await
        .into_iter()
        .find(|t| t.name == "probe.late")
        .expect("probe.late");
    let schema: Value = serde_json::from_str(&late.input_schema).unwrap();
    assert_eq!(schema, late_schema());
    assert_eq!(late.description, "Listed only after add_tool");
    let refused = tools(&app)
        .invoke_tool(with_key(
            ADMIN,
            "mcp-late-invalid",
            invoke("probe.late", json!({"n": -1})),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    let doubled = run(&app, ADMIN, "mcp-late", "probe.late", json!({"n": 21})).await;
    assert_eq!(
        doubled.status(),
        pb::InvocationStatus::Succeeded,
        "{doubled:?}"
    );
    // Numbers cross a protobuf Struct as floats.
    assert_eq!(output(&doubled)["doubled"].as_f64(), Some(42.0));
    app.stop().await;
}

#[tokio::test]
async fn the_refresh_interval_picks_up_a_tool_added_without_a_notification() {
    let hook = super::webhook::Webhook::start().await;
    let app = spawn(
        &hook.url(),
        &server("probe", "1.2.3", "refresh_interval = \"200ms\"\n"),
    )
    .await;
    wait_listed(&app, "probe", "probe.add_tool@1.2.3").await;
    assert!(
        !names(&app, "probe")
            .await
            .contains(&"probe.late@1.2.3".to_owned())
    );

    // The server adds the tool and says nothing.
    let added = run(
        &app,
        ADMIN,
        "mcp-add-quiet",
        "probe.add_tool",
        json!({"notify": false}),
    )
    .await;
    assert_eq!(output(&added), json!({"added": "late", "notified": false}));
    wait_listed(&app, "probe", "probe.late@1.2.3").await;

    let doubled = run(&app, ADMIN, "mcp-late", "probe.late", json!({"n": 4})).await;
    assert_eq!(
        doubled.status(),
        pb::InvocationStatus::Succeeded,
        "{doubled:?}"
    );
    assert_eq!(output(&doubled)["doubled"].as_f64(), Some(8.0));
    app.stop().await;
}
