//! One log event's JSON line: timestamp, level, fields, target, then the
//! `trace_id` and `span_id` at the top level too (a search by either needs no
//! span layout), and the innermost span with its fields as `span`.

use super::{Escaped, JsonObject};
use std::fmt::{self, Write};
use tracing::{
    Event, Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{
    fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, format::Writer},
    layer::{Context, Layer},
    registry::LookupSpan,
};

/// A span's `trace_id` and `span_id`, kept in its extensions by [`CorrelationIds`].
#[derive(Debug, Default, Clone)]
struct Ids {
    trace_id: Option<String>,
    span_id: Option<String>,
}

impl Visit for Ids {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "trace_id" => self.trace_id = Some(value.to_owned()),
            "span_id" => self.span_id = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%value` fields arrive here, formatted with `Display`.
        if matches!(field.name(), "trace_id" | "span_id") {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

/// Keeps spans' `trace_id` / `span_id` for [`JsonEvent`] to lift to the top.
#[derive(Debug, Default, Clone, Copy)]
pub struct CorrelationIds;

impl<S> Layer<S> for CorrelationIds
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let fields = attrs.metadata().fields();
        if fields.field("trace_id").is_none() && fields.field("span_id").is_none() {
            return;
        }
        let mut ids = Ids::default();
        attrs.record(&mut ids);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(ids);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(ids) = extensions.get_mut::<Ids>() {
            values.record(ids);
        }
    }
}

/// Formats each event as one JSON object per line (see the module doc).
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonEvent;

impl<S, N> FormatEvent<S, N> for JsonEvent
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'w> FormatFields<'w> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        write!(
            writer,
            "{{\"timestamp\":\"{now}\",\"level\":\"{}\"",
            meta.level()
        )?;
        let mut fields = JsonObject::new(&mut writer, true);
        event.record(&mut fields);
        fields.result?;
        writer.write_str(",\"target\":\"")?;
        write!(Escaped(&mut writer), "{}", meta.target())?;
        writer.write_char('"')?;

        let mut ids = Ids::default();
        let mut innermost = None;
        if let Some(scope) = ctx.event_scope() {
            for span in scope {
                let extensions = span.extensions();
                if let Some(found) = extensions.get::<Ids>() {
                    ids.trace_id = ids.trace_id.or_else(|| found.trace_id.clone());
                    ids.span_id = ids.span_id.or_else(|| found.span_id.clone());
                }
                if innermost.is_none() {
                    let fields = extensions
                        .get::<FormattedFields<N>>()
                        .map(|f| f.fields.clone())
                        .unwrap_or_default();
                    innermost = Some((span.name(), fields));
                }
            }
        }
        for (key, value) in [("trace_id", &ids.trace_id), ("span_id", &ids.span_id)] {
            if let Some(value) = value {
                write!(writer, ",\"{key}\":\"")?;
                write!(Escaped(&mut writer), "{value}")?;
                writer.write_char('"')?;
            }
        }
        if let Some((name, fields)) = innermost {
            writer.write_str(",\"span\":{\"name\":\"")?;
            write!(Escaped(&mut writer), "{name}")?;
            writer.write_char('"')?;
            // `SpanFields` wrote a JSON object: its members follow the name.
            let members = fields
                .strip_prefix('{')
                .and_then(|f| f.strip_suffix('}'))
                .unwrap_or("");
            if !members.is_empty() {
                writer.write_char(',')?;
                writer.write_str(members)?;
            }
            writer.write_char('}')?;
        }
        writer.write_str("}\n")
    }
}
