//! The runtime tool registry (SPEC §16) end to end: `ToolAdmin` over the
//! real server, tools stored in SQLite or a PostgreSQL shared by two
//! replicas, invoked through the one entry point against the fake n8n
//! webhook. Registered, disabled with a reason, enabled, deprecated;
//! config-file tools read-only; every change audited on the '' chain.

use super::{
    ADMIN, CALLER, events, invoke, run, spawn, spawn_on, tools, webhook::Webhook, with_key,
};
use crate::common::{TestApp, TestPostgres, wait_for};
use ai_orchestrator::api::{
    convert::json_to_struct,
    pb::{self, tool_admin_client::ToolAdminClient},
};
use serde_json::{Value, json};
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt;

fn admin(app: &TestApp) -> ToolAdminClient<Channel> {
    ToolAdminClient::new(app.channel.clone())
}

/// A webhook tool posting to `hook`'s `path`, its input a lead ID.
fn webhook_config(hook: &Webhook, path: &str) -> Value {
    json!({
        "kind": "http",
        "description": "Sync a contact to the CRM",
        "url": format!("{}/webhook/{path}", hook.url()),
        "side_effects": true,
        "timeout": "5s",
        "input_schema": {"type": "object", "required": ["lead_id"],
                         "properties": {"lead_id": {"type": "string"}}},
    })
}

fn registration(name: &str, version: &str, config: Value) -> pb::RegisterToolRequest {
    let Value::Object(config) = config else {
        panic!("a config is an object")
    };
    pb::RegisterToolRequest {
        name: name.into(),
        version: version.into(),
        config: Some(json_to_struct(config)),
    }
}

async fn register(
    app: &TestApp,
    key: &str,
    req: pb::RegisterToolRequest,
) -> Result<pb::ToolVersion, tonic::Status> {
    admin(app)
        .register_tool(with_key(key, "register", req))
        .await
        .map(tonic::Response::into_inner)
}

async fn disable(
    app: &TestApp,
    name: &str,
    version: &str,
    reason: &str,
) -> Result<pb::ToolVersions, tonic::Status> {
    let req = pb::DisableToolRequest {
        name: name.into(),
        version: version.into(),
        reason: reason.into(),
    };
    admin(app)
        .disable_tool(with_key(ADMIN, "disable", req))
        .await
        .map(tonic::Response::into_inner)
}

async fn versions(app: &TestApp, name: &str) -> Vec<pb::ToolVersion> {
    let req = pb::ListToolVersionsRequest { name: name.into() };
    admin(app)
        .list_tool_versions(with_key(ADMIN, "versions", req))
        .await
        .expect("ListToolVersions")
        .into_inner()
        .versions
}

/// The caller key's invocation of `tool` for lead L-1, or its refusal.
async fn try_run(app: &TestApp, tool: &str) -> Result<pb::ToolInvocation, tonic::Status> {
    try_lead(app, tool, "L-1").await
}

/// The caller key's invocation of `tool` for `lead` (each lead its own
/// idempotency key), or its refusal.
async fn try_lead(
    app: &TestApp,
    tool: &str,
    lead: &str,
) -> Result<pb::ToolInvocation, tonic::Status> {
    tools(app)
        .invoke_tool(with_key(
            CALLER,
            "invoke",
            invoke(tool, json!({"lead_id": lead})),
        ))
        .await
        .map(|r| r.into_inner().invocation.expect("an invocation"))
}

/// Asserts `err` is `code` with the stable `reason`.
fn refused(err: &tonic::Status, code: Code, reason: &str) {
    assert_eq!(err.code(), code, "{err:?}");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(info.reason, reason, "{err:?}");
}

/// `name@version` → (deprecated, replacement) of what ListTools shows the caller.
async fn listed(app: &TestApp) -> Vec<(String, bool, String)> {
    let req = pb::ListToolsRequest {
        context: crate::common::ctx(),
    };
    tools(app)
        .list_tools(with_key(CALLER, "list", req))
        .await
        .expect("ListTools")
        .into_inner()
        .tools
        .into_iter()
        .map(|t| {
            (
                format!("{}@{}", t.name, t.version),
                t.deprecated,
                t.replacement,
            )
        })
        .collect()
}

#[tokio::test]
async fn a_registered_tool_runs_lists_and_is_audited_and_its_version_never_changes() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    let config = webhook_config(&hook, "sync-contact");
    let stored = register(
        &app,
        ADMIN,
        registration("crm.sync_contact", "1.0.0", config.clone()),
    )
    .await
    .expect("RegisterTool");
    assert_eq!(stored.source(), pb::ToolSource::Registry);
    assert_eq!(stored.kind(), pb::ToolKind::Http);
    assert_eq!(
        (stored.registered_by.as_str(), stored.enabled, stored.loaded),
        ("ops", true, true)
    );

    let inv = run(
        &app,
        CALLER,
        "reg-run",
        "crm.sync_contact",
        json!({"lead_id": "L-7"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    let received = hook.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].path, "/webhook/sync-contact");
    assert_eq!(received[0].body, json!({"lead_id": "L-7"}));
    let shown = listed(&app).await;
    assert!(
        shown.contains(&("crm.sync_contact@1.0.0".into(), false, String::new())),
        "{shown:?}"
    );

    // The same registration again (a retry) answers the stored version.
    let again = register(
        &app,
        ADMIN,
        registration("crm.sync_contact", "1.0.0", config),
    )
    .await
    .expect("the same registration");
    assert_eq!(again.created_at_ms, stored.created_at_ms);
    let other = webhook_config(&hook, "elsewhere");
    let err = register(
        &app,
        ADMIN,
        registration("crm.sync_contact", "1.0.0", other),
    )
    .await
    .expect_err("another config for a registered version");
    refused(&err, Code::AlreadyExists, "TOOL_VERSION_EXISTS");

    let registered: Vec<_> = events(&app, "")
        .await
        .into_iter()
        .filter(|e| e.action == "tool.registered")
        .collect();
    assert_eq!(registered.len(), 1, "{registered:?}");
    assert_eq!(
        (
            registered[0].subject.as_str(),
            registered[0].principal.as_str()
        ),
        ("crm.sync_contact@1.0.0", "ops")
    );
    assert!(!registered[0].input_sha256.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn disabling_carries_its_reason_and_a_deprecated_version_stays_callable() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    for (version, path) in [("1.0.0", "v1"), ("2.0.0", "v2")] {
        let req = registration("crm.sync_contact", version, webhook_config(&hook, path));
        register(&app, ADMIN, req).await.expect("RegisterTool");
    }
    let changed = disable(
        &app,
        "crm.sync_contact",
        "2.0.0",
        "CRM migration until Friday",
    )
    .await
    .expect("DisableTool");
    // The same again changes nothing, and audits nothing.
    disable(
        &app,
        "crm.sync_contact",
        "2.0.0",
        "CRM migration until Friday",
    )
    .await
    .expect("the same DisableTool");
    let v2 = changed
        .versions
        .iter()
        .find(|v| v.version == "2.0.0")
        .expect("2.0.0 listed");
    assert_eq!(
        (v2.enabled, v2.disabled_reason.as_str()),
        (false, "CRM migration until Friday")
    );
    let err = try_run(&app, "crm.sync_contact@2.0.0")
        .await
        .expect_err("disabled");
    refused(&err, Code::PermissionDenied, "TOOL_DISABLED");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(
        info.metadata.get("disabled_reason").map(String::as_str),
        Some("CRM migration until Friday")
    );
    assert!(
        err.message().contains("CRM migration until Friday"),
        "{err:?}"
    );
    // The name alone takes the highest enabled version meanwhile.
    let inv = try_run(&app, "crm.sync_contact").await.expect("1.0.0 runs");
    assert_eq!(inv.version, "1.0.0");

    let enable = pb::EnableToolRequest {
        name: "crm.sync_contact".into(),
        version: String::new(),
    };
    admin(&app)
        .enable_tool(with_key(ADMIN, "enable", enable))
        .await
        .expect("EnableTool");
    let deprecate = pb::DeprecateToolRequest {
        name: "crm.sync_contact".into(),
        version: "2.0.0".into(),
        replacement: "crm.sync_contact@1.0.0".into(),
    };
    for wrong in [
        "crm.none@1.0.0",
        "crm.sync_contact@2.0.0",
        "crm.sync_contact",
    ] {
        let mut req = deprecate.clone();
        req.replacement = wrong.into();
        let err = admin(&app)
            .deprecate_tool(with_key(ADMIN, "deprecate", req))
            .await
            .expect_err(wrong);
        refused(&err, Code::InvalidArgument, "INVALID_INPUT");
    }
    let v2 = admin(&app)
        .deprecate_tool(with_key(ADMIN, "deprecate", deprecate.clone()))
        .await
        .expect("DeprecateTool")
        .into_inner();
    admin(&app)
        .deprecate_tool(with_key(ADMIN, "deprecate", deprecate))
        .await
        .expect("the same DeprecateTool");
    assert_eq!(
        (v2.deprecated, v2.replacement.as_str()),
        (true, "crm.sync_contact@1.0.0")
    );
    let shown = listed(&app).await;
    assert!(
        shown.contains(&(
            "crm.sync_contact@2.0.0".into(),
            true,
            "crm.sync_contact@1.0.0".into()
        )),
        "{shown:?}"
    );
    // Still callable when pinned; the name alone prefers the version that is not deprecated.
    let pinned = try_run(&app, "crm.sync_contact@2.0.0")
        .await
        .expect("deprecated runs");
    assert_eq!(pinned.status(), pb::InvocationStatus::Succeeded);
    let unpinned = try_lead(&app, "crm.sync_contact", "L-2")
        .await
        .expect("runs");
    assert_eq!(unpinned.version, "1.0.0");
    let paths: Vec<_> = hook.received().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/webhook/v1", "/webhook/v2", "/webhook/v1"]);

    let changes: Vec<_> = events(&app, "")
        .await
        .into_iter()
        .map(|e| (e.action, e.subject, e.reason))
        .filter(|(action, ..)| action != "tool.registered")
        .collect();
    assert_eq!(
        changes,
        [
            (
                "tool.disabled".into(),
                "crm.sync_contact@2.0.0".into(),
                "CRM migration until Friday".into()
            ),
            (
                "tool.enabled".into(),
                "crm.sync_contact".into(),
                String::new()
            ),
            (
                "tool.deprecated".into(),
                "crm.sync_contact@2.0.0".into(),
                "crm.sync_contact@1.0.0".into()
            ),
        ]
    );
    app.stop().await;
}

#[tokio::test]
async fn config_tools_are_read_only_and_bad_registrations_are_refused() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), "").await;
    // Declared in the config file, or built in.
    for name in ["crm.add_note", "system.echo"] {
        let err = register(
            &app,
            ADMIN,
            registration(name, "9.0.0", webhook_config(&hook, "x")),
        )
        .await
        .expect_err(name);
        refused(&err, Code::FailedPrecondition, "TOOL_READ_ONLY");
        let err = disable(&app, name, "", "no").await.expect_err(name);
        refused(&err, Code::FailedPrecondition, "TOOL_READ_ONLY");
    }
    // Only workflow:manage for every team may change the registry.
    let err = register(
        &app,
        CALLER,
        registration("crm.new", "1.0.0", webhook_config(&hook, "x")),
    )
    .await
    .expect_err("a caller key");
    refused(&err, Code::PermissionDenied, "CAPABILITY_MISSING");

    let bad: [(&str, &str, Value, &str); 8] = [
        ("crm.x@9.0.0", "1.0.0", webhook_config(&hook, "x"), "name"),
        ("crm.new", "", webhook_config(&hook, "x"), "version"),
        (
            "crm.new",
            "1.0.0",
            json!({"kind": "builtin"}),
            "config.kind",
        ),
        ("crm.new", "1.0.0", json!({"kind": "http"}), "config.url"),
        (
            "crm.new",
            "1.0.0",
            json!({"kind": "http", "url": "http://h/x", "colour": "red"}),
            "config",
        ),
        (
            "crm.new",
            "1.0.0",
            json!({"kind": "task", "task": "no_such_task"}),
            "config.task",
        ),
        (
            "crm.new",
            "1.0.0",
            json!({"kind": "http", "url": "http://h/x", "auth_header": "X-Key", "auth_env": "AIO_TEST_UNSET_VARIABLE"}),
            "config.auth_env",
        ),
        ("bad name!", "1.0.0", webhook_config(&hook, "x"), "name"),
    ];
    for (name, version, config, field) in bad {
        let err = register(&app, ADMIN, registration(name, version, config.clone()))
            .await
            .expect_err(field);
        refused(&err, Code::InvalidArgument, "INVALID_INPUT");
        let violations = err
            .get_details_bad_request()
            .expect("BadRequest")
            .field_violations;
        assert!(
            violations.iter().any(|v| v.field == field),
            "{field}: {violations:?} for {config}"
        );
    }
    let err = disable(&app, "crm.never_registered", "", "gone")
        .await
        .expect_err("unknown");
    refused(&err, Code::NotFound, "TOOL_NOT_FOUND");
    register(
        &app,
        ADMIN,
        registration("crm.new", "1.0.0", webhook_config(&hook, "x")),
    )
    .await
    .expect("a good one");
    let err = disable(&app, "crm.new", "1.0.0", "  ")
        .await
        .expect_err("no reason");
    refused(&err, Code::InvalidArgument, "INVALID_INPUT");
    // Nothing refused was stored or audited.
    let all = versions(&app, "").await;
    let registered: Vec<_> = all
        .iter()
        .filter(|v| v.source() == pb::ToolSource::Registry)
        .map(|v| format!("{}@{}", v.name, v.version))
        .collect();
    assert_eq!(registered, ["crm.new@1.0.0"]);
    assert!(
        all.iter()
            .any(|v| v.name == "crm.add_note" && v.source() == pb::ToolSource::Config)
    );
    let changes = events(&app, "").await.len();
    assert_eq!(changes, 1);
    app.stop().await;
}

/// Two replicas share PostgreSQL; B refreshes every 100 ms. A change made
/// on A is served by B within the refresh, including the disable reason.
#[tokio::test]
async fn every_replica_sees_a_change_within_the_refresh_interval() {
    let hook = Webhook::start().await;
    let db = TestPostgres::create().await;
    let fast = "\n[tool_registry]\nrefresh_interval = \"100ms\"\n";
    let a = spawn_on(&db.url, &hook.url(), fast).await;
    let b = spawn_on(&db.url, &hook.url(), fast).await;
    let req = registration("crm.sync_contact", "1.0.0", webhook_config(&hook, "fleet"));
    register(&a, ADMIN, req).await.expect("RegisterTool on A");
    // B lists it at once (it reads the store) and serves it within the refresh.
    let on_b = versions(&b, "crm.sync_contact").await;
    assert_eq!(on_b.len(), 1);
    assert_eq!(
        (on_b[0].source(), on_b[0].registered_by.as_str()),
        (pb::ToolSource::Registry, "ops")
    );
    wait_for(|| async { try_run(&b, "crm.sync_contact").await.is_ok() }).await;

    disable(&a, "crm.sync_contact", "", "paused by ops")
        .await
        .expect("DisableTool on A");
    wait_for(|| async {
        try_run(&b, "crm.sync_contact").await.is_err_and(|e| {
            e.get_details_error_info().is_some_and(|i| {
                i.metadata
                    .get("disabled_reason")
                    .is_some_and(|r| r == "paused by ops")
            })
        })
    })
    .await;
    a.stop().await;
    b.stop().await;
    db.drop_now().await;
}

/// A task tool registered at run time goes through the call pipeline like
/// one of the config file.
#[tokio::test]
async fn a_registered_task_tool_runs_its_task() {
    let hook = Webhook::start().await;
    let task =
        "\n[tasks.lead_brief]\nchain = [{ provider = \"primary\", model = \"gpt-4o-mini\" }]\n";
    let app = spawn(&hook.url(), task).await;
    let config = json!({
        "kind": "task",
        "task": "lead_brief",
        "input_schema": {"type": "object", "required": ["lead"],
                         "properties": {"lead": {"type": "string"}}},
    });
    let stored = register(
        &app,
        ADMIN,
        registration("crm.brief_contact", "1.0.0", config),
    )
    .await
    .expect("RegisterTool");
    assert_eq!(stored.kind(), pb::ToolKind::Task);
    let inv = run(
        &app,
        CALLER,
        "reg-task",
        "crm.brief_contact",
        json!({"lead": "Dana"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert!(super::output(&inv)["text"].is_string(), "{inv:?}");
    assert!(inv.cost_usd > 0.0, "{inv:?}");
    app.stop().await;
}

/// Registered tools are loaded before a restarted server takes its first
/// request, not at its first refresh.
#[tokio::test]
async fn a_restarted_server_serves_registered_tools_at_once() {
    let hook = Webhook::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("tools.db").display());
    let slow = "\n[tool_registry]\nrefresh_interval = \"1h\"\n";
    let first = spawn_on(&url, &hook.url(), slow).await;
    let req = registration("crm.sync_contact", "1.0.0", webhook_config(&hook, "again"));
    register(&first, ADMIN, req).await.expect("RegisterTool");
    disable(&first, "crm.sync_contact", "1.0.0", "held for review")
        .await
        .expect("DisableTool");
    first.stop().await;
    let second = spawn_on(&url, &hook.url(), slow).await;
    let err = try_run(&second, "crm.sync_contact")
        .await
        .expect_err("disabled");
    let info = err.get_details_error_info().expect("ErrorInfo");
    assert_eq!(
        (
            info.reason.as_str(),
            info.metadata.get("disabled_reason").map(String::as_str)
        ),
        ("TOOL_DISABLED", Some("held for review"))
    );
    second.stop().await;
}
