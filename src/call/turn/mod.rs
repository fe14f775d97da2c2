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
mod lease;
mod prepare;
mod tools;
mod wire;

pub use prepare::TurnRequest;

use super::{CallContext, CallError, CallMeta, Pipeline, tool::AgentScope};
use crate::{
    agent::{StopReason, conversations, memory},
    auth::Principal,
    domain::{ChatMessage, CompletionRequest, ToolCall, ToolOutcome, ToolSpec, completion::Role},
    providers::WireNames,
    router::{RouteError, RouteEvent},
    telemetry::metrics,
};
use calls::Opener;
use futures::{Stream, StreamExt, stream::FuturesUnordered};
use lease::{Completed, store_turn};
use prepare::Prepared;
use tokio::{sync::OwnedSemaphorePermit, time::Instant};
use wire::{on_wire, ours};

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

/// The turn's running totals.
struct Totals {
    meta: CallMeta,
    /// Every model call and tool had a price.
    cost_known: bool,
    spent_usd: f64,
    iterations: u32,
    tool_calls: u32,
}

impl Totals {
    fn new() -> Self {
        Self {
            meta: CallMeta::default(),
            cost_known: true,
            spent_usd: 0.0,
            iterations: 0,
            tool_calls: 0,
        }
    }

    /// Adds one finished call: a model call (`model`) or an iteration's
    /// tools.
    fn add(&mut self, meta: &CallMeta, model: bool) {
        self.meta.attempts.extend(meta.attempts.iter().cloned());
        self.meta.usage = self.meta.usage.saturating_add(meta.usage);
        match meta.cost_usd {
            Some(usd) => self.spent_usd += usd,
            None => self.cost_known = false,
        }
        if model && !meta.provider.is_empty() {
            self.meta.provider.clone_from(&meta.provider);
            self.meta.model.clone_from(&meta.model);
            self.meta.degraded |= meta.degraded;
        }
    }

    /// What is left of `budget_usd` for the next call: `Some(None)` without
    /// a budget, `None` when it is spent.
    fn budget_left(&self, budget_usd: Option<f64>) -> Option<Option<f64>> {
        match budget_usd.filter(|b| *b > 0.0) {
            None => Some(None),
            Some(budget) => {
                let left = budget - self.spent_usd;
                (left > 0.0).then_some(Some(left))
            }
        }
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
    let stream = async_stream::stream! {
        let _slot = slot;
        // `held` gives the conversation back if the turn is dropped
        // unfinished (the caller went away).
        let Prepared { name, agent, conversation, token, mut held, system, mut messages, tools, known, prompt } = turn;
        let started = Instant::now();
        yield TurnEvent::Started { conversation_id: conversation.id.clone() };
        audit::start(&pipeline, &ctx, &principal, &name, &conversation.id, messages.last()).await;

        // Every name the model may see, offered or in the history, gets
        // its wire name once for the whole turn.
        let names = WireNames::new(
            known.iter().map(String::as_str).chain(
                messages.iter().flat_map(|m| m.tool_calls.iter().map(|c| c.name.as_str())),
            ),
        );
        let scope = AgentScope { tools: agent.tools.clone(), timeout: agent.tool_timeout };
        let opener = Opener { pipeline: &pipeline, ctx: &ctx, task: format!("agent:{name}"), conversation: &conversation.id, prompt: &prompt };
        let mut stored = vec![messages.last().cloned().unwrap_or_default()];
        let mut totals = Totals::new();
        let mut so_far = String::new();
        let mut final_text = String::new();
        let mut suggestions = Vec::new();
        // Calls given a place under max_tool_calls (run or refused before
        // running), and tool output handed to the model so far.
        let mut admitted = 0_u32;
        let mut output_bytes = 0_usize;
        let ended: Result<StopReason, CallError> = 'turn: loop {
            if totals.iterations >= agent.max_iterations {
                break 'turn Ok(StopReason::MaxIterations);
            }
            if Instant::now() >= ctx.deadline {
                break 'turn Ok(StopReason::Deadline);
            }
            let Some(left) = totals.budget_left(ctx.budget_usd) else {
                break 'turn Ok(StopReason::Budget);
            };
            totals.iterations += 1;
            let call = opener.open(totals.iterations, left);
            let request = CompletionRequest {
                model: String::new(),
                system: Some(system.clone()),
                messages: messages.iter().map(|m| on_wire(&names, m)).collect(),
                temperature: agent.temperature,
                max_tokens: agent.max_tokens,
                response_format: agent.memory_suggestions.then(memory::format),
                tools: tools.iter().map(|t| crate::domain::ToolSpec {
                    name: names.wire(&t.name).unwrap_or(&t.name).to_owned(),
                    ..t.clone()
                }).collect(),
                trace_id: ctx.trace_id.clone(),
                traceparent: ctx.traceparent.clone(),
                deadline: ctx.deadline,
            };
            // One model call: its events passed through as they come.
            let events = match call.model_stream(&agent.chain, request).await {
                Ok(events) => events,
                // Refused before any work: the call leaves no record.
                Err(CallError::Budget { .. }) => {
                    totals.iterations -= 1;
                    break 'turn Ok(StopReason::Budget);
                }
                Err(err) => {
                    let err = call.finish::<()>(Err(err)).await.err().unwrap_or(CallError::Overloaded);
                    break 'turn Err(err);
                }
            };
            // What this call has streamed: part of the text so far if the
            // call is cut off.
            let mut partial = String::new();
            let mut answered = None;
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                match event {
                    RouteEvent::Started { .. } => {}
                    RouteEvent::Fallback { from, to, reason } => yield TurnEvent::Fallback { from, to, reason },
                    RouteEvent::Delta(text) => {
                        // A structured answer is JSON: its content is sent once parsed.
                        if !agent.memory_suggestions {
                            partial.push_str(&text);
                            yield TurnEvent::Delta(text);
                        }
                    }
                    RouteEvent::Completed { completion, provider, model, degraded, attempts } => {
                        let mut log = call.log();
                        log.add(&attempts, pipeline.meter().pricing());
                        log.served = Some((provider, model, degraded));
                        drop(log);
                        answered = Some(Ok(completion));
                        break;
                    }
                    RouteEvent::Failed(err) => {
                        call.log().add(err.attempts(), pipeline.meter().pricing());
                        answered = Some(Err(err));
                        break;
                    }
                }
            }
            let completion = match answered {
                Some(Ok(completion)) => completion,
                failed => {
                    let err = failed
                        .and_then(Result::err)
                        .unwrap_or(RouteError::AllProvidersFailed { attempts: Vec::new() });
                    let cut = matches!(err, RouteError::DeadlineExceeded { .. });
                    let meta = call.meta();
                    // Recorded with its outcome; a record that cannot be
                    // written fails the turn (SPEC §5).
                    match call.finish::<()>(Err(CallError::Route(err))).await {
                        Err(CallError::Route(_)) if cut => {
                            totals.add(&meta, true);
                            so_far.push_str(&partial);
                            break 'turn Ok(StopReason::Deadline);
                        }
                        Err(err) => break 'turn Err(err),
                        Ok(_) => break 'turn Err(CallError::Storage("a failed model call finished".into())),
                    }
                }
            };
            // Settled at its actual cost before any tool runs: the tools'
            // reservations see what is really left.
            match call.finish(Ok(())).await {
                Ok(((), meta)) => totals.add(&meta, true),
                Err(err) => break 'turn Err(err),
            }
            let calls = ours(&names, &completion.tool_calls, &messages, conversation.turns + 1, totals.iterations);
            if calls.is_empty() {
                let text = if agent.memory_suggestions {
                    let parsed = memory::parse(&completion.text);
                    suggestions = parsed.suggestions;
                    yield TurnEvent::Delta(parsed.content.clone());
                    parsed.content
                } else {
                    completion.text.clone()
                };
                stored.push(ChatMessage::text(Role::Assistant, text.clone()));
                final_text = text;
                break 'turn Ok(StopReason::FinalAnswer);
            }
            so_far.push_str(&completion.text);
            let assistant = ChatMessage { role: Role::Assistant, content: completion.text.clone(), tool_calls: calls.clone(), tool_result: None };
            messages.push(assistant.clone());
            stored.push(assistant);
            // The cap admits the first calls; the rest are answered as refused.
            let room = agent.max_tool_calls.saturating_sub(admitted) as usize;
            let over_cap = calls.len() > room;
            admitted += u32::try_from(calls.len().min(room)).unwrap_or(u32::MAX);
            for c in &calls {
                yield TurnEvent::ToolCall { call_id: c.id.clone(), tool: c.name.clone() };
            }
            // The tools run on a call of their own (the same iteration):
            // metered with what is left of the budget, their time not
            // counted as our overhead.
            let Some(left) = totals.budget_left(ctx.budget_usd) else {
                for c in &calls {
                    audit::refused(&pipeline, &ctx, &principal, c, "BUDGET_EXCEEDED").await;
                    let (outcome, report) = tools::refused_over_budget(c);
                    yield tool_result(&name, &tools, &outcome, report);
                    stored.push(ChatMessage { role: Role::Tool, content: String::new(), tool_calls: Vec::new(), tool_result: Some(outcome) });
                }
                break 'turn Ok(StopReason::Budget);
            };
            let tool_call = opener.open(totals.iterations, left);
            let tool_call_ref = &tool_call;
            let one = |i: usize, c: &'_ ToolCall| {
                let (principal, scope, cap) = (&principal, &scope, agent.max_tool_calls);
                let c = c.clone();
                async move {
                    let done = if i >= room { Ok(tools::refused_over_cap(tool_call_ref, &c, cap).await) } else { tools::run(tool_call_ref, principal, scope, &c).await };
                    (i, done)
                }
            };
            let mut running = if agent.parallel_tool_calls {
                calls.iter().enumerate().map(|(i, c)| one(i, c)).collect::<FuturesUnordered<_>>().boxed()
            } else {
                futures::stream::iter(calls.iter().enumerate()).then(|(i, c)| one(i, c)).boxed()
            };
            // Results go back to the model in the order of its calls.
            let mut results = vec![None; calls.len()];
            let mut broken = None;
            while let Some((i, done)) = running.next().await {
                let (mut outcome, report) = match done {
                    Ok(done) => done,
                    Err(err) => {
                        broken = Some(err);
                        break;
                    }
                };
                if report.executed { totals.tool_calls += 1; }
                output_bytes += outcome.content.len();
                if output_bytes > pipeline.config().server.max_prompt_bytes {
                    // The turn's prompt would outgrow what one model call
                    // may send: the model is told instead.
                    outcome = tools::over_output_budget(&outcome);
                }
                yield tool_result(&name, &tools, &outcome, report);
                if let Some(slot) = results.get_mut(i) { *slot = Some(outcome); }
            }
            drop(running);
            if let Some(err) = broken {
                // A tool's record or audit could not be written.
                let _ = tool_call.finish::<()>(Err(CallError::Storage(String::new()))).await;
                break 'turn Err(err);
            }
            for outcome in results.into_iter().flatten() {
                let message = ChatMessage { role: Role::Tool, content: String::new(), tool_calls: Vec::new(), tool_result: Some(outcome) };
                messages.push(message.clone());
                stored.push(message);
            }
            match tool_call.finish(Ok(())).await {
                Ok(((), meta)) => totals.add(&meta, false),
                Err(err) => break 'turn Err(err),
            }
            if over_cap {
                break 'turn Ok(StopReason::MaxToolCalls);
            }
        };
        let stop = match ended {
            Ok(stop) => stop,
            Err(err) => {
                metrics::agent_turn(&name, "FAILED", totals.iterations);
                let reason = err.reason().or(match &err {
                    CallError::Route(e) => Some(e.reason()),
                    CallError::Storage(_) => Some("STORAGE_UNAVAILABLE"),
                    _ => None,
                });
                audit::failed(&pipeline, &ctx, &principal, &name, reason.unwrap_or("INTERNAL"), started).await;
                held.release(&ctx).await;
                yield TurnEvent::Failed(err);
                return;
            }
        };
        let text = if stop == StopReason::FinalAnswer { final_text } else { so_far };
        let record = conversations::TurnRecord {
            turn: conversation.turns + 1,
            trace_id: ctx.trace_id.clone(),
            stop_reason: stop.as_str().to_owned(),
            iterations: totals.iterations,
            tool_calls: totals.tool_calls,
            memory_suggestions: suggestions.clone(),
        };
        // The end event is written with the turn's rows, in one
        // transaction, durable before the turn is answered (SPEC §10).
        let end = audit::complete(&ctx, &principal, &name, &record, &text, started);
        let completed = Completed { messages: &stored, record: &record, end };
        let stored_turn = store_turn(&pipeline, &ctx, &agent, &conversation, &token, completed).await;
        if let Err(err) = stored_turn {
            held.release(&ctx).await;
            yield TurnEvent::Failed(err);
            return;
        }
        held.let_go();
        metrics::agent_turn(&name, stop.as_str(), totals.iterations);
        tracing::Span::current().record("stop_reason", stop.as_str());
        tracing::Span::current().record("iterations", totals.iterations);
        if !suggestions.is_empty() {
            yield TurnEvent::MemorySuggestions(suggestions);
        }
        let mut meta = totals.meta.clone();
        meta.trace_id.clone_from(&ctx.trace_id);
        meta.cost_usd = totals.cost_known.then_some(totals.spent_usd);
        meta.latency = started.elapsed();
        meta.prompt_key = prompt.1.clone();
        meta.prompt_version = prompt.2;
        yield TurnEvent::Completed(Box::new(TurnOutcome {
            text,
            iterations: totals.iterations,
            tool_calls: totals.tool_calls,
            stop_reason: stop,
            meta,
        }));
    };
    crate::telemetry::InSpan::new(Box::pin(stream), span)
}
