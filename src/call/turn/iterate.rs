//! A running turn: a model call per iteration and its tool calls, until a
//! final answer or a cap; then the turn stored, or failed with nothing stored.

use super::{
    TurnEvent, TurnOutcome, audit,
    calls::Opener,
    lease::{Completed, Held, store_turn},
    prepare::Prepared,
    tools,
    totals::Totals,
    wire::{on_wire, ours},
};
use crate::{
    agent::{StopReason, conversations, memory},
    auth::Principal,
    call::{Call, CallContext, CallError, Pipeline, tool::AgentScope},
    config::agents::AgentConfig,
    domain::{
        ChatMessage, Completion, CompletionRequest, ToolCall, ToolOutcome, ToolSpec,
        completion::Role,
    },
    providers::WireNames,
    router::{RouteError, RouteEvent},
    telemetry::metrics,
};
use futures::{SinkExt, StreamExt, channel::mpsc, stream::FuturesUnordered};
use tokio::time::Instant;

/// Where a turn's events go: its stream, which owns the turn.
pub(super) struct Emit(mpsc::Sender<TurnEvent>);

impl Emit {
    pub fn new(tx: mpsc::Sender<TurnEvent>) -> Self {
        Self(tx)
    }

    async fn send(&mut self, event: TurnEvent) {
        // The receiver goes only with the turn: a failed send has no one to tell.
        let _ = self.0.send(event).await;
    }
}

/// A turn as it runs: what it was prepared with and what it has done.
pub(super) struct Turn {
    pipeline: Pipeline,
    ctx: CallContext,
    principal: Principal,
    name: String,
    agent: AgentConfig,
    conversation: conversations::Conversation,
    token: String,
    /// Gives the conversation back if the turn is dropped unfinished.
    held: Held,
    system: String,
    /// What the model sees: the history, the message, the turn so far.
    messages: Vec<ChatMessage>,
    tools: Vec<ToolSpec>,
    prompt: (String, String, u32),
    /// Every name the model may see with its wire name, once for the turn.
    names: WireNames,
    scope: AgentScope,
    started: Instant,
    /// What the turn stores: the user's message, then the turn's.
    stored: Vec<ChatMessage>,
    totals: Totals,
    /// The text so far, answered when a cap ends the turn.
    so_far: String,
    final_text: String,
    suggestions: Vec<String>,
    /// Calls given a place under `max_tool_calls` (run or refused).
    admitted: u32,
    /// Tool output handed to the model so far.
    output_bytes: usize,
    emit: Emit,
}

impl Turn {
    pub fn new(
        pipeline: Pipeline,
        ctx: CallContext,
        principal: Principal,
        turn: Prepared,
        emit: Emit,
    ) -> Self {
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
        } = turn;
        let names = WireNames::new(
            known.iter().map(String::as_str).chain(
                messages
                    .iter()
                    .flat_map(|m| m.tool_calls.iter().map(|c| c.name.as_str())),
            ),
        );
        let scope = AgentScope {
            tools: agent.tools.clone(),
            timeout: agent.tool_timeout,
        };
        let stored = vec![messages.last().cloned().unwrap_or_default()];
        Self {
            pipeline,
            ctx,
            principal,
            name,
            agent,
            conversation,
            token,
            held,
            system,
            messages,
            tools,
            prompt,
            names,
            scope,
            started: Instant::now(),
            stored,
            totals: Totals::new(),
            so_far: String::new(),
            final_text: String::new(),
            suggestions: Vec::new(),
            admitted: 0,
            output_bytes: 0,
            emit,
        }
    }

    /// Runs the turn to its end, its last event `Completed` or `Failed`.
    pub async fn run(mut self) {
        let conversation_id = self.conversation.id.clone();
        self.emit.send(TurnEvent::Started { conversation_id }).await;
        let (ctx, principal) = (&self.ctx, &self.principal);
        let message = self.messages.last();
        audit::start(
            &self.pipeline,
            ctx,
            principal,
            &self.name,
            &self.conversation.id,
            message,
        )
        .await;
        match self.iterate().await {
            Ok(stop) => self.complete(stop).await,
            Err(err) => self.fail(err).await,
        }
    }

    fn opener(&self) -> Opener<'_> {
        Opener {
            pipeline: &self.pipeline,
            ctx: &self.ctx,
            task: format!("agent:{}", self.name),
            conversation: &self.conversation.id,
            prompt: &self.prompt,
        }
    }

    /// Iterations until the model answers or a cap ends the turn.
    async fn iterate(&mut self) -> Result<StopReason, CallError> {
        loop {
            if self.totals.iterations >= self.agent.max_iterations {
                return Ok(StopReason::MaxIterations);
            }
            if Instant::now() >= self.ctx.deadline {
                return Ok(StopReason::Deadline);
            }
            let Some(left) = self.totals.budget_left(self.ctx.budget_usd) else {
                return Ok(StopReason::Budget);
            };
            self.totals.iterations += 1;
            let completion = match self.model_call(left).await? {
                Ok(completion) => completion,
                Err(stop) => return Ok(stop),
            };
            let turn = self.conversation.turns + 1;
            let (names, history) = (&self.names, &self.messages);
            let calls = ours(
                names,
                &completion.tool_calls,
                history,
                turn,
                self.totals.iterations,
            );
            if calls.is_empty() {
                return Ok(self.answer(&completion).await);
            }
            if let Some(stop) = self.tool_calls(&completion, calls).await? {
                return Ok(stop);
            }
        }
    }

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
            trace_id: self.ctx.trace_id.clone(),
            traceparent: self.ctx.traceparent.clone(),
            deadline: self.ctx.deadline,
        }
    }

    /// One model call with `left` of the budget, settled at its actual cost
    /// before any tool runs, so the tools' reservations see what is really
    /// left. `Ok(Err(stop))` when the budget or the deadline ends the turn.
    async fn model_call(
        &mut self,
        left: Option<f64>,
    ) -> Result<Result<Completion, StopReason>, CallError> {
        let call = self.opener().open(self.totals.iterations, left);
        let events = match call.model_stream(&self.agent.chain, self.request()).await {
            Ok(events) => events,
            // Refused before any work: the call leaves no record.
            Err(CallError::Budget { .. }) => {
                self.totals.iterations -= 1;
                return Ok(Err(StopReason::Budget));
            }
            Err(err) => {
                let err = call.finish::<()>(Err(err)).await.err();
                return Err(err.unwrap_or(CallError::Overloaded));
            }
        };
        // Part of the text so far if the call is cut off.
        let mut partial = String::new();
        let mut answered = None;
        let pricing = self.pipeline.meter().pricing();
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                RouteEvent::Started { .. } => {}
                RouteEvent::Fallback { from, to, reason } => {
                    let fallback = TurnEvent::Fallback { from, to, reason };
                    self.emit.send(fallback).await;
                }
                // A structured answer is JSON: its content is sent once parsed.
                RouteEvent::Delta(text) if !self.agent.memory_suggestions => {
                    partial.push_str(&text);
                    self.emit.send(TurnEvent::Delta(text)).await;
                }
                RouteEvent::Delta(_) => {}
                RouteEvent::Completed {
                    completion,
                    provider,
                    model,
                    degraded,
                    attempts,
                } => {
                    let mut log = call.log();
                    log.add(&attempts, pricing);
                    log.served = Some((provider, model, degraded));
                    drop(log);
                    answered = Some(Ok(completion));
                    break;
                }
                RouteEvent::Failed(err) => {
                    call.log().add(err.attempts(), pricing);
                    answered = Some(Err(err));
                    break;
                }
            }
        }
        let completion = match answered {
            Some(Ok(completion)) => completion,
            failed => return self.model_failed(call, failed, partial).await,
        };
        let ((), meta) = call.finish(Ok(())).await?;
        self.totals.add(&meta, true);
        Ok(Ok(completion))
    }

    /// A model call that gave no answer, recorded (a record not written fails
    /// the turn, SPEC §5); cut off by the deadline, the turn ends with its text.
    async fn model_failed(
        &mut self,
        call: Call,
        failed: Option<Result<Completion, RouteError>>,
        partial: String,
    ) -> Result<Result<Completion, StopReason>, CallError> {
        let err = failed
            .and_then(Result::err)
            .unwrap_or(RouteError::AllProvidersFailed {
                attempts: Vec::new(),
            });
        let cut = matches!(err, RouteError::DeadlineExceeded { .. });
        let meta = call.meta();
        match call.finish::<()>(Err(CallError::Route(err))).await {
            Err(CallError::Route(_)) if cut => {
                self.totals.add(&meta, true);
                self.so_far.push_str(&partial);
                Ok(Err(StopReason::Deadline))
            }
            Err(err) => Err(err),
            Ok(_) => Err(CallError::Storage("a failed model call finished".into())),
        }
    }

    /// The model's final answer, memory suggestions parsed out if asked for.
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

    /// The model's tool calls, run on a call of their own; those past
    /// `max_tool_calls` refused. `Some(stop)` when a cap ends the turn.
    async fn tool_calls(
        &mut self,
        completion: &Completion,
        calls: Vec<ToolCall>,
    ) -> Result<Option<StopReason>, CallError> {
        self.so_far.push_str(&completion.text);
        let assistant = ChatMessage {
            role: Role::Assistant,
            content: completion.text.clone(),
            tool_calls: calls.clone(),
            tool_result: None,
        };
        self.messages.push(assistant.clone());
        self.stored.push(assistant);
        let room = self.agent.max_tool_calls.saturating_sub(self.admitted) as usize;
        let over_cap = calls.len() > room;
        self.admitted += u32::try_from(calls.len().min(room)).unwrap_or(u32::MAX);
        for c in &calls {
            let (call_id, tool) = (c.id.clone(), c.name.clone());
            self.emit.send(TurnEvent::ToolCall { call_id, tool }).await;
        }
        let Some(left) = self.totals.budget_left(self.ctx.budget_usd) else {
            self.refuse_over_budget(&calls).await;
            return Ok(Some(StopReason::Budget));
        };
        let tool_call = self.opener().open(self.totals.iterations, left);
        let results = match self.run_tools(&tool_call, &calls, room).await {
            Ok(results) => results,
            Err(err) => {
                // A tool's record or audit could not be written.
                let storage = Err(CallError::Storage(String::new()));
                let _ = tool_call.finish::<()>(storage).await;
                return Err(err);
            }
        };
        for outcome in results.into_iter().flatten() {
            let message = tool_message(outcome);
            self.messages.push(message.clone());
            self.stored.push(message);
        }
        let ((), meta) = tool_call.finish(Ok(())).await?;
        self.totals.add(&meta, false);
        Ok(over_cap.then_some(StopReason::MaxToolCalls))
    }

    /// The budget is spent: each of `calls` is answered as refused (and
    /// audited), so the stored history pairs every call with a result.
    async fn refuse_over_budget(&mut self, calls: &[ToolCall]) {
        for c in calls {
            let (ctx, principal) = (&self.ctx, &self.principal);
            audit::refused(&self.pipeline, ctx, principal, c, "BUDGET_EXCEEDED").await;
            let (outcome, report) = tools::refused_over_budget(c);
            let event = tool_result(&self.name, &self.tools, &outcome, report);
            self.emit.send(event).await;
            self.stored.push(tool_message(outcome));
        }
    }

    /// Runs `calls` on `on` (concurrently if allowed), those from `room` on
    /// refused; outcomes in call order. `Err` when a tool's run was not recorded.
    async fn run_tools(
        &mut self,
        on: &Call,
        calls: &[ToolCall],
        room: usize,
    ) -> Result<Vec<Option<ToolOutcome>>, CallError> {
        let (principal, scope, cap) = (&self.principal, &self.scope, self.agent.max_tool_calls);
        let one = |i: usize, c: &ToolCall| {
            let c = c.clone();
            async move {
                let done = if i >= room {
                    Ok(tools::refused_over_cap(on, &c, cap).await)
                } else {
                    tools::run(on, principal, scope, &c).await
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
        let max_output = self.pipeline.config().server.max_prompt_bytes;
        let mut results = vec![None; calls.len()];
        while let Some((i, done)) = running.next().await {
            let (mut outcome, report) = done?;
            if report.executed {
                self.totals.tool_calls += 1;
            }
            self.output_bytes += outcome.content.len();
            if self.output_bytes > max_output {
                // Past what one model call may send: the model is told instead.
                outcome = tools::over_output_budget(&outcome);
            }
            let event = tool_result(&self.name, &self.tools, &outcome, report);
            self.emit.send(event).await;
            if let Some(slot) = results.get_mut(i) {
                *slot = Some(outcome);
            }
        }
        Ok(results)
    }

    /// A failed turn: counted, audited, conversation given back, nothing stored.
    async fn fail(mut self, err: CallError) {
        metrics::agent_turn(&self.name, "FAILED", self.totals.iterations);
        let reason = err.reason().or(match &err {
            CallError::Route(e) => Some(e.reason()),
            CallError::Storage(_) => Some("STORAGE_UNAVAILABLE"),
            _ => None,
        });
        let (ctx, principal) = (&self.ctx, &self.principal);
        let reason = reason.unwrap_or("INTERNAL");
        audit::failed(
            &self.pipeline,
            ctx,
            principal,
            &self.name,
            reason,
            self.started,
        )
        .await;
        self.held.release(&self.ctx).await;
        self.emit.send(TurnEvent::Failed(err)).await;
    }

    /// A turn ended with `stop`: its messages and end event in one transaction,
    /// durable before the turn is answered (SPEC §10).
    async fn complete(mut self, stop: StopReason) {
        let text = if stop == StopReason::FinalAnswer {
            std::mem::take(&mut self.final_text)
        } else {
            std::mem::take(&mut self.so_far)
        };
        let record = conversations::TurnRecord {
            turn: self.conversation.turns + 1,
            trace_id: self.ctx.trace_id.clone(),
            stop_reason: stop.as_str().to_owned(),
            iterations: self.totals.iterations,
            tool_calls: self.totals.tool_calls,
            memory_suggestions: self.suggestions.clone(),
        };
        let (ctx, principal) = (&self.ctx, &self.principal);
        let end = audit::complete(ctx, principal, &self.name, &record, &text, self.started);
        let completed = Completed {
            messages: &self.stored,
            record: &record,
            end,
        };
        let (agent, conversation) = (&self.agent, &self.conversation);
        let stored = store_turn(
            &self.pipeline,
            ctx,
            agent,
            conversation,
            &self.token,
            completed,
        )
        .await;
        if let Err(err) = stored {
            self.held.release(&self.ctx).await;
            self.emit.send(TurnEvent::Failed(err)).await;
            return;
        }
        self.held.let_go();
        metrics::agent_turn(&self.name, stop.as_str(), self.totals.iterations);
        tracing::Span::current().record("stop_reason", stop.as_str());
        tracing::Span::current().record("iterations", self.totals.iterations);
        if !self.suggestions.is_empty() {
            let suggestions = std::mem::take(&mut self.suggestions);
            self.emit
                .send(TurnEvent::MemorySuggestions(suggestions))
                .await;
        }
        let outcome = self.outcome(text, stop);
        self.emit
            .send(TurnEvent::Completed(Box::new(outcome)))
            .await;
    }

    /// How the turn ended, its meta summed over its calls.
    fn outcome(&self, text: String, stop: StopReason) -> TurnOutcome {
        let totals = &self.totals;
        let mut meta = totals.meta.clone();
        meta.trace_id.clone_from(&self.ctx.trace_id);
        meta.cost_usd = totals.cost_known.then_some(totals.spent_usd);
        meta.latency = self.started.elapsed();
        meta.prompt_key = self.prompt.1.clone();
        meta.prompt_version = self.prompt.2;
        TurnOutcome {
            text,
            iterations: totals.iterations,
            tool_calls: totals.tool_calls,
            stop_reason: stop,
            meta,
        }
    }
}

/// A tool's result as the message the model reads.
fn tool_message(outcome: ToolOutcome) -> ChatMessage {
    ChatMessage {
        role: Role::Tool,
        content: String::new(),
        tool_calls: Vec::new(),
        tool_result: Some(outcome),
    }
}

/// The event of a tool call's `outcome`, counted in the agent's metrics
/// (a tool not `offered` counted as `other`: the model names it).
fn tool_result(
    agent: &str,
    offered: &[ToolSpec],
    outcome: &ToolOutcome,
    report: tools::Report,
) -> TurnEvent {
    let tool = if offered.iter().any(|t| t.name == outcome.name) {
        outcome.name.as_str()
    } else {
        "other"
    };
    metrics::agent_tool_call(agent, tool, report.status);
    TurnEvent::ToolResult {
        call_id: outcome.call_id.clone(),
        tool: outcome.name.clone(),
        status: report.status,
        duration_ms: report.duration_ms,
        error_code: report.error_code,
    }
}
