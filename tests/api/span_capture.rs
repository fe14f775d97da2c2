//! Spans exported into memory, for the span test binaries
//! (`tests/otel_*.rs`), through one subscriber installed process-wide, as
//! `serve` installs its own.
//!
//! Not a thread-local (`set_default`) subscriber: when a span closes,
//! tracing-subscriber's registry releases its parent through the closing
//! thread's default dispatcher. A span dropped on a thread that is not the
//! test's (sqlx runs each SQLite connection on a worker thread, carrying the
//! current span with every statement) would release its parent into the
//! no-op dispatcher, and the parent, the RPC's span, would never close.

use opentelemetry::{
    Context, KeyValue,
    trace::{Link, SpanKind, TraceId},
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SamplingResult, ShouldSample};
use std::sync::{
    OnceLock,
    atomic::{AtomicU64, Ordering},
};

/// The ratio of new traces sampled, as `f64` bits: each test sets its own.
static RATIO: AtomicU64 = AtomicU64::new(0);

/// One span test at a time: they share the subscriber and the exporter.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The server's sampler ([`ai_orchestrator::telemetry::otel::sampler`]) at
/// the current test's ratio.
#[derive(Debug, Clone)]
struct TestRatio;

impl ShouldSample for TestRatio {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[Link],
    ) -> SamplingResult {
        let ratio = f64::from_bits(RATIO.load(Ordering::Relaxed));
        ai_orchestrator::telemetry::otel::sampler(ratio).should_sample(
            parent_context,
            trace_id,
            name,
            span_kind,
            attributes,
            links,
        )
    }
}

/// The exporter every span reaches, installed on first use with the
/// server's span and trace IDs ([`ai_orchestrator::telemetry::otel::RequestIds`]).
fn exporter() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_sdk::trace::SdkTracerProvider;
        use tracing_subscriber::prelude::*;
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .with_sampler(TestRatio)
            .with_id_generator(ai_orchestrator::telemetry::otel::RequestIds::default())
            .build();
        tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("info"))
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .init();
        exporter
    })
}

/// A test's hold on the span exporter: its spans, and no other test's
/// until it is dropped.
pub struct Capture {
    exporter: &'static InMemorySpanExporter,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

/// Waits for the other span tests, then captures spans from an empty
/// exporter, sampling `ratio` of new traces (a caller's sampled
/// `traceparent` is followed whatever the ratio).
pub async fn capture_spans(ratio: f64) -> Capture {
    let serial = SERIAL.lock().await;
    let exporter = exporter();
    RATIO.store(ratio.to_bits(), Ordering::Relaxed);
    exporter.reset();
    Capture {
        exporter,
        _serial: serial,
    }
}

impl Capture {
    /// Every span finished so far.
    pub fn spans(&self) -> Vec<opentelemetry_sdk::trace::SpanData> {
        self.exporter.get_finished_spans().unwrap_or_default()
    }

    /// The finished spans once `count` spans named `name` are among them (10
    /// s at most): a server span ends when its connection task drops the
    /// response, which may be after the client has the reply.
    pub async fn spans_once(
        &self,
        name: &str,
        count: usize,
    ) -> Vec<opentelemetry_sdk::trace::SpanData> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if spans.iter().filter(|s| s.name == name).count() >= count
                || std::time::Instant::now() > deadline
            {
                return spans;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
