//! The one driver: every request the edges take in (a task, a typed SMS or
//! research RPC, a tool invocation) runs as a [`Feature`] through
//! [`Pipeline::run`], which owns the call's lifecycle. Agent turns and
//! streamed calls have their own entry points (`converse`, `stream`) over
//! the same open and finish.

use super::{Call, CallContext, CallError, CallMeta, Pipeline};
use crate::tasks::Task;
use std::future::Future;

/// A unit of work run inside one call. It sees the pipeline only through
/// the [`Call`] it is given (its session: render, complete, invoke a tool)
/// and never the edge that asked for it.
pub trait Feature: Send {
    /// Its answer.
    type Output: Send;

    /// The task the call is admitted, metered and recorded under.
    fn task(&self) -> String;

    /// Runs inside `call`; the pipeline finishes the call with the result.
    fn run(self, call: &Call) -> impl Future<Output = Result<Self::Output, CallError>> + Send;
}

/// Every task is a feature: run with the tasks the pipeline knows, through
/// the call as its session.
impl<T: Task> Feature for T {
    type Output = T::Output;

    fn task(&self) -> String {
        self.name().to_owned()
    }

    async fn run(self, call: &Call) -> Result<Self::Output, CallError> {
        Task::run(self, call.pipeline().tasks(), call)
            .await
            .map_err(CallError::from)
    }
}

impl Pipeline {
    /// Runs `feature` for `ctx`: opens the call (its slot under
    /// `server.max_concurrent_requests`, shed at once past it, and its
    /// meter session), runs the feature, and finishes the call (metrics,
    /// the usage record, the ledger's settlement; see [`Call::finish`]).
    pub async fn run<F: Feature>(
        &self,
        ctx: CallContext,
        feature: F,
    ) -> Result<(F::Output, CallMeta), CallError> {
        let call = self.open(ctx, &feature.task())?;
        let result = feature.run(&call).await;
        call.finish(result).await
    }
}
