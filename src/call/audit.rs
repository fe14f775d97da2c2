//! A call's own audit event (SPEC §14.3, `[audit] calls`): `call.completed`
//! or `call.failed`, the figures of its usage record with digests of its
//! redacted input and answer, never their content. It rides in the call's
//! settlement, so it is committed in the same transaction as the record and
//! is as durable as the reply. Tool invocations audit themselves (`tool.*`),
//! turns their start and end (`turn::audit`).

use super::{Call, CallContext, log::CallLog};
use crate::{
    audit::{AuditEvent, Category, digest},
    domain::{ChatMessage, Completion, ToolCall, completion::Role},
    usage::{
        MeterError, UsageRecord,
        ledger::{LedgerWriter, Op},
    },
};
use serde_json::{Map, Value, json};

impl Call {
    /// Audits this call with `input` (the caller's variables or messages)
    /// as what its event digests; nothing with `[audit] calls = false` or
    /// when the feature audits itself (`None`).
    pub(super) fn audit_input(&self, input: impl FnOnce() -> Option<Value>) {
        if !self.pipeline.config().audit.calls {
            return;
        }
        if let Some(input) = input() {
            let digest = digest::digest(&input);
            self.log().audit_input = Some(digest);
        }
    }

    /// Remembers the digest of an audited call's answer; a later model call
    /// of the same call (a redraft) replaces it.
    pub(super) fn audit_answer(&self, completion: &Completion) {
        if self.log().audit_input.is_none() {
            return;
        }
        let digest = digest::digest(&answer(completion));
        self.log().audit_output = Some(digest);
    }
}

/// The event of an audited call that ended with `record`; `None` when the
/// call is not audited. The reason is the record's outcome (`ok`, or the
/// stable reason of the failure) followed by its figures as `key=value`.
pub(super) fn event(ctx: &CallContext, log: &CallLog, record: &UsageRecord) -> Option<AuditEvent> {
    let (input_sha256, input_bytes) = log.audit_input.clone()?;
    let ok = record.outcome == "ok";
    let (action, decision) = if ok {
        ("call.completed", "ok")
    } else {
        ("call.failed", "error")
    };
    let reason = format!(
        "{} provider={} model={} input_tokens={} output_tokens={} attempts={}",
        record.outcome,
        record.provider,
        record.model,
        record.input_tokens,
        record.output_tokens,
        log.attempts.len(),
    );
    let mut event = AuditEvent::new(
        &ctx.team_id,
        &ctx.principal,
        &ctx.trace_id,
        Category::Call,
        action,
        &record.task,
    )
    .decided(decision, &reason);
    event.input_sha256 = Some(input_sha256);
    event.input_bytes = Some(input_bytes);
    // A failed call has no answer (a redraft's first draft was not served).
    if let (true, Some((sha, bytes))) = (ok, log.audit_output.clone()) {
        event.output_sha256 = Some(sha);
        event.output_bytes = Some(bytes);
    }
    event.duration_ms = Some(record.latency_ms);
    event.estimated_cost_micros = log.estimated_micros;
    event.actual_cost_micros = record.cost_micros;
    Some(event)
}

/// Appends the events of a call no settlement carries (metering off):
/// durably, unless the call's reply does not wait for the disk (a fast
/// failure, a turn's call), as its settlement would have been.
pub(super) async fn append_unsettled(
    ledger: &LedgerWriter,
    events: Vec<AuditEvent>,
    durable: bool,
) -> Result<(), MeterError> {
    if events.is_empty() {
        return Ok(());
    }
    if durable {
        ledger.submit(Op::Audit(events)).await?;
    } else {
        ledger.enqueue(Op::Audit(events)).await?;
    }
    Ok(())
}

/// A request's messages as its audit input: the system text and each
/// message; tool arguments and results as JSON where they are, so that
/// redaction reaches their keys.
pub(super) fn messages(system: Option<&str>, messages: &[ChatMessage]) -> Value {
    json!({
        "system": system,
        "messages": messages.iter().map(message).collect::<Vec<_>>(),
    })
}

fn message(m: &ChatMessage) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let mut out = Map::new();
    out.insert("role".into(), role.into());
    out.insert("content".into(), m.content.as_str().into());
    if !m.tool_calls.is_empty() {
        out.insert("tool_calls".into(), tool_calls(&m.tool_calls));
    }
    if let Some(r) = &m.tool_result {
        let result = json!({
            "call_id": r.call_id,
            "name": r.name,
            "content": as_json(&r.content),
            "is_error": r.is_error,
        });
        out.insert("tool_result".into(), result);
    }
    Value::Object(out)
}

/// An answer as its audit output: the text, and the tool calls if any.
fn answer(c: &Completion) -> Value {
    let mut out = Map::new();
    out.insert("text".into(), c.text.as_str().into());
    if !c.tool_calls.is_empty() {
        out.insert("tool_calls".into(), tool_calls(&c.tool_calls));
    }
    Value::Object(out)
}

fn tool_calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": as_json(&c.arguments)}))
        .collect()
}

/// `text` parsed when it is JSON, else as a string.
fn as_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ToolOutcome;

    #[test]
    fn an_answer_is_its_text_and_tool_calls_with_arguments_as_json() {
        let plain = Completion {
            text: "Hello.".into(),
            ..Completion::default()
        };
        assert_eq!(answer(&plain), json!({"text": "Hello."}));
        let calling = Completion {
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "crm__lookup".into(),
                arguments: r#"{"email":"ann@example.com"}"#.into(),
            }],
            ..Completion::default()
        };
        let value = answer(&calling);
        assert_eq!(
            value["tool_calls"][0]["arguments"]["email"],
            "ann@example.com"
        );
        // Redaction reaches the arguments: another address, the same digest.
        let other = Completion {
            tool_calls: vec![ToolCall {
                arguments: r#"{"email":"bob@example.com"}"#.into(),
                ..calling.tool_calls[0].clone()
            }],
            ..Completion::default()
        };
        assert_eq!(digest::digest(&value), digest::digest(&answer(&other)));
    }

    #[test]
    fn messages_keep_roles_order_and_tool_results() {
        let history = [
            ChatMessage::text(Role::User, "Look her up."),
            ChatMessage {
                role: Role::Tool,
                tool_result: Some(ToolOutcome {
                    call_id: "c1".into(),
                    name: "crm.lookup".into(),
                    content: r#"{"phone":"+1 555"}"#.into(),
                    is_error: false,
                }),
                ..ChatMessage::default()
            },
        ];
        let value = messages(Some("Be brief."), &history);
        assert_eq!(value["system"], "Be brief.");
        assert_eq!(
            value["messages"][0],
            json!({"role": "user", "content": "Look her up."})
        );
        assert_eq!(
            value["messages"][1]["tool_result"]["content"]["phone"],
            "+1 555"
        );
        let swapped = messages(Some("Be brief."), &[history[1].clone(), history[0].clone()]);
        assert_ne!(digest::digest(&value), digest::digest(&swapped));
    }
}
