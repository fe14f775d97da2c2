//! The triggers' relay (SPEC §16): every replica takes fired triggers from
//! the outbox (written with their event, `audit::outbox`) under a lease and
//! starts each trigger's tool ASYNC through the tools entry point, as the
//! principal `trigger:<name>` with the trigger's role, for the event's team.
//! Delivery is at least once; the idempotency key `trigger:<outbox id>`
//! makes a replay answer the first invocation, so a webhook never sees one
//! trigger twice. Each row ends with its `trigger.fired` event in one
//! ledger transaction.

use super::{CallContext, CallError, Pipeline, tool::InvokeTool, tool::ToolRequest};
use crate::{
    audit::{
        AuditEvent, Category,
        outbox::{self, Pending},
    },
    auth::{Principal, TeamScope},
    domain::Role,
    tools::invocations::{self, Mode},
};
use std::time::Duration;
use tokio::{sync::watch, time::Instant};

/// Rows taken in one round, at most.
const BATCH: i64 = 100;
/// How long a taken row is the taker's; then another relay may take it.
const LEASE: Duration = Duration::from_secs(60);
/// How long starting one trigger's invocation may take.
const START_WITHIN: Duration = Duration::from_secs(30);

/// How one taken row ends.
enum Ended {
    /// Started (or found started by an earlier attempt) as this invocation.
    Fired(String),
    /// Refused for good: the stable reason.
    Failed(String),
    /// Not now (the store, overload): the lease runs out and it is taken again.
    Later,
}

/// Relays fired triggers every `[trigger_relay] poll_interval` until `stop`.
pub async fn run_relay(pipeline: Pipeline, mut stop: watch::Receiver<bool>) {
    let every = pipeline.config().trigger_relay.poll_interval;
    loop {
        relay(&pipeline).await;
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

/// One round: takes due rows, batch after batch, and ends each.
async fn relay(pipeline: &Pipeline) {
    loop {
        let now = now_ms();
        let lease = now.saturating_add(i64::try_from(LEASE.as_millis()).unwrap_or(i64::MAX));
        let taken = match outbox::take(pipeline.store(), now, lease, BATCH).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::error!(error = %e, "taking fired triggers from the outbox failed");
                return;
            }
        };
        let full = i64::try_from(taken.len()).unwrap_or(i64::MAX) >= BATCH;
        for row in taken {
            fire(pipeline, row).await;
        }
        if !full {
            return;
        }
    }
}

async fn fire(pipeline: &Pipeline, row: Pending) {
    let trace_id = row
        .fields
        .get("trace_id")
        .and_then(|v| v.as_str())
        .filter(|t| !t.is_empty())
        .map_or_else(crate::telemetry::trace_id::generate, str::to_owned);
    let (statement, decision, reason, invocation) = match start(pipeline, &row, &trace_id).await {
        Ended::Later => return,
        Ended::Fired(id) => (
            outbox::fired(&row.id, &id, now_ms()),
            "allow",
            String::new(),
            id,
        ),
        Ended::Failed(why) => (
            outbox::failed(&row.id, &why, now_ms()),
            "deny",
            why,
            String::new(),
        ),
    };
    let tool = pipeline
        .config()
        .triggers
        .get(&row.trigger)
        .map_or("", |t| t.tool.as_str());
    let mut event = AuditEvent::new(
        &row.team_id,
        &format!("trigger:{}", row.trigger),
        &trace_id,
        Category::Workflow,
        "trigger.fired",
        tool,
    )
    .decided(decision, &reason)
    .with_input(&serde_json::Value::Object(row.fields.clone()));
    event.idempotency_key = Some(key(&row));
    match pipeline.guarded_write(&row.team_id, statement, event).await {
        Ok(true) => {
            tracing::info!(trigger = %row.trigger, team = %row.team_id, invocation = %invocation, %trace_id, decision, "trigger fired");
        }
        // Another relay ended it first (its lease ran out under this one).
        Ok(false) => {}
        Err(e) => {
            tracing::error!(trigger = %row.trigger, error = %e, "recording a fired trigger failed; it is taken again");
        }
    }
}

/// The idempotency key of the invocation a row starts.
fn key(row: &Pending) -> String {
    format!("trigger:{}", row.id)
}

/// Starts `row`'s tool, unless an earlier attempt did.
async fn start(pipeline: &Pipeline, row: &Pending, trace_id: &str) -> Ended {
    let Some(trigger) = pipeline.config().triggers.get(&row.trigger) else {
        return Ended::Failed("TRIGGER_REMOVED".into());
    };
    if row.team_id.is_empty() {
        return Ended::Failed("TENANT_REQUIRED".into());
    }
    // The key's window may have turned since an earlier attempt: look first.
    match invocations::by_key(pipeline.store(), &row.team_id, &key(row)).await {
        Ok(Some(id)) => return Ended::Fired(id),
        Ok(None) => {}
        Err(e) => {
            tracing::error!(trigger = %row.trigger, error = %e, "reading a trigger's invocation failed");
            return Ended::Later;
        }
    }
    let name = format!("trigger:{}", row.trigger);
    let principal = Principal {
        name: name.clone(),
        teams: TeamScope::from_list([row.team_id.as_str()]),
        role: Role::parse(&trigger.role).unwrap_or(Role::Caller),
    };
    let now = Instant::now();
    let ctx = CallContext {
        team_id: row.team_id.clone(),
        user_id: String::new(),
        trace_id: trace_id.to_owned(),
        channel: crate::domain::Channel::System,
        priority: crate::domain::Priority::Background,
        started: now,
        started_at_ms: now_ms(),
        deadline: now + START_WITHIN,
        budget_usd: None,
        traceparent: None,
        principal: name,
    };
    let request = ToolRequest {
        tool: trigger.tool.clone(),
        input: outbox::render(&trigger.input, &row.fields),
        mode: Mode::Async,
        idempotency_key: Some(key(row)),
        agent: None,
        call_id: None,
        approved: None,
    };
    match pipeline.run(ctx, InvokeTool { principal, request }).await {
        Ok((started, _)) => Ended::Fired(started.invocation_id),
        Err(CallError::ToolDenied(denial)) => Ended::Failed(denial.reason().to_owned()),
        Err(CallError::Invalid(_)) => Ended::Failed("INVALID_INPUT".into()),
        Err(CallError::Quota(_) | CallError::Budget { .. } | CallError::ToolBudget { .. }) => {
            Ended::Failed("QUOTA_EXCEEDED".into())
        }
        Err(e) => {
            tracing::warn!(trigger = %row.trigger, error = ?e, "starting a trigger's tool failed; it is taken again");
            Ended::Later
        }
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
