//! An agent's turn (SPEC §11.3) over the call pipeline: prepare (take the
//! conversation, assemble the layered prompt, list the tools), iterate (a
//! model call of its own, then its tool calls through the entry point,
//! until a final answer or a cap), complete (store, audit, count).

mod audit;
mod calls;
mod iterate;
mod lease;
mod prepare;
mod tools;
mod totals;
mod wire;

pub use prepare::TurnRequest;

use super::{CallContext, CallError, CallMeta, Pipeline};
use crate::{agent::StopReason, auth::Principal};
use futures::{Stream, StreamExt, channel::mpsc};
use iterate::{Emit, Turn};
use prepare::Prepared;
use tokio::sync::OwnedSemaphorePermit;

/// What a turn reports: `Started` first, `Completed` or `Failed` last.
#[derive(Debug)]
pub enum TurnEvent {
    /// The turn runs in this conversation.
    Started {
        conversation_id: String,
    },
    /// A piece of answer text.
    Delta(String),
    /// A tool call starts.
    ToolCall {
        call_id: String,
        tool: String,
    },
    /// A tool call ended.
    ToolResult {
        call_id: String,
        tool: String,
        /// SUCCEEDED, FAILED, TIMED_OUT or DENIED.
        status: &'static str,
        duration_ms: u64,
        /// Why it did not succeed.
        error_code: String,
    },
    /// A model call moved to its next target before any output.
    Fallback {
        from: String,
        to: String,
        reason: String,
    },
    /// The answer's memory suggestions.
    MemorySuggestions(Vec<String>),
    Completed(Box<TurnOutcome>),
    /// The turn failed; nothing of it was stored.
    Failed(CallError),
}

/// How a turn ended.
#[derive(Debug)]
pub struct TurnOutcome {
    /// The final answer, or the text so far when a cap ended the turn.
    pub text: String,
    /// Model calls made.
    pub iterations: u32,
    /// Tool executions made.
    pub tool_calls: u32,
    pub stop_reason: StopReason,
    /// Every model call and tool of the turn, summed.
    pub meta: CallMeta,
}

impl Pipeline {
    /// Runs one turn; errors before the first event come back as `Err`.
    /// Dropping the stream cancels the turn like any call: in-flight work is
    /// charged its estimate, nothing is stored, the conversation is given back.
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

/// The turn's events: the turn is a future sending into a channel of one,
/// owned by the stream, so dropping the stream drops the turn.
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
    let (tx, rx) = mpsc::channel(0);
    let work = async move {
        let _slot = slot;
        Turn::new(pipeline, ctx, principal, turn, Emit::new(tx))
            .run()
            .await;
    };
    let ended = futures::stream::once(work).filter_map(|()| std::future::ready(None));
    let stream = futures::stream::select(rx, ended);
    crate::telemetry::InSpan::new(Box::pin(stream), span)
}
