//! The log pipeline's hot-path pieces, kept cheap because every request opens
//! spans (log lines carry their `trace_id`, so our spans are on at any level):
//! - [`LogFilter`], one global filter: `RUST_LOG` for lines, our spans always.
//!   A per-layer filter would be asked about every h2/hyper `trace!` on every
//!   call instead of caching "never" once per callsite.
//! - [`SpanFields`]: a span's fields written once as a JSON object, appended
//!   to on `record` (`JsonFields` re-parses the whole object each time).

mod event;

pub use event::{CorrelationIds, JsonEvent};

use std::fmt::{self, Write};
use tracing::{
    Metadata, Subscriber,
    field::{Field, Visit},
    level_filters::LevelFilter,
    span,
    subscriber::Interest,
};
use tracing_subscriber::{
    EnvFilter,
    field::RecordFields,
    fmt::{FormatFields, FormattedFields, format::Writer},
    layer::{Context, Layer},
    registry::LookupSpan,
};

/// Target prefix of this crate's spans and events.
const OURS: &str = "ai_orchestrator";

fn is_our_span(meta: &Metadata<'_>) -> bool {
    meta.is_span() && meta.target().starts_with(OURS)
}

/// The global filter: what `RUST_LOG` enables (default `info`), and our spans
/// at any level so a `warn` line still names its request's `trace_id`.
pub struct LogFilter {
    env: EnvFilter,
    /// Whether `RUST_LOG` has span directives (`target[span]=..`): without
    /// them `EnvFilter`'s span callbacks only take a lock, so are not forwarded.
    dynamic: bool,
}

impl LogFilter {
    /// The filter from `RUST_LOG`, or `info` when it is unset or invalid.
    pub fn from_env() -> Self {
        match std::env::var(EnvFilter::DEFAULT_ENV) {
            Ok(spec) => Self::new(&spec),
            Err(_) => Self::new("info"),
        }
    }

    /// The filter for a `RUST_LOG`-style string; `info` if it does not parse.
    pub fn new(spec: &str) -> Self {
        match EnvFilter::try_new(spec) {
            Ok(env) => Self {
                env,
                dynamic: spec.contains('['),
            },
            Err(_) => Self {
                env: EnvFilter::new("info"),
                dynamic: false,
            },
        }
    }
}

impl<S> Layer<S> for LogFilter
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        // `EnvFilter` is always told: it remembers span callsites that its
        // span directives (`[request]=debug`) match.
        let env = Layer::<S>::register_callsite(&self.env, meta);
        if is_our_span(meta) {
            Interest::always()
        } else {
            env
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, ctx: Context<'_, S>) -> bool {
        is_our_span(meta) || Layer::<S>::enabled(&self.env, meta, ctx)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        // Our spans are all `info_span!`s.
        let env = Layer::<S>::max_level_hint(&self.env)?;
        Some(env.max(LevelFilter::INFO))
    }

    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        if self.dynamic {
            Layer::<S>::on_new_span(&self.env, attrs, id, ctx);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if self.dynamic {
            Layer::<S>::on_record(&self.env, id, values, ctx);
        }
    }

    fn on_enter(&self, id: &span::Id, ctx: Context<'_, S>) {
        if self.dynamic {
            Layer::<S>::on_enter(&self.env, id, ctx);
        }
    }

    fn on_exit(&self, id: &span::Id, ctx: Context<'_, S>) {
        if self.dynamic {
            Layer::<S>::on_exit(&self.env, id, ctx);
        }
    }

    fn on_close(&self, id: span::Id, ctx: Context<'_, S>) {
        if self.dynamic {
            Layer::<S>::on_close(&self.env, id, ctx);
        }
    }
}

/// Span fields as one JSON object (the JSON log line's `span`).
#[derive(Debug, Default, Clone, Copy)]
pub struct SpanFields;

impl<'w> FormatFields<'w> for SpanFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        writer.write_char('{')?;
        let mut visitor = JsonObject::new(&mut writer, false).for_spans();
        fields.record(&mut visitor);
        visitor.result?;
        writer.write_char('}')
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &span::Record<'_>,
    ) -> fmt::Result {
        // Always the `{...}` `format_fields` wrote: reopen it.
        let object = &mut current.fields;
        object.pop();
        let has_fields = object.len() > 1;
        let mut visitor = JsonObject::new(&mut *object, has_fields).for_spans();
        fields.record(&mut visitor);
        let result = visitor.result;
        object.push('}');
        result
    }
}

/// Writes `"name":value` pairs into an open JSON object. A field recorded
/// twice appears twice; JSON readers (serde_json included) keep the last.
struct JsonObject<W> {
    out: W,
    comma: bool,
    /// The first write error, if any (`Visit` methods cannot return one).
    result: fmt::Result,
    /// Leave out the attributes that are only for trace export.
    spans: bool,
}

/// Span fields in OpenTelemetry's namespaces (`otel.kind`, `rpc.method`, ...)
/// are for export; log lines carry our own names for the same facts.
const EXPORT_ONLY: [&str; 4] = ["otel.", "rpc.", "gen_ai.", "error."];

impl<W: fmt::Write> JsonObject<W> {
    fn new(out: W, comma: bool) -> Self {
        Self {
            out,
            comma,
            result: Ok(()),
            spans: false,
        }
    }

    /// The writer of span fields: export-only ones left out.
    fn for_spans(mut self) -> Self {
        self.spans = true;
        self
    }

    fn skip(&self, field: &Field) -> bool {
        self.spans && EXPORT_ONLY.iter().any(|p| field.name().starts_with(p))
    }

    fn write(&mut self, value: fmt::Arguments<'_>) {
        if self.result.is_ok() {
            self.result = self.out.write_fmt(value);
        }
    }

    fn key(&mut self, field: &Field) {
        let comma = if self.comma { "," } else { "" };
        self.comma = true;
        self.string(format_args!("{comma}"), field.name());
        self.write(format_args!(":"));
    }

    /// `prefix` then `value` as a JSON string literal.
    fn string(&mut self, prefix: fmt::Arguments<'_>, value: impl fmt::Display) {
        if self.result.is_ok() {
            self.result = write!(self.out, "{prefix}\"")
                .and_then(|()| write!(Escaped(&mut self.out), "{value}"))
                .and_then(|()| self.out.write_char('"'));
        }
    }
}

impl<W: fmt::Write> Visit for JsonObject<W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if self.skip(field) {
            return;
        }
        self.key(field);
        self.string(format_args!(""), value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.skip(field) {
            return;
        }
        self.key(field);
        self.write(format_args!("{value}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.skip(field) {
            return;
        }
        self.key(field);
        self.write(format_args!("{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.skip(field) {
            return;
        }
        self.key(field);
        self.write(format_args!("{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.skip(field) {
            return;
        }
        self.key(field);
        if value.is_finite() {
            self.write(format_args!("{value}"));
        } else {
            // JSON has no NaN or infinities.
            self.write(format_args!("null"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.skip(field) {
            return;
        }
        // `%value` fields arrive here too, formatted with `Display`.
        self.key(field);
        self.string(format_args!(""), format_args!("{value:?}"));
    }
}

/// A `fmt::Write` escaping for the inside of a JSON string (RFC 8259 §7).
struct Escaped<W>(W);

impl<W: fmt::Write> fmt::Write for Escaped<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut plain = 0;
        for (i, b) in s.bytes().enumerate() {
            let escape = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..=0x1f => "",
                _ => continue,
            };
            self.0.write_str(&s[plain..i])?;
            if escape.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = i + 1;
        }
        self.0.write_str(&s[plain..])
    }
}

#[cfg(test)]
mod tests;
