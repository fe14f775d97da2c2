//! Logs, trace IDs, Prometheus metrics and OpenTelemetry export.
//!
//! Must never log message contents, prompts, replies or API keys: fields are
//! chosen by hand at each call site, never whole requests.

pub mod metrics;
pub mod otel;
pub mod trace_id;

use std::{
    pin::Pin,
    task::{Context, Poll},
};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// A stream polled inside `span`: what `tracing::Instrument` does for a
/// future. The span stays open until the stream is dropped, so a response
/// stream's request span covers the whole stream, and spans and log lines
/// made while it is polled (provider attempts) are its children.
pub struct InSpan<S> {
    inner: S,
    span: tracing::Span,
}

impl<S> InSpan<S> {
    /// `inner`, polled inside `span`.
    pub fn new(inner: S, span: tracing::Span) -> Self {
        Self { inner, span }
    }
}

impl<S: futures::Stream + Unpin> futures::Stream for InSpan<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = &mut *self;
        let _entered = this.span.enter();
        Pin::new(&mut this.inner).poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum LogFormat {
    /// One JSON object per line (production).
    #[default]
    Json,
    /// Human-readable (local runs).
    Text,
}

/// The JSON log layer used in production: one object per line, with the
/// fields of the current span (so `trace_id` on every line of a request).
pub fn json_layer<S, W>(writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_writer(writer)
}

/// Installs the global subscriber. `RUST_LOG` filters log lines (default
/// `info`) but never our spans: a `warn` line still carries its request's
/// `trace_id`, and trace export does not depend on the log level.
/// With a `tracer`, our spans are also exported over OpenTelemetry.
/// Safe to call twice (the second call does nothing), which tests rely on.
pub fn init_logging(format: LogFormat, tracer: Option<opentelemetry_sdk::trace::Tracer>) {
    use tracing_subscriber::filter::{FilterExt, Targets, filter_fn};
    let ours = |m: &tracing::Metadata<'_>| m.target().starts_with("ai_orchestrator");
    let logs = || {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("info"))
            .or(filter_fn(move |m| m.is_span() && ours(m)))
    };
    let otel = tracer.map(|t| {
        tracing_opentelemetry::layer()
            .with_tracer(t)
            .with_filter(Targets::new().with_target("ai_orchestrator", tracing::Level::INFO))
    });
    let registry = tracing_subscriber::registry().with(otel);
    let _ = match format {
        LogFormat::Json => registry
            .with(json_layer(std::io::stdout).with_filter(logs()))
            .try_init(),
        LogFormat::Text => registry.with(fmt::layer().with_filter(logs())).try_init(),
    };
}
