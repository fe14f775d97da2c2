//! What a turn does through the pipeline that runs it: each model call and
//! each iteration's tools a call of its own (reserved, routed, metered,
//! recorded), its audit events, and storing it. The loop (`super`) decides
//! what to call and when; the session does the calling.

use super::Report;
use crate::{
    agent::conversations::TurnRecord,
    domain::{ChatMessage, Completion, CompletionRequest, ToolCall, ToolOutcome},
};
use futures::stream::BoxStream;
use std::future::Future;
use tokio::time::Instant;

/// One model call's events, its last `Answered`, `Cut` or `Failed`.
#[derive(Debug)]
pub enum ModelEvent<M, E> {
    /// The call moved to its next target before any output.
    Fallback {
        /// Provider that failed.
        from: String,
        /// Provider tried next.
        to: String,
        /// Stable error code.
        reason: String,
    },
    /// A piece of the answer.
    Delta(String),
    /// The answer; the call is finished (recorded, settled) with `M`.
    Answered(Box<Completion>, M),
    /// The deadline cut the call off; recorded with `M`.
    Cut(M),
    /// No answer, or it could not be recorded: the turn fails.
    Failed(E),
}

/// Why a model call did not start.
#[derive(Debug)]
pub enum Refused<E> {
    /// The budget left cannot cover it: the turn stops with `BUDGET`.
    Budget,
    /// Anything else fails the turn.
    Failed(E),
}

/// The turn as stored: its messages, its record and its answer.
pub struct StoredTurn<'a> {
    /// The user's message, then the turn's.
    pub messages: &'a [ChatMessage],
    /// Its record (the session adds the trace ID).
    pub record: TurnRecord,
    /// The answer (or the text so far, when a cap ended it).
    pub text: &'a str,
}

/// A model call's events (see [`TurnSession::model`]).
pub type ModelStream<S> =
    BoxStream<'static, ModelEvent<<S as TurnSession>::Meta, <S as TurnSession>::Error>>;

/// The pipeline as a turn sees it.
pub trait TurnSession: Send + 'static {
    /// Why a call failed the turn.
    type Error: Send + 'static;
    /// What a call or the whole turn used (attempts, tokens, cost).
    type Meta: Send + 'static;
    /// One iteration's tool calls.
    type Tools: ToolCalls<Error = Self::Error, Meta = Self::Meta>;

    /// What is left of the turn's budget: `Some(None)` without one, `None`
    /// when it is spent.
    fn budget_left(&self) -> Option<Option<f64>>;

    /// Adds a finished call's meta to the turn's (`model`: a model call).
    fn add(&mut self, meta: &Self::Meta, model: bool);

    /// Audits the turn's start.
    fn started(&self, message: Option<&ChatMessage>) -> impl Future<Output = ()> + Send;

    /// Opens the model call of `iteration` with `budget` left and streams
    /// it (the session fills in the request's trace and deadline).
    fn model(
        &self,
        iteration: u32,
        budget: Option<f64>,
        request: CompletionRequest,
    ) -> impl Future<Output = Result<ModelStream<Self>, Refused<Self::Error>>> + Send;

    /// Opens the call the tools of `iteration` run on, with `budget` left.
    fn tools(&self, iteration: u32, budget: Option<f64>) -> Self::Tools;

    /// Audits a tool call refused for `reason` without running.
    fn refused(&self, call: &ToolCall, reason: &'static str) -> impl Future<Output = ()> + Send;

    /// Audits the failed turn and gives its conversation back.
    fn failed(&mut self, err: &Self::Error, started: Instant) -> impl Future<Output = ()> + Send;

    /// Stores the turn with its end event, durable before it is answered
    /// (SPEC §10); on failure gives the conversation back.
    fn store(
        &mut self,
        turn: StoredTurn<'_>,
        started: Instant,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The turn's meta: every call summed, its latency from `started`.
    fn meta(&self, started: Instant) -> Self::Meta;
}

/// An iteration's tool calls, on one call of their own.
pub trait ToolCalls: Send + Sync {
    /// Why a tool call failed the turn.
    type Error: Send;
    /// What the calls used.
    type Meta: Send;

    /// Runs `call` through the tools' entry point, within the agent's
    /// allowlist and timeout. `Err` only when what it did could not be
    /// recorded: anything else is a result the model reads.
    fn run(
        &self,
        call: &ToolCall,
    ) -> impl Future<Output = Result<(ToolOutcome, Report), Self::Error>> + Send;

    /// Refuses `call`, past the turn's `cap` of tool calls (audited).
    fn over_cap(
        &self,
        call: &ToolCall,
        cap: u32,
    ) -> impl Future<Output = (ToolOutcome, Report)> + Send;

    /// Finishes the iteration's call: recorded and settled.
    fn finish(self) -> impl Future<Output = Result<Self::Meta, Self::Error>> + Send;

    /// Closes the iteration's call after a tool's record failed.
    fn abandon(self) -> impl Future<Output = ()> + Send;
}
