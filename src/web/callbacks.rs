//! `POST /v1/tool-invocations/{id}/complete` (SPEC §16): a workflow that
//! accepted an invocation reports its end. No API key: the `X-Signature`
//! HMAC over the raw body, keyed by the tool's callback secret, is the
//! credential, so the body is read raw and handed to the pipeline as is.

use super::{Edge, error::HttpError, read_body, trace_of, traced};
use crate::api::error::Failure;
use axum::{
    body::Body,
    extract::{Path, State},
    http::HeaderMap,
    response::{IntoResponse, Response},
};
use serde_json::json;

/// `POST /v1/tool-invocations/{id}/complete`: 200 with the invocation's
/// status (again for a repeat of the same body), 401 for a bad signature,
/// 404 for no such invocation, 409 for a different body after the end.
pub(super) async fn complete(
    State(edge): State<Edge>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Response> {
    let trace_id = trace_of(&headers);
    crate::api::access::note(|f| f.trace_id.clone_from(&trace_id));
    let bytes = read_body(&edge, body, &trace_id).await?;
    let signature = headers.get("x-signature").and_then(|v| v.to_str().ok());
    let done = edge
        .pipeline
        .complete_invocation(&id, signature, &bytes)
        .await
        .map_err(|e| HttpError::new(Failure::Callback(e), &trace_id).into_response())?;
    let mut body = json!({
        "invocation_id": done.invocation_id,
        "status": done.status.as_str(),
        "repeated": done.repeated,
    });
    if let Some(e) = &done.error {
        body["error"] = json!({"code": e.code, "message": e.message});
    }
    Ok(traced(axum::Json(body).into_response(), &trace_id))
}
