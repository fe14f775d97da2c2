//! Logs, trace IDs, Prometheus metrics and OpenTelemetry export.
//!
//! Must never log message contents, prompts, replies or API keys: fields are
//! chosen by hand at each call site, never whole requests.

pub mod logs;
pub mod metrics;
pub mod otel;
pub mod trace_id;

use std::{
    pin::Pin,
    task::{Context, Poll},
};
use tracing_subscriber::{fmt, prelude::*};

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
/// request's `trace_id` (and, when traces are exported, the `span_id`) at
/// the top level and the current span's fields under `span` (see
/// [`logs::JsonEvent`]). Span fields are kept by [`logs::SpanFields`].
pub fn json_layer<S, W>(writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    logs::CorrelationIds.and_then(
        fmt::layer()
            .event_format(logs::JsonEvent)
            .fmt_fields(logs::SpanFields)
            .with_writer(writer),
    )
}

/// The human-readable layer: colours only on a terminal (a file or a pipe
/// gets plain text).
fn text_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use std::io::IsTerminal;
    fmt::layer().with_ansi(std::io::stdout().is_terminal())
}

/// Installs the global subscriber. `RUST_LOG` filters log lines (default
/// `info`) but never our spans: a `warn` line still carries its request's
/// `trace_id`, and trace export does not depend on the log level.
/// With a `tracer`, our spans are also exported over OpenTelemetry, with the
/// log lines `RUST_LOG` lets through as their events; spans of other crates
/// are never exported (their fields are not ours to vet).
/// Safe to call twice (the second call does nothing), which tests rely on.
pub fn init_logging(format: LogFormat, tracer: Option<opentelemetry_sdk::trace::Tracer>) {
    // No `Option` layer when export is off: an absent layer under the log
    // layer would turn every disabled callsite's cached "never" into
    // "sometimes" and cost a filter call per h2/hyper `trace!`.
    let registry = tracing_subscriber::registry().with(logs::LogFilter::from_env());
    let _ = match (format, tracer) {
        (LogFormat::Json, None) => registry.with(json_layer(std::io::stdout)).try_init(),
        (LogFormat::Json, Some(t)) => registry
            .with(json_layer(std::io::stdout))
            .with(otel_layer(t))
            .try_init(),
        (LogFormat::Text, None) => registry.with(text_layer()).try_init(),
        (LogFormat::Text, Some(t)) => registry.with(text_layer()).with(otel_layer(t)).try_init(),
    };
}

/// Span export: this crate's spans only.
fn otel_layer<S>(tracer: opentelemetry_sdk::trace::Tracer) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::filter::Targets;
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(Targets::new().with_target("ai_orchestrator", tracing::Level::INFO))
}
