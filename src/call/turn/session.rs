//! The pipeline as an agent's turn sees it (`agent::turn::TurnSession`):
//! each model call and each iteration's tools a call of its own (opened by
//! [`Opener`]), the turn's audit events, its storage and its totals.

use super::held::Resolution;
use super::{
    audit,
    calls::Opener,
    guard::TurnGuard,
    lease::{Completed, Held, store_turn},
    tools,
    totals::Totals,
};
use crate::{
    agent::{
        conversations::Conversation,
        turn::{ModelEvent, Refused, Report, StoredTurn, ToolCalls, TurnSession},
    },
    auth::Principal,
    call::{Call, CallContext, CallError, CallMeta, Pipeline, audit::messages, tool::AgentScope},
    config::{agents::AgentConfig, guardrails::Stage},
    domain::{ChatMessage, Completion, CompletionRequest, ToolCall, ToolOutcome},
    router::{RouteError, RouteEvent},
};
use futures::{StreamExt, stream::BoxStream};
use std::{collections::BTreeMap, sync::Arc};
use tokio::{sync::OwnedSemaphorePermit, time::Instant};

/// One turn's hold on the pipeline.
pub(super) struct PipelineTurn {
    pub pipeline: Pipeline,
    pub ctx: CallContext,
    pub principal: Principal,
    pub name: String,
    pub agent: AgentConfig,
    pub conversation: Conversation,
    pub token: String,
    /// Gives the conversation back if the turn is dropped unfinished.
    pub held: Held,
    /// The governed prompt: `(owner team, key, version)`.
    pub prompt: (String, String, u32),
    /// A resumed turn's held calls, as decided, by call ID.
    pub resolved: Arc<BTreeMap<String, Resolution>>,
    /// The agent's guardrails and masker, if it lists any.
    pub guard: Option<Arc<TurnGuard>>,
    pub totals: Totals,
    /// The turn's slot under `server.max_concurrent_requests`.
    pub _slot: OwnedSemaphorePermit,
}

impl PipelineTurn {
    fn opener(&self) -> Opener<'_> {
        Opener {
            pipeline: &self.pipeline,
            ctx: &self.ctx,
            task: format!("agent:{}", self.name),
            conversation: &self.conversation.id,
            prompt: &self.prompt,
        }
    }
}

impl TurnSession for PipelineTurn {
    type Error = CallError;
    type Meta = CallMeta;
    type Tools = IterationTools;

    fn budget_left(&self) -> Option<Option<f64>> {
        self.totals.budget_left(self.ctx.budget_usd)
    }

    fn add(&mut self, meta: &CallMeta, model: bool) {
        self.totals.add(meta, model);
    }

    async fn started(&self, message: Option<&ChatMessage>) {
        let (ctx, principal) = (&self.ctx, &self.principal);
        let conversation = &self.conversation.id;
        audit::start(
            &self.pipeline,
            ctx,
            principal,
            &self.name,
            conversation,
            message,
        )
        .await;
    }

    async fn model(
        &self,
        iteration: u32,
        budget: Option<f64>,
        mut request: CompletionRequest,
    ) -> Result<BoxStream<'static, ModelEvent<CallMeta, CallError>>, Refused<CallError>> {
        request.trace_id.clone_from(&self.ctx.trace_id);
        request.traceparent.clone_from(&self.ctx.traceparent);
        if let Some(guard) = &self.guard {
            request = guard.mask(request);
        }
        let call = self.opener().open(iteration, budget);
        let input = || Some(messages(request.system.as_deref(), &request.messages));
        call.audit_input(input);
        match call.model_stream(&self.agent.chain, request).await {
            Ok(events) => Ok(model_events(call, events, self.guard.clone()).boxed()),
            // Refused before any work: the call leaves no record.
            Err(CallError::Budget { .. }) => Err(Refused::Budget),
            Err(err) => {
                let err = call.finish::<()>(Err(err)).await.err();
                Err(Refused::Failed(err.unwrap_or(CallError::Overloaded)))
            }
        }
    }

    fn tools(&self, iteration: u32, budget: Option<f64>) -> IterationTools {
        IterationTools {
            call: self.opener().open(iteration, budget),
            principal: self.principal.clone(),
            scope: AgentScope {
                tools: self.agent.tools.clone(),
                timeout: self.agent.tool_timeout,
            },
            resolved: Arc::clone(&self.resolved),
            guard: self.guard.clone(),
        }
    }

    async fn refused(&self, call: &ToolCall, reason: &'static str) {
        audit::refused(&self.pipeline, &self.ctx, &self.principal, call, reason).await;
    }

    async fn failed(&mut self, err: &CallError, started: Instant) {
        let reason = err.reason().or(match err {
            CallError::Route(e) => Some(e.reason()),
            CallError::Storage(_) => Some("STORAGE_UNAVAILABLE"),
            _ => None,
        });
        let (ctx, principal) = (&self.ctx, &self.principal);
        let reason = reason.unwrap_or("INTERNAL");
        audit::failed(&self.pipeline, ctx, principal, &self.name, reason, started).await;
        self.held.release(&self.ctx).await;
    }

    async fn store(&mut self, turn: StoredTurn<'_>, started: Instant) -> Result<(), CallError> {
        let mut record = turn.record;
        record.trace_id.clone_from(&self.ctx.trace_id);
        let (ctx, principal) = (&self.ctx, &self.principal);
        let end = audit::complete(ctx, principal, &self.name, &record, turn.text, started);
        let completed = Completed {
            messages: turn.messages,
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
        match stored {
            Ok(()) => {
                self.held.let_go();
                Ok(())
            }
            Err(err) => {
                self.held.release(&self.ctx).await;
                Err(err)
            }
        }
    }

    fn meta(&self, started: Instant) -> CallMeta {
        let totals = &self.totals;
        let mut meta = totals.meta.clone();
        meta.trace_id.clone_from(&self.ctx.trace_id);
        meta.cost_usd = totals.cost_known.then_some(totals.spent_usd);
        meta.latency = started.elapsed();
        meta.prompt_key = self.prompt.1.clone();
        meta.prompt_version = self.prompt.2;
        meta
    }
}

/// A model call's route events as the turn reads them: the call logged
/// and finished (recorded, settled) before its last event. Under `guard`
/// the answer may be held whole, then screened and restored.
fn model_events(
    call: Call,
    events: impl futures::Stream<Item = RouteEvent> + Send + 'static,
    guard: Option<Arc<TurnGuard>>,
) -> impl futures::Stream<Item = ModelEvent<CallMeta, CallError>> + Send + 'static {
    let hold = guard.as_ref().is_some_and(|g| g.holds());
    async_stream::stream! {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                RouteEvent::Started { .. } => {}
                RouteEvent::Fallback { from, to, reason } => yield ModelEvent::Fallback { from, to, reason },
                RouteEvent::Delta(text) if !hold => yield ModelEvent::Delta(text),
                RouteEvent::Delta(_) => {}
                RouteEvent::Completed { mut completion, provider, model, degraded, attempts } => {
                    call.audit_answer(&completion);
                    {
                        let mut log = call.log();
                        log.add(&attempts, call.pipeline().meter().pricing());
                        log.served = Some((provider, model, degraded));
                    }
                    if let Some(guard) = &guard {
                        if let Err(err) = guarded(&call, guard, &mut completion).await {
                            let err = call.finish::<()>(Err(err)).await.err();
                            yield ModelEvent::Failed(err.unwrap_or(CallError::Overloaded));
                            return;
                        }
                        if hold && !completion.text.is_empty() {
                            yield ModelEvent::Delta(completion.text.clone());
                        }
                    }
                    yield match call.finish(Ok(())).await {
                        Ok(((), meta)) => ModelEvent::Answered(Box::new(completion), meta),
                        Err(err) => ModelEvent::Failed(err),
                    };
                    return;
                }
                RouteEvent::Failed(err) => {
                    call.log().add(err.attempts(), call.pipeline().meter().pricing());
                    yield model_failed(call, err).await;
                    return;
                }
            }
        }
        let ended = RouteError::AllProvidersFailed { attempts: Vec::new() };
        yield model_failed(call, ended).await;
    }
}

/// A model's answer under the turn's guard: its text screened (`output`),
/// then the originals put back. A block is the call's error.
async fn guarded(
    call: &Call,
    guard: &TurnGuard,
    completion: &mut Completion,
) -> Result<(), CallError> {
    if guard.applies(Stage::Output) && !completion.text.is_empty() {
        let subject = call.task.clone();
        completion.text = call
            .screen(&guard.list, Stage::Output, &completion.text, &subject, true)
            .await?;
    }
    guard.show(completion);
    Ok(())
}

/// A model call that gave no answer, recorded with its outcome (a record
/// that cannot be written fails the turn, SPEC §5). Cut off by the
/// deadline, the turn ends with the text so far.
async fn model_failed(call: Call, err: RouteError) -> ModelEvent<CallMeta, CallError> {
    let cut = matches!(err, RouteError::DeadlineExceeded { .. });
    let meta = call.meta();
    match call.finish::<()>(Err(CallError::Route(err))).await {
        Err(CallError::Route(_)) if cut => ModelEvent::Cut(meta),
        Err(err) => ModelEvent::Failed(err),
        Ok(_) => ModelEvent::Failed(CallError::Storage("a failed model call finished".into())),
    }
}

/// An iteration's tool calls, on one call of their own.
pub(super) struct IterationTools {
    call: Call,
    principal: Principal,
    scope: AgentScope,
    resolved: Arc<BTreeMap<String, Resolution>>,
    guard: Option<Arc<TurnGuard>>,
}

impl ToolCalls for IterationTools {
    type Error = CallError;
    type Meta = CallMeta;

    async fn run(&self, call: &ToolCall) -> Result<(ToolOutcome, Report), CallError> {
        let resolved = self.resolved.get(&call.id);
        let guard = self.guard.as_deref();
        tools::run(
            &self.call,
            &self.principal,
            &self.scope,
            call,
            resolved,
            guard,
        )
        .await
    }

    async fn over_cap(&self, call: &ToolCall, cap: u32) -> (ToolOutcome, Report) {
        tools::refused_over_cap(&self.call, call, cap).await
    }

    async fn finish(self) -> Result<CallMeta, CallError> {
        self.call.finish(Ok(())).await.map(|((), meta)| meta)
    }

    async fn abandon(self) {
        // A tool's record or audit could not be written.
        let storage = Err(CallError::Storage(String::new()));
        let _ = self.call.finish::<()>(storage).await;
    }
}
