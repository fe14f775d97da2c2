//! The one driver: every request the edges take in runs as a [`Feature`]
//! through [`Pipeline::run`]; agent turns and streamed calls have their own
//! entry points (`converse`, `stream`) over the same open and finish.

use super::{Call, CallContext, CallError, CallMeta, Pipeline};
use crate::tasks::{
    Task,
    execute::{Execute, Output},
};
use serde_json::{Map, Value};
use std::future::Future;

/// A unit of work run inside one call: it sees the pipeline only through
/// its [`Call`] (render, complete, invoke a tool), never the edge.
pub trait Feature: Send {
    /// Its answer.
    type Output: Send;

    /// The task the call is admitted, metered and recorded under.
    fn task(&self) -> String;

    /// The request as its `call.*` audit event digests it (SPEC §14.3:
    /// redacted, never kept); `None` for a feature that audits itself.
    fn audit_input(&self) -> Option<Value>;

    /// Runs inside `call`; the pipeline finishes the call with the result.
    fn run(self, call: &Call) -> impl Future<Output = Result<Self::Output, CallError>> + Send;
}

/// Every task is a feature, with the call as its session.
impl<T: Task> Feature for T {
    type Output = T::Output;

    fn task(&self) -> String {
        self.name().to_owned()
    }

    fn audit_input(&self) -> Option<Value> {
        Some(Task::input(self))
    }

    async fn run(self, call: &Call) -> Result<Self::Output, CallError> {
        Task::run(self, call.pipeline().tasks(), call)
            .await
            .map_err(CallError::from)
    }
}

impl Pipeline {
    /// Runs `feature` for `ctx` in a call of its own: open, run, [`Call::finish`].
    pub async fn run<F: Feature>(
        &self,
        ctx: CallContext,
        feature: F,
    ) -> Result<(F::Output, CallMeta), CallError> {
        let call = self.open(ctx, &feature.task())?;
        call.audit_input(|| feature.audit_input());
        let result = feature.run(&call).await;
        call.finish(result).await
    }
}

impl Pipeline {
    /// Generic `task` on `input`, for the caller of `ctx` but in a call of
    /// its own started now: what a feature asks a model on the side (a
    /// classification, a summary), admitted, metered and recorded under its
    /// task with the caller's trace. `Err` is the failure's stable reason.
    pub(crate) async fn run_aside(
        &self,
        ctx: &CallContext,
        task: &str,
        input: Map<String, Value>,
    ) -> Result<(Output, CallMeta), &'static str> {
        let mut ctx = ctx.clone();
        ctx.started = tokio::time::Instant::now();
        ctx.started_at_ms = chrono::Utc::now().timestamp_millis();
        let execute = Execute {
            task: task.to_owned(),
            input,
            prompt_key: None,
        };
        match self.run(ctx, execute).await {
            Ok(done) => Ok(done),
            Err(e) => Err(aside_reason(&e)),
        }
    }
}

/// The stable reason a call on the side failed with, as its caller reports it.
fn aside_reason(e: &CallError) -> &'static str {
    match e {
        CallError::Route(e) => e.reason(),
        CallError::Invalid(_) => "INVALID_INPUT",
        CallError::UnknownTask { .. } => crate::router::RouteError::TASK_UNKNOWN,
        CallError::PromptNotFound(_) => "PROMPT_NOT_FOUND",
        CallError::Storage(_) => "STORAGE_UNAVAILABLE",
        CallError::Overloaded => "OVERLOADED",
        CallError::GuardrailBlocked { .. } => "GUARDRAIL_BLOCKED",
        other => other.reason().unwrap_or("INTERNAL"),
    }
}
