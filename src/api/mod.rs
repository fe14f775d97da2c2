//! The gRPC surface: proto → domain types, the call pipeline, domain →
//! proto, and every error mapped to a status once (in [`error`]).

pub mod admin;
pub mod auth;
pub mod convert;
pub mod error;
pub mod metrics_layer;
mod orchestrator;
pub mod pb;
pub(crate) mod request;
mod usage;

pub use orchestrator::OrchestratorApi;

use crate::{call::CallContext, telemetry::trace_id::TRACE_ID_HEADER};
use tonic::Response;

/// The span of one request: every log line inside it carries the trace ID.
/// Only identifiers go here, never message contents.
fn request_span(rpc: &'static str, ctx: &CallContext) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        rpc,
        trace_id = %ctx.trace_id,
        team_id = %ctx.team_id,
        priority = ctx.priority.as_str(),
    );
    if let Some(tp) = &ctx.traceparent {
        crate::telemetry::otel::continue_trace(&span, tp);
    }
    span
}

/// Wraps a body in a response carrying the `x-trace-id` metadata.
fn reply<T>(trace_id: &str, body: T) -> Response<T> {
    let mut response = Response::new(body);
    if let Ok(value) = trace_id.parse() {
        response.metadata_mut().insert(TRACE_ID_HEADER, value);
    }
    response
}
