//! Human approval of tool calls (SPEC §14.1) through the real server: a
//! held `InvokeTool` answers `AWAITING_APPROVAL` and runs as ASYNC once
//! another principal approves it, or ends `REJECTED`; the capability, four
//! eyes and expiry are enforced; a decision is valid on any replica and
//! survives a SIGKILL between the request and the decision.

use super::{
    ADMIN, CALLER, MULTI,
    durable::{free_addr, kill, start},
    events, fetch, fetch_on, invoke, spawn, spawn_on, tools, verify,
    webhook::Webhook,
    with_key,
};
use crate::common::{TestApp, TestPostgres, connect, wait_for};
use ai_orchestrator::{
    api::pb::{self, approval_service_client::ApprovalServiceClient},
    auth::keys::hash_hex,
};
use serde_json::{Value, json};
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt;

/// A second admin key, for decisions under four eyes.
const OPS2: &str = "aio_test_tools_second_admin_key";

/// Admins may decide (and so are auto-approved); a tool that always asks.
fn extra(hook: &Webhook, approvals: &str) -> String {
    format!(
        r#"
[auth.roles.admin]
capabilities = ["tool:*", "approve:*"]

[[auth.keys]]
name = "ops2"
sha256 = "{ops2}"
teams = ["*"]
role = "admin"

[tools."crm.send_offer"]
kind = "http"
url = "{hook}/webhook/send-offer"
side_effects = true
approval = "always"
retry = {{ max_attempts = 1 }}

[approvals]
{approvals}
"#,
        ops2 = hash_hex(OPS2),
        hook = hook.url(),
    )
}

fn offer(lead: &str) -> Value {
    json!({"lead_id": lead, "offer": "10% off"})
}

fn approvals_on(channel: Channel) -> ApprovalServiceClient<Channel> {
    ApprovalServiceClient::new(channel)
}

fn approvals(app: &TestApp) -> ApprovalServiceClient<Channel> {
    approvals_on(app.channel.clone())
}

/// `InvokeTool` (SYNC asked) of `crm.send_offer` as `key`.
async fn ask(channel: Channel, key: &str, trace: &str, lead: &str) -> pb::ToolInvocation {
    pb::tool_service_client::ToolServiceClient::new(channel)
        .invoke_tool(with_key(key, trace, invoke("crm.send_offer", offer(lead))))
        .await
        .expect("InvokeTool")
        .into_inner()
        .invocation
        .expect("an invocation")
}

fn decide_req(id: &str, decision: pb::Decision, reason: &str) -> pb::DecideApprovalRequest {
    pb::DecideApprovalRequest {
        context: crate::common::ctx(),
        approval_id: id.into(),
        decision: decision as i32,
        reason: reason.into(),
    }
}

async fn decide_on(
    channel: Channel,
    key: &str,
    id: &str,
    decision: pb::Decision,
    reason: &str,
) -> Result<pb::Approval, tonic::Status> {
    approvals_on(channel)
        .decide_approval(with_key(key, "decide", decide_req(id, decision, reason)))
        .await
        .map(tonic::Response::into_inner)
}

async fn decide(
    app: &TestApp,
    key: &str,
    id: &str,
    decision: pb::Decision,
) -> Result<pb::Approval, tonic::Status> {
    decide_on(app.channel.clone(), key, id, decision, "").await
}

async fn get_on(channel: Channel, key: &str, id: &str) -> Result<pb::Approval, tonic::Status> {
    approvals_on(channel)
        .get_approval(with_key(
            key,
            "get",
            pb::GetApprovalRequest {
                context: crate::common::ctx(),
                approval_id: id.into(),
            },
        ))
        .await
        .map(tonic::Response::into_inner)
}

async fn list(app: &TestApp, key: &str, status: pb::ApprovalStatus) -> Vec<pb::Approval> {
    approvals(app)
        .list_approvals(with_key(
            key,
            "list",
            pb::ListApprovalsRequest {
                context: crate::common::ctx(),
                status: status as i32,
                ..Default::default()
            },
        ))
        .await
        .expect("ListApprovals")
        .into_inner()
        .approvals
}

fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

fn refused(result: Result<pb::Approval, tonic::Status>, code: Code, why: &str) {
    let status = result.expect_err("refused");
    assert_eq!(
        (status.code(), reason(&status).as_str()),
        (code, why),
        "{status:?}"
    );
}

/// The team's events as (action, principal, decision).
async fn actions(app: &TestApp) -> Vec<(String, String, String)> {
    events(app, "t1")
        .await
        .into_iter()
        .map(|e| (e.action, e.principal, e.decision))
        .collect()
}

#[tokio::test]
async fn a_held_invocation_runs_once_another_principal_approves_it() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &extra(&hook, "")).await;

    let held = ask(app.channel.clone(), CALLER, "held-1", "L-1").await;
    assert_eq!(held.status(), pb::InvocationStatus::AwaitingApproval);
    assert!(!held.approval_id.is_empty());
    assert_eq!(
        fetch(&app, &held.invocation_id).await.approval_id,
        held.approval_id
    );

    // The caller sees its request but not the input; an approver sees both.
    let seen = get_on(app.channel.clone(), CALLER, &held.approval_id)
        .await
        .unwrap();
    assert_eq!(seen.status(), pb::ApprovalStatus::Pending);
    assert_eq!(
        (seen.tool.as_str(), seen.requested_by.as_str()),
        ("crm.send_offer", "crm-key")
    );
    assert_eq!(seen.invocation_id, held.invocation_id);
    assert_eq!(seen.trace_id, "held-1");
    assert!(seen.input_json.is_empty() && !seen.input_sha256.is_empty());
    let pending = list(&app, ADMIN, pb::ApprovalStatus::Pending).await;
    assert_eq!(pending.len(), 1);
    let shown: Value = serde_json::from_str(&pending[0].input_json).unwrap();
    assert_eq!(shown, offer("L-1"));

    // Refusals: no capability, no decision, unknown, another team's.
    refused(
        decide(&app, CALLER, &held.approval_id, pb::Decision::Approve).await,
        Code::PermissionDenied,
        "CAPABILITY_MISSING",
    );
    let unspecified = decide(&app, ADMIN, &held.approval_id, pb::Decision::Unspecified).await;
    assert_eq!(unspecified.unwrap_err().code(), Code::InvalidArgument);
    refused(
        decide(
            &app,
            ADMIN,
            "0190c1d2-0000-7000-8000-000000000000",
            pb::Decision::Approve,
        )
        .await,
        Code::NotFound,
        "APPROVAL_NOT_FOUND",
    );
    let mut elsewhere = decide_req(&held.approval_id, pb::Decision::Approve, "");
    elsewhere.context.as_mut().unwrap().team_id = "t2".into();
    let status = approvals(&app)
        .decide_approval(with_key(MULTI, "t2", elsewhere))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(hook.count(), 0, "nothing ran while it waited");

    let approved = decide(&app, ADMIN, &held.approval_id, pb::Decision::Approve)
        .await
        .unwrap();
    assert_eq!(approved.status(), pb::ApprovalStatus::Approved);
    assert_eq!(approved.decided_by, "ops");
    assert!(approved.decided_at_ms > 0);
    wait_for(|| async {
        fetch(&app, &held.invocation_id).await.status() == pb::InvocationStatus::Succeeded
    })
    .await;
    assert_eq!(hook.count(), 1);
    assert_eq!(hook.received()[0].headers["x-trace-id"], "held-1");
    refused(
        decide(&app, ADMIN, &held.approval_id, pb::Decision::Reject).await,
        Code::FailedPrecondition,
        "APPROVAL_ALREADY_DECIDED",
    );

    let log = actions(&app).await;
    let requested = (
        "approval.requested".into(),
        "crm-key".into(),
        "pending".into(),
    );
    let decided = ("approval.decided".into(), "ops".into(), "approved".into());
    assert!(log.contains(&requested), "{log:?}");
    assert!(log.contains(&decided), "{log:?}");
    let call = events(&app, "t1").await;
    let held_call = call
        .iter()
        .find(|e| e.action == "workflow.invoke" && e.trace_id == "held-1")
        .expect("the call's event");
    assert_eq!(held_call.reason, "AWAITING_APPROVAL");
    assert!(verify(&app, "t1").await.ok);
    app.stop().await;
}

#[tokio::test]
async fn a_rejected_invocation_never_runs_and_an_approver_is_auto_approved() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &extra(&hook, "")).await;

    let held = ask(app.channel.clone(), CALLER, "reject-me", "L-2").await;
    let rejected = decide_on(
        app.channel.clone(),
        ADMIN,
        &held.approval_id,
        pb::Decision::Reject,
        "not this customer",
    )
    .await
    .unwrap();
    assert_eq!(rejected.status(), pb::ApprovalStatus::Rejected);
    assert_eq!(rejected.reason, "not this customer");
    let inv = fetch(&app, &held.invocation_id).await;
    assert_eq!(inv.status(), pb::InvocationStatus::Rejected);
    let error = inv.error.expect("why");
    assert_eq!(error.code, "REJECTED");
    assert!(error.message.contains("not this customer"), "{error:?}");

    // The approver's own call runs at once; its event says why.
    let own = ask(app.channel.clone(), ADMIN, "auto", "L-3").await;
    assert_eq!(own.status(), pb::InvocationStatus::Succeeded);
    assert!(own.approval_id.is_empty());
    assert_eq!(hook.count(), 1, "only the auto-approved call ran");
    let log = events(&app, "t1").await;
    let auto = log
        .iter()
        .find(|e| e.action == "workflow.invoke" && e.trace_id == "auto")
        .expect("the call's event");
    assert_eq!(auto.reason, "AUTO_APPROVED");
    assert!(
        log.iter()
            .any(|e| e.action == "approval.decided" && e.decision == "rejected")
    );
    app.stop().await;
}

#[tokio::test]
async fn four_eyes_holds_an_approvers_own_call_for_another_to_decide() {
    let hook = Webhook::start().await;
    let app = spawn(&hook.url(), &extra(&hook, "four_eyes = true")).await;

    let held = ask(app.channel.clone(), ADMIN, "four-eyes", "L-4").await;
    assert_eq!(held.status(), pb::InvocationStatus::AwaitingApproval);
    refused(
        decide(&app, ADMIN, &held.approval_id, pb::Decision::Approve).await,
        Code::PermissionDenied,
        "FOUR_EYES",
    );
    let approved = decide(&app, OPS2, &held.approval_id, pb::Decision::Approve)
        .await
        .unwrap();
    assert_eq!(approved.decided_by, "ops2");
    wait_for(|| async {
        fetch(&app, &held.invocation_id).await.status() == pb::InvocationStatus::Succeeded
    })
    .await;
    assert_eq!(hook.count(), 1);
    app.stop().await;
}

#[tokio::test]
async fn side_effects_covers_every_such_tool_and_an_undecided_request_expires() {
    let hook = Webhook::start().await;
    let settings = "side_effects = true\napproval_timeout = \"1s\"\nsweep_interval = \"100ms\"";
    let app = spawn(&hook.url(), &extra(&hook, settings)).await;

    let note = invoke(
        "crm.add_note",
        json!({"lead_id": "L-5", "note": "call back"}),
    );
    let held = tools(&app)
        .invoke_tool(with_key(CALLER, "expires", note))
        .await
        .unwrap()
        .into_inner()
        .invocation
        .unwrap();
    assert_eq!(held.status(), pb::InvocationStatus::AwaitingApproval);

    wait_for(|| async {
        fetch(&app, &held.invocation_id).await.status() == pb::InvocationStatus::Rejected
    })
    .await;
    let inv = fetch(&app, &held.invocation_id).await;
    assert_eq!(inv.error.unwrap().code, "EXPIRED");
    let expired = get_on(app.channel.clone(), ADMIN, &held.approval_id)
        .await
        .unwrap();
    assert_eq!(expired.status(), pb::ApprovalStatus::Expired);
    assert_eq!(expired.decided_by, "system");
    refused(
        decide(&app, ADMIN, &held.approval_id, pb::Decision::Approve).await,
        Code::FailedPrecondition,
        "APPROVAL_ALREADY_DECIDED",
    );
    assert_eq!(hook.count(), 0);
    let log = actions(&app).await;
    let swept = ("approval.decided".into(), "system".into(), "expired".into());
    assert!(log.contains(&swept), "{log:?}");
    app.stop().await;
}

#[tokio::test]
async fn replica_b_decides_what_replica_a_held() {
    let hook = Webhook::start().await;
    let db = TestPostgres::create().await;
    let a = spawn_on(&db.url, &hook.url(), &extra(&hook, "")).await;
    let b = spawn_on(&db.url, &hook.url(), &extra(&hook, "")).await;

    let held = ask(a.channel.clone(), CALLER, "on-a", "L-6").await;
    let on_b = list(&b, ADMIN, pb::ApprovalStatus::Pending).await;
    assert_eq!(on_b.len(), 1);
    assert_eq!(on_b[0].approval_id, held.approval_id);
    decide(&b, ADMIN, &held.approval_id, pb::Decision::Approve)
        .await
        .unwrap();
    wait_for(|| async {
        fetch_on(a.channel.clone(), &held.invocation_id)
            .await
            .status()
            == pb::InvocationStatus::Succeeded
    })
    .await;
    assert_eq!(hook.count(), 1, "one replica's worker ran it, once");
    refused(
        decide(&a, ADMIN, &held.approval_id, pb::Decision::Reject).await,
        Code::FailedPrecondition,
        "APPROVAL_ALREADY_DECIDED",
    );
    a.stop().await;
    b.stop().await;
    db.drop_now().await;
}

#[tokio::test]
async fn a_sigkill_between_the_request_and_the_decision_loses_nothing() {
    let hook = Webhook::start().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = free_addr();
    let url = format!("sqlite://{}", dir.path().join("tools.db").display());
    let toml = super::toml(&url, &hook.url(), &extra(&hook, ""))
        .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{addr}\""));
    let config = dir.path().join("config.toml");
    std::fs::write(&config, toml).unwrap();

    let server = start(&config, addr).await;
    let held = ask(connect(addr).await, CALLER, "before-kill", "L-7").await;
    assert_eq!(held.status(), pb::InvocationStatus::AwaitingApproval);
    kill(server).await;

    let server = start(&config, addr).await;
    let channel = connect(addr).await;
    let still = get_on(channel.clone(), ADMIN, &held.approval_id)
        .await
        .unwrap();
    assert_eq!(still.status(), pb::ApprovalStatus::Pending);
    let inv = fetch_on(channel.clone(), &held.invocation_id).await;
    assert_eq!(inv.status(), pb::InvocationStatus::AwaitingApproval);
    decide_on(
        channel.clone(),
        ADMIN,
        &held.approval_id,
        pb::Decision::Approve,
        "",
    )
    .await
    .unwrap();
    wait_for(|| async {
        fetch_on(channel.clone(), &held.invocation_id)
            .await
            .status()
            == pb::InvocationStatus::Succeeded
    })
    .await;
    assert_eq!(hook.count(), 1);
    assert_eq!(hook.received()[0].headers["x-trace-id"], "before-kill");
    kill(server).await;
}
