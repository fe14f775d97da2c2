//! An agent's turn (SPEC §11.3) on the call pipeline: prepared here (the
//! conversation taken, a second turn refused; the layered prompt
//! assembled; the agent's tools listed), then run by the loop in
//! `agent::turn` over this pipeline's session (`session`), each model call
//! and each iteration's tools a call of its own.

mod audit;
mod calls;
mod guard;
mod held;
mod history;
mod lease;
mod prepare;
mod session;
mod tools;
mod totals;

pub use prepare::TurnRequest;

use super::{CallContext, CallError, CallMeta, Pipeline};
use crate::{
    agent::{self, turn::Start},
    auth::Principal,
};
use futures::Stream;
use prepare::Prepared;
use session::PipelineTurn;
use tokio::sync::OwnedSemaphorePermit;
use totals::Totals;

/// What a turn reports, in order (see [`agent::turn::TurnEvent`]).
pub type TurnEvent = agent::turn::TurnEvent<CallMeta, CallError>;

/// How a turn ended.
pub type TurnOutcome = agent::turn::TurnOutcome<CallMeta>;

impl Pipeline {
    /// Runs one turn of `req` for `principal`. Errors before the first
    /// event (unknown agent, conversation busy or not found, a layer over
    /// its budget, overload) come back as `Err`.
    ///
    /// Dropping the stream (the caller went away) cancels the turn like
    /// any call: what is in flight is charged its estimate, nothing of the
    /// turn is stored, and the conversation is given back at once.
    pub async fn converse(
        &self,
        ctx: CallContext,
        principal: Principal,
        req: TurnRequest,
    ) -> Result<impl Stream<Item = TurnEvent> + Send + use<>, CallError> {
        let slot = self.slot()?;
        let prepared = self.prepare(&ctx, &principal, req).await?;
        Ok(run(self.clone(), ctx, principal, prepared, slot))
    }
}

/// The turn's events as it runs: the loop (`agent::turn`) over this
/// pipeline's session, inside the turn's span.
fn run(
    pipeline: Pipeline,
    ctx: CallContext,
    principal: Principal,
    turn: Prepared,
    slot: OwnedSemaphorePermit,
) -> impl Stream<Item = TurnEvent> + Send + use<> {
    let span = tracing::info_span!(
        "agent_turn",
        otel.name = %format_args!("invoke_agent {}", turn.name),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %turn.name,
        gen_ai.conversation.id = %turn.conversation.id,
        trace_id = %ctx.trace_id,
        stop_reason = tracing::field::Empty,
        iterations = tracing::field::Empty,
    );
    let Prepared {
        name,
        agent,
        conversation,
        token,
        held,
        system,
        messages,
        tools,
        known,
        prompt,
        resumed,
        guard,
    } = turn;
    let start = Start {
        name: name.clone(),
        agent: agent.clone(),
        conversation_id: conversation.id.clone(),
        turn: conversation.turns + 1,
        system,
        messages,
        resume: resumed.calls,
        tools,
        known,
        deadline: ctx.deadline,
        max_output: pipeline.config().server.max_prompt_bytes,
    };
    let session = PipelineTurn {
        pipeline,
        ctx,
        principal,
        name,
        agent,
        conversation,
        token,
        held,
        prompt,
        resolved: std::sync::Arc::new(resumed.resolved),
        guard,
        totals: Totals::new(),
        _slot: slot,
    };
    crate::telemetry::InSpan::new(Box::pin(agent::turn::run(session, start)), span)
}
