//! OpenTelemetry traces: OTLP/gRPC export when an endpoint is configured, a
//! caller's W3C `traceparent` continued, ours sent upstream. Spans come from
//! `tracing` through `tracing-opentelemetry`; their fields never hold
//! contents or keys.

use crate::config::TelemetryConfig;
use opentelemetry::{
    Context,
    propagation::{Extractor, TextMapPropagator},
    trace::{SpanId, TraceContextExt, TraceId, TracerProvider as _},
};
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    propagation::TraceContextPropagator,
    trace::{
        IdGenerator, RandomIdGenerator, Sampler, SdkTracerProvider, SpanData, SpanExporter, Tracer,
    },
};
use std::{sync::Arc, time::Duration};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The collector: `OTEL_EXPORTER_OTLP_ENDPOINT` (platform-injected settings work), else config.
pub fn endpoint(config: &TelemetryConfig) -> Option<String> {
    std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .or_else(|| config.otlp_endpoint.clone())
}

/// A running OTLP pipeline; [`Otel::shutdown`] flushes it.
pub struct Otel {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Otel {
    /// The tracer to hand to the `tracing` layer.
    pub fn tracer(&self) -> Tracer {
        self.provider.tracer("ai-orchestrator")
    }

    /// Flushes pending spans and stops the exporter.
    pub fn shutdown(mut self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "flushing traces at shutdown failed");
        }
        if let Some(rt) = self.runtime.take() {
            // Dropping a runtime inside another one's context would panic.
            rt.shutdown_background();
        }
    }
}

/// Starts OTLP export when an endpoint is configured; `Ok(None)` otherwise.
pub fn init(config: &TelemetryConfig) -> anyhow::Result<Option<Otel>> {
    let Some(endpoint) = endpoint(config) else {
        return Ok(None);
    };
    // The SDK's batch processor exports from a plain thread, but the tonic
    // exporter needs a Tokio reactor: it gets a small runtime of its own.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otel-export")
        .enable_all()
        .build()?;
    let exporter = {
        let _enter = runtime.enter();
        use opentelemetry_otlp::WithExportConfig;
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(Duration::from_secs(5))
            .build()?
    };
    let exporter = OnRuntime {
        inner: Arc::new(exporter),
        handle: runtime.handle().clone(),
    };
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| config.service_name.clone());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler(config.sample_ratio))
        .with_id_generator(RequestIds::default())
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    Ok(Some(Otel {
        provider,
        runtime: Some(runtime),
    }))
}

/// Follows the caller's sampling decision; samples `ratio` of new traces.
pub fn sampler(ratio: f64) -> Sampler {
    Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
}

tokio::task_local! {
    /// The trace ID the root span being started must take ([`start_root`]).
    static ROOT_TRACE_ID: TraceId;
}

/// Random IDs, except a request's root span takes the request's trace ID, so
/// a log line, a span and a usage record share one ID.
#[derive(Debug, Default)]
pub struct RequestIds(RandomIdGenerator);

impl IdGenerator for RequestIds {
    fn new_trace_id(&self) -> TraceId {
        ROOT_TRACE_ID
            .try_with(|id| *id)
            .unwrap_or_else(|_| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        self.0.new_span_id()
    }
}

/// Starts root `span` with `trace_id` as its trace ID when that is a valid
/// W3C trace-id (ours are). A no-op while export is off.
pub fn start_root(span: &tracing::Span, trace_id: &str) {
    let Ok(id) = TraceId::from_hex(trace_id) else {
        return;
    };
    if trace_id.len() != 32 || id == TraceId::INVALID {
        return;
    }
    // Building the span's context starts it: the ID generator runs here.
    ROOT_TRACE_ID.sync_scope(id, || drop(span.context()));
}

/// Records `span`'s OpenTelemetry span ID as its `span_id` field, for logs.
pub fn record_span_id(span: &tracing::Span) {
    let cx = span.context();
    let span_ref = cx.span();
    let sc = span_ref.span_context();
    if sc.is_valid() {
        span.record("span_id", sc.span_id().to_string());
    }
}

/// Runs each export of `inner` on the exporter's own runtime.
#[derive(Debug)]
struct OnRuntime<E> {
    inner: Arc<E>,
    handle: tokio::runtime::Handle,
}

impl<E: SpanExporter + 'static> SpanExporter for OnRuntime<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let inner = self.inner.clone();
        match self
            .handle
            .spawn(async move { inner.export(batch).await })
            .await
        {
            Ok(result) => result,
            Err(e) => Err(opentelemetry_sdk::error::OTelSdkError::InternalFailure(
                e.to_string(),
            )),
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        // Called while the provider is built, before the exporter is shared.
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.set_resource(resource);
        }
    }
}

struct OneHeader<'a>(&'a str);

impl Extractor for OneHeader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

/// Makes `span` a child of the caller's span, so the caller's trace ID is
/// the trace ID of everything we record. A no-op while export is off.
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    let cx = TraceContextPropagator::new().extract(&OneHeader(traceparent));
    if cx.span().span_context().is_valid() {
        // Fails only for a disabled or started span: the trace starts here.
        let _ = span.set_parent(cx);
    }
}

/// The W3C `traceparent` of `span` (for upstream calls), when tracing is on.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let cx: Context = span.context();
    let span_ref = cx.span();
    let sc = span_ref.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// Puts a request's server `span` in its trace: the caller's valid
/// `traceparent`, else a root whose trace ID is ours; then records its span ID.
pub fn attach(span: &tracing::Span, traceparent: Option<&str>, trace_id: &str) {
    match traceparent {
        Some(tp) => continue_trace(span, tp),
        None => start_root(span, trace_id),
    }
    record_span_id(span);
}
