//! Agent turns as Server-Sent Events and the conversations they keep
//! (SPEC §13): `POST /v1/agents/{agent}/turns`, `GET` and `DELETE
//! /v1/conversations/{id}`, read and erased by their team only.

use super::{Edge, caller::caller, error::HttpError, read_json, traced, typed};
use crate::{
    agent::{
        conversations::{self, StoredMessage},
        prompt::{Preferences, Retrieved},
    },
    api::{
        access::Noted,
        agent::{MAX_MESSAGES_READ, MAX_RETRIEVED},
        error::Failure,
        request,
    },
    call::turn::{TurnEvent, TurnOutcome},
    domain::completion::Role,
};
use axum::{
    body::Body,
    extract::{Path, State},
    http::HeaderMap,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use std::convert::Infallible;
use tracing::Instrument;

/// A turn's body.
#[derive(Debug, Deserialize)]
struct TurnBody {
    #[serde(default)]
    conversation_id: Option<String>,
    /// Empty (or absent) only with `resume`.
    #[serde(default)]
    message: String,
    /// Settles the conversation's held tool calls, then goes on (SPEC §14.1).
    #[serde(default)]
    resume: bool,
    #[serde(default)]
    preferences: Option<PreferencesBody>,
    #[serde(default)]
    retrieved: Vec<RetrievedBody>,
}

#[derive(Debug, Default, Deserialize)]
struct PreferencesBody {
    #[serde(default)]
    response_length: String,
    #[serde(default)]
    formality: String,
    #[serde(default)]
    custom_instructions: String,
}

#[derive(Debug, Deserialize)]
struct RetrievedBody {
    #[serde(default)]
    source: String,
    text: String,
    #[serde(default)]
    priority: i32,
}

/// `POST /v1/agents/{agent}/turns`.
pub(super) async fn turn(
    State(edge): State<Edge>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    const ROUTE: &str = "POST /v1/agents/{agent}/turns";
    let result = async {
        let caller = caller(&edge, ROUTE, &headers).map_err(IntoResponse::into_response)?;
        let trace_id = caller.ctx.trace_id.clone();
        let value = read_json(&edge, body, &trace_id).await?;
        let body: TurnBody = typed(value, &trace_id).map_err(IntoResponse::into_response)?;
        let turn =
            turn_request(agent, body).map_err(|f| HttpError::new(f, &trace_id).into_response())?;
        let span = caller.span.clone();
        let pipeline = &edge.pipeline;
        let events = async {
            let events = pipeline.converse(caller.ctx, caller.principal, turn).await;
            events.map_err(|e| HttpError::call(e, &trace_id).into_response())
        }
        .instrument(span.clone())
        .await?;
        let cut = [
            named(
                "error",
                &json!({"code": "SHUTTING_DOWN", "message": "the server is shutting down"}),
            ),
            named("done", &json!({})),
        ];
        let events = edge.streams.bounded(
            sse(events, trace_id.clone()),
            cut.into_iter().flatten().collect(),
        );
        let events = crate::telemetry::InSpan::new(Box::pin(events), span);
        let body = Sse::new(Noted::current(events)).keep_alive(KeepAlive::default());
        Ok::<_, Response>(traced(body.into_response(), &trace_id))
    };
    result.await.unwrap_or_else(|err| err)
}

fn turn_request(agent: String, body: TurnBody) -> Result<crate::call::turn::TurnRequest, Failure> {
    if body.retrieved.len() > MAX_RETRIEVED {
        let why = format!("at most {MAX_RETRIEVED} items");
        return Err(Failure::invalid("retrieved", &why));
    }
    if let Some(id) = &body.conversation_id {
        request::check_id(id, false).map_err(|why| Failure::invalid("conversation_id", why))?;
    }
    let preferences = body.preferences.unwrap_or_default();
    Ok(crate::call::turn::TurnRequest {
        agent,
        conversation_id: body.conversation_id.filter(|id| !id.is_empty()),
        message: body.message,
        preferences: Preferences {
            response_length: preferences.response_length,
            formality: preferences.formality,
            custom_instructions: preferences.custom_instructions,
        },
        retrieved: body
            .retrieved
            .into_iter()
            .map(|r| Retrieved {
                source: r.source,
                text: r.text,
                priority: r.priority,
            })
            .collect(),
        resume: body.resume,
    })
}

/// One named event.
fn named(name: &'static str, data: &Value) -> Result<Event, Infallible> {
    Ok(Event::default().event(name).data(data.to_string()))
}

/// The turn's events under the seed's names, always ending in `done`.
fn sse(
    events: impl Stream<Item = TurnEvent> + Send + 'static,
    trace_id: String,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    async_stream::stream! {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let (name, data) = match event {
                TurnEvent::Started { conversation_id } => (
                    "message.start",
                    json!({"trace_id": trace_id, "conversation_id": conversation_id}),
                ),
                TurnEvent::Delta(text) => ("message.delta", json!({"text": text})),
                TurnEvent::ToolCall { call_id, tool } => {
                    ("tool.start", json!({"call_id": call_id, "tool": tool}))
                }
                TurnEvent::ToolResult { call_id, tool, status, duration_ms, error_code } => (
                    "tool.complete",
                    json!({"call_id": call_id, "tool": tool, "status": status,
                           "duration_ms": duration_ms, "error_code": error_code}),
                ),
                TurnEvent::Fallback { from, to, reason } => {
                    ("fallback", json!({"from": from, "to": to, "reason": reason}))
                }
                TurnEvent::ApprovalRequired { call_id, tool, approval_id } => (
                    "approval.required",
                    json!({"call_id": call_id, "tool": tool, "approval_id": approval_id}),
                ),
                TurnEvent::MemorySuggestions(items) => {
                    ("memory.suggestions", json!({"items": items}))
                }
                TurnEvent::Completed(outcome) => ("message.complete", completed(&outcome)),
                TurnEvent::Failed(err) => {
                    let err = HttpError::call(err, &trace_id);
                    ("error", json!({"code": err.reason(), "message": err.message()}))
                }
            };
            yield named(name, &data);
        }
        yield named("done", &json!({}));
    }
}

fn completed(outcome: &TurnOutcome) -> Value {
    let meta = &outcome.meta;
    crate::api::access::note(|f| {
        f.attempts = meta.attempts.len();
        f.provider.clone_from(&meta.provider);
        f.model.clone_from(&meta.model);
    });
    json!({
        "text": outcome.text,
        "stop_reason": outcome.stop_reason.as_str(),
        "iterations": outcome.iterations,
        "tool_calls": outcome.tool_calls,
        "usage": {
            "input_tokens": meta.usage.input_tokens,
            "output_tokens": meta.usage.output_tokens,
            "cost_usd": meta.cost_usd,
        },
        "provider": meta.provider,
        "model": meta.model,
    })
}

/// `GET /v1/conversations/{id}`: the conversation and its newest messages.
pub(super) async fn get_conversation(
    State(edge): State<Edge>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let caller = caller(&edge, "GET /v1/conversations/{id}", &headers)?;
    let ctx = &caller.ctx;
    let storage = |e: crate::store::StoreError| {
        HttpError::new(Failure::Storage(e.to_string()), &ctx.trace_id)
    };
    let store = edge.pipeline.store();
    let now = chrono::Utc::now().timestamp_millis();
    let Some(c) = conversations::find(store, &ctx.team_id, &id, now)
        .await
        .map_err(storage)?
    else {
        return Err(not_found(&id, &ctx.trace_id));
    };
    let messages = conversations::history(store, &c.id, MAX_MESSAGES_READ)
        .await
        .map_err(storage)?;
    let turns = conversations::turns(store, &c.id).await.map_err(storage)?;
    let body = json!({
        "conversation_id": c.id,
        "agent": c.agent,
        "turns": c.turns,
        "created_at_ms": c.created_at_ms,
        "updated_at_ms": c.updated_at_ms,
        "expires_at_ms": c.expires_at_ms,
        "summary": c.summary,
        "messages": messages.iter().map(stored).collect::<Vec<_>>(),
        "memory_suggestions": turns
            .iter()
            .filter(|t| !t.memory_suggestions.is_empty())
            .map(|t| json!({"turn": t.turn, "items": t.memory_suggestions}))
            .collect::<Vec<_>>(),
    });
    Ok(traced(axum::Json(body).into_response(), &ctx.trace_id))
}

/// `DELETE /v1/conversations/{id}`: erased with its messages.
pub(super) async fn delete_conversation(
    State(edge): State<Edge>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let caller = caller(&edge, "DELETE /v1/conversations/{id}", &headers)?;
    let ctx = &caller.ctx;
    match conversations::delete(edge.pipeline.store(), &ctx.team_id, &id).await {
        Ok(Some(deleted)) => {
            let body = axum::Json(json!({"messages_deleted": deleted}));
            Ok(traced(body.into_response(), &ctx.trace_id))
        }
        Ok(None) => Err(not_found(&id, &ctx.trace_id)),
        Err(e) => Err(HttpError::new(
            Failure::Storage(e.to_string()),
            &ctx.trace_id,
        )),
    }
}

fn not_found(id: &str, trace_id: &str) -> HttpError {
    let id = id.chars().take(128).collect::<String>();
    HttpError::new(Failure::NotFound(format!("conversation `{id}`")), trace_id)
}

fn stored(m: &StoredMessage) -> Value {
    let role = match m.message.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    json!({
        "role": role,
        "content": m.message.content,
        "tool_calls": m.message.tool_calls.iter().map(|c| json!({
            "id": c.id, "tool": c.name, "arguments": c.arguments,
        })).collect::<Vec<_>>(),
        "tool_result": m.message.tool_result.as_ref().map(|r| json!({
            "call_id": r.call_id, "tool": r.name, "content": r.content, "is_error": r.is_error,
        })),
        "turn": m.turn,
        "created_at_ms": m.created_at_ms,
    })
}
