//! The entry point's last steps, shared with the ASYNC worker: running a
//! tool within its deadline and judging its output against its schema.

use crate::call::{CallContext, Pipeline};
use crate::tools::{
    Failure, Kind, Status, Tool,
    executor::{Ran, Run},
    invocations::Invocation,
    schema,
};
use serde_json::{Value, json};
use tokio::time::Instant;

/// Runs `tool` for `ctx` until `deadline`: a task tool as a call of its
/// own through the pipeline, any other with its kind's executor. `row` is
/// the invocation's stored row, when it has one (its idempotency key and ID
/// go to a workflow).
pub(crate) async fn run(
    pipeline: &Pipeline,
    ctx: &CallContext,
    tool: &Tool,
    input: &Value,
    row: Option<&Invocation>,
    deadline: Instant,
) -> Ran {
    if let Kind::Task(task) = &tool.kind {
        return run_task(pipeline, ctx, task, input, deadline).await;
    }
    let health = || pipeline.health();
    let run = Run {
        tool,
        input,
        idempotency_key: row.map(|r| r.idempotency_key.as_str()),
        invocation_id: row.map(|r| r.id.as_str()),
        trace_id: &ctx.trace_id,
        deadline,
        health: &health,
    };
    pipeline.toolbox().run(run).await
}

/// SUCCEEDED with `output` when it fits the tool's output schema, else
/// FAILED (`OUTPUT_INVALID`, naming where).
pub(crate) fn checked(tool: &Tool, output: Value) -> (Status, Option<Value>, Option<Failure>) {
    let broken = tool.output.as_ref().map(|v| schema::violations(v, &output));
    match broken {
        Some(v) if !v.is_empty() => {
            let at = if v[0].0.is_empty() {
                "its root"
            } else {
                &v[0].0
            };
            let why = format!("the output breaks the tool's output_schema at {at}");
            (
                Status::Failed,
                None,
                Some(Failure::new("OUTPUT_INVALID", why)),
            )
        }
        _ => (Status::Succeeded, Some(output), None),
    }
}

/// A task tool (SPEC §16): `input` as `task`'s variables, admitted, metered
/// and recorded as a model call under `task` with the caller's trace; the
/// tool's output is `{text, output?}` as `Execute` answers, and its cost is
/// that call's.
async fn run_task(
    pipeline: &Pipeline,
    ctx: &CallContext,
    task: &str,
    input: &Value,
    deadline: Instant,
) -> Ran {
    // The input schema is an object's, checked before this; a hand-written
    // schema that lets another value through is the tool's mistake.
    let Value::Object(vars) = input.clone() else {
        return Ran::once(Err(Failure::new(
            "TOOL_INPUT_INVALID",
            "a task tool's input is an object: the task's variables",
        )));
    };
    let mut ctx = ctx.clone();
    ctx.deadline = ctx.deadline.min(deadline);
    match pipeline.run_aside(&ctx, task, vars).await {
        Ok((out, meta)) => {
            let mut output = json!({ "text": out.text });
            if let Some(answer) = out.json {
                output["output"] = Value::Object(answer);
            }
            Ran {
                cost_micros: meta.cost_usd.map(micros),
                ..Ran::once(Ok(output))
            }
        }
        Err(reason) if reason == crate::router::RouteError::DEADLINE_EXCEEDED => Ran::once(Err(
            Failure::new("TIMED_OUT", "the tool did not finish within its timeout"),
        )),
        Err(reason) => Ran::once(Err(Failure::new(
            reason,
            format!("the task `{task}` failed: {reason}"),
        ))),
    }
}

/// USD back to the micro-USD it was made from.
fn micros(usd: f64) -> i64 {
    // The cost is a sum of whole micro-USD divided once: rounding undoes it.
    #[allow(clippy::cast_possible_truncation)]
    let m = (usd * 1_000_000.0).round() as i64;
    m
}

/// SUCCEEDED with the output when it fits the output schema, else FAILED
/// (`OUTPUT_INVALID`); TIMED_OUT or FAILED with the run's failure. A
/// workflow that calls back has only accepted the work: AWAITING_CALLBACK.
pub(crate) fn judge(
    tool: &Tool,
    result: Result<Value, Failure>,
) -> (Status, Option<Value>, Option<Failure>) {
    match result {
        Ok(_) if tool.callback().is_some() => (Status::AwaitingCallback, None, None),
        Ok(output) => checked(tool, output),
        Err(f) if f.code == "TIMED_OUT" => (Status::TimedOut, None, Some(f)),
        Err(f) => (Status::Failed, None, Some(f)),
    }
}

/// When an invocation `judge`d `status` now ends without its callback, unix ms.
pub(crate) fn callback_until(tool: &Tool, status: Status) -> Option<i64> {
    let callback = tool
        .callback()
        .filter(|_| status == Status::AwaitingCallback)?;
    let wait = i64::try_from(callback.timeout.as_millis()).unwrap_or(i64::MAX);
    Some(chrono::Utc::now().timestamp_millis().saturating_add(wait))
}

/// A result event's decision: `ok`, `accepted` (a workflow calls back
/// later) or `error`.
pub(crate) fn decision(status: Status) -> &'static str {
    match status {
        Status::Succeeded => "ok",
        Status::AwaitingCallback => "accepted",
        _ => "error",
    }
}
