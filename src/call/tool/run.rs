//! The entry point's last steps: running a tool within its deadline, and
//! judging what it returned against its output schema. The ASYNC worker
//! (`call::worker`) runs queued invocations through the same two.

use crate::{
    telemetry::metrics,
    tools::{Failure, Kind, Status, Tool, builtin, schema},
};
use serde_json::Value;
use std::sync::Arc;
use tokio::time::Instant;

/// Runs `tool` until `deadline`: its output or why not, the POSTs made,
/// and a workflow's execution ID. The entry point's last step before the
/// result; the ASYNC worker's too.
pub(crate) async fn run(
    pipeline: &crate::call::Pipeline,
    tool: &Arc<Tool>,
    input: &Value,
    idempotency_key: Option<&str>,
    trace_id: &str,
    deadline: Instant,
) -> (Result<Value, Failure>, u32, Option<String>) {
    let timed_out = || Failure::new("TIMED_OUT", "the tool did not finish within its timeout");
    let tools = pipeline.toolbox();
    match &tool.kind {
        Kind::Builtin => {
            let health = || pipeline.health();
            (builtin::run(&tool.name, input, health), 1, None)
        }
        Kind::Mcp {
            server,
            tool: remote,
        } => {
            let timeout = deadline.saturating_duration_since(Instant::now());
            (
                tools.servers.call(server, remote, input, timeout).await,
                1,
                None,
            )
        }
        Kind::Http(http) => {
            let key = idempotency_key.unwrap_or_default();
            let name = tool.name.clone();
            let called =
                crate::tools::http::call(&tools.http, http, input, key, trace_id, deadline, || {
                    metrics::workflow_retry(&name)
                })
                .await;
            match called {
                Ok(a) => (Ok(a.output), a.attempts, a.execution_id),
                // Out of time, whatever the last POST said.
                Err(f) if Instant::now() >= deadline => {
                    (Err(timed_out()), f.attempts, f.execution_id)
                }
                Err(f) => (Err(f.failure), f.attempts, f.execution_id),
            }
        }
    }
}

/// What a run comes to: SUCCEEDED with its output when the output fits
/// the tool's output schema, FAILED (`OUTPUT_INVALID`) when it does not,
/// TIMED_OUT or FAILED with the run's failure.
pub(crate) fn judge(
    tool: &Tool,
    result: Result<Value, Failure>,
) -> (Status, Option<Value>, Option<Failure>) {
    match result {
        Ok(output) => match tool.output.as_ref().map(|v| schema::violations(v, &output)) {
            Some(v) if !v.is_empty() => (
                Status::Failed,
                None,
                Some(Failure::new(
                    "OUTPUT_INVALID",
                    format!(
                        "the output breaks the tool's output_schema at {}",
                        if v[0].0.is_empty() {
                            "its root"
                        } else {
                            &v[0].0
                        }
                    ),
                )),
            ),
            _ => (Status::Succeeded, Some(output), None),
        },
        Err(f) if f.code == "TIMED_OUT" => (Status::TimedOut, None, Some(f)),
        Err(f) => (Status::Failed, None, Some(f)),
    }
}
