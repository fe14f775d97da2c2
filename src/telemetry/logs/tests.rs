#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::telemetry::json_layer;
use std::sync::{Arc, Mutex};
use tracing_subscriber::prelude::*;

/// Log output captured in memory, one JSON object per line.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'w> tracing_subscriber::fmt::MakeWriter<'w> for Captured {
    type Writer = Captured;

    fn make_writer(&'w self) -> Self::Writer {
        self.clone()
    }
}

impl Captured {
    fn lines(&self) -> Vec<serde_json::Value> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

fn logged(spec: &str, body: impl FnOnce()) -> Vec<serde_json::Value> {
    let out = Captured::default();
    let subscriber = tracing_subscriber::registry()
        .with(LogFilter::new(spec))
        .with(json_layer(out.clone()));
    tracing::subscriber::with_default(subscriber, body);
    out.lines()
}

#[test]
fn a_warn_line_carries_the_span_fields_at_warn_level() {
    let lines = logged("warn", || {
        let span = tracing::info_span!(
            "provider_attempt",
            trace_id = %"0190-abc",
            provider = "openai",
            retry = 2_u32,
            outcome = tracing::field::Empty,
        );
        let _entered = span.enter();
        tracing::info!("not at warn");
        tracing::debug!("not at warn either");
        span.record("outcome", "ok");
        tracing::warn!(code = "TIMEOUT", "provider attempt failed");
    });
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_eq!(line["level"], "WARN");
    assert_eq!(line["message"], "provider attempt failed");
    assert_eq!(line["code"], "TIMEOUT");
    let span = &line["span"];
    assert_eq!(span["name"], "provider_attempt");
    assert_eq!(span["trace_id"], "0190-abc");
    assert_eq!(span["provider"], "openai");
    assert_eq!(span["retry"], 2);
    assert_eq!(span["outcome"], "ok");
}

#[test]
fn span_fields_are_valid_json_whatever_their_values() {
    let lines = logged("info", || {
        let span = tracing::info_span!(
            "request",
            text = "quote \" backslash \\ newline \n tab \t bell \u{7} é ✓",
            shown = %"display \"quoted\"",
            debug = ?vec!["a\"b"],
            negative = -3_i64,
            ratio = 0.5_f64,
            nan = f64::NAN,
            flag = true,
            late = tracing::field::Empty,
            later = tracing::field::Empty,
        );
        span.record("late", 7_u64);
        span.record("later", "x\"y");
        span.in_scope(|| tracing::info!("inside"));
    });
    assert_eq!(lines.len(), 1);
    let span = &lines[0]["span"];
    assert_eq!(
        span["text"],
        "quote \" backslash \\ newline \n tab \t bell \u{7} é ✓"
    );
    assert_eq!(span["shown"], "display \"quoted\"");
    assert_eq!(span["debug"], "[\"a\\\"b\"]");
    assert_eq!(span["negative"], -3);
    assert_eq!(span["ratio"], 0.5);
    assert!(span["nan"].is_null());
    assert_eq!(span["flag"], true);
    assert_eq!(span["late"], 7);
    assert_eq!(span["later"], "x\"y");
}

#[test]
fn a_span_without_fields_and_one_recorded_later_stay_valid() {
    let lines = logged("info", || {
        let span = tracing::info_span!("bare", outcome = tracing::field::Empty);
        span.in_scope(|| tracing::info!("before"));
        span.record("outcome", "ok");
        span.in_scope(|| tracing::info!("after"));
    });
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["span"]["name"], "bare");
    assert!(lines[0]["span"].get("outcome").is_none());
    assert_eq!(lines[1]["span"]["outcome"], "ok");
}

#[test]
fn rust_log_still_filters_lines_by_target_and_level() {
    let lines = logged("warn,ai_orchestrator::telemetry=debug", || {
        tracing::debug!("ours at debug");
        tracing::trace!("ours at trace");
        tracing::info!(target: "h2::codec", "a dependency at info");
        tracing::warn!(target: "h2::codec", "a dependency at warn");
    });
    let messages: Vec<_> = lines.iter().map(|l| l["message"].clone()).collect();
    assert_eq!(messages, ["ours at debug", "a dependency at warn"]);
}

#[test]
fn span_directives_in_rust_log_still_work() {
    let lines = logged("warn,[request]=debug", || {
        tracing::debug!("outside");
        let span = tracing::info_span!("request", trace_id = "t-1");
        span.in_scope(|| tracing::debug!("inside"));
    });
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["message"], "inside");
    assert_eq!(lines[0]["span"]["trace_id"], "t-1");
}

#[test]
fn an_invalid_rust_log_falls_back_to_info() {
    let lines = logged("=[not a directive", || {
        tracing::debug!("hidden");
        tracing::info!("shown");
    });
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["message"], "shown");
}

#[test]
fn escaping_covers_every_control_character() {
    let mut out = String::new();
    let all: String = (0u8..0x20).map(char::from).collect();
    out.push('"');
    std::fmt::Write::write_str(&mut Escaped(&mut out), &all).unwrap();
    out.push('"');
    let back: String = serde_json::from_str(&out).unwrap();
    assert_eq!(back, all);
}

#[test]
fn trace_and_span_ids_are_top_level_fields_of_every_line_in_a_request() {
    let lines = logged("info", || {
        let request = tracing::info_span!(
            "request",
            trace_id = %"4bf92f3577b34da6a3ce929d0e0e4736",
            span_id = tracing::field::Empty,
        );
        request.record("span_id", "00f067aa0ba902b7");
        let _r = request.enter();
        tracing::info!(code = "OK", "in the request");
        let attempt = tracing::info_span!(
            "provider_attempt",
            trace_id = %"4bf92f3577b34da6a3ce929d0e0e4736",
            provider = "openai",
        );
        attempt.in_scope(|| tracing::warn!("in an attempt"));
        drop(_r);
        tracing::info!("outside");
    });
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(lines[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(lines[0]["span_id"], "00f067aa0ba902b7");
    assert_eq!(lines[0]["code"], "OK");
    assert_eq!(lines[0]["span"]["name"], "request");
    // The attempt has no span_id of its own here: the nearest one counts.
    assert_eq!(lines[1]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(lines[1]["span_id"], "00f067aa0ba902b7");
    assert_eq!(lines[1]["span"]["provider"], "openai");
    assert!(lines[2].get("trace_id").is_none(), "{:?}", lines[2]);
    assert!(lines[2].get("span").is_none());
    for line in &lines {
        assert!(line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
        assert_eq!(line["target"], "ai_orchestrator::telemetry::logs::tests");
    }
}
