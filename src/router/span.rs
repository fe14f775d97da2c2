//! The span of one provider attempt: the OpenTelemetry GenAI CLIENT span
//! (`gen_ai.*`, `chat {model}`) plus our own fields, the only ones logs show.

use crate::{
    config::{ProviderKind, TargetConfig},
    domain::{Completion, FinishReason, ProviderError},
    telemetry::otel,
};

/// `gen_ai.provider.name` of a provider kind (the convention's value if any).
fn provider_name(kind: Option<ProviderKind>) -> &'static str {
    match kind {
        Some(ProviderKind::Openai) => "openai",
        Some(ProviderKind::Anthropic) => "anthropic",
        Some(ProviderKind::Gemini) => "gcp.gemini",
        Some(ProviderKind::Perplexity) => "perplexity",
        Some(ProviderKind::OpenaiCompatible) => "openai_compatible",
        Some(ProviderKind::Mock) => "mock",
        None => "unknown",
    }
}

/// The span of an attempt at `target` (a provider of `kind`).
pub(super) fn attempt(
    target: &TargetConfig,
    kind: Option<ProviderKind>,
    trace_id: &str,
    retry: u32,
) -> tracing::Span {
    let empty = tracing::field::Empty;
    // trace_id again: JSON log lines show only the innermost span.
    let span = tracing::info_span!(
        "provider_attempt",
        otel.name = %format_args!("chat {}", target.model),
        otel.kind = "client",
        otel.status_code = empty,
        "error.type" = empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider_name(kind),
        gen_ai.request.model = %target.model,
        gen_ai.response.model = empty,
        gen_ai.response.finish_reasons = empty,
        gen_ai.usage.input_tokens = empty,
        gen_ai.usage.output_tokens = empty,
        trace_id = %trace_id,
        span_id = empty,
        provider = %target.provider,
        model = %target.model,
        retry,
        outcome = empty,
        input_tokens = empty,
        output_tokens = empty,
    );
    otel::record_span_id(&span);
    span
}

/// Records an answered attempt.
pub(super) fn answered(span: &tracing::Span, completion: &Completion) {
    span.record("outcome", "ok");
    let (input, output) = (
        completion.usage.input_tokens,
        completion.usage.output_tokens,
    );
    span.record("input_tokens", input);
    span.record("output_tokens", output);
    span.record("gen_ai.usage.input_tokens", input);
    span.record("gen_ai.usage.output_tokens", output);
    if let Some(model) = &completion.model {
        span.record("gen_ai.response.model", model.as_str());
    }
    let reason = match completion.finish_reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::Other => "other",
    };
    span.record("gen_ai.response.finish_reasons", reason);
}

/// Records a failed attempt by its error code (never its message).
pub(super) fn failed(span: &tracing::Span, err: &ProviderError) {
    record_failure(span, &err.code());
}

/// Records a failed attempt with `code`.
pub(super) fn record_failure(span: &tracing::Span, code: &str) {
    span.record("outcome", code);
    span.record("error.type", code);
    span.record("otel.status_code", "error");
}
