//! Logs, trace IDs and (later) metrics and OpenTelemetry export.
//!
//! Must never log message contents, prompts, replies or API keys: fields are
//! chosen by hand at each call site, never whole requests.

pub mod metrics;
pub mod trace_id;

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

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

/// Installs the global subscriber. `RUST_LOG` filters (default `info`).
/// Safe to call twice (the second call does nothing), which tests rely on.
pub fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Json => registry.with(json_layer(std::io::stdout)).try_init(),
        LogFormat::Text => registry.with(fmt::layer()).try_init(),
    };
}
