//! The ASYNC worker (SPEC §9.4): runs accepted invocations from their rows,
//! each under a lease; a row whose process died runs again under the same
//! idempotency key, a SYNC one is marked FAILED (`INTERRUPTED`). An
//! invocation at `quota.max_concurrent` goes back to PENDING, never refused
//! (its hour was counted when accepted).

use super::{
    CallContext, Pipeline,
    tool::{callback_until, judge, run},
};
use crate::{
    audit::{AuditEvent, Category},
    config::tools::ToolWorkerConfig,
    telemetry::metrics,
    tools::{
        Kind, Status, Tool,
        executor::Ran,
        invocations::{self, Invocation, Outcome, Taken},
        quota::Slot,
    },
    usage::ledger::Op,
};
use std::{sync::Arc, time::Duration};
use tokio::{
    sync::watch,
    task::{JoinError, JoinSet},
    time::Instant,
};

/// Invocations running at once on this replica.
const BATCH: usize = 16;

/// Invocations one round may take and put back (their tool reached its
/// `max_concurrent` after the look at the quotas): bounds a round's writes.
const MAX_WAITING: usize = 4 * BATCH;

/// Runs until `stop`, then lets the runs under way record their ends.
pub async fn run_worker(pipeline: Pipeline, mut stop: watch::Receiver<bool>) {
    let settings = pipeline.config().tool_worker.clone();
    // A run per task: a slow webhook holds up no other, a freed slot is used at once.
    let mut running = JoinSet::new();
    loop {
        if *stop.borrow() {
            break;
        }
        fail_interrupted(&pipeline).await;
        pipeline.expire_callbacks().await;
        start_work(&pipeline, &settings, &mut running).await;
        // The next round when a run ends or new work may have come: never at
        // once, so invocations waiting for a slot are not retaken in a busy loop.
        tokio::select! {
            Some(ended) = running.join_next(), if !running.is_empty() => {
                report(ended);
                while let Some(ended) = running.try_join_next() {
                    report(ended);
                }
            }
            () = tokio::time::sleep(settings.poll_interval) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    while let Some(ended) = running.join_next().await {
        report(ended);
    }
}

/// Marks FAILED the SYNC invocations whose process died mid-run.
async fn fail_interrupted(pipeline: &Pipeline) {
    let now = chrono::Utc::now().timestamp_millis();
    match invocations::fail_interrupted(pipeline.store(), now).await {
        Ok(failed) => {
            for inv in failed {
                tracing::warn!(invocation = %inv.id, tool = %inv.tool, trace_id = %inv.trace_id, "a SYNC tool invocation was interrupted by a stop; marked FAILED");
                audit(pipeline, &inv, "error", "INTERRUPTED", None, None).await;
            }
        }
        Err(e) => {
            tracing::error!(error = %e, "looking for interrupted tool invocations failed")
        }
    }
}

/// Takes work into the room `running` leaves, passing over pairs at their
/// `max_concurrent` so a busy tool never holds up others; one that filled
/// up after the look waits, leased, and goes back to PENDING.
async fn start_work(pipeline: &Pipeline, settings: &ToolWorkerConfig, running: &mut JoinSet<()>) {
    let slack = duration_ms(settings.lease_slack);
    let toolbox = pipeline.toolbox();
    let mut busy = busy(pipeline);
    let mut waiting = Vec::new();
    while running.len() < BATCH && waiting.len() < MAX_WAITING {
        let room = BATCH - running.len();
        let now = chrono::Utc::now().timestamp_millis();
        let limit = i64::try_from(room).unwrap_or(i64::MAX);
        let work = match invocations::take_work(pipeline.store(), now, slack, limit, &busy).await {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "taking ASYNC tool invocations failed");
                break;
            }
        };
        let drained = work.len() < room;
        let unknown = |t: &Taken| {
            let id = format!("{}@{}", t.invocation.tool, t.invocation.version);
            toolbox.registry.lookup(&id).is_err()
        };
        // Registered on another replica since this one's last refresh.
        if work.iter().any(unknown)
            && let Err(e) = pipeline.refresh_tools().await
        {
            tracing::error!(error = %e, "reloading the registered tools failed");
        }
        for Taken {
            invocation: inv,
            lease_until_ms: lease,
        } in work
        {
            match toolbox
                .registry
                .lookup(&format!("{}@{}", inv.tool, inv.version))
            {
                // Registered, but not loadable here (a secret variable or a
                // task this replica lacks): left leased, for a replica that
                // can, or for this one once its lease runs out.
                Err(_)
                    if toolbox
                        .loader
                        .is_unloadable(&format!("{}@{}", inv.tool, inv.version)) =>
                {
                    tracing::warn!(invocation = %inv.id, tool = %inv.tool, "an ASYNC invocation of a registered tool this replica cannot load is left for another");
                }
                // Recorded as such: nothing to wait for.
                Err(_) => {
                    running.spawn(execute(pipeline.clone(), inv, lease, None));
                }
                Ok(tool) => match toolbox
                    .quotas
                    .try_running(&inv.team_id, &tool.id(), &tool.quota, tool.timeout)
                    .await
                {
                    Some(slot) => {
                        let ready = Some((tool, slot));
                        running.spawn(execute(pipeline.clone(), inv, lease, ready));
                    }
                    None => {
                        let pair = (inv.team_id.clone(), inv.tool.clone(), inv.version.clone());
                        // Newest first: past `MAX_BUSY` pairs, the newest are passed over now.
                        if !busy.contains(&pair) {
                            busy.insert(0, pair);
                        }
                        waiting.push((inv, lease));
                    }
                },
            }
        }
        if drained {
            break;
        }
    }
    put_back(pipeline, waiting).await;
}

/// The `(team, tool, version)` pairs running at their `max_concurrent`.
fn busy(pipeline: &Pipeline) -> Vec<(String, String, String)> {
    let toolbox = pipeline.toolbox();
    toolbox
        .quotas
        .running()
        .into_iter()
        .filter_map(|(team, id, running)| {
            let tool = toolbox.registry.lookup(&id).ok()?;
            let full = tool.quota.max_concurrent.is_some_and(|max| running >= max);
            full.then(|| (team, tool.name.clone(), tool.version.to_string()))
        })
        .collect()
}

/// Returns invocations taken but not started to PENDING, lease released.
async fn put_back(pipeline: &Pipeline, waiting: Vec<(Invocation, i64)>) {
    if waiting.is_empty() {
        return;
    }
    tracing::debug!(
        waiting = waiting.len(),
        "ASYNC tool invocations wait for a concurrency slot"
    );
    for (inv, lease) in &waiting {
        if let Err(e) = invocations::release(pipeline.store(), &inv.id, *lease).await {
            // Its lease runs out and a later round takes it.
            tracing::error!(invocation = %inv.id, error = %e, "putting back an ASYNC tool invocation failed");
        }
    }
}

/// Logs a run that panicked (its lease expires and it runs again).
fn report(ended: Result<(), JoinError>) {
    if let Err(e) = ended
        && e.is_panic()
    {
        tracing::error!(error = %e, "an ASYNC tool invocation's run panicked");
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Runs one taken invocation (`ready` is `None` once the tool left the
/// registry) and records its end unless another run owns the row.
async fn execute(
    pipeline: Pipeline,
    inv: Invocation,
    lease: i64,
    ready: Option<(Arc<Tool>, Slot)>,
) {
    let pipeline = &pipeline;
    let outcome = match ready {
        None => Outcome {
            status: Status::Failed,
            output: None,
            error: Some(crate::tools::Failure::new(
                "TOOL_NOT_FOUND",
                "the tool is no longer in the registry",
            )),
            cost_micros: inv.estimated_cost_micros,
            duration_ms: 0,
            execution_id: None,
            attempts: inv.attempts,
            callback_until_ms: None,
        },
        Some((tool, slot)) => {
            let started = Instant::now();
            // Within the timeout its lease was sized by: a run past its lease
            // would be taken for dead and run again beside it.
            let accepted = Duration::from_millis(u64::try_from(inv.timeout_ms).unwrap_or(u64::MAX));
            let deadline = started + tool.timeout.min(accepted);
            let ctx = context(&inv, deadline);
            let Ran {
                result,
                attempts,
                execution_id,
                cost_micros,
            } = run(pipeline, &ctx, &tool, &inv.input, Some(&inv), deadline).await;
            drop(slot);
            let took = started.elapsed();
            let (status, output, error) = judge(&tool, result);
            let callback_until_ms = callback_until(&tool, status);
            metrics::tool_invocation(&tool.name, status.as_str(), took);
            Outcome {
                status,
                output,
                error,
                // Charged at its estimate when accepted (docs/tools.md); a
                // task tool's model call was metered as a call of its own.
                cost_micros: cost_micros.unwrap_or(inv.estimated_cost_micros),
                duration_ms: duration_ms(took),
                execution_id,
                attempts: inv.attempts + i64::from(attempts),
                callback_until_ms,
            }
        }
    };
    let decision = super::tool::decision(outcome.status);
    let mut inv = inv;
    inv.cost_micros = Some(outcome.cost_micros);
    let reason = outcome.error.as_ref().map_or("", |e| e.code.as_str());
    let event = result_event(
        pipeline,
        &inv,
        decision,
        reason,
        outcome.output.as_ref(),
        Some(outcome.duration_ms),
    );
    // The row's end and its result event (with the triggers it fires) in one
    // transaction: a crash never leaves one without the other.
    let end = invocations::end_run(&inv.id, lease, &outcome, now_ms());
    match pipeline
        .guarded_write(&inv.team_id, end, event.clone())
        .await
    {
        Ok(true) => return,
        // The workflow called back before its acceptance was recorded:
        // the callback ended the row; the acceptance is still audited.
        Ok(false) if outcome.status == Status::AwaitingCallback => {}
        Ok(false) => {
            tracing::warn!(invocation = %inv.id, tool = %inv.tool, trace_id = %inv.trace_id, "an ASYNC tool invocation ended after its lease ran out and another run took it; its end is not recorded over that run's");
        }
        Err(e) => {
            // The lease expires and the invocation runs again.
            tracing::error!(invocation = %inv.id, error = %e, "recording an ASYNC tool invocation failed");
            return;
        }
    }
    // The run happened, so it is audited; the row keeps the owning run's end.
    if let Err(e) = pipeline.ledger().submit(Op::Audit(vec![event])).await {
        tracing::error!(invocation = %inv.id, error = %e, "auditing an ASYNC tool result failed");
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The envelope an ASYNC invocation runs in: its team, principal and trace,
/// until `deadline`.
fn context(inv: &Invocation, deadline: Instant) -> CallContext {
    CallContext {
        team_id: inv.team_id.clone(),
        user_id: String::new(),
        trace_id: inv.trace_id.clone(),
        channel: crate::domain::Channel::System,
        priority: crate::domain::Priority::Background,
        started: Instant::now(),
        started_at_ms: chrono::Utc::now().timestamp_millis(),
        deadline,
        budget_usd: None,
        traceparent: None,
        principal: inv.principal.clone(),
    }
}

/// The result event of an invocation the worker (or its callback) ended.
async fn audit(
    pipeline: &Pipeline,
    inv: &Invocation,
    decision: &str,
    reason: &str,
    output: Option<&serde_json::Value>,
    duration_ms: Option<i64>,
) {
    let event = result_event(pipeline, inv, decision, reason, output, duration_ms);
    if let Err(e) = pipeline.ledger().submit(Op::Audit(vec![event])).await {
        tracing::error!(invocation = %inv.id, error = %e, "auditing an ASYNC tool result failed");
    }
}

/// `workflow.result` (a webhook's) or `tool.result` of a stored invocation.
pub(super) fn result_event(
    pipeline: &Pipeline,
    inv: &Invocation,
    decision: &str,
    reason: &str,
    output: Option<&serde_json::Value>,
    duration_ms: Option<i64>,
) -> AuditEvent {
    let workflow = pipeline
        .toolbox()
        .registry
        .lookup(&format!("{}@{}", inv.tool, inv.version))
        .is_ok_and(|t| matches!(t.kind, Kind::Http(_)));
    let (category, action) = if workflow {
        (Category::Workflow, "workflow.result")
    } else {
        (Category::Tool, "tool.result")
    };
    let mut event = AuditEvent::new(
        &inv.team_id,
        &inv.principal,
        &inv.trace_id,
        category,
        action,
        &format!("{}@{}", inv.tool, inv.version),
    )
    .decided(decision, reason)
    .with_input(&inv.input);
    if let Some(out) = output {
        event = event.with_output(out);
    }
    event.duration_ms = duration_ms;
    event.estimated_cost_micros = Some(inv.estimated_cost_micros);
    event.actual_cost_micros = Some(inv.cost_micros.unwrap_or(inv.estimated_cost_micros));
    event.idempotency_key = Some(inv.idempotency_key.clone());
    event
}
