//! `POST /v1/chat/completions` (SPEC §13): `model` names a task, whose
//! chain, fallbacks, breakers, pricing and defaults apply; the caller's
//! messages and tools are sent as given, and the model's tool calls come
//! back in OpenAI's format whatever the provider. Streamed as SSE `data:`
//! chunks ending in `data: [DONE]`.

mod reply;
mod wire;

use super::{Edge, caller::caller, error::HttpError, read_json, traced, typed};
use crate::{
    api::{access::Noted, error::Failure},
    call::CallEvent,
};
use axum::{
    body::Body,
    extract::State,
    http::HeaderMap,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::{Stream, StreamExt};
use reply::Head;
use serde_json::Value;
use std::convert::Infallible;
use tracing::Instrument;
use wire::ChatRequest;

const ROUTE: &str = "POST /v1/chat/completions";

/// The handler.
pub(super) async fn completions(
    State(edge): State<Edge>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match answer(&edge, &headers, body).await {
        Ok(response) => response,
        Err(err) => err,
    }
}

async fn answer(edge: &Edge, headers: &HeaderMap, body: Body) -> Result<Response, Response> {
    let mut caller = caller(edge, ROUTE, headers).map_err(IntoResponse::into_response)?;
    let trace_id = caller.ctx.trace_id.clone();
    let refuse = |err: HttpError| err.renaming("task", "model").into_response();
    let value = read_json(edge, body, &trace_id).await?;
    let request: ChatRequest = typed(value, &trace_id).map_err(refuse)?;
    caller.body_user(request.user.as_deref()).map_err(refuse)?;
    check(edge, &request).map_err(|f| refuse(HttpError::new(f, &trace_id)))?;
    let stream = request.stream.unwrap_or(false);
    let include_usage = request
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let chat = request
        .into_chat()
        .map_err(|v| refuse(HttpError::new(Failure::Invalid(v), &trace_id)))?;
    let head = Head::new(&trace_id, &chat.task, include_usage);
    let (pipeline, span) = (&edge.pipeline, caller.span.clone());
    let fail = |e| refuse(HttpError::call(e, &trace_id));
    // Failures are mapped inside the request's span, as on gRPC.
    if stream {
        let events = async { pipeline.stream_chat(caller.ctx, chat).await.map_err(fail) }
            .instrument(span.clone())
            .await?;
        let events = edge.streams.bounded(
            sse(events, head, trace_id.clone()),
            vec![Event::default().data(shutting_down().to_string())],
        );
        let events = crate::telemetry::InSpan::new(Box::pin(events), span);
        let body = Sse::new(Noted::current(events)).keep_alive(KeepAlive::default());
        return Ok(traced(body.into_response(), &trace_id));
    }
    let (completion, meta) = async { pipeline.run(caller.ctx, chat).await.map_err(fail) }
        .instrument(span)
        .await?;
    reply::note(&meta);
    let body = axum::Json(head.completion(&completion, &meta));
    Ok(traced(body.into_response(), &trace_id))
}

/// The last chunk of a stream cut by the shutdown: the SDKs raise it.
fn shutting_down() -> serde_json::Value {
    serde_json::json!({"error": {
        "message": "the server is shutting down; retry on another replica",
        "type": "service_unavailable_error", "code": "SHUTTING_DOWN", "param": null,
    }})
}

/// What gRPC bounds besides bytes (`server.max_history_entries`), and a
/// model that is an agent: agents run through their own route.
fn check(edge: &Edge, request: &ChatRequest) -> Result<(), Failure> {
    let max = edge.pipeline.config().server.max_history_entries;
    if request.messages.len() > max {
        let why = format!(
            "has {} messages, more than the {max} allowed (server.max_history_entries)",
            request.messages.len()
        );
        return Err(Failure::invalid("messages", &why));
    }
    if let Some(agent) = request.model.strip_prefix("agent/") {
        let agent: String = agent.chars().take(128).collect();
        let why = format!("`agent/{agent}` is an agent: run it with POST /v1/agents/{agent}/turns");
        return Err(Failure::invalid("model", &why));
    }
    Ok(())
}

/// The call's events as Chat Completions chunks: the role first, each text
/// delta, the tool calls, the finish reason, the usage when asked, `[DONE]`.
/// A failure after the first byte is a last `data: {"error": …}`, which the
/// SDKs raise.
fn sse(
    events: impl Stream<Item = CallEvent> + Send + 'static,
    head: Head,
    trace_id: String,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    let data = |v: Value| Ok(Event::default().data(v.to_string()));
    async_stream::stream! {
        yield data(head.delta(serde_json::json!({"role": "assistant", "content": ""}), None));
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                CallEvent::Started { .. } | CallEvent::Fallback { .. } => {}
                CallEvent::Delta(text) => {
                    yield data(head.delta(serde_json::json!({"content": text}), None));
                }
                CallEvent::Completed { completion, meta, .. } => {
                    reply::note(&meta);
                    if !completion.tool_calls.is_empty() {
                        let calls = reply::tool_calls(&completion.tool_calls, true);
                        yield data(head.delta(serde_json::json!({"tool_calls": calls}), None));
                    }
                    yield data(head.delta(serde_json::json!({}), Some(completion.finish_reason)));
                    if head.include_usage {
                        yield data(head.usage_chunk(&meta));
                    }
                    yield Ok(Event::default().data("[DONE]"));
                    return;
                }
                CallEvent::Failed(err) => {
                    let err = HttpError::call(err, &trace_id).renaming("task", "model");
                    yield data(err.body());
                    return;
                }
            }
        }
        // Neither an answer nor a failure: never a silent, seemingly whole answer.
        yield data(serde_json::json!({"error": {
            "message": "the call ended without an answer", "type": "api_error",
            "code": "INTERNAL", "param": null,
        }}));
    }
}
