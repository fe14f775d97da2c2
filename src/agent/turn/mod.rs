//! An agent's turn (SPEC §11.3):
//!
//! ```text
//! iterate   one model call (a call of its own: reserved, routed with
//!           fallback before its first delta, metered with the
//!           conversation and iteration) → its tool calls through the
//!           entry point, concurrently → the results appended → again,
//!           until a final answer or a cap
//! complete  the turn's messages stored, audited, counted
//! ```
//!
//! The loop is here; it reaches the pipeline only through its
//! [`TurnSession`], which `call::turn` implements (and prepares: the
//! conversation taken, the layered prompt assembled, the tools listed).
//! The turn is a plain future that sends its events into a channel of
//! one; the stream [`run`] returns owns that future, so dropping the
//! stream drops the turn (cancelled as any call) and nothing runs
//! unpolled.

mod event;
pub mod outcomes;
mod session;
mod wire;

pub use event::{TurnEvent, TurnOutcome};
pub use outcomes::Report;
use outcomes::{tool_message, tool_result};
pub use session::{ModelEvent, ModelStream, Refused, StoredTurn, ToolCalls, TurnSession};

use super::{StopReason, conversations::TurnRecord, memory};
use crate::{
    config::agents::AgentConfig,
    domain::{
        ChatMessage, Completion, CompletionRequest, ToolCall, ToolChoice, ToolOutcome, ToolSpec,
        WireNames, completion::Role,
    },
    telemetry::metrics,
};
use futures::{SinkExt, Stream, StreamExt, channel::mpsc, stream::FuturesUnordered};
use tokio::time::Instant;
use wire::{on_wire, ours};

/// A turn ready to run, as the pipeline prepared it.
pub struct Start {
    /// The agent's name.
    pub name: String,
    /// Its config.
    pub agent: AgentConfig,
    /// The conversation.
    pub conversation_id: String,
    /// This turn's number, from 1.
    pub turn: u32,
    /// The system prompt: layers 1-4 (and the memory instruction).
    pub system: String,
    /// Layer 5: the kept history and the new message, last (or, resumed,
    /// the history ending with the held calls).
    pub messages: Vec<ChatMessage>,
    /// The held calls a resumed turn settles first (decided by a person).
    pub resume: Vec<ToolCall>,
    /// The tools offered, in our names.
    pub tools: Vec<ToolSpec>,
    /// Every tool the agent's patterns allow, offered or not: a call of
    /// one maps back to its name, and the entry point says why it is
    /// refused.
    pub known: Vec<String>,
    /// When the turn must be over.
    pub deadline: Instant,
    /// Most bytes of tool output a turn hands the model
    /// (`server.max_prompt_bytes`).
    pub max_output: usize,
}

/// Runs the turn of `start` through `session`: its events, `Started`
/// first, `Completed` or `Failed` last.
pub fn run<S: TurnSession>(
    session: S,
    start: Start,
) -> impl Stream<Item = TurnEvent<S::Meta, S::Error>> + Send + use<S> {
    let (tx, rx) = mpsc::channel(0);
    let work = Turn::new(session, start, Emit(tx)).run();
    let ended = futures::stream::once(work).filter_map(|()| std::future::ready(None));
    futures::stream::select(rx, ended)
}

/// Where a turn's events go: its stream, which owns the turn.
struct Emit<M, E>(mpsc::Sender<TurnEvent<M, E>>);

impl<M, E> Emit<M, E> {
    async fn send(&mut self, event: TurnEvent<M, E>) {
        // The receiver goes only with the stream, which drops the turn
        // with it: a failed send has no one to tell.
        let _ = self.0.send(event).await;
    }
}

/// A turn as it runs: what it was started with and what it has done.
struct Turn<S: TurnSession> {
    session: S,
    name: String,
    agent: AgentConfig,
    conversation_id: String,
    turn: u32,
    system: String,
    /// What the model sees: the history, the message, the turn so far.
    messages: Vec<ChatMessage>,
    /// Held calls to settle before the first model call.
    resume: Vec<ToolCall>,
    tools: Vec<ToolSpec>,
    /// Every name the model may see, offered or in the history, with its
    /// wire name, once for the whole turn.
    names: WireNames,
    deadline: Instant,
    max_output: usize,
    started: Instant,
    /// What the turn stores: the user's message, then the turn's.
    stored: Vec<ChatMessage>,
    iterations: u32,
    tool_calls: u32,
    /// The text so far, answered when a cap ends the turn.
    so_far: String,
    final_text: String,
    suggestions: Vec<String>,
    /// Calls given a place under `max_tool_calls` (run or refused).
    admitted: u32,
    /// Tool output handed to the model so far.
    output_bytes: usize,
    emit: Emit<S::Meta, S::Error>,
}

impl<S: TurnSession> Turn<S> {
    fn new(session: S, start: Start, emit: Emit<S::Meta, S::Error>) -> Self {
        let Start {
            name,
            agent,
            conversation_id,
            turn,
            system,
            messages,
            resume,
            tools,
            known,
            deadline,
            max_output,
        } = start;
        let names = WireNames::new(
            known.iter().map(String::as_str).chain(
                messages
                    .iter()
                    .flat_map(|m| m.tool_calls.iter().map(|c| c.name.as_str())),
            ),
        );
        // A resumed turn has no message of its own: it stores what it adds.
        let stored = if resume.is_empty() {
            vec![messages.last().cloned().unwrap_or_default()]
        } else {
            Vec::new()
        };
        Self {
            session,
            name,
            agent,
            conversation_id,
            turn,
            system,
            messages,
            resume,
            tools,
            names,
            deadline,
            max_output,
            started: Instant::now(),
            stored,
            iterations: 0,
            tool_calls: 0,
            so_far: String::new(),
            final_text: String::new(),
            suggestions: Vec::new(),
            admitted: 0,
            output_bytes: 0,
            emit,
        }
    }

    async fn run(mut self) {
        let conversation_id = self.conversation_id.clone();
        self.emit.send(TurnEvent::Started { conversation_id }).await;
        let message = self
            .resume
            .is_empty()
            .then(|| self.messages.last())
            .flatten();
        self.session.started(message).await;
        let ended = match self.resume_held().await {
            Ok(None) => self.iterate().await,
            Ok(Some(stop)) => Ok(stop),
            Err(err) => Err(err),
        };
        match ended {
            Ok(stop) => self.complete(stop).await,
            Err(err) => self.fail(err).await,
        }
    }

    /// A resumed turn's held calls, settled as a person decided (an
    /// approved call runs, a rejected one is answered as such) before the
    /// model goes on. `Some(stop)` when that already ends the turn.
    async fn resume_held(&mut self) -> Result<Option<StopReason>, S::Error> {
        if self.resume.is_empty() {
            return Ok(None);
        }
        let calls = std::mem::take(&mut self.resume);
        let room = self.admit(&calls).await;
        self.settle(&calls, room).await
    }

    /// Gives `calls` their places under `max_tool_calls`, announcing each:
    /// the calls from the returned index on are refused over the cap.
    async fn admit(&mut self, calls: &[ToolCall]) -> usize {
        let room = self.agent.max_tool_calls.saturating_sub(self.admitted) as usize;
        self.admitted += u32::try_from(calls.len().min(room)).unwrap_or(u32::MAX);
        for c in calls {
            let (call_id, tool) = (c.id.clone(), c.name.clone());
            self.emit.send(TurnEvent::ToolCall { call_id, tool }).await;
        }
        room
    }

    /// Iterations until the model answers or a cap (iterations, the
    /// deadline, the budget, tool calls) ends the turn.
    async fn iterate(&mut self) -> Result<StopReason, S::Error> {
        loop {
            if self.iterations >= self.agent.max_iterations {
                return Ok(StopReason::MaxIterations);
            }
            if Instant::now() >= self.deadline {
                return Ok(StopReason::Deadline);
            }
            let Some(left) = self.session.budget_left() else {
                return Ok(StopReason::Budget);
            };
            self.iterations += 1;
            let completion = match self.model_call(left).await? {
                Ok(completion) => completion,
                Err(stop) => return Ok(stop),
            };
            let (names, history) = (&self.names, &self.messages);
            let calls = ours(
                names,
                &completion.tool_calls,
                history,
                self.turn,
                self.iterations,
            );
            if calls.is_empty() {
                return Ok(self.answer(&completion).await);
            }
            if let Some(stop) = self.tool_calls(&completion, calls).await? {
                return Ok(stop);
            }
        }
    }

    /// The request of this iteration's model call (the session adds the
    /// trace and the deadline).
    fn request(&self) -> CompletionRequest {
        let (agent, names) = (&self.agent, &self.names);
        CompletionRequest {
            model: String::new(),
            system: Some(self.system.clone()),
            messages: self.messages.iter().map(|m| on_wire(names, m)).collect(),
            temperature: agent.temperature,
            max_tokens: agent.max_tokens,
            response_format: agent.memory_suggestions.then(memory::format),
            tools: self
                .tools
                .iter()
                .map(|t| ToolSpec {
                    name: names.wire(&t.name).unwrap_or(&t.name).to_owned(),
                    ..t.clone()
                })
                .collect(),
            tool_choice: ToolChoice::Auto,
            trace_id: String::new(),
            traceparent: None,
            deadline: self.deadline,
        }
    }

    /// One model call with `left` of the budget, its events passed through
    /// as they come. It is settled at its actual cost before any tool runs
    /// (the tools' reservations see what is really left). `Ok(Err(stop))`
    /// when the budget or the deadline ends the turn here.
    async fn model_call(
        &mut self,
        left: Option<f64>,
    ) -> Result<Result<Completion, StopReason>, S::Error> {
        let request = self.request();
        let mut events = match self.session.model(self.iterations, left, request).await {
            Ok(events) => events,
            // Refused before any work: the call leaves no record.
            Err(Refused::Budget) => {
                self.iterations -= 1;
                return Ok(Err(StopReason::Budget));
            }
            Err(Refused::Failed(err)) => return Err(err),
        };
        // What this call has streamed: part of the text so far if the
        // call is cut off.
        let mut partial = String::new();
        while let Some(event) = events.next().await {
            match event {
                ModelEvent::Fallback { from, to, reason } => {
                    let fallback = TurnEvent::Fallback { from, to, reason };
                    self.emit.send(fallback).await;
                }
                // A structured answer is JSON: its content is sent once parsed.
                ModelEvent::Delta(text) if !self.agent.memory_suggestions => {
                    partial.push_str(&text);
                    self.emit.send(TurnEvent::Delta(text)).await;
                }
                ModelEvent::Delta(_) => {}
                ModelEvent::Answered(completion, meta) => {
                    self.session.add(&meta, true);
                    return Ok(Ok(*completion));
                }
                ModelEvent::Cut(meta) => {
                    self.session.add(&meta, true);
                    self.so_far.push_str(&partial);
                    return Ok(Err(StopReason::Deadline));
                }
                ModelEvent::Failed(err) => return Err(err),
            }
        }
        // A session always ends a model call with one of the three.
        Ok(Err(StopReason::Deadline))
    }

    /// The model's final answer (its memory suggestions parsed out when
    /// asked for).
    async fn answer(&mut self, completion: &Completion) -> StopReason {
        let text = if self.agent.memory_suggestions {
            let parsed = memory::parse(&completion.text);
            self.suggestions = parsed.suggestions;
            self.emit
                .send(TurnEvent::Delta(parsed.content.clone()))
                .await;
            parsed.content
        } else {
            completion.text.clone()
        };
        self.stored
            .push(ChatMessage::text(Role::Assistant, text.clone()));
        self.final_text = text;
        StopReason::FinalAnswer
    }

    /// The model's tool calls: the first under `max_tool_calls` run (on a
    /// call of their own, the same iteration, metered with what is left
    /// of the budget), the rest answered as refused; their results go
    /// back to the model. `Some(stop)` when a cap ends the turn.
    async fn tool_calls(
        &mut self,
        completion: &Completion,
        calls: Vec<ToolCall>,
    ) -> Result<Option<StopReason>, S::Error> {
        self.so_far.push_str(&completion.text);
        let assistant = ChatMessage {
            role: Role::Assistant,
            content: completion.text.clone(),
            tool_calls: calls.clone(),
            tool_result: None,
        };
        self.messages.push(assistant.clone());
        self.stored.push(assistant);
        let room = self.admit(&calls).await;
        let over_cap = calls.len() > room;
        if let Some(stop) = self.settle(&calls, room).await? {
            return Ok(Some(stop));
        }
        Ok(over_cap.then_some(StopReason::MaxToolCalls))
    }

    /// Runs `calls` (those from `room` on refused over the cap) on a call
    /// of their own and appends their results. `Some(stop)` when the
    /// budget is spent or a call waits for approval: the held call has no
    /// result yet, the resumed turn gives it one.
    async fn settle(
        &mut self,
        calls: &[ToolCall],
        room: usize,
    ) -> Result<Option<StopReason>, S::Error> {
        let Some(left) = self.session.budget_left() else {
            self.refuse_over_budget(calls).await;
            return Ok(Some(StopReason::Budget));
        };
        let on = self.session.tools(self.iterations, left);
        let results = match self.run_tools(&on, calls, room).await {
            Ok(results) => results,
            Err(err) => {
                on.abandon().await;
                return Err(err);
            }
        };
        let mut held = false;
        for outcome in results {
            let Some(outcome) = outcome else {
                held = true;
                continue;
            };
            let message = tool_message(outcome);
            self.messages.push(message.clone());
            self.stored.push(message);
        }
        let meta = on.finish().await?;
        self.session.add(&meta, false);
        Ok(held.then_some(StopReason::ApprovalRequired))
    }

    /// The budget was spent by the model call that asked for `calls`:
    /// each is answered as refused (and audited), so the stored history
    /// pairs every call with a result (a provider refuses one that does
    /// not).
    async fn refuse_over_budget(&mut self, calls: &[ToolCall]) {
        for c in calls {
            self.session.refused(c, "BUDGET_EXCEEDED").await;
            let (outcome, report) = outcomes::refused_over_budget(c);
            let event = tool_result(&self.name, &self.tools, &outcome, report);
            self.emit.send(event).await;
            self.stored.push(tool_message(outcome));
        }
    }

    /// Runs `calls` on `on` (concurrently when the agent allows), those
    /// from `room` on refused over the cap; their outcomes in the order of
    /// the calls. `Err` when what a tool did could not be recorded.
    async fn run_tools(
        &mut self,
        on: &S::Tools,
        calls: &[ToolCall],
        room: usize,
    ) -> Result<Vec<Option<ToolOutcome>>, S::Error> {
        let cap = self.agent.max_tool_calls;
        let one = |i: usize, c: &ToolCall| {
            let c = c.clone();
            async move {
                let done = if i >= room {
                    Ok(on.over_cap(&c, cap).await)
                } else {
                    on.run(&c).await
                };
                (i, done)
            }
        };
        let mut running = if self.agent.parallel_tool_calls {
            let all = calls.iter().enumerate().map(|(i, c)| one(i, c));
            all.collect::<FuturesUnordered<_>>().boxed()
        } else {
            let all = futures::stream::iter(calls.iter().enumerate());
            all.then(|(i, c)| one(i, c)).boxed()
        };
        let mut results = vec![None; calls.len()];
        while let Some((i, done)) = running.next().await {
            let (mut outcome, mut report) = done?;
            if let Some(approval_id) = report.approval_id.take() {
                let (call_id, tool) = (outcome.call_id, outcome.name);
                let event = TurnEvent::ApprovalRequired {
                    call_id,
                    tool,
                    approval_id,
                };
                self.emit.send(event).await;
                continue;
            }
            if report.executed {
                self.tool_calls += 1;
            }
            self.output_bytes += outcome.content.len();
            if self.output_bytes > self.max_output {
                // The turn's prompt would outgrow what one model call may
                // send: the model is told instead.
                outcome = outcomes::over_output_budget(&outcome);
            }
            let event = tool_result(&self.name, &self.tools, &outcome, report);
            self.emit.send(event).await;
            if let Some(slot) = results.get_mut(i) {
                *slot = Some(outcome);
            }
        }
        Ok(results)
    }

    /// A failed turn: counted, audited, its conversation given back,
    /// nothing of it stored.
    async fn fail(mut self, err: S::Error) {
        metrics::agent_turn(&self.name, "FAILED", self.iterations);
        self.session.failed(&err, self.started).await;
        self.emit.send(TurnEvent::Failed(err)).await;
    }

    /// A turn that ended with `stop`: stored, counted, answered.
    async fn complete(mut self, stop: StopReason) {
        let text = if stop == StopReason::FinalAnswer {
            std::mem::take(&mut self.final_text)
        } else {
            std::mem::take(&mut self.so_far)
        };
        let record = TurnRecord {
            turn: self.turn,
            trace_id: String::new(),
            stop_reason: stop.as_str().to_owned(),
            iterations: self.iterations,
            tool_calls: self.tool_calls,
            memory_suggestions: self.suggestions.clone(),
        };
        let turn = StoredTurn {
            messages: &self.stored,
            record,
            text: &text,
        };
        if let Err(err) = self.session.store(turn, self.started).await {
            self.emit.send(TurnEvent::Failed(err)).await;
            return;
        }
        metrics::agent_turn(&self.name, stop.as_str(), self.iterations);
        tracing::Span::current().record("stop_reason", stop.as_str());
        tracing::Span::current().record("iterations", self.iterations);
        if !self.suggestions.is_empty() {
            let suggestions = std::mem::take(&mut self.suggestions);
            self.emit
                .send(TurnEvent::MemorySuggestions(suggestions))
                .await;
        }
        let outcome = TurnOutcome {
            text,
            iterations: self.iterations,
            tool_calls: self.tool_calls,
            stop_reason: stop,
            meta: self.session.meta(self.started),
        };
        self.emit
            .send(TurnEvent::Completed(Box::new(outcome)))
            .await;
    }
}
