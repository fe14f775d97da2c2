//! A tower layer counting gRPC calls by method and status code, and timing
//! them (until response headers: for a stream, its start).

use crate::telemetry::metrics;
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};
use tokio::time::Instant;
use tonic::codegen::http;
use tower::{Layer, Service};

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

/// Only our services get their own label; anything else a client sends is
/// `other`, so a scanner cannot blow up the label cardinality.
fn method_label(path: &str) -> String {
    let known = [
        "/ai.orchestrator.v1.",
        "/grpc.health.v1.",
        "/grpc.reflection.",
    ];
    if known.iter().any(|p| path.starts_with(p)) && path.len() < 128 {
        path.trim_start_matches('/').to_owned()
    } else {
        "other".to_owned()
    }
}

/// gRPC status number → canonical name.
fn code_name(code: &str) -> &'static str {
    match code {
        "0" => "OK",
        "1" => "CANCELLED",
        "2" => "UNKNOWN",
        "3" => "INVALID_ARGUMENT",
        "4" => "DEADLINE_EXCEEDED",
        "5" => "NOT_FOUND",
        "6" => "ALREADY_EXISTS",
        "7" => "PERMISSION_DENIED",
        "8" => "RESOURCE_EXHAUSTED",
        "9" => "FAILED_PRECONDITION",
        "10" => "ABORTED",
        "11" => "OUT_OF_RANGE",
        "12" => "UNIMPLEMENTED",
        "13" => "INTERNAL",
        "14" => "UNAVAILABLE",
        "15" => "DATA_LOSS",
        "16" => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

impl<S, B, R> Service<http::Request<B>> for GrpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_label(request.uri().path());
        let started = Instant::now();
        let future = self.inner.call(request);
        Box::pin(async move {
            let response = future.await;
            // Errors travel trailers-only, so their status is in the headers;
            // a unary success carries it in trailers after the body.
            let code = match &response {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .map_or("OK", code_name),
                Err(_) => "UNKNOWN",
            };
            metrics::grpc(&method, code, started.elapsed());
            response
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded() {
        assert_eq!(
            method_label("/ai.orchestrator.v1.Orchestrator/ClassifySms"),
            "ai.orchestrator.v1.Orchestrator/ClassifySms"
        );
        assert_eq!(method_label("/evil.Service/Random123"), "other");
        assert_eq!(code_name("8"), "RESOURCE_EXHAUSTED");
    }
}
