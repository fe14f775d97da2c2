//! A model answer's tool calls, each through the tools' one entry point
//! (`Call::invoke_tool`) with the agent's allowlist and timeout. Whatever
//! happens to a call (denied, invalid, failed, timed out, past the turn's
//! `max_tool_calls`) becomes a tool result the model reads; none is raised
//! to the caller.

use super::super::{
    Call, CallError,
    tool::{AgentScope, ToolRequest, ToolResult},
};
use super::{guard::TurnGuard, held::Resolution};
use crate::{
    agent::turn::{
        Report,
        outcomes::{self, arguments, cut, error},
    },
    auth::Principal,
    config::{ServerConfig, guardrails::Stage},
    domain::json::{bytes as json_bytes, depth as json_depth},
    domain::{ToolCall, ToolOutcome},
    tasks::TaskError,
    tools::{Status, invocations::Mode},
};
use tokio::time::Instant;

/// A call refused because the turn reached `max_tool_calls`: audited as a
/// denial (SPEC §9.2: every decision is), answered to the model.
pub async fn refused_over_cap(on: &Call, call: &ToolCall, cap: u32) -> (ToolOutcome, Report) {
    on.audit_denial(&call.name, &arguments(call), "MAX_TOOL_CALLS")
        .await;
    outcomes::over_cap(call, cap)
}

/// A model's arguments within the limits of a caller's tool input,
/// measured alike (`server.max_input_depth`, then `server.max_input_bytes`
/// of compact JSON): a webhook and the invocation store get no more from a
/// model than from a caller.
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

/// `text` screened at `stage` by the turn's guardrails: `Ok(Err(why))`
/// when one blocks (the model is answered with `why`).
async fn screened(
    call: &Call,
    guard: Option<&TurnGuard>,
    stage: Stage,
    text: String,
    tool: &str,
) -> Result<Result<String, String>, CallError> {
    let Some(guard) = guard.filter(|g| g.applies(stage)) else {
        return Ok(Ok(text));
    };
    match call.screen(&guard.list, stage, &text, tool, false).await {
        Ok(text) => Ok(Ok(text)),
        Err(TaskError::GuardrailBlocked {
            guardrail, stage, ..
        }) => Ok(Err(format!("guardrail `{guardrail}` blocked the {stage}"))),
        Err(e) => Err(e.into()),
    }
}

/// Runs `tc` for `principal` within `scope`, its arguments and its result
/// screened by the turn's `guard`. `Err` only when what the call did could
/// not be recorded or audited: that fails the turn.
pub async fn run(
    call: &Call,
    principal: &Principal,
    scope: &AgentScope,
    tc: &ToolCall,
    resolved: Option<&Resolution>,
    guard: Option<&TurnGuard>,
) -> Result<(ToolOutcome, Report), CallError> {
    if let Some(Resolution::Rejected(reason)) = resolved {
        return Ok(outcomes::rejected(tc, reason));
    }
    let started = Instant::now();
    let took = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let tc = &match screened(
        call,
        guard,
        Stage::ToolInput,
        tc.arguments.clone(),
        &tc.name,
    )
    .await?
    {
        Ok(arguments) => ToolCall {
            arguments,
            ..tc.clone()
        },
        Err(why) => {
            let code = "GUARDRAIL_BLOCKED";
            return Ok((error(tc, code, &why), refusal(code, took())));
        }
    };
    let parsed = tc
        .parsed()
        .map(serde_json::Value::Object)
        .and_then(|input| within_limits(input, &call.pipeline.config().server));
    let input = match parsed {
        Ok(input) => input,
        Err(why) => {
            // Never reaches the tool: the model gets the reason and may
            // call again with valid arguments. The refusal is audited like
            // the entry point's own.
            call.audit_denial(&tc.name, &arguments(tc), "ARGUMENTS_INVALID")
                .await;
            let code = "ARGUMENTS_INVALID";
            return Ok((error(tc, code, &why), refusal(code, took())));
        }
    };
    let request = ToolRequest {
        tool: tc.name.clone(),
        input,
        mode: Mode::Sync,
        idempotency_key: None,
        agent: Some(scope.clone()),
        call_id: Some(tc.id.clone()),
        approved: match resolved {
            Some(Resolution::Approved(id)) => Some(id.clone()),
            _ => None,
        },
    };
    match call.invoke_tool(principal, request).await {
        Ok(result) if result.status == Status::AwaitingApproval => Ok((
            error(tc, "AWAITING_APPROVAL", "held for a person's decision"),
            Report {
                status: "AWAITING_APPROVAL",
                duration_ms: took(),
                error_code: "AWAITING_APPROVAL".into(),
                executed: false,
                approval_id: result.approval_id,
            },
        )),
        Ok(result) => ran(call, guard, tc, result).await,
        Err(err @ CallError::Storage(_)) => Err(err),
        Err(err) => {
            let code = err.reason().unwrap_or("INTERNAL");
            let why = format!("the call was refused ({code})");
            Ok((error(tc, code, &why), refusal(code, took())))
        }
    }
}

/// What the model reads of a tool that ran: its output (screened as
/// `tool_output`: a block answers an error instead) or its failure.
async fn ran(
    call: &Call,
    guard: Option<&TurnGuard>,
    tc: &ToolCall,
    result: ToolResult,
) -> Result<(ToolOutcome, Report), CallError> {
    let shown = match result.status {
        // Shown as RUNNING, as on every edge.
        Status::AwaitingCallback => Status::Running,
        other => other,
    };
    let mut report = Report {
        status: shown.as_str(),
        duration_ms: u64::try_from(result.duration_ms).unwrap_or(0),
        error_code: String::new(),
        executed: true,
        approval_id: None,
    };
    let outcome = match (&result.output, result.error) {
        (Some(output), _) if result.status == Status::Succeeded => {
            let content = cut(output.to_string());
            match screened(call, guard, Stage::ToolOutput, content, &tc.name).await? {
                Ok(content) => ToolOutcome {
                    call_id: tc.id.clone(),
                    name: tc.name.clone(),
                    content,
                    is_error: false,
                },
                Err(why) => {
                    report.error_code = "GUARDRAIL_BLOCKED".into();
                    error(tc, "GUARDRAIL_BLOCKED", &why)
                }
            }
        }
        (_, Some(f)) => {
            report.error_code.clone_from(&f.code);
            error(tc, &f.code, &f.message)
        }
        // A workflow that calls back took the work on: not an error, and
        // not its result either.
        _ if result.status == Status::AwaitingCallback => ToolOutcome {
            call_id: tc.id.clone(),
            name: tc.name.clone(),
            content: serde_json::json!({
                "status": "ACCEPTED",
                "invocation_id": result.invocation_id,
                "note": "the workflow accepted the work and reports its result later",
            })
            .to_string(),
            is_error: false,
        },
        _ => error(tc, result.status.as_str(), "the tool gave no output"),
    };
    Ok((outcome, report))
}

/// The report of a call that never reached the tool.
fn refusal(code: &str, duration_ms: u64) -> Report {
    Report {
        status: if code == "ARGUMENTS_INVALID" {
            "FAILED"
        } else {
            "DENIED"
        },
        duration_ms,
        error_code: code.to_owned(),
        executed: false,
        approval_id: None,
    }
}
