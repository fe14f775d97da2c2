//! The entry point's last steps: running a tool within its deadline, and
//! judging what it returned against its output schema. The ASYNC worker
//! (`call::worker`) runs queued invocations through the same two.

use crate::tools::{
    Failure, Status, Tool,
    executor::{Ran, Run},
    schema,
};
use serde_json::Value;
use tokio::time::Instant;

/// Runs `tool` until `deadline` with its kind's executor, `system.health`
/// answered from the pipeline. The entry point's last step before the
/// result; the ASYNC worker's too.
pub(crate) async fn run(
    pipeline: &crate::call::Pipeline,
    tool: &Tool,
    input: &Value,
    idempotency_key: Option<&str>,
    trace_id: &str,
    deadline: Instant,
) -> Ran {
    let health = || pipeline.health();
    let run = Run {
        tool,
        input,
        idempotency_key,
        trace_id,
        deadline,
        health: &health,
    };
    pipeline.toolbox().run(run).await
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
