//! An agent's turn (SPEC §11.3) over the call pipeline:
//!
//! ```text
//! prepare   the conversation taken (a second turn is refused), the
//!           layered prompt assembled, the agent's tools listed
//! iterate   one model call (a call of its own: reserved, routed with
//!           fallback before its first delta, metered with the
//!           conversation and iteration) → its tool calls through the
//!           entry point, concurrently → the results appended → again,
//!           until a final answer or a cap
//! complete  the turn's messages stored, audited, counted
//! ```
//!
//! A model stream is read until its answer is complete and then dropped:
//! after the tools run, the next model call opens a new stream.

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

/// What a turn reports, in order: `Started` first, `Completed` (or
/// `Failed`) last.
#[derive(Debug)]
pub enum TurnEvent {
    /// The turn runs in this conversation.
    Started {
        /// The conversation (new or continued).
        conversation_id: String,
    },
    /// A piece of answer text.
    Delta(String),
    /// A tool call starts.
    ToolCall {
        /// The model's ID for it.
        call_id: String,
        /// Tool name.
        tool: String,
    },
    /// A tool call ended.
    ToolResult {
        /// The model's ID for it.
        call_id: String,
        /// Tool name.
        tool: String,
        /// SUCCEEDED, FAILED, TIMED_OUT or DENIED.
        status: &'static str,
        /// How long it ran.
        duration_ms: u64,
        /// Why it did not succeed.
        error_code: String,
    },
    /// A model call moved to its next target before any output.
    Fallback {
        /// Provider that failed.
        from: String,
        /// Provider tried next.
        to: String,
        /// Stable error code.
        reason: String,
    },
    /// The answer's memory suggestions.
    MemorySuggestions(Vec<String>),
    /// The turn ended.
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
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Every model call and tool of the turn, summed.
    pub meta: CallMeta,
}

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

/// The turn's events as it runs. The turn itself is a plain future that
/// sends its events into a channel of one; the stream owns it, so dropping
/// the stream drops the turn (cancelled as any call) and nothing runs
/// unpolled.
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
