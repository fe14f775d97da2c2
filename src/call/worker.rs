//! The ASYNC worker (SPEC §9.4): runs the invocations the entry point
//! accepted, from their durable rows. A row is taken with a lease; a
//! process that dies mid-run lets its lease expire and the row is taken
//! again and run again under the same idempotency key (a webhook that saw
//! the first POST can tell). A SYNC invocation whose process died is
//! marked FAILED (`INTERRUPTED`): its caller is gone. Nothing is left
//! RUNNING for ever, nothing is lost.

use super::{
    Pipeline,
    tool::{judge, run},
};
use crate::{
    audit::{AuditEvent, Category},
    telemetry::metrics,
    tools::{
        Kind, Status,
        invocations::{self, Invocation, Outcome},
    },
    usage::ledger::Op,
};
use std::time::Duration;
use tokio::{sync::watch, time::Instant};

/// Invocations taken at once.
const BATCH: i64 = 16;

/// Runs until `stop`.
pub async fn run_worker(pipeline: Pipeline, mut stop: watch::Receiver<bool>) {
    let settings = pipeline.config().tool_worker.clone();
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let slack = duration_ms(settings.lease_slack);
        let store = pipeline.store();
        match invocations::fail_interrupted(store, now).await {
            Ok(failed) => {
                for inv in failed {
                    tracing::warn!(invocation = %inv.id, tool = %inv.tool, trace_id = %inv.trace_id, "a SYNC tool invocation was interrupted by a stop; marked FAILED");
                    audit(&pipeline, &inv, "error", "INTERRUPTED", None, None).await;
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "looking for interrupted tool invocations failed")
            }
        }
        let work = match invocations::take_work(store, now, slack, BATCH).await {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "taking ASYNC tool invocations failed");
                Vec::new()
            }
        };
        let idle = work.is_empty();
        let runs = work.into_iter().map(|inv| execute(&pipeline, inv));
        futures::future::join_all(runs).await;
        if idle {
            tokio::select! {
                () = tokio::time::sleep(settings.poll_interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        } else if *stop.borrow() {
            return;
        }
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Runs one taken invocation and records how it ended.
async fn execute(pipeline: &Pipeline, inv: Invocation) {
    let tool_id = format!("{}@{}", inv.tool, inv.version);
    let outcome = match pipeline.toolbox().registry.lookup(&tool_id) {
        Err(_) => Outcome {
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
        },
        Ok(tool) => {
            let started = Instant::now();
            let key = matches!(tool.kind, Kind::Http(_)).then_some(inv.idempotency_key.as_str());
            let (result, attempts, execution_id) = run(
                pipeline,
                &tool,
                &inv.input,
                key,
                &inv.trace_id,
                started + tool.timeout,
            )
            .await;
            let took = started.elapsed();
            let (status, output, error) = judge(&tool, result);
            metrics::tool_invocation(&tool.name, status.as_str(), took);
            Outcome {
                status,
                output,
                error,
                // Charged at its estimate when accepted (docs/tools.md).
                cost_micros: inv.estimated_cost_micros,
                duration_ms: duration_ms(took),
                execution_id,
                attempts: inv.attempts + i64::from(attempts),
            }
        }
    };
    if let Err(e) = invocations::finish(pipeline.store(), &inv.id, &outcome).await {
        // The lease expires and the invocation runs again.
        tracing::error!(invocation = %inv.id, error = %e, "recording an ASYNC tool invocation failed");
        return;
    }
    let decision = if outcome.status == Status::Succeeded {
        "ok"
    } else {
        "error"
    };
    let reason = outcome.error.as_ref().map_or("", |e| e.code.as_str());
    audit(
        pipeline,
        &inv,
        decision,
        reason,
        outcome.output.as_ref(),
        Some(outcome.duration_ms),
    )
    .await;
}

/// The result event of an invocation the worker finished.
async fn audit(
    pipeline: &Pipeline,
    inv: &Invocation,
    decision: &str,
    reason: &str,
    output: Option<&serde_json::Value>,
    duration_ms: Option<i64>,
) {
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
    event.actual_cost_micros = Some(inv.estimated_cost_micros);
    event.idempotency_key = Some(inv.idempotency_key.clone());
    if let Err(e) = pipeline.ledger().submit(Op::Audit(vec![event])).await {
        tracing::error!(invocation = %inv.id, error = %e, "auditing an ASYNC tool result failed");
    }
}
