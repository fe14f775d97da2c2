//! Tools: a team's pending approvals, each with Approve and Reject (a
//! CSRF-protected form that calls the pipeline's DecideApproval), and its
//! latest tool invocations.

use super::super::{Console, FormOf, QueryOf, Viewer, error::ConsoleError, layout, respond};
use crate::{
    call::{CallContext, approvals::Shown},
    domain::{Channel, Priority, instant_after},
    telemetry::trace_id,
    tools::{
        approvals::{ApprovalStatus, Decision},
        invocations::{self, Invocation},
    },
};
use axum::{
    extract::{Path, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use maud::{Markup, html};
use serde::Deserialize;

/// Pending approvals listed.
const PENDING: usize = 100;
/// Invocations listed.
const RECENT: i64 = 50;
/// Most bytes of a decision's reason (as DecideApproval).
const MAX_REASON: usize = 4096;

/// The page's query.
#[derive(Deserialize, Default)]
pub(crate) struct Params {
    team: Option<String>,
    /// The approval just decided, and how.
    decided: Option<String>,
    outcome: Option<String>,
}

/// The approve/reject form.
#[derive(Deserialize)]
pub(crate) struct DecideForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    team: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    reason: String,
}

/// GET `/console/tools`.
pub(crate) async fn show(
    State(console): State<Console>,
    viewer: Viewer,
    QueryOf(p): QueryOf<Params>,
) -> Result<Response, ConsoleError> {
    let (teams, team) =
        match super::team_page(&console, &viewer, p.team.as_deref(), "Tools").await? {
            Ok(picked) => picked,
            Err(none) => return Ok(none),
        };
    let principal = &viewer.session.principal;
    let pending = console
        .pipeline
        .list_approvals(
            principal,
            &team,
            Some(ApprovalStatus::Pending),
            None,
            PENDING,
        )
        .await?;
    let recent = invocations::recent(console.pipeline.store(), &team, RECENT).await?;
    let body = html! {
        (layout::team_picker("/console/tools", &teams, &team, html! {}))
        @if let Some((id, outcome)) = decided(&p) {
            p.notice role="status" id="decided" { "Approval " code { (id) } " " (outcome) "." }
        }
        h2 { "Pending approvals" }
        @if pending.approvals.is_empty() {
            (layout::empty("Nothing waits for a decision."))
        }
        @for shown in &pending.approvals {
            (approval(&viewer, &team, shown))
        }
        h2 { "Latest invocations" }
        (invocation_table(&team, &recent))
    };
    Ok(respond(&viewer, layout::page("Tools", Some(&viewer), body)))
}

/// The notice after a decision: only an approval ID and a status, so a
/// crafted link cannot put words on the page.
fn decided(p: &Params) -> Option<(&str, &str)> {
    let id = p.decided.as_deref().filter(|id| approval_id(id))?;
    let outcome = p.outcome.as_deref()?;
    ["approved", "rejected", "expired", "pending"]
        .contains(&outcome)
        .then_some((id, outcome))
}

/// Whether `id` looks like an approval ID (a UUID's characters).
fn approval_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn approval(viewer: &Viewer, team: &str, shown: &Shown) -> Markup {
    let a = &shown.approval;
    let reason_id = format!("reason-{}", a.id);
    html! {
        section.approval data-approval=(a.id) aria-labelledby=(format!("approval-{}", a.id)) {
            h3 id=(format!("approval-{}", a.id)) { (a.tool) "@" (a.version) }
            dl {
                dt { "Asked by" } dd { (a.requested_by) }
                dt { "Asked at" } dd { (layout::when(a.created_at_ms)) }
                dt { "Expires" } dd { (layout::when(a.expires_at_ms)) }
                dt { "Trace" } dd { a href=(format!("/console/calls?team={team}&trace={}", a.trace_id)) { code { (a.trace_id) } } }
                dt { "Input" }
                dd {
                    @if shown.input_visible { pre { code { (a.input.to_string()) } } }
                    @else { "hidden: deciding needs approve:" (a.tool) }
                }
            }
            form.inline method="post" action=(format!("/console/approvals/{}", a.id)) {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="team" value=(team);
                label for=(reason_id) { "Reason" }
                input id=(reason_id) name="reason" maxlength="4096" size="30";
                button type="submit" name="decision" value="approve" { "Approve" }
                button.reject type="submit" name="decision" value="reject" { "Reject" }
            }
        }
    }
}

fn invocation_table(team: &str, list: &[Invocation]) -> Markup {
    html! {
        @if list.is_empty() { (layout::empty("No invocations yet.")) } @else {
            table id="invocations" {
                caption { "The latest " (list.len()) " invocations of " (team) }
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Tool" } th scope="col" { "Mode" }
                    th scope="col" { "Status" } th scope="col" { "Principal" } th.n scope="col" { "Duration" }
                    th.n scope="col" { "Cost" } th scope="col" { "Trace" }
                } }
                tbody {
                    @for i in list {
                        tr data-invocation=(i.id) {
                            td { (layout::when(i.created_at_ms)) }
                            td { (i.tool) "@" (i.version) }
                            td { (i.mode.as_str()) }
                            td data-field="status" { (i.status.as_str()) @if let Some(e) = &i.error { " (" (e.code) ")" } }
                            td { (i.principal) }
                            td.n { @if let Some(d) = i.duration_ms { (d) " ms" } }
                            td.n { (i.cost_micros.map_or_else(String::new, layout::usd)) }
                            td { a href=(format!("/console/calls?team={team}&trace={}", i.trace_id)) { code { (i.trace_id) } } }
                        }
                    }
                }
            }
        }
    }
}

/// POST `/console/approvals/{id}`: Approve or Reject, as DecideApproval.
pub(crate) async fn decide(
    State(console): State<Console>,
    viewer: Viewer,
    Path(id): Path<String>,
    FormOf(form): FormOf<DecideForm>,
) -> Result<Response, ConsoleError> {
    if !console.sessions.csrf_matches(&viewer.session, &form.csrf) {
        return Err(ConsoleError::Forged);
    }
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(ConsoleError::invalid("approval", "is not an approval ID"));
    }
    super::check_id("team", &form.team)?;
    if form.team.is_empty() || !viewer.may_see(&form.team) {
        return Err(ConsoleError::TeamForbidden(form.team));
    }
    let decision = match form.decision.as_str() {
        "approve" => Decision::Approve,
        "reject" => Decision::Reject,
        _ => {
            return Err(ConsoleError::invalid(
                "decision",
                "must be approve or reject",
            ));
        }
    };
    if form.reason.len() > MAX_REASON {
        return Err(ConsoleError::invalid(
            "reason",
            "must be at most 4096 bytes",
        ));
    }
    let ctx = context(&console, &viewer, &form.team);
    let shown = console
        .pipeline
        .decide_approval(&viewer.session.principal, &ctx, &id, decision, &form.reason)
        .await?;
    let outcome = shown.approval.status.as_str().to_ascii_lowercase();
    let to = format!(
        "/console/tools?team={}&decided={id}&outcome={outcome}",
        form.team
    );
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response())
}

/// The decision's call context: the console's principal acting for `team`
/// under a new trace ID.
fn context(console: &Console, viewer: &Viewer, team: &str) -> CallContext {
    let started = tokio::time::Instant::now();
    CallContext {
        team_id: team.to_owned(),
        user_id: String::new(),
        trace_id: trace_id::generate(),
        channel: Channel::System,
        priority: Priority::Interactive,
        started,
        started_at_ms: chrono::Utc::now().timestamp_millis(),
        deadline: instant_after(started, console.pipeline.config().server.default_timeout),
        budget_usd: None,
        traceparent: None,
        principal: viewer.session.principal.name.clone(),
    }
}
