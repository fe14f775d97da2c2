//! What a tool call comes to for the model: its result (cut to a size a
//! prompt can carry) or an error object it can read and act on. Whatever
//! happens to a call (denied, invalid, failed, timed out, past a cap) is a
//! result, never an error raised to the caller.

use super::TurnEvent;
use crate::{
    domain::{ChatMessage, ToolCall, ToolOutcome, ToolSpec, completion::Role},
    telemetry::metrics,
};
use serde_json::json;

/// Most bytes of a tool's output handed back to the model: an output past
/// it is cut (on a character boundary) and says so.
const MAX_RESULT_BYTES: usize = 64 * 1024;

/// How one tool call ended, for the `tool_result` event and metrics.
#[derive(Debug, Clone)]
pub struct Report {
    /// SUCCEEDED, FAILED, TIMED_OUT, DENIED, REJECTED or AWAITING_APPROVAL.
    pub status: &'static str,
    /// How long it took.
    pub duration_ms: u64,
    /// The stable reason when it did not succeed.
    pub error_code: String,
    /// It reached the tool (counts against `max_tool_calls`).
    pub executed: bool,
    /// It was not run: it waits for this approval.
    pub approval_id: Option<String>,
}

/// An error result for `call`.
pub fn error(call: &ToolCall, code: &str, message: &str) -> ToolOutcome {
    ToolOutcome {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: json!({ "error": { "code": code, "message": message } }).to_string(),
        is_error: true,
    }
}

/// A call's arguments as its audit event digests them: the parsed object,
/// or the text as sent when it is not one.
pub fn arguments(call: &ToolCall) -> serde_json::Value {
    call.parsed().map_or_else(
        |_| serde_json::Value::String(call.arguments.clone()),
        serde_json::Value::Object,
    )
}

/// `text`, cut to [`MAX_RESULT_BYTES`].
pub fn cut(mut text: String) -> String {
    if text.len() > MAX_RESULT_BYTES {
        let mut end = MAX_RESULT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" …[output cut]");
    }
    text
}

/// A call refused because the turn reached `max_tool_calls` (the session
/// audits it: SPEC §9.2, every decision is).
pub fn over_cap(call: &ToolCall, cap: u32) -> (ToolOutcome, Report) {
    (
        error(
            call,
            "MAX_TOOL_CALLS",
            &format!("not run: this turn reached its limit of {cap} tool calls"),
        ),
        Report {
            status: "DENIED",
            duration_ms: 0,
            error_code: "MAX_TOOL_CALLS".into(),
            executed: false,
            approval_id: None,
        },
    )
}

/// A call not run because the turn's budget was spent by the model call
/// that asked for it: answered all the same, so the stored history pairs
/// every call with a result (a provider refuses a history that does not).
pub fn refused_over_budget(call: &ToolCall) -> (ToolOutcome, Report) {
    (
        error(
            call,
            "BUDGET_EXCEEDED",
            "not run: this turn's budget is spent",
        ),
        Report {
            status: "DENIED",
            duration_ms: 0,
            error_code: "BUDGET_EXCEEDED".into(),
            executed: false,
            approval_id: None,
        },
    )
}

/// A held call a person rejected (or let expire), as the model reads it
/// when the conversation resumes: `{"error": "rejected: <reason>"}`.
pub fn rejected(call: &ToolCall, reason: &str) -> (ToolOutcome, Report) {
    (
        ToolOutcome {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: json!({ "error": format!("rejected: {reason}") }).to_string(),
            is_error: true,
        },
        Report {
            status: "REJECTED",
            duration_ms: 0,
            error_code: "REJECTED".into(),
            executed: false,
            approval_id: None,
        },
    )
}

/// The result of a call whose output would take the turn past what one
/// model call may send (`server.max_prompt_bytes` of tool output a turn).
pub fn over_output_budget(outcome: &ToolOutcome) -> ToolOutcome {
    ToolOutcome {
        call_id: outcome.call_id.clone(),
        name: outcome.name.clone(),
        content: json!({ "error": {
            "code": "TURN_OUTPUT_BUDGET",
            "message": "this turn's tool output is spent: answer with what you have",
        }})
        .to_string(),
        is_error: true,
    }
}

/// A tool's result as the message the model reads.
pub(super) fn tool_message(outcome: ToolOutcome) -> ChatMessage {
    ChatMessage {
        role: Role::Tool,
        content: String::new(),
        tool_calls: Vec::new(),
        tool_result: Some(outcome),
    }
}

/// The event of a tool call's `outcome`, counted in the agent's metrics
/// (a tool not `offered` counted as `other`: the model names it).
pub(super) fn tool_result<M, E>(
    agent: &str,
    offered: &[ToolSpec],
    outcome: &ToolOutcome,
    report: Report,
) -> TurnEvent<M, E> {
    let tool = if offered.iter().any(|t| t.name == outcome.name) {
        outcome.name.as_str()
    } else {
        "other"
    };
    metrics::agent_tool_call(agent, tool, report.status);
    TurnEvent::ToolResult {
        call_id: outcome.call_id.clone(),
        tool: outcome.name.clone(),
        status: report.status,
        duration_ms: report.duration_ms,
        error_code: report.error_code,
    }
}
