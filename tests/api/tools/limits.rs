//! What both tool edges (gRPC `ToolService`, the MCP endpoint) let in and
//! hand back, on the real server: an output that is not a JSON object (an
//! n8n "All Entries" array, a string, `true`) comes back as
//! `{"result": ...}`, never dropped; an input over `server.max_input_bytes`
//! (2048 in the tests' config) or `server.max_input_depth` (32) is
//! INVALID_INPUT on both; an `x-team-id` that is not a team ID is refused,
//! even for a key of every team; an `initialize` past
//! `mcp_endpoint.max_sessions` is 503 until a session closes. The MCP side is driven by the official
//! Rust SDK's client and, for the HTTP-level refusals, plain HTTP.

use super::{
    ADMIN, CALLER, MULTI, invoke, output, run, spawn, tools,
    webhook::{Answer, Webhook},
    with_key,
};
use crate::{
    common::{TestApp, wait_for},
    observability::free_port,
};
use ai_orchestrator::api::pb;
use rmcp::{
    RoleClient, ServiceError, ServiceExt,
    model::{CallToolRequestParams, CallToolResult, ErrorCode},
    service::RunningService,
    transport::{
        StreamableHttpClientTransport, streamable_http_client::StreamableHttpClientTransportConfig,
    },
};
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;

/// A server with the MCP endpoint on a free port, and the endpoint's URL.
async fn spawn_with_mcp(hook: &Webhook) -> (TestApp, String) {
    spawn_with_mcp_lines(hook, "").await
}

/// [`spawn_with_mcp`] with `more` lines in `[mcp_endpoint]`.
async fn spawn_with_mcp_lines(hook: &Webhook, more: &str) -> (TestApp, String) {
    let port = free_port();
    let app = spawn(
        &hook.url(),
        &format!("[mcp_endpoint]\nlisten = \"127.0.0.1:{port}\"\n{more}"),
    )
    .await;
    wait_for(|| async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    (app, format!("http://127.0.0.1:{port}/mcp"))
}

/// An MCP session with our endpoint at `url` as `key`.
async fn mcp_session(url: &str, key: &str) -> RunningService<RoleClient, ()> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(key),
    );
    ().serve(transport).await.expect("an MCP session")
}

/// `tools/call` of `tool` with `arguments` (an object).
async fn mcp_call(
    session: &RunningService<RoleClient, ()>,
    tool: &str,
    arguments: Value,
) -> Result<CallToolResult, ServiceError> {
    let Value::Object(arguments) = arguments else {
        panic!("MCP arguments are an object")
    };
    session
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
}

/// `{"a": {"a": ... 1}}`, `levels` objects deep.
fn nested(levels: usize) -> Value {
    (0..levels).fold(json!(1), |inner, _| json!({ "a": inner }))
}

#[tokio::test]
async fn an_output_that_is_not_an_object_comes_back_as_result_on_grpc_and_mcp() {
    let hook = Webhook::start().await;
    hook.script([
        Answer::status(200).body(r#"[{"id": 1}]"#),
        Answer::status(200).body(r#""done""#),
        Answer::status(200).body("true"),
        Answer::status(200).body(r#"[{"id": 2}]"#),
    ]);
    let (app, url) = spawn_with_mcp(&hook).await;
    let note = |lead: &str| json!({"lead_id": lead, "note": "n"});

    // gRPC: each answer wrapped, SUCCEEDED, nothing lost (a Struct's
    // numbers are doubles).
    let mut ids = Vec::new();
    for (lead, answered) in [
        ("L-1", json!([{"id": 1.0}])),
        ("L-2", json!("done")),
        ("L-3", json!(true)),
    ] {
        let inv = run(&app, CALLER, "wrap-grpc", "crm.add_note", note(lead)).await;
        assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
        assert_eq!(output(&inv), json!({ "result": answered }), "{lead}");
        ids.push(inv.invocation_id);
    }

    // The stored invocation reads the same through GetToolInvocation.
    let stored = tools(&app)
        .get_tool_invocation(with_key(
            CALLER,
            "wrap-get",
            pb::GetToolInvocationRequest {
                context: crate::common::ctx(),
                invocation_id: ids[0].clone(),
            },
        ))
        .await
        .expect("GetToolInvocation")
        .into_inner();
    assert_eq!(stored.status(), pb::InvocationStatus::Succeeded);
    assert_eq!(output(&stored), json!({"result": [{"id": 1.0}]}));

    // MCP: structuredContent is an object, the same shape as gRPC's.
    let session = mcp_session(&url, CALLER).await;
    let result = mcp_call(&session, "crm.add_note", note("L-4"))
        .await
        .expect("tools/call");
    assert_eq!(result.is_error, Some(false), "{result:?}");
    assert_eq!(
        result.structured_content,
        Some(json!({"result": [{"id": 2}]})),
        "{result:?}"
    );

    // An object is carried as it is (the webhook's default answer).
    let inv = run(&app, CALLER, "wrap-object", "crm.add_note", note("L-5")).await;
    assert_eq!(output(&inv), json!({"ok": true, "note_id": "N-1"}));
    let result = mcp_call(&session, "crm.add_note", note("L-6"))
        .await
        .expect("tools/call");
    assert_eq!(
        result.structured_content,
        Some(json!({"ok": true, "note_id": "N-1"}))
    );
    assert_eq!(hook.count(), 6, "one POST per invocation");
    let _ = session.cancel().await;
    app.stop().await;
}

#[tokio::test]
async fn a_tool_input_over_the_request_limits_is_invalid_input_on_grpc_and_mcp() {
    let hook = Webhook::start().await;
    let (app, url) = spawn_with_mcp(&hook).await;

    // gRPC: over `server.max_input_bytes`, as every RPC refuses it.
    let big = json!({"text": "x".repeat(3000)});
    let err = tools(&app)
        .invoke_tool(with_key(
            CALLER,
            "limits-grpc",
            invoke("system.echo", big.clone()),
        ))
        .await
        .expect_err("over the input limit");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, "INVALID_INPUT");
    let violations = err
        .get_details_bad_request()
        .expect("BadRequest")
        .field_violations;
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].field, "input");
    assert!(
        violations[0].description.contains("server.max_input_bytes"),
        "{violations:?}"
    );
    assert!(
        !format!("{err:?}").contains("xxxx"),
        "an input value never comes back in the error"
    );
    // Under the limit, the same tool runs.
    let fits = "y".repeat(1500);
    let inv = run(
        &app,
        CALLER,
        "limits-fits",
        "system.echo",
        json!({"text": fits}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert_eq!(output(&inv)["text"], fits);

    // MCP: the same limits, the same stable reason, as a JSON-RPC error.
    let session = mcp_session(&url, CALLER).await;
    for (arguments, limit) in [
        (big, "server.max_input_bytes"),
        (
            json!({"text": "deep", "extra": nested(40)}),
            "server.max_input_depth",
        ),
    ] {
        let Err(ServiceError::McpError(e)) = mcp_call(&session, "system.echo", arguments).await
        else {
            panic!("{limit}: not refused as a protocol error");
        };
        assert_eq!(e.code.0, ErrorCode::INVALID_PARAMS.0, "{e:?}");
        assert!(e.message.starts_with("INVALID_INPUT: arguments: "), "{e:?}");
        assert!(e.message.contains(limit), "{e:?}");
    }
    // The session still serves a call within the limits.
    let result = mcp_call(&session, "system.echo", json!({"text": "hi"}))
        .await
        .expect("tools/call");
    assert_eq!(result.structured_content, Some(json!({"text": "hi"})));
    let _ = session.cancel().await;
    assert_eq!(hook.count(), 0);
    app.stop().await;
}

#[tokio::test]
async fn an_x_team_id_that_is_not_a_team_id_is_refused_even_for_a_key_of_every_team() {
    let hook = Webhook::start().await;
    let (app, url) = spawn_with_mcp(&hook).await;
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "limits", "version": "0"}}});
    let initialize = |key: &str, team: &str| {
        http.post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {key}"))
            .header("x-team-id", team)
            .json(&init)
            .send()
    };

    // ADMIN's teams are `*`: before the fix any text became its team.
    let too_long = "t".repeat(129);
    for bad in ["no such team!", "*", "t1 OR 1=1", "", too_long.as_str()] {
        let refused = initialize(ADMIN, bad).await.unwrap();
        assert_eq!(refused.status(), 400, "{bad:?}");
        let body = refused.text().await.unwrap();
        assert!(
            body.starts_with("INVALID_INPUT: x-team-id: "),
            "{bad:?}: {body}"
        );
    }
    // Validity is checked before the key's teams, as gRPC does: a bad ID
    // is 400 for a key of two teams too, a good one it lacks is 403.
    assert_eq!(initialize(MULTI, "bad id").await.unwrap().status(), 400);
    assert_eq!(initialize(MULTI, "t3").await.unwrap().status(), 403);
    // A well-formed team: the all-teams key acts for it.
    let accepted = initialize(ADMIN, "t9").await.unwrap();
    assert!(accepted.status().is_success(), "{}", accepted.status());
    app.stop().await;
}

#[tokio::test]
async fn an_initialize_past_max_sessions_is_503_until_a_session_closes() {
    let hook = Webhook::start().await;
    let (app, url) = spawn_with_mcp_lines(&hook, "max_sessions = 2\n").await;
    let first = mcp_session(&url, CALLER).await;
    let second = mcp_session(&url, CALLER).await;
    let http = reqwest::Client::new();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "limits", "version": "0"}}});
    let initialize = || {
        http.post(&url)
            .header("accept", "application/json, text/event-stream")
            .header("authorization", format!("Bearer {CALLER}"))
            .json(&init)
            .send()
    };

    let refused = initialize().await.unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "5");
    let body = refused.text().await.unwrap();
    assert!(body.starts_with("MCP_SESSIONS_FULL: "), "{body}");
    // A request that would open no session gets rmcp's own answer.
    let sessionless = http
        .post(&url)
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {CALLER}"))
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_ne!(sessionless.status(), 503);
    // The sessions already open go on (their bodies read and passed on).
    let listed = second.list_all_tools().await.expect("tools/list");
    assert!(
        listed.iter().any(|t| t.name == "crm.add_note"),
        "{listed:?}"
    );

    // A closed session (the client's DELETE) frees its place.
    first.cancel().await.expect("the session closes");
    wait_for(|| async {
        initialize()
            .await
            .is_ok_and(|answer| answer.status().is_success())
    })
    .await;
    // And the cap holds again with the new one.
    assert_eq!(initialize().await.unwrap().status(), 503);
    let _ = second.cancel().await;
    app.stop().await;
}
