//! `POST /v1/chat/completions` (SPEC §13): `model` names a task, whose
//! chain, fallbacks, breakers, pricing and defaults apply; the caller's
//! messages and tools are sent as given, and the model's tool calls come
//! back in OpenAI's format whatever the provider. Streamed as SSE `data:`
//! chunks ending in `data: [DONE]`.

mod reply;
mod wire;

use super::{Edge, caller::caller, error::HttpError, read_json, traced, typed};
use crate::{
    api::{access::Noted, error::Failure, request},
    call::CallEvent,
    domain::json,
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
    let (value, bytes) = read_json(edge, body, &trace_id).await?;
    check_size(edge, &value, bytes).map_err(|f| refuse(HttpError::new(f, &trace_id)))?;
    let request: ChatRequest = typed(value, &trace_id).map_err(refuse)?;
    caller.body_user(request.user.as_deref()).map_err(refuse)?;
    let stream = request.stream.unwrap_or(false);
    let include_usage = request
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let chat = request
        .into_chat()
        .map_err(|v| refuse(HttpError::new(Failure::Invalid(v), &trace_id)))?;
    let head = Head::new(&trace_id, &chat.task);
    let span = caller.span.clone();
    if stream {
        let events = edge
            .pipeline
            .stream_chat(caller.ctx, chat)
            .instrument(span.clone())
            .await
            .map_err(|e| refuse(HttpError::call(e, &trace_id)))?;
        let events = sse(events, head, include_usage, trace_id.clone());
        let events = crate::telemetry::InSpan::new(Box::pin(events), span);
        let body = Sse::new(Noted::current(events)).keep_alive(KeepAlive::default());
        return Ok(traced(body.into_response(), &trace_id));
    }
    let (completion, meta) = edge
        .pipeline
        .run(caller.ctx, chat)
        .instrument(span)
        .await
        .map_err(|e| refuse(HttpError::call(e, &trace_id)))?;
    reply::note(&meta);
    let body = axum::Json(head.completion(&completion, &meta));
    Ok(traced(body.into_response(), &trace_id))
}

/// `server.max_input_bytes` over what the caller fills, as gRPC's `Execute`.
fn check_size(edge: &Edge, body: &Value, bytes: usize) -> Result<(), Failure> {
    let part = |key: &str| body.get(key).map_or(0, json::bytes);
    request::check_input(
        bytes,
        &[("messages", part("messages")), ("tools", part("tools"))],
        &edge.pipeline.config().server,
    )
}

/// The call's events as Chat Completions chunks: the role first, each text
/// delta, the tool calls, the finish reason, the usage when asked, `[DONE]`.
/// A failure after the first byte is a last `data: {"error": …}`, which the
/// SDKs raise.
fn sse(
    events: impl Stream<Item = CallEvent> + Send + 'static,
    head: Head,
    include_usage: bool,
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
                    if include_usage {
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
    }
}
