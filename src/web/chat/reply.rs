//! Our answers in Chat Completions' shapes: the `chat.completion` object and
//! the `chat.completion.chunk`s of a stream.

use crate::{
    api::access,
    call::CallMeta,
    domain::{Completion, FinishReason, ToolCall},
};
use serde_json::{Value, json};

/// What every object of one answer shares.
pub(super) struct Head {
    /// `chatcmpl-<trace ID>`: the answer is found in our logs by its ID.
    pub id: String,
    /// The task the caller named as `model`.
    pub model: String,
    /// Unix seconds.
    pub created: i64,
    /// `stream_options.include_usage`: chunks carry `"usage": null` until
    /// the last, as OpenAI's do.
    pub include_usage: bool,
}

impl Head {
    pub(super) fn new(trace_id: &str, task: &str, include_usage: bool) -> Self {
        Self {
            id: format!("chatcmpl-{trace_id}"),
            model: task.to_owned(),
            created: chrono::Utc::now().timestamp(),
            include_usage,
        }
    }

    /// One chunk of a stream with `choices`.
    pub(super) fn chunk(&self, choices: Value) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// A chunk of the one choice: its `delta` and `finish_reason`.
    pub(super) fn delta(&self, delta: Value, finish: Option<FinishReason>) -> Value {
        self.chunk(json!([{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish.map(finish_reason),
        }]))
    }

    /// The last chunk of `stream_options.include_usage`: no choices, the usage.
    pub(super) fn usage_chunk(&self, meta: &CallMeta) -> Value {
        let mut chunk = self.chunk(json!([]));
        chunk["usage"] = usage(meta);
        chunk
    }

    /// The whole answer.
    pub(super) fn completion(&self, completion: &Completion, meta: &CallMeta) -> Value {
        let mut message = json!({
            "role": "assistant",
            "content": if completion.text.is_empty() && !completion.tool_calls.is_empty() {
                Value::Null
            } else {
                Value::String(completion.text.clone())
            },
            "refusal": null,
        });
        if !completion.tool_calls.is_empty() {
            message["tool_calls"] = tool_calls(&completion.tool_calls, false);
        }
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": finish_reason(completion.finish_reason),
            }],
            "usage": usage(meta),
        })
    }
}

/// The model's tool calls in OpenAI's shape; a stream's carry their `index`.
pub(super) fn tool_calls(calls: &[ToolCall], indexed: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut call = json!({
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            });
            if indexed {
                call["index"] = json!(i);
            }
            call
        })
        .collect()
}

/// OpenAI's `finish_reason`.
pub(super) fn finish_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop | FinishReason::Other => "stop",
        FinishReason::Length => "length",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::ToolCalls => "tool_calls",
    }
}

/// Notes the answered call for the access line.
pub(super) fn note(meta: &CallMeta) {
    access::note(|f| {
        f.attempts = meta.attempts.len();
        f.provider.clone_from(&meta.provider);
        f.model.clone_from(&meta.model);
    });
}

/// The call's tokens over every attempt: what the caller is billed for.
fn usage(meta: &CallMeta) -> Value {
    let (input, output) = (meta.usage.input_tokens, meta.usage.output_tokens);
    json!({
        "prompt_tokens": input,
        "completion_tokens": output,
        "total_tokens": input.saturating_add(output),
    })
}
