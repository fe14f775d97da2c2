//! A turn's calls: each model call and each iteration's tools a call of its
//! own, settling without waiting for the disk (ADR 0018).

use super::super::{Call, CallContext, CallError, CallMeta, Pipeline};
use super::prepare::now_ms;
use crate::{
    domain::CompletionRequest,
    router::{RouteEvent, RouteOptions},
};
use futures::Stream;
use tokio::time::Instant;

/// Opens a turn's calls, each with its own start, conversation and iteration.
pub(super) struct Opener<'a> {
    pub pipeline: &'a Pipeline,
    pub ctx: &'a CallContext,
    pub task: String,
    pub conversation: &'a str,
    /// The governed prompt: `(owner team, key, version)`.
    pub prompt: &'a (String, String, u32),
}

impl Opener<'_> {
    pub fn open(&self, iteration: u32, budget_usd: Option<f64>) -> Call {
        let mut ctx = self.ctx.clone();
        ctx.started = Instant::now();
        ctx.started_at_ms = now_ms();
        ctx.budget_usd = budget_usd;
        let mut call = self.pipeline.open_with(ctx, &self.task, None);
        call.turn = Some((self.conversation.to_owned(), iteration));
        call.meter.in_turn(self.conversation, iteration);
        // The turn's end (its durable audit event) acknowledges it.
        call.queued_settlement = true;
        call.log().prompt = Some(self.prompt.clone());
        call
    }
}

impl Call {
    /// The call's meta so far, as `finish` would build it.
    pub(super) fn meta(&self) -> CallMeta {
        CallMeta::of(&self.log(), &self.ctx.trace_id, self.ctx.started.elapsed())
    }

    /// Reserves one model call of an agent over `chain`, then streams it.
    /// A refusal comes back as is: `finish` counts it.
    pub(super) async fn model_stream(
        &self,
        chain: &[crate::config::TargetConfig],
        request: CompletionRequest,
    ) -> Result<impl Stream<Item = RouteEvent> + Send + use<>, CallError> {
        self.reserve(&self.task, chain, &request).await?;
        let options = RouteOptions {
            priority: self.ctx.priority,
            primary_model: None,
        };
        Ok(self
            .pipeline
            .router()
            .stream(chain.to_vec(), request, self.ctx.deadline, &options))
    }
}
