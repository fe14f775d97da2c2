//! A tower layer counting and timing gRPC calls by method and final code, as the
//! grpc-ecosystem convention names them (`grpc_server_started_total`,
//! `grpc_server_handled_total`, `grpc_server_handling_seconds`), and writing each call's
//! access line ([`super::access`]) when it ends.
//!
//! A unary call is recorded when its response head leaves (an error travels trailers-only).
//! A server stream's outcome is only in its trailers, so a streaming handler takes the
//! recording over with [`GrpcCall::defer`] and reports the final code; streams that do not
//! (health `Watch`, reflection) are recorded at their start as `OK`. A response future
//! dropped before it resolves (the client went away) is recorded as `CANCELLED`, so every
//! started call is handled once, with an access line.
//!
//! This layer runs before authentication: its labels must never echo what a caller sent.
//! Methods come from a fixed list, codes from the gRPC set.

use super::access::{self, Record};
use crate::telemetry::metrics;
use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
};
use tokio::time::Instant;
use tonic::{Code, codegen::http};
use tower::{Layer, Service};

/// Every method this server serves (`service/method`, as in the path): ours, gRPC health
/// and reflection (v1, v1alpha). A unit test checks it against the compiled descriptor
/// sets, so a new RPC cannot be forgotten.
const METHODS: &[(&str, &str)] = &[
    ("ai.orchestrator.v1.Orchestrator/Execute", UNARY),
    (
        "ai.orchestrator.v1.Orchestrator/ExecuteStream",
        SERVER_STREAM,
    ),
    ("ai.orchestrator.v1.Orchestrator/ClassifySms", UNARY),
    ("ai.orchestrator.v1.Orchestrator/GenerateSms", UNARY),
    ("ai.orchestrator.v1.Orchestrator/Research", UNARY),
    ("ai.orchestrator.v1.Orchestrator/GetUsage", UNARY),
    ("ai.orchestrator.v1.Orchestrator/GetProviderHealth", UNARY),
    ("ai.orchestrator.v1.PromptAdmin/ListPrompts", UNARY),
    ("ai.orchestrator.v1.PromptAdmin/CreatePromptVersion", UNARY),
    (
        "ai.orchestrator.v1.PromptAdmin/ActivatePromptVersion",
        UNARY,
    ),
    ("ai.orchestrator.v1.ToolService/ListTools", UNARY),
    ("ai.orchestrator.v1.ToolService/InvokeTool", UNARY),
    ("ai.orchestrator.v1.ToolService/GetToolInvocation", UNARY),
    ("ai.orchestrator.v1.ApprovalService/ListApprovals", UNARY),
    ("ai.orchestrator.v1.ApprovalService/GetApproval", UNARY),
    ("ai.orchestrator.v1.ApprovalService/DecideApproval", UNARY),
    ("ai.orchestrator.v1.ToolAdmin/RegisterTool", UNARY),
    ("ai.orchestrator.v1.ToolAdmin/DisableTool", UNARY),
    ("ai.orchestrator.v1.ToolAdmin/EnableTool", UNARY),
    ("ai.orchestrator.v1.ToolAdmin/DeprecateTool", UNARY),
    ("ai.orchestrator.v1.ToolAdmin/ListToolVersions", UNARY),
    ("ai.orchestrator.v1.AuditService/ListAuditEvents", UNARY),
    ("ai.orchestrator.v1.AuditService/VerifyAuditChain", UNARY),
    ("ai.orchestrator.v1.AgentService/Converse", SERVER_STREAM),
    ("ai.orchestrator.v1.AgentService/GetConversation", UNARY),
    ("ai.orchestrator.v1.AgentService/DeleteConversation", UNARY),
    ("grpc.health.v1.Health/Check", UNARY),
    ("grpc.health.v1.Health/Watch", SERVER_STREAM),
    (
        "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        BIDI_STREAM,
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        BIDI_STREAM,
    ),
];

/// `grpc_type` values (the grpc-ecosystem convention's).
const UNARY: &str = "unary";
const SERVER_STREAM: &str = "server_stream";
const BIDI_STREAM: &str = "bidi_stream";

/// Label of everything not in [`METHODS`] (scanners, typos, old clients).
const OTHER: &str = "other";

/// Adds gRPC server metrics to every call.
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

/// The service wrapper of [`GrpcMetricsLayer`].
#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
}

/// The method of a request path and its `grpc_type`: one of [`METHODS`], else `other`.
fn method_label(path: &str) -> (&'static str, &'static str) {
    let method = path.strip_prefix('/').unwrap_or(path);
    METHODS
        .iter()
        .find(|(known, _)| *known == method)
        .copied()
        .unwrap_or((OTHER, OTHER))
}

/// gRPC status code → canonical name (17 values).
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Who records a call. Every recording moves the phase to `Done` under its
/// lock first, so a call is recorded once whoever gets there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The layer, when the response head is out (or its future dropped first: `CANCELLED`).
    Head,
    /// A handler asked to record a stream's end, before the response (if the handler fails,
    /// or its future is dropped, the layer records after all).
    Deferred,
    /// The stream is running: its [`StreamEnd`] records.
    Streaming,
    Done,
}

#[derive(Debug)]
struct CallState {
    method: &'static str,
    kind: &'static str,
    started: Instant,
    phase: Mutex<Phase>,
    /// What the handler noted for the access line.
    record: Record,
}

/// One call's metrics, put in the request extensions by the layer so a
/// streaming handler can [`defer`](GrpcCall::defer) them to the stream's end.
#[derive(Debug, Clone)]
pub struct GrpcCall(Arc<CallState>);

impl GrpcCall {
    fn new((method, kind): (&'static str, &'static str)) -> Self {
        metrics::grpc_started(kind, method);
        Self(Arc::new(CallState {
            method,
            kind,
            started: Instant::now(),
            phase: Mutex::new(Phase::Head),
            record: Record::default(),
        }))
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        // The lock guards a plain enum: a poisoned one is still consistent.
        self.0.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn observe(&self, code: Code) {
        let (took, code) = (self.0.started.elapsed(), code_name(code));
        metrics::grpc_handled(self.0.kind, self.0.method, code, took);
        self.0.record.log(self.0.method, code, took);
    }

    /// The response head left the service; `status` is its `grpc-status`
    /// header (present when the call failed before any message).
    fn responded(&self, status: Option<Code>) {
        let mut phase = self.phase();
        match (status, *phase) {
            (_, Phase::Done) | (_, Phase::Streaming) => {}
            (None, Phase::Deferred) => *phase = Phase::Streaming,
            (status, Phase::Head | Phase::Deferred) => {
                *phase = Phase::Done;
                drop(phase);
                self.observe(status.unwrap_or(Code::Ok));
            }
        }
    }

    /// The response future was dropped before it resolved: nobody will answer, so record
    /// `CANCELLED` now. A resolved future (`Streaming`, `Done`) dropped is not a cancellation.
    fn abandoned(&self) {
        let mut phase = self.phase();
        match *phase {
            // `Deferred`: the handler's guard, if still alive, is inside the
            // future being dropped and drops after this; it then finds
            // `Done` and records nothing.
            Phase::Head | Phase::Deferred => {
                *phase = Phase::Done;
                drop(phase);
                self.observe(Code::Cancelled);
            }
            Phase::Streaming | Phase::Done => {}
        }
    }

    /// Hands the recording to the returned guard, to move into the response stream: the call
    /// is counted with the code given to [`StreamEnd::finish`], or as `CANCELLED` if dropped
    /// unfinished. Call it once nothing can fail before the response; should the handler
    /// fail anyway, the layer records as usual.
    pub fn defer(&self) -> StreamEnd {
        let mut phase = self.phase();
        if *phase == Phase::Head {
            *phase = Phase::Deferred;
        }
        StreamEnd {
            call: self.clone(),
            code: None,
        }
    }
}

/// Records a deferred streaming call when dropped (see [`GrpcCall::defer`]).
#[derive(Debug)]
pub struct StreamEnd {
    call: GrpcCall,
    code: Option<Code>,
}

impl StreamEnd {
    /// The stream's final status (what its trailers will carry): the call
    /// is recorded now, before the trailers go out.
    pub fn finish(&mut self, code: Code) {
        self.code = Some(code);
        let mut phase = self.call.phase();
        if *phase == Phase::Streaming {
            *phase = Phase::Done;
            drop(phase);
            self.call.observe(code);
        }
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        let mut phase = self.call.phase();
        match *phase {
            // Dropped unfinished: the client went away.
            Phase::Streaming => {
                *phase = Phase::Done;
                drop(phase);
                self.call.observe(self.code.unwrap_or(Code::Cancelled));
            }
            // Dropped before the response went out: the layer records it.
            Phase::Deferred => *phase = Phase::Head,
            Phase::Head | Phase::Done => {}
        }
    }
}

impl<S, B, R> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = ResponseFuture<tokio::task::futures::TaskLocalFuture<Record, S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let call = GrpcCall::new(method_label(request.uri().path()));
        request.extensions_mut().insert(call.clone());
        ResponseFuture {
            inner: access::scope(call.0.record.clone(), self.inner.call(request)),
            call,
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`GrpcMetrics`]: the inner one, recorded when it resolves, or
    /// as `CANCELLED` when dropped before (the client reset the stream or hung up).
    ///
    /// A named future, not an async block: that would hold the inner future twice
    /// (rust-lang/rust#62958) and allocate, for every call in flight.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        call: GrpcCall,
    }

    // Runs before the fields drop: a deferred call's guard, inside `inner`,
    // is still alive here (see `GrpcCall::abandoned`).
    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            this.project().call.abandoned();
        }
    }
}

impl<F, R, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<R>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx));
        match &response {
            Ok(r) => this.call.responded(
                r.headers()
                    .get("grpc-status")
                    .map(|v| Code::from_bytes(v.as_bytes())),
            ),
            Err(_) => this.call.responded(Some(Code::Unknown)),
        }
        Poll::Ready(response)
    }
}

#[cfg(test)]
mod tests;
