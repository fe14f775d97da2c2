//! `AgentService` (SPEC §11): a turn streamed as events, and the
//! conversations it keeps, read and erased by their team only.

use super::{
    convert,
    error::{Failure, to_status},
    metrics_layer,
    open::{self, Caller},
    pb::{self, agent_service_server::AgentService},
    reply, request,
};
use crate::{
    agent::{
        StopReason,
        conversations::{self, StoredMessage},
        prompt::{Preferences, Retrieved},
    },
    auth::Authenticator,
    call::{
        Pipeline,
        turn::{TurnEvent, TurnRequest},
    },
    config::Config,
    domain::completion::Role,
};
use futures::{Stream, StreamExt};
use std::{pin::Pin, sync::Arc};
use tonic::{Request, Response, Status, metadata::MetadataMap};
use tracing::Instrument;

/// Most retrieved-context items a turn may carry.
pub(crate) const MAX_RETRIEVED: usize = 64;

/// Most messages `GetConversation` returns, the newest: a reply well inside the limits.
pub(crate) const MAX_MESSAGES_READ: u32 = 500;

/// The `AgentService`.
#[derive(Clone)]
pub struct AgentApi {
    config: Arc<Config>,
    pipeline: Pipeline,
    auth: Authenticator,
}

impl AgentApi {
    /// A service over the call pipeline.
    pub fn new(config: Arc<Config>, pipeline: Pipeline, auth: Authenticator) -> Self {
        Self {
            config,
            pipeline,
            auth,
        }
    }

    /// The caller of `rpc` (see [`open::caller`]).
    fn caller(
        &self,
        rpc: &'static str,
        envelope: (Option<&pb::RequestContext>, Option<&pb::Budget>),
        metadata: &MetadataMap,
        extensions: &tonic::Extensions,
    ) -> Result<Caller, Status> {
        let service = pb::agent_service_server::SERVICE_NAME;
        open::caller(
            &self.config,
            &self.auth,
            (service, rpc),
            envelope,
            metadata,
            extensions,
        )
    }

    /// The turn's request, its sizes checked (`server.max_input_bytes`, as for every RPC).
    fn turn_request(&self, req: pb::ConverseRequest) -> Result<TurnRequest, Failure> {
        use prost::Message;
        if req.agent.is_empty() {
            return Err(Failure::invalid("agent", "is required"));
        }
        if req.retrieved.len() > MAX_RETRIEVED {
            return Err(Failure::invalid(
                "retrieved",
                &format!("at most {MAX_RETRIEVED} items"),
            ));
        }
        request::check_input(
            req.encoded_len(),
            &[
                ("message", req.message.len()),
                (
                    "preferences",
                    req.preferences.as_ref().map_or(0, Message::encoded_len),
                ),
                (
                    "retrieved",
                    req.retrieved.iter().map(Message::encoded_len).sum(),
                ),
                (
                    "context",
                    req.context.as_ref().map_or(0, Message::encoded_len),
                ),
            ],
            &self.config.server,
        )?;
        let preferences = req.preferences.unwrap_or_default();
        let conversation_id = req
            .context
            .as_ref()
            .map(|c| c.conversation_id.clone())
            .filter(|id| !id.is_empty());
        Ok(TurnRequest {
            agent: req.agent,
            conversation_id,
            message: req.message,
            preferences: Preferences {
                response_length: preferences.response_length,
                formality: preferences.formality,
                custom_instructions: preferences.custom_instructions,
            },
            retrieved: req
                .retrieved
                .into_iter()
                .map(|r| Retrieved {
                    source: r.source,
                    text: r.text,
                    priority: r.priority,
                })
                .collect(),
            resume: req.resume,
        })
    }
}

fn stop_reason(s: StopReason) -> pb::StopReason {
    match s {
        StopReason::FinalAnswer => pb::StopReason::FinalAnswer,
        StopReason::MaxIterations => pb::StopReason::MaxIterations,
        StopReason::MaxToolCalls => pb::StopReason::MaxToolCalls,
        StopReason::Budget => pb::StopReason::Budget,
        StopReason::Deadline => pb::StopReason::Deadline,
        StopReason::ApprovalRequired => pb::StopReason::ApprovalRequired,
    }
}

fn role(r: Role) -> &'static str {
    match r {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

fn stored(m: StoredMessage) -> pb::ConversationMessage {
    pb::ConversationMessage {
        role: role(m.message.role).into(),
        content: m.message.content,
        tool_calls: m
            .message
            .tool_calls
            .into_iter()
            .map(|c| pb::StoredToolCall {
                id: c.id,
                tool: c.name,
                arguments: c.arguments,
            })
            .collect(),
        tool_result: m.message.tool_result.map(|r| pb::StoredToolResult {
            call_id: r.call_id,
            tool: r.name,
            content: r.content,
            is_error: r.is_error,
        }),
        turn: m.turn,
        created_at_ms: m.created_at_ms,
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ConverseEvent, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for AgentApi {
    type ConverseStream = EventStream;

    async fn converse(
        &self,
        request: Request<pb::ConverseRequest>,
    ) -> Result<Response<Self::ConverseStream>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        let envelope = (req.context.as_ref(), req.budget.as_ref());
        let caller = self.caller("Converse", envelope, &metadata, &extensions)?;
        let turn = self.turn_request(req).map_err(|f| caller.fail(f))?;
        let Caller {
            ctx,
            principal,
            span,
        } = caller;
        let trace_id = ctx.trace_id.clone();
        let events = self
            .pipeline
            .converse(ctx, principal, turn)
            .instrument(span.clone())
            .await
            .map_err(|e| to_status(e.into(), &trace_id))?;
        let mut stream_end = extensions
            .get::<metrics_layer::GrpcCall>()
            .map(metrics_layer::GrpcCall::defer);
        let event_trace_id = trace_id.clone();
        let stream = async_stream::stream! {
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                use pb::converse_event::Event;
                let out = match event {
                    TurnEvent::Started { conversation_id } => Event::Started(pb::TurnStarted {
                        trace_id: event_trace_id.clone(),
                        conversation_id,
                    }),
                    TurnEvent::Delta(text) => Event::Delta(pb::TextDelta { text }),
                    TurnEvent::ToolCall { call_id, tool } => Event::ToolCall(pb::ToolCallStarted { call_id, tool }),
                    TurnEvent::ToolResult { call_id, tool, status, duration_ms, error_code } => {
                        Event::ToolResult(pb::ToolCallResult {
                            call_id,
                            tool,
                            status: status.into(),
                            duration_ms: u32::try_from(duration_ms).unwrap_or(u32::MAX),
                            error_code,
                        })
                    }
                    TurnEvent::Fallback { from, to, reason } => Event::Fallback(pb::FallbackEvent { from, to, reason }),
                    TurnEvent::ApprovalRequired { call_id, tool, approval_id } => {
                        Event::ApprovalRequired(pb::ApprovalRequired { call_id, tool, approval_id })
                    }
                    TurnEvent::MemorySuggestions(items) => Event::MemorySuggestions(pb::MemorySuggestions { items }),
                    TurnEvent::Completed(outcome) => Event::Completed(pb::TurnCompleted {
                        text: outcome.text,
                        iterations: outcome.iterations,
                        stop_reason: stop_reason(outcome.stop_reason) as i32,
                        meta: Some(convert::meta(&outcome.meta)),
                        tool_calls: outcome.tool_calls,
                    }),
                    TurnEvent::Failed(err) => {
                        let status = to_status(err.into(), &event_trace_id);
                        if let Some(end) = stream_end.as_mut() { end.finish(status.code()); }
                        yield Err(status);
                        return;
                    }
                };
                yield Ok(pb::ConverseEvent { event: Some(out) });
            }
            if let Some(end) = stream_end.as_mut() { end.finish(tonic::Code::Ok); }
        };
        let stream = crate::telemetry::InSpan::new(Box::pin(stream), span);
        let stream = super::access::Noted::current(stream);
        Ok(reply(&trace_id, Box::pin(stream) as EventStream))
    }

    async fn get_conversation(
        &self,
        request: Request<pb::GetConversationRequest>,
    ) -> Result<Response<pb::Conversation>, Status> {
        const RPC: &str = "GetConversation";
        let (metadata, extensions, req) = request.into_parts();
        let envelope = (req.context.as_ref(), None);
        let Caller { ctx, .. } = self.caller(RPC, envelope, &metadata, &extensions)?;
        let fail = |f: Failure| to_status(f, &ctx.trace_id);
        let storage = |e: crate::store::StoreError| fail(Failure::Storage(e.to_string()));
        let store = self.pipeline.store();
        let now = chrono::Utc::now().timestamp_millis();
        let Some(c) = conversations::find(store, &ctx.team_id, &req.conversation_id, now)
            .await
            .map_err(storage)?
        else {
            return Err(fail(not_found(&req.conversation_id)));
        };
        let messages = conversations::history(store, &c.id, MAX_MESSAGES_READ)
            .await
            .map_err(storage)?;
        let turns = conversations::turns(store, &c.id).await.map_err(storage)?;
        Ok(reply(
            &ctx.trace_id,
            pb::Conversation {
                conversation_id: c.id,
                agent: c.agent,
                turns: c.turns,
                created_at_ms: c.created_at_ms,
                updated_at_ms: c.updated_at_ms,
                expires_at_ms: c.expires_at_ms,
                summary: c.summary,
                messages: messages.into_iter().map(stored).collect(),
                memory_suggestions: turns
                    .into_iter()
                    .filter(|t| !t.memory_suggestions.is_empty())
                    .map(|t| pb::TurnSuggestions {
                        turn: t.turn,
                        items: t.memory_suggestions,
                    })
                    .collect(),
            },
        ))
    }

    async fn delete_conversation(
        &self,
        request: Request<pb::DeleteConversationRequest>,
    ) -> Result<Response<pb::DeleteConversationResponse>, Status> {
        const RPC: &str = "DeleteConversation";
        let (metadata, extensions, req) = request.into_parts();
        let envelope = (req.context.as_ref(), None);
        let Caller { ctx, .. } = self.caller(RPC, envelope, &metadata, &extensions)?;
        let fail = |f: Failure| to_status(f, &ctx.trace_id);
        match conversations::delete(self.pipeline.store(), &ctx.team_id, &req.conversation_id)
            .await
            .map_err(|e| fail(Failure::Storage(e.to_string())))?
        {
            Some(messages_deleted) => Ok(reply(
                &ctx.trace_id,
                pb::DeleteConversationResponse { messages_deleted },
            )),
            None => Err(fail(not_found(&req.conversation_id))),
        }
    }
}

fn not_found(id: &str) -> Failure {
    Failure::NotFound(format!("conversation `{id}`"))
}
