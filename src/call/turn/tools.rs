//! A model answer's tool calls, each through the tools' entry point: whatever
//! happens to one becomes a tool result the model reads, never an error.

use super::super::{Call, CallError, tool::AgentScope, tool::ToolRequest};
use crate::{
    auth::Principal,
    config::ServerConfig,
    domain::json::{bytes as json_bytes, depth as json_depth},
    domain::{ToolCall, ToolOutcome},
    tools::{Status, invocations::Mode},
};
use serde_json::json;
use tokio::time::Instant;

/// Most bytes of a tool's output handed to the model; more is cut, and says so.
const MAX_RESULT_BYTES: usize = 64 * 1024;

/// How one tool call ended, for the `tool_result` event and metrics.
#[derive(Debug, Clone)]
pub struct Report {
    /// SUCCEEDED, FAILED, TIMED_OUT or DENIED.
    pub status: &'static str,
    pub duration_ms: u64,
    /// The stable reason when it did not succeed.
    pub error_code: String,
    /// It reached the tool (counts against `max_tool_calls`).
    pub executed: bool,
}

fn error(call: &ToolCall, code: &str, message: &str) -> ToolOutcome {
    ToolOutcome {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: json!({ "error": { "code": code, "message": message } }).to_string(),
        is_error: true,
    }
}

/// A call's arguments as audited: the parsed object, else the text as sent.
pub(super) fn arguments(call: &ToolCall) -> serde_json::Value {
    call.parsed().map_or_else(
        |_| serde_json::Value::String(call.arguments.clone()),
        serde_json::Value::Object,
    )
}

fn cut(mut text: String) -> String {
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

/// A call refused because the turn reached `max_tool_calls`: audited as a
/// denial (SPEC §9.2: every decision is), answered to the model.
pub async fn refused_over_cap(on: &Call, call: &ToolCall, cap: u32) -> (ToolOutcome, Report) {
    on.audit_denial(&call.name, &arguments(call), "MAX_TOOL_CALLS")
        .await;
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
        },
    )
}

/// A call not run because the turn's budget is spent: answered all the same,
/// since a provider refuses a history with a call and no result.
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
        },
    )
}

/// The result of a call whose output would exceed the turn's `max_prompt_bytes`.
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

/// A model's arguments within a caller's tool input limits: a webhook and
/// the invocation store get no more from a model than from a caller.
fn within_limits(
    input: serde_json::Value,
    server: &ServerConfig,
) -> Result<serde_json::Value, String> {
    // Depth first: it bounds the serializer's recursion that counts bytes.
    let depth = json_depth(&input);
    if depth > server.max_input_depth {
        return Err(format!(
            "the arguments nest {depth} levels deep, more than the {} a tool's input may",
            server.max_input_depth
        ));
    }
    let bytes = json_bytes(&input);
    if bytes > server.max_input_bytes {
        return Err(format!(
            "the arguments are {bytes} bytes of JSON, more than the {} a tool's input may be",
            server.max_input_bytes
        ));
    }
    Ok(input)
}

/// Runs `tc`; `Err` only when its record or audit failed, which fails the turn.
pub async fn run(
    call: &Call,
    principal: &Principal,
    scope: &AgentScope,
    tc: &ToolCall,
) -> Result<(ToolOutcome, Report), CallError> {
    let started = Instant::now();
    let took = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let parsed = tc
        .parsed()
        .map(serde_json::Value::Object)
        .and_then(|input| within_limits(input, &call.pipeline.config().server));
    let input = match parsed {
        Ok(input) => input,
        Err(why) => {
            // Never reaches the tool; the model may retry. Audited like the entry point's.
            call.audit_denial(&tc.name, &arguments(tc), "ARGUMENTS_INVALID")
                .await;
            return Ok((
                error(tc, "ARGUMENTS_INVALID", &why),
                Report {
                    status: "FAILED",
                    duration_ms: took(),
                    error_code: "ARGUMENTS_INVALID".into(),
                    executed: false,
                },
            ));
        }
    };
    let request = ToolRequest {
        tool: tc.name.clone(),
        input,
        mode: Mode::Sync,
        idempotency_key: None,
        agent: Some(scope.clone()),
    };
    match call.invoke_tool(principal, request).await {
        Ok(result) => {
            let outcome = match (&result.output, &result.error) {
                (Some(output), _) if result.status == Status::Succeeded => ToolOutcome {
                    call_id: tc.id.clone(),
                    name: tc.name.clone(),
                    content: cut(output.to_string()),
                    is_error: false,
                },
                (_, Some(f)) => error(tc, &f.code, &f.message),
                _ => error(tc, result.status.as_str(), "the tool gave no output"),
            };
            let report = Report {
                status: result.status.as_str(),
                duration_ms: u64::try_from(result.duration_ms).unwrap_or(0),
                error_code: result.error.map(|f| f.code).unwrap_or_default(),
                executed: true,
            };
            Ok((outcome, report))
        }
        Err(err @ CallError::Storage(_)) => Err(err),
        Err(err) => {
            let code = err.reason().unwrap_or("INTERNAL");
            Ok((
                error(tc, code, &format!("the call was refused ({code})")),
                Report {
                    status: "DENIED",
                    duration_ms: took(),
                    error_code: code.to_owned(),
                    executed: false,
                },
            ))
        }
    }
}
