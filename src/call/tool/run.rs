//! The entry point's last steps, shared with the ASYNC worker: running a
//! tool within its deadline and judging its output against its schema.

use crate::tools::{
    Failure, Status, Tool,
    executor::{Ran, Run},
    schema,
};
use serde_json::Value;
use tokio::time::Instant;

/// Runs `tool` until `deadline` with its kind's executor.
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

/// SUCCEEDED with the output when it fits the output schema, else FAILED
/// (`OUTPUT_INVALID`); TIMED_OUT or FAILED with the run's failure.
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
