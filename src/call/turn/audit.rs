//! A turn's own audit events (SPEC §10, §14.3): its start and its end
//! (`agent.turn.complete`, or `agent.turn.failed`), digests and counts only.
//! Each tool call audits itself in the entry point, each model call in its
//! settlement (`call::audit`).

use super::super::{CallContext, CallError, Pipeline};
use crate::{
    agent::conversations,
    audit::{AuditEvent, Category},
    auth::Principal,
    domain::{ChatMessage, ToolCall},
};
use tokio::time::Instant;

/// `agent.turn.start`: the conversation and a digest of the message.
pub(super) async fn start(
    pipeline: &Pipeline,
    ctx: &CallContext,
    principal: &Principal,
    agent: &str,
    conversation: &str,
    message: Option<&ChatMessage>,
) {
    let input = serde_json::json!({
        "conversation_id": conversation,
        "message": message.map_or("", |m| m.content.as_str()),
    });
    let event = AuditEvent::new(
        &ctx.team_id,
        &principal.name,
        &ctx.trace_id,
        Category::Agent,
        "agent.turn.start",
        agent,
    )
    .decided("allow", "")
    .with_input(&input);
    if let Err(e) = pipeline
        .ledger()
        .enqueue(crate::usage::ledger::Op::Audit(vec![event]))
        .await
    {
        tracing::error!(trace_id = %ctx.trace_id, error = %e, "auditing a turn's start failed");
    }
}

/// `agent.turn.complete`: digests and counts, written in the transaction
/// that stores the turn ([`super::lease::store_turn`]).
pub(super) fn complete(
    ctx: &CallContext,
    principal: &Principal,
    agent: &str,
    record: &conversations::TurnRecord,
    text: &str,
    started: Instant,
) -> AuditEvent {
    // Counts travel in the reason; the text only as its digest.
    let reason = format!(
        "{} iterations={} tool_calls={} suggestions={}",
        record.stop_reason,
        record.iterations,
        record.tool_calls,
        record.memory_suggestions.len()
    );
    turn_end(
        ctx,
        principal,
        agent,
        ("agent.turn.complete", "ok", &reason),
        started,
    )
    .with_output(&serde_json::json!({ "text": text }))
}

/// `agent.turn.failed` with the failure's stable reason, durable before
/// the failure is answered (the turn's queued settlements, its model
/// calls' events among them, commit before it).
pub(super) async fn failed(
    pipeline: &Pipeline,
    ctx: &CallContext,
    principal: &Principal,
    agent: &str,
    reason: &str,
    started: Instant,
) {
    let end = ("agent.turn.failed", "error", reason);
    let event = turn_end(ctx, principal, agent, end, started);
    if let Err(e) = submit(pipeline, event).await {
        tracing::error!(trace_id = %ctx.trace_id, error = ?e, "auditing a failed turn failed");
    }
}

/// A turn's end: its `(action, decision, reason)` and duration.
fn turn_end(
    ctx: &CallContext,
    principal: &Principal,
    agent: &str,
    (action, decision, reason): (&str, &str, &str),
    started: Instant,
) -> AuditEvent {
    let mut event = AuditEvent::new(
        &ctx.team_id,
        &principal.name,
        &ctx.trace_id,
        Category::Agent,
        action,
        agent,
    )
    .decided(decision, reason);
    event.duration_ms = Some(i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX));
    event
}

/// `tool.denied` for a call the turn refused before the entry point (its
/// budget spent), durable and counted like the entry point's own.
pub(super) async fn refused(
    pipeline: &Pipeline,
    ctx: &CallContext,
    principal: &Principal,
    call: &ToolCall,
    reason: &'static str,
) {
    crate::telemetry::metrics::tool_denial(reason);
    let event = crate::call::tool::denial(
        &ctx.team_id,
        &principal.name,
        &ctx.trace_id,
        &call.name,
        &crate::agent::turn::outcomes::arguments(call),
        reason,
    );
    if let Err(e) = submit(pipeline, event).await {
        tracing::error!(trace_id = %ctx.trace_id, error = ?e, "auditing a tool denial failed");
    }
}

/// Appends `event` to the audit log and waits until it is durable.
async fn submit(pipeline: &Pipeline, event: AuditEvent) -> Result<(), CallError> {
    pipeline
        .ledger()
        .submit(crate::usage::ledger::Op::Audit(vec![event]))
        .await
        .map(drop)
        .map_err(|e| CallError::Storage(e.to_string()))
}
