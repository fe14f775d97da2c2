//! Task tools (SPEC §16, `kind = "task"`): a model call offered as a tool.
//! The input becomes the task's variables, the call goes through the call
//! pipeline (admitted, metered and audited under its task, with the
//! caller's trace), and what that call cost is the tool's actual cost,
//! charged once.

use super::{
    CALLER, env, events, fetch, invoke, output, run, tools, tools_extra, usage_totals, with_key,
};
use crate::common::{TestApp, config_toml_with, wait_for};
use ai_orchestrator::api::pb;
use serde_json::json;

/// What the model answers every call.
const ANSWER: &str = r#"{"verdict": "call back tomorrow"}"#;

/// `crm.brief_lead`: the `lead_brief` task (gpt-4o-mini, priced) as a tool.
const TASK_TOOL: &str = r#"
[tasks.lead_brief]
chain = [{ provider = "primary", model = "gpt-4o-mini" }]

[tools."crm.brief_lead"]
kind = "task"
task = "lead_brief"
description = "Briefs a salesperson on a lead"
timeout = "TIMEOUT"
input_schema = { type = "object", required = ["lead"], properties = { lead = { type = "string" } } }
output_schema = { type = "object", required = ["text", "output"] }
"#;

/// A server whose models answer [`ANSWER`] after `latency`, the task tool
/// timing out after `timeout`.
async fn spawn(latency: &str, timeout: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("tools.db").display());
    let model = format!("latency = \"{latency}\"\nreply = '{ANSWER}'");
    let extra = format!(
        "{}{}",
        tools_extra("http://127.0.0.1:9"),
        TASK_TOOL.replace("TIMEOUT", timeout)
    );
    let toml = config_toml_with(&url, &model, &model, &extra);
    let mut app = TestApp::spawn_toml_env(&toml, env).await;
    app.keep(dir);
    app
}

fn usd_micros(usd: f64) -> i64 {
    (usd * 1e6).round() as i64
}

#[tokio::test]
async fn a_task_tool_answers_with_its_model_call_and_costs_what_that_call_cost_once() {
    let app = spawn("1ms", "5s").await;
    let inv = run(
        &app,
        CALLER,
        "task-tool-sync",
        "crm.brief_lead",
        json!({"lead": "Dana, asked about pricing twice"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::Succeeded, "{inv:?}");
    assert_eq!(
        output(&inv),
        json!({"text": ANSWER, "output": {"verdict": "call back tomorrow"}})
    );
    assert!(inv.cost_usd > 0.0, "the model call is priced: {inv:?}");

    // Two calls recorded (the tool's and its model call, under the task),
    // the money once.
    let totals = usage_totals(&app).await;
    assert_eq!(totals.requests, 2, "{totals:?}");
    assert_eq!(usd_micros(totals.cost_usd), usd_micros(inv.cost_usd));

    let events = events(&app, "t1").await;
    let traced: Vec<_> = events
        .iter()
        .filter(|e| e.trace_id == "task-tool-sync")
        .collect();
    let model_call = traced
        .iter()
        .find(|e| e.action == "call.completed" && e.subject == "lead_brief")
        .unwrap_or_else(|| panic!("the model call is audited under its task: {traced:#?}"));
    let result = traced
        .iter()
        .find(|e| e.action == "tool.result")
        .unwrap_or_else(|| panic!("the tool's result is audited: {traced:#?}"));
    assert_eq!(result.subject, "crm.brief_lead@1.0.0");
    assert_eq!(result.decision, "ok");
    assert_eq!(
        result.actual_cost_usd.map(usd_micros),
        Some(usd_micros(inv.cost_usd))
    );
    assert_eq!(
        model_call.actual_cost_usd.map(usd_micros),
        Some(usd_micros(inv.cost_usd))
    );
}

#[tokio::test]
async fn an_async_task_tool_runs_on_the_worker_and_reports_its_model_calls_cost() {
    let app = spawn("1ms", "5s").await;
    let mut req = invoke("crm.brief_lead", json!({"lead": "Sam, wants a demo"}));
    req.mode = pb::InvocationMode::Async as i32;
    let accepted = tools(&app)
        .invoke_tool(with_key(CALLER, "task-tool-async", req))
        .await
        .expect("InvokeTool")
        .into_inner()
        .invocation
        .expect("an invocation");
    assert_eq!(accepted.status(), pb::InvocationStatus::Pending);
    let id = accepted.invocation_id.clone();
    wait_for(|| async { fetch(&app, &id).await.status() == pb::InvocationStatus::Succeeded }).await;
    let done = fetch(&app, &id).await;
    assert_eq!(
        output(&done),
        json!({"text": ANSWER, "output": {"verdict": "call back tomorrow"}})
    );
    assert!(done.cost_usd > 0.0, "{done:?}");
    // The model call is metered under the invocation's trace, at the cost
    // the invocation reports.
    let events = events(&app, "t1").await;
    let model_call = events
        .iter()
        .find(|e| e.trace_id == "task-tool-async" && e.action == "call.completed")
        .unwrap_or_else(|| panic!("the worker's model call is audited: {events:#?}"));
    assert_eq!(
        model_call.actual_cost_usd.map(usd_micros),
        Some(usd_micros(done.cost_usd))
    );
    let result = events
        .iter()
        .find(|e| e.trace_id == "task-tool-async" && e.action == "tool.result")
        .unwrap_or_else(|| panic!("the worker's result is audited: {events:#?}"));
    assert_eq!(
        result.actual_cost_usd.map(usd_micros),
        Some(usd_micros(done.cost_usd))
    );
}

#[tokio::test]
async fn a_task_tool_whose_model_outlasts_its_timeout_ends_timed_out() {
    let app = spawn("3s", "200ms").await;
    let inv = run(
        &app,
        CALLER,
        "task-tool-slow",
        "crm.brief_lead",
        json!({"lead": "Kim"}),
    )
    .await;
    assert_eq!(inv.status(), pb::InvocationStatus::TimedOut, "{inv:?}");
    assert_eq!(inv.error.expect("an error").code, "TIMED_OUT");
}
