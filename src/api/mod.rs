//! The gRPC surface: proto → domain types, the call pipeline, domain →
//! proto, and every error mapped to a status once (in [`error`]).

pub mod access;
pub mod admin;
pub mod agent;
pub mod approvals;
pub mod audit;
pub mod auth;
pub mod convert;
pub mod error;
pub mod mcp;
pub mod metrics_layer;
mod open;
mod orchestrator;
pub mod pb;
pub(crate) mod request;
pub mod tool_admin;
pub mod tools;
mod usage;

pub use orchestrator::OrchestratorApi;

use crate::{
    call::CallContext,
    telemetry::{otel, trace_id::TRACE_ID_HEADER},
};
use tonic::Response;

/// One request's span, carrying the trace ID: identifiers only, never message contents.
/// Exported, it is the OpenTelemetry RPC SERVER span, named `service/method`.
fn request_span((service, rpc): (&'static str, &'static str), ctx: &CallContext) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{service}/{rpc}"),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = rpc,
        rpc.grpc.status_code = tracing::field::Empty,
        rpc,
        trace_id = %ctx.trace_id,
        span_id = tracing::field::Empty,
        team_id = %ctx.team_id,
        priority = ctx.priority.as_str(),
    );
    otel::attach(&span, ctx.traceparent.as_deref(), &ctx.trace_id);
    span
}

/// Records the final gRPC code on the request span. Per the OpenTelemetry RPC conventions
/// only the server's faults make it an error; a refused input is the caller's.
pub(crate) fn record_status(code: tonic::Code) {
    use tonic::Code;
    let span = tracing::Span::current();
    span.record("rpc.grpc.status_code", code as i64);
    if matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    ) {
        span.record("otel.status_code", "error");
    }
}

/// Wraps a body in a response carrying the `x-trace-id` metadata.
fn reply<T>(trace_id: &str, body: T) -> Response<T> {
    access::note(|f| trace_id.clone_into(&mut f.trace_id));
    record_status(tonic::Code::Ok);
    let mut response = Response::new(body);
    if let Ok(value) = trace_id.parse() {
        response.metadata_mut().insert(TRACE_ID_HEADER, value);
    }
    response
}
