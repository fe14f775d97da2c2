//! `GET /v1/models` and `GET /v1/models/{model}`: every task, and every
//! agent as `agent/<name>`, in OpenAI's list format.

use super::{Edge, caller::caller, error::HttpError, traced};
use crate::api::error::Failure;
use axum::{
    extract::{Path, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

/// Who owns what we list.
const OWNER: &str = "ai-orchestrator";

fn model(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": OWNER})
}

/// Every model ID: the tasks, then the agents.
fn ids(edge: &Edge) -> impl Iterator<Item = String> + '_ {
    let config = edge.pipeline.config();
    let tasks = config.tasks.keys().cloned();
    tasks.chain(config.agents.keys().map(|a| format!("agent/{a}")))
}

/// `GET /v1/models`.
pub(super) async fn list(
    State(edge): State<Edge>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let caller = caller(&edge, "GET /v1/models", &headers)?;
    let data: Vec<Value> = ids(&edge).map(|id| model(&id)).collect();
    let body = axum::Json(json!({"object": "list", "data": data}));
    Ok(traced(body.into_response(), &caller.ctx.trace_id))
}

/// `GET /v1/models/{model}`; an unknown one is 404 `NOT_FOUND`.
pub(super) async fn one(
    State(edge): State<Edge>,
    Path(wanted): Path<String>,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    let caller = caller(&edge, "GET /v1/models/{model}", &headers)?;
    let trace_id = &caller.ctx.trace_id;
    if ids(&edge).any(|id| id == wanted) {
        return Ok(traced(axum::Json(model(&wanted)).into_response(), trace_id));
    }
    let wanted: String = wanted.chars().take(128).collect();
    let failure = Failure::NotFound(format!("no model `{wanted}` (a task, or agent/<name>)"));
    Err(HttpError::new(failure, trace_id))
}
