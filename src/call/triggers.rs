//! The triggers' relay (SPEC §16): every replica takes fired triggers from
//! the outbox (written with their event, `audit::outbox`) under a lease and
//! starts each trigger's tool ASYNC through the tools entry point, as the
//! principal `trigger:<name>` with the trigger's role, for the trigger's
//! `team` (else the event's, as the outbox row says).
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
    tools::{
        Denial,
        invocations::{self, Mode},
    },
};
use std::time::Duration;
use tokio::{sync::watch, time::Instant};

/// Rows taken in one round, at most.
const BATCH: i64 = 20;
/// How long a row is the relay's that took it (renewed just before its
/// start, which takes at most `START_WITHIN`); then another may take it.
const LEASE: Duration = Duration::from_secs(60);
/// How long starting one trigger's invocation may take.
const START_WITHIN: Duration = Duration::from_secs(30);
/// Takes of a row that could not start yet before it ends FAILED.
const MAX_ATTEMPTS: i64 = 10;
/// How long ended rows are kept, and how often they are purged.
const KEEP_ENDED: Duration = Duration::from_secs(7 * 24 * 3600);
const PURGE_EVERY: Duration = Duration::from_secs(3600);

/// How one taken row ends.
enum Ended {
    /// Started (or found started by an earlier attempt) as this invocation.
    Fired(String),
    /// Refused for good: the stable reason.
    Failed(String),
    /// Not now (the store, overload, a quota, a tool not loaded yet): the
    /// lease runs out and it is taken again, up to `MAX_ATTEMPTS` times.
    Later(String),
}

/// Relays fired triggers every `[trigger_relay] poll_interval` until `stop`.
pub async fn run_relay(pipeline: Pipeline, mut stop: watch::Receiver<bool>) {
    let every = pipeline.config().trigger_relay.poll_interval;
    let mut purged = Instant::now();
    loop {
        relay(&pipeline).await;
        if purged.elapsed() >= PURGE_EVERY {
            purged = Instant::now();
            purge(&pipeline).await;
        }
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
}

/// Deletes the rows ended more than `KEEP_ENDED` ago.
async fn purge(pipeline: &Pipeline) {
    let before = now_ms().saturating_sub(millis(KEEP_ENDED));
    match outbox::purge(pipeline.store(), before).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(rows = n, "purged ended trigger outbox rows"),
        Err(e) => tracing::error!(error = %e, "purging the trigger outbox failed"),
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One round: takes due rows, batch after batch, and ends each.
async fn relay(pipeline: &Pipeline) {
    loop {
        let now = now_ms();
        let lease = now.saturating_add(millis(LEASE));
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

async fn fire(pipeline: &Pipeline, mut row: Pending) {
    // Its own lease from now: the batch's may have run down behind earlier rows.
    let until = now_ms().saturating_add(millis(LEASE));
    match outbox::renew(pipeline.store(), &row.id, row.lease_until_ms, until).await {
        Ok(true) => row.lease_until_ms = until,
        Ok(false) => return,
        Err(e) => {
            tracing::error!(trigger = %row.trigger, error = %e, "renewing a trigger's lease failed");
            return;
        }
    }
    let trace_id = row
        .fields
        .get("trace_id")
        .and_then(|v| v.as_str())
        .filter(|t| !t.is_empty())
        .map_or_else(crate::telemetry::trace_id::generate, str::to_owned);
    let ended = match start(pipeline, &row, &trace_id).await {
        Ended::Later(why) if row.attempts >= MAX_ATTEMPTS => Ended::Failed(why),
        ended => ended,
    };
    let (statement, decision, reason, invocation) = match ended {
        Ended::Later(why) => {
            tracing::warn!(trigger = %row.trigger, attempts = row.attempts, reason = %why, "a trigger could not start yet; it is taken again");
            return;
        }
        Ended::Fired(id) => (
            outbox::fired(&row, &id, now_ms()),
            "allow",
            String::new(),
            id,
        ),
        Ended::Failed(why) => (
            outbox::failed(&row, &why, now_ms()),
            "deny",
            why,
            String::new(),
        ),
    };
    let mut event = AuditEvent::new(
        &row.team_id,
        &format!("trigger:{}", row.trigger),
        &trace_id,
        Category::Workflow,
        "trigger.fired",
        &row.tool,
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

/// Starts `row`'s tool, unless an earlier attempt did. What it starts was
/// fixed when its event happened; only disabling the trigger stops it.
async fn start(pipeline: &Pipeline, row: &Pending, trace_id: &str) -> Ended {
    let disabled = pipeline
        .config()
        .triggers
        .get(&row.trigger)
        .is_some_and(|t| !t.enabled);
    if disabled {
        return Ended::Failed("TRIGGER_DISABLED".into());
    }
    let Some(role) = Role::parse(&row.role).filter(|_| !row.tool.is_empty()) else {
        return Ended::Failed("TRIGGER_ROW_INVALID".into());
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
            return Ended::Later("STORAGE_UNAVAILABLE".into());
        }
    }
    let name = format!("trigger:{}", row.trigger);
    let principal = Principal {
        name: name.clone(),
        teams: TeamScope::from_list([row.team_id.as_str()]),
        role,
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
        tool: row.tool.clone(),
        input: row.input.clone(),
        mode: Mode::Async,
        idempotency_key: Some(key(row)),
        agent: None,
        call_id: None,
        approved: None,
    };
    match pipeline.run(ctx, InvokeTool { principal, request }).await {
        Ok((started, _)) => Ended::Fired(started.invocation_id),
        Err(CallError::ToolDenied(denial)) => refused(&denial),
        Err(CallError::Invalid(_)) => Ended::Failed("INVALID_INPUT".into()),
        Err(e) => {
            tracing::debug!(trigger = %row.trigger, error = ?e, "a trigger's tool did not start");
            Ended::Later(stable(&e).into())
        }
    }
}

/// The stable reason of a call that may pass when tried again.
fn stable(e: &CallError) -> &'static str {
    match e {
        CallError::Quota(_) => "QUOTA_EXCEEDED",
        CallError::Budget { .. } | CallError::ToolBudget { .. } => "BUDGET_EXCEEDED",
        CallError::Overloaded => "OVERLOADED",
        CallError::Storage(_) => "STORAGE_UNAVAILABLE",
        _ => "START_FAILED",
    }
}

/// A denial that may pass later (a quota, the cluster store, a tool not
/// loaded yet after a start) is tried again; the rest end the row.
fn refused(denial: &Denial) -> Ended {
    let reason = denial.reason().to_owned();
    match denial {
        Denial::Quota { .. } | Denial::StoreUnavailable | Denial::NotFound(_) => {
            Ended::Later(reason)
        }
        _ => Ended::Failed(reason),
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}
