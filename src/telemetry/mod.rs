//! Logs, trace IDs, Prometheus metrics and OpenTelemetry export. Never logs
//! contents, prompts, replies or keys: call sites pick fields by hand.

pub mod logs;
pub mod metrics;
pub mod otel;
pub mod trace_id;

use std::{
    pin::Pin,
    task::{Context, Poll},
};
use tracing_subscriber::{fmt, prelude::*};

/// A stream polled inside `span`, as `tracing::Instrument` does a future: a
/// request span covers its whole response stream and parents its attempts.
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

/// The production log layer: one JSON object per line ([`logs::JsonEvent`]),
/// span fields kept by [`logs::SpanFields`].
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

/// The human-readable layer, coloured only on a terminal.
fn text_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use std::io::IsTerminal;
    fmt::layer().with_ansi(std::io::stdout().is_terminal())
}

/// Installs the global subscriber. `RUST_LOG` filters log lines (default
/// `info`), never our spans: a `warn` line keeps its `trace_id`, and export
/// ignores the level. A `tracer` exports our spans only (other crates' fields
/// are not ours to vet). A second call does nothing; tests rely on that.
pub fn init_logging(format: LogFormat, tracer: Option<opentelemetry_sdk::trace::Tracer>) {
    // No `Option` layer when export is off: it would turn each disabled
    // callsite's cached "never" into "sometimes", a filter call per `trace!`.
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
