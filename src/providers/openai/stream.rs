//! A Chat Completions stream assembled: text deltas passed on as they
//! come, tool-call pieces buffered by index until the stream ends, usage and
//! citations as the last chunk reports them.

use super::{Flavor, WireChunk, citations, finish_reason};
use crate::providers::{
    Completion, FinishReason, ProviderError, TokenUsage, http, tool_calls::CallBuffer,
};
use serde_json::Value;

/// What one SSE `data:` payload means for the caller.
#[derive(Debug, PartialEq)]
pub(super) enum Step {
    /// A piece of answer text to pass on.
    Delta(String),
    /// Nothing to pass on (role-only chunk, usage chunk, keep-alive).
    Nothing,
    /// `[DONE]`: the stream is over.
    Done,
}

/// The answer assembled from stream chunks so far.
pub(super) struct StreamState {
    flavor: Flavor,
    text: String,
    usage: TokenUsage,
    finish_reason: Option<FinishReason>,
    citations: Option<Value>,
    search_results: Option<Value>,
    /// The answering model, as the chunks name it.
    model: Option<String>,
    /// Most bytes of text (and, apart, of tool-call IDs, names and
    /// arguments) it may accumulate.
    limit: usize,
    /// Tool calls in pieces, by index (bounded in count and bytes).
    calls: CallBuffer,
}

impl StreamState {
    pub(super) fn new(flavor: Flavor, limit: usize) -> Self {
        Self {
            flavor,
            limit,
            text: String::new(),
            usage: TokenUsage::default(),
            finish_reason: None,
            citations: None,
            search_results: None,
            model: None,
            calls: CallBuffer::default(),
        }
    }

    pub(super) fn on_data(&mut self, data: &str) -> Result<Step, ProviderError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(Step::Nothing);
        }
        if data == "[DONE]" {
            return Ok(Step::Done);
        }
        // serde's message can quote the offending value (upstream text), so
        // only its category and position are kept.
        let chunk: WireChunk = serde_json::from_str(data).map_err(|e| {
            ProviderError::Malformed(format!(
                "stream chunk JSON: {:?} error at column {}",
                e.classify(),
                e.column()
            ))
        })?;
        if let Some(error) = &chunk.error {
            return Err(stream_error(error, data));
        }
        // OpenAI sends usage once, in a last chunk with no choices; Perplexity
        // and llama.cpp send running totals. The last report wins either way.
        if let Some(usage) = chunk.usage {
            self.usage = usage.into();
        }
        if chunk.model.is_some() {
            self.model = chunk.model;
        }
        // Perplexity repeats the full (growing) lists in every chunk.
        if chunk.citations.is_some() {
            self.citations = chunk.citations;
        }
        if chunk.search_results.is_some() {
            self.search_results = chunk.search_results;
        }
        let Some(choice) = chunk.choices.into_iter().next() else {
            return Ok(Step::Nothing);
        };
        if let Some(reason) = choice.finish_reason.as_deref() {
            self.finish_reason = Some(finish_reason(Some(reason)));
        }
        let Some(delta) = choice.delta else {
            return Ok(Step::Nothing);
        };
        // Argument pieces are only parsed once the call is whole. Each
        // index is a call of its own; the buffer refuses more calls or bytes
        // than one answer may hold, whatever indexes the server makes up.
        for (i, piece) in delta.tool_calls.into_iter().enumerate() {
            let index = piece.index.unwrap_or(i as u64);
            let (name, arguments) = piece
                .function
                .map_or((None, None), |f| (f.name, f.arguments));
            self.calls.add(
                index,
                piece.id.as_deref(),
                name.as_deref(),
                arguments.as_deref().unwrap_or_default(),
                self.limit,
            )?;
        }
        match delta.content {
            Some(piece) if !piece.is_empty() => {
                http::append_limited(&mut self.text, &piece, self.limit)?;
                Ok(Step::Delta(piece))
            }
            _ => Ok(Step::Nothing),
        }
    }

    /// The whole answer once the stream is over, or `Malformed` when it was
    /// cut off (no `[DONE]` and no finish reason).
    pub(super) fn finish(self, saw_done: bool) -> Result<Completion, ProviderError> {
        if !saw_done && self.finish_reason.is_none() {
            return Err(ProviderError::Malformed(
                "stream ended before the answer was complete".into(),
            ));
        }
        Ok(Completion {
            citations: citations(
                self.flavor,
                self.citations.as_ref(),
                self.search_results.as_ref(),
            ),
            text: self.text,
            usage: self.usage,
            finish_reason: self.finish_reason.unwrap_or(FinishReason::Other),
            model: self.model,
            tool_calls: self.calls.finish()?,
        })
    }
}

/// An in-stream `{"error": ...}` as a status error, keeping only its type.
fn stream_error(error: &Value, data: &str) -> ProviderError {
    let status = ["code", "status"]
        .iter()
        .filter_map(|k| error.get(k).and_then(Value::as_u64))
        .find(|c| (400..=599).contains(c))
        .and_then(|c| u16::try_from(c).ok())
        .unwrap_or(502);
    ProviderError::Status {
        status,
        retry_after: None,
        summary: format!("in-stream error: {}", http::error_type(data.as_bytes())),
    }
}
