//! Tools (SPEC §9) and the audit log (§10) end to end: the real server on
//! port 0 with auth, the generated clients, a fake workflow webhook that
//! counts its calls, real SQLite files and PostgreSQL.

mod approvals;
mod audit;
mod audit_calls;
mod audit_list;
mod callbacks;
pub mod counterparts;
mod durable;
mod gateway;
mod leases;
mod limits;
mod mcp;
mod mcp_counterpart;
mod platform_triggers;
mod registry;
mod retries;
mod task_tools;
mod triggers;
mod versions;
pub mod webhook;
mod workflows;

use crate::common::{TestApp, config_toml_with};
use ai_orchestrator::{
    api::pb::{
        self, audit_service_client::AuditServiceClient, tool_service_client::ToolServiceClient,
    },
    auth::keys::hash_hex,
};
use serde_json::Value;
use tonic::{Request, transport::Channel};

/// A `caller` key of team t1 (its key name, the audit principal, is `crm-key`).
pub const CALLER: &str = "aio_test_tools_caller_key";
/// A `viewer` key of team t1.
pub const VIEWER: &str = "aio_test_tools_viewer_key";
/// An `admin` key of every team.
pub const ADMIN: &str = "aio_test_tools_ops_admin_key";
/// A `caller` key of teams t1 and t2.
pub const MULTI: &str = "aio_test_tools_two_teams_key";
/// The webhook's secret, from the environment variable `N8N_API_KEY`.
pub const WEBHOOK_SECRET: &str = "n8n-secret-from-env";

/// The tools' config: keys and roles, a workflow tool posting to
/// `webhook`, and built-ins with settings (a disabled one, a quota).
pub fn tools_extra(webhook: &str) -> String {
    format!(
        r#"
[auth]
enabled = true
refresh_interval = "1h"
[[auth.keys]]
name = "crm-key"
sha256 = "{caller}"
teams = ["t1"]
[[auth.keys]]
name = "viewer-key"
sha256 = "{viewer}"
teams = ["t1"]
role = "viewer"
[[auth.keys]]
name = "ops"
sha256 = "{admin}"
teams = ["*"]
role = "admin"
[[auth.keys]]
name = "two-teams"
sha256 = "{multi}"
teams = ["t1", "t2"]

[auth.roles.caller]
capabilities = ["tool:system.*", "tool:sms.*", "tool:crm.*", "tool:everything.*"]
[auth.roles.viewer]
capabilities = ["tool:system.*", "tool:sms.*", "tool:crm.*"]

[tools."crm.add_note"]
version = "1.0.0"
kind = "http"
description = "Add a note to a lead in the CRM"
url = "{webhook}/webhook/crm-add-note"
auth_header = "X-N8N-API-KEY"
auth_env = "N8N_API_KEY"
side_effects = true
timeout = "5s"
input_schema = {{ type = "object", required = ["lead_id", "note"], properties = {{ lead_id = {{ type = "string" }}, note = {{ type = "string", maxLength = 2000 }} }} }}
cost = {{ fixed_usd = 0.001 }}
retry = {{ max_attempts = 3, initial_backoff = "20ms", max_backoff = "100ms" }}

[tools."billing.refund"]
version = "2.1.0"
kind = "http"
url = "{webhook}/webhook/refund"
side_effects = true

[tools."sms.segments"]
kind = "builtin"
enabled = false

[tools."system.health"]
kind = "builtin"
quota = {{ max_per_hour = 2 }}

[tool_worker]
poll_interval = "50ms"
lease_slack = "1s"
"#,
        caller = hash_hex(CALLER),
        viewer = hash_hex(VIEWER),
        admin = hash_hex(ADMIN),
        multi = hash_hex(MULTI),
    )
}

/// The environment the tools' config reads.
pub fn env(name: &str) -> Option<String> {
    (name == "N8N_API_KEY").then(|| WEBHOOK_SECRET.to_owned())
}

/// A server on a fresh SQLite file with the tools' config and `extra`.
pub async fn spawn(webhook: &str, extra: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("tools.db").display());
    let mut app = spawn_on(&url, webhook, extra).await;
    app.keep(dir);
    app
}

/// A server on `database_url` with the tools' config and `extra`.
pub async fn spawn_on(database_url: &str, webhook: &str, extra: &str) -> TestApp {
    TestApp::spawn_toml_env(&toml(database_url, webhook, extra), env).await
}

/// The whole config of a tools test.
pub fn toml(database_url: &str, webhook: &str, extra: &str) -> String {
    config_toml_with(
        database_url,
        "latency = \"1ms\"",
        "latency = \"1ms\"",
        &format!("{}{extra}", tools_extra(webhook)),
    )
}

/// A request with `key` and a trace ID.
pub fn with_key<T>(key: &str, trace: &str, body: T) -> Request<T> {
    let mut req = Request::new(body);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req.metadata_mut()
        .insert("x-trace-id", trace.parse().unwrap());
    req
}

/// The tool service on `app`.
pub fn tools(app: &TestApp) -> ToolServiceClient<Channel> {
    ToolServiceClient::new(app.channel.clone())
}

/// The audit service on `app`.
pub fn audit(app: &TestApp) -> AuditServiceClient<Channel> {
    AuditServiceClient::new(app.channel.clone())
}

/// A SYNC invocation of `tool` with `input` for team t1.
pub fn invoke(tool: &str, input: Value) -> pb::InvokeToolRequest {
    let Value::Object(input) = input else {
        panic!("a tool input is an object")
    };
    pb::InvokeToolRequest {
        context: crate::common::ctx(),
        tool: tool.into(),
        input: Some(ai_orchestrator::api::convert::json_to_struct(input)),
        mode: pb::InvocationMode::Sync as i32,
        ..Default::default()
    }
}

/// A SYNC invocation of `tool` with `input` for team t1 as `key`: the
/// invocation it answered with (a refusal fails the test).
pub async fn run(
    app: &TestApp,
    key: &str,
    trace: &str,
    tool: &str,
    input: Value,
) -> pb::ToolInvocation {
    tools(app)
        .invoke_tool(with_key(key, trace, invoke(tool, input)))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e:?}"))
        .into_inner()
        .invocation
        .expect("an invocation")
}

/// `GetToolInvocation` of `id` for team t1, as the caller key.
pub async fn fetch(app: &TestApp, id: &str) -> pb::ToolInvocation {
    fetch_on(app.channel.clone(), id).await
}

/// [`fetch`] from the server at the other end of `channel`.
pub async fn fetch_on(channel: tonic::transport::Channel, id: &str) -> pb::ToolInvocation {
    pb::tool_service_client::ToolServiceClient::new(channel)
        .get_tool_invocation(with_key(
            CALLER,
            "poll",
            pb::GetToolInvocationRequest {
                context: crate::common::ctx(),
                invocation_id: id.into(),
            },
        ))
        .await
        .expect("GetToolInvocation")
        .into_inner()
}

/// Team t1's `GetUsage` totals this month, read with the admin key.
pub async fn usage_totals(app: &TestApp) -> pb::UsageTotals {
    pb::orchestrator_client::OrchestratorClient::new(app.channel.clone())
        .get_usage(with_key(
            ADMIN,
            "usage",
            pb::GetUsageRequest {
                team_id: "t1".into(),
                ..Default::default()
            },
        ))
        .await
        .expect("GetUsage")
        .into_inner()
        .totals
        .expect("totals")
}

/// An invocation's output as JSON.
pub fn output(inv: &pb::ToolInvocation) -> Value {
    Value::Object(ai_orchestrator::api::convert::struct_to_json(
        inv.output.clone().expect("an output"),
    ))
}

/// Every audit event of `team`, in chain order.
pub async fn events(app: &TestApp, team: &str) -> Vec<pb::AuditEvent> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = audit(app)
            .list_audit_events(with_key(
                ADMIN,
                "audit-read",
                pb::ListAuditEventsRequest {
                    team_id: team.into(),
                    page_size: 100,
                    page_token: page_token.clone(),
                    ..Default::default()
                },
            ))
            .await
            .expect("ListAuditEvents")
            .into_inner();
        out.extend(page.events);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

/// `VerifyAuditChain` of `team`.
pub async fn verify(app: &TestApp, team: &str) -> pb::VerifyAuditChainResponse {
    audit(app)
        .verify_audit_chain(with_key(
            ADMIN,
            "audit-verify",
            pb::VerifyAuditChainRequest {
                team_id: team.into(),
            },
        ))
        .await
        .expect("VerifyAuditChain")
        .into_inner()
}
