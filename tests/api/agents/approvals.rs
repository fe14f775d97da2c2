//! An agent's tool call held for a person (SPEC §14.1): the turn ends with
//! `approval_required` and `APPROVAL_REQUIRED`, the conversation takes no
//! new message while the call waits, and `resume` runs an approved call or
//! tells the model a rejected one did not run.

use super::{completed, conversation_id, converse, kinds, toml_with, turn};
use crate::{
    common::TestApp,
    tools::{ADMIN, CALLER, webhook::Webhook, with_key},
};
use ai_orchestrator::api::pb::{self, approval_service_client::ApprovalServiceClient};
use pb::converse_event::Event;
use tonic::Code;
use tonic_types::StatusExt;

/// An agent whose model asks to add a note (a side effect, so held), and
/// admins who may decide.
pub const EXTRA: &str = r#"
[providers.noting]
kind = "mock"
[providers.noting.mock]
tool_script = [[{ tool = "crm.add_note", arguments = '{"lead_id":"L-1","note":"called back"}' }]]

[agents.noter]
chain = [{ provider = "noting", model = "gpt-4o-mini" }]
core_prompt = "You take notes."
tools = ["crm.*"]

[auth.roles.admin]
capabilities = ["tool:*", "approve:*"]

[approvals]
side_effects = true
"#;

async fn spawn(hook: &Webhook) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("agents.db").display());
    let toml = toml_with(
        &url,
        "http://127.0.0.1:9",
        "http://127.0.0.1:9",
        &hook.url(),
        EXTRA,
    );
    let mut app = TestApp::spawn_toml_env(&toml, super::env).await;
    app.keep(dir);
    app
}

fn resume(conversation: &str) -> pb::ConverseRequest {
    let mut req = converse("noter", "", Some(conversation));
    req.resume = true;
    req
}

fn reason(status: &tonic::Status) -> String {
    status
        .get_details_error_info()
        .map(|i| i.reason)
        .unwrap_or_default()
}

fn held(events: &[Event]) -> &pb::ApprovalRequired {
    events
        .iter()
        .find_map(|e| match e {
            Event::ApprovalRequired(a) => Some(a),
            _ => None,
        })
        .expect("an approval_required event")
}

fn result(events: &[Event]) -> &pb::ToolCallResult {
    events
        .iter()
        .find_map(|e| match e {
            Event::ToolResult(r) => Some(r),
            _ => None,
        })
        .expect("a tool_result event")
}

async fn decide(app: &TestApp, id: &str, decision: pb::Decision, why: &str) {
    ApprovalServiceClient::new(app.channel.clone())
        .decide_approval(with_key(
            ADMIN,
            "decide",
            pb::DecideApprovalRequest {
                context: crate::common::ctx(),
                approval_id: id.into(),
                decision: decision as i32,
                reason: why.into(),
            },
        ))
        .await
        .expect("DecideApproval");
}

/// A turn of `noter` in a new conversation that stops for approval.
async fn held_turn(app: &TestApp, trace: &str) -> (String, pb::ApprovalRequired) {
    let events = turn(
        app,
        CALLER,
        trace,
        converse("noter", "Lead L-1 called", None),
    )
    .await
    .unwrap();
    assert_eq!(
        kinds(&events),
        ["started", "tool_call", "approval_required", "completed"]
    );
    let done = completed(&events);
    assert_eq!(done.stop_reason(), pb::StopReason::ApprovalRequired);
    (conversation_id(&events), held(&events).clone())
}

#[tokio::test]
async fn an_approved_call_runs_when_the_conversation_resumes() {
    let hook = Webhook::start().await;
    let app = spawn(&hook).await;
    let (conversation, asked) = held_turn(&app, "hold").await;
    assert_eq!(asked.tool, "crm.add_note");
    assert_eq!(asked.call_id, "call_mock_0_0");
    assert_eq!(hook.count(), 0);

    // While the call waits, neither a new message nor an early resume goes on.
    let next = converse("noter", "Anything else?", Some(&conversation));
    let err = turn(&app, CALLER, "too-soon", next).await.unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "APPROVAL_PENDING")
    );
    let err = turn(&app, CALLER, "early", resume(&conversation))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "APPROVAL_PENDING")
    );

    decide(&app, &asked.approval_id, pb::Decision::Approve, "").await;
    let events = turn(&app, CALLER, "resumed", resume(&conversation))
        .await
        .unwrap();
    let ran = result(&events);
    assert_eq!(
        (ran.call_id.as_str(), ran.status.as_str()),
        ("call_mock_0_0", "SUCCEEDED")
    );
    assert_eq!(
        completed(&events).stop_reason(),
        pb::StopReason::FinalAnswer
    );
    assert_eq!(hook.count(), 1);
    assert_eq!(hook.received()[0].headers["x-trace-id"], "resumed");

    let err = turn(&app, CALLER, "again", resume(&conversation))
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), reason(&err).as_str()),
        (Code::FailedPrecondition, "NOTHING_TO_RESUME")
    );
    // The same call in the next turn is a new call (the model repeated its
    // ID; the turn gave it one of ours): it waits for a decision of its own.
    let next = converse("noter", "Lead L-1 called again", Some(&conversation));
    let events = turn(&app, CALLER, "next", next).await.unwrap();
    let again = held(&events);
    assert_ne!(again.call_id, asked.call_id);
    assert_ne!(again.approval_id, asked.approval_id);
    assert_eq!(hook.count(), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_rejected_call_reaches_the_model_as_an_error_and_an_approver_is_not_held() {
    let hook = Webhook::start().await;
    let app = spawn(&hook).await;
    let (conversation, asked) = held_turn(&app, "hold").await;
    decide(&app, &asked.approval_id, pb::Decision::Reject, "wrong lead").await;
    let events = turn(&app, CALLER, "resumed", resume(&conversation))
        .await
        .unwrap();
    assert_eq!(result(&events).status, "REJECTED");
    assert_eq!(
        completed(&events).stop_reason(),
        pb::StopReason::FinalAnswer
    );
    assert_eq!(hook.count(), 0, "a rejected call never runs");

    let stored = super::agents(&app)
        .get_conversation(with_key(
            CALLER,
            "read",
            pb::GetConversationRequest {
                context: crate::common::ctx(),
                conversation_id: conversation.clone(),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let told = stored
        .messages
        .iter()
        .find_map(|m| m.tool_result.as_ref())
        .expect("the call's result is stored");
    assert!(
        told.is_error && told.content.contains("rejected: wrong lead"),
        "{told:?}"
    );

    // An approver's own turn runs the call at once.
    let own = turn(
        &app,
        ADMIN,
        "own",
        converse("noter", "Lead L-2 called", None),
    )
    .await
    .unwrap();
    assert!(!kinds(&own).contains(&"approval_required"));
    assert_eq!(result(&own).status, "SUCCEEDED");
    assert_eq!(hook.count(), 1);
    app.stop().await;
}
