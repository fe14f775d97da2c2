//! Guardrails in a call (SPEC §15): the text a task sends and the answer it
//! gets screened by the task's guardrails, each detection audited
//! (`guardrail.flagged`, durable with the call's settlement) and counted
//! (`guardrail_decisions_total`); a block is the call's error, naming the
//! guardrail and never the content.

mod classify;

use super::{Call, CallContext, Pipeline};
use crate::{
    audit::{AuditEvent, Category},
    config::guardrails::{Action, PiiConfig, Stage},
    domain::{CompletionRequest, ToolCall, completion::Role},
    guardrails::{self, Blocked, Finding, Guardrail, Screened, pii::Masker},
    tasks::TaskError,
    telemetry::metrics,
};
use std::sync::Arc;

/// A call's PII masker and whether its answer gets the originals back.
pub(super) struct Pii {
    pub masker: Masker,
    pub restore: bool,
}

impl Pii {
    /// The masker `config` asks for.
    pub(super) fn of(config: &PiiConfig) -> Self {
        Self {
            masker: Masker::new(&config.mask),
            restore: config.restore,
        }
    }

    /// `request` with its system prompt and every message's text masked:
    /// contents, tool results, and the arguments of earlier tool calls.
    pub(super) fn mask(&mut self, request: &CompletionRequest) -> CompletionRequest {
        let mut masked = request.clone();
        if let Some(system) = &mut masked.system {
            *system = self.masker.mask(system);
        }
        for m in &mut masked.messages {
            m.content = self.masker.mask(&m.content);
            if let Some(result) = &mut m.tool_result {
                result.content = self.masker.mask(&result.content);
            }
            for call in &mut m.tool_calls {
                call.arguments = self.masker.mask(&call.arguments);
            }
        }
        masked
    }

    /// The answer as the caller sees it: with the originals back if asked.
    pub(super) fn shown(&self, text: &str) -> String {
        if self.restore {
            self.masker.restore(text)
        } else {
            text.to_owned()
        }
    }

    /// The tool calls the model wrote, as the caller (or a tool) gets them:
    /// with the originals back in their arguments if asked.
    pub(super) fn show_calls(&self, calls: &mut [ToolCall]) {
        for call in calls.iter_mut().filter(|_| self.restore) {
            call.arguments = self.masker.restore(&call.arguments);
        }
    }
}

impl Call {
    /// The masker of `[tasks.<task>] pii`, if the task masks.
    pub(super) fn task_pii(&self, task: &str) -> Option<Pii> {
        let config = self.pipeline.config().tasks.get(task)?.pii.as_ref()?;
        Some(Pii::of(config))
    }

    /// The guardrails `[tasks.<task>] guardrails` lists, in order.
    pub(super) fn task_guardrails(&self, task: &str) -> Vec<Arc<Guardrail>> {
        let names = self
            .pipeline
            .config()
            .tasks
            .get(task)
            .map(|t| &t.guardrails);
        names.map_or_else(Vec::new, |n| self.pipeline.guardrails().listed(n))
    }

    /// `request` with its user messages screened (`input`): `None` when
    /// nothing changed, the redacted request otherwise.
    pub(super) async fn screen_request(
        &self,
        list: &[Arc<Guardrail>],
        task: &str,
        request: &CompletionRequest,
    ) -> Result<Option<CompletionRequest>, TaskError> {
        if !list.iter().any(|g| g.applies(Stage::Input)) {
            return Ok(None);
        }
        let mut changed: Option<CompletionRequest> = None;
        for (i, m) in request.messages.iter().enumerate() {
            if m.role != Role::User || m.content.is_empty() {
                continue;
            }
            let text = self
                .screen(list, Stage::Input, &m.content, task, false)
                .await?;
            if text != m.content {
                let copy = changed.get_or_insert_with(|| request.clone());
                copy.messages[i].content = text;
            }
        }
        Ok(changed)
    }

    /// `text` screened at `stage` for `subject` (the task): what is left
    /// after redactions, or the block as the task's error (`answered`: a
    /// provider already answered, so the call is recorded).
    pub(super) async fn screen(
        &self,
        list: &[Arc<Guardrail>],
        stage: Stage,
        text: &str,
        subject: &str,
        answered: bool,
    ) -> Result<String, TaskError> {
        if !list.iter().any(|g| g.applies(stage)) {
            return Ok(text.to_owned());
        }
        match self
            .pipeline
            .screen_text(&self.ctx, list, stage, text)
            .await
        {
            Ok(screened) => {
                self.report(&screened.findings, subject, text, answered)
                    .await?;
                Ok(screened.text)
            }
            Err(blocked) => Err(self.blocked(blocked, subject, text, answered).await),
        }
    }

    /// A block as the task's error, audited and counted first.
    pub(super) async fn blocked(
        &self,
        blocked: Blocked,
        subject: &str,
        text: &str,
        answered: bool,
    ) -> TaskError {
        let (guardrail, stage) = (blocked.guardrail.clone(), blocked.stage);
        if let Err(e) = self
            .report(&[as_finding(blocked)], subject, text, answered)
            .await
        {
            return e;
        }
        TaskError::GuardrailBlocked {
            guardrail,
            stage: stage.as_str(),
            answered,
        }
    }

    /// Counts and audits `findings` over `text` (its digest, never the
    /// text). Before a provider answered (`answered` false) the events are
    /// durable at once: the call may yet be refused and write nothing else.
    /// After, they ride the call's settlement.
    pub(super) async fn report(
        &self,
        findings: &[Finding],
        subject: &str,
        text: &str,
        answered: bool,
    ) -> Result<(), TaskError> {
        if findings.is_empty() {
            return Ok(());
        }
        let events = events(&self.ctx, findings, subject, text);
        let written = if answered {
            self.audit_before_finish(events).await
        } else {
            self.audit(events).await
        };
        written.map_err(|e| TaskError::Storage(format!("auditing a guardrail decision: {e:?}")))
    }
}

impl Pipeline {
    /// `text` screened at `stage` by `list`: the pattern guardrails in
    /// order, then the classifiers. What they found is not yet reported.
    pub(super) async fn screen_text(
        &self,
        ctx: &CallContext,
        list: &[Arc<Guardrail>],
        stage: Stage,
        text: &str,
    ) -> Result<Screened, Blocked> {
        let screened = guardrails::screen(list, stage, text)?;
        self.classified(ctx, list, stage, screened).await
    }
}

/// A block as the finding its audit event and metric report.
pub(super) fn as_finding(b: Blocked) -> Finding {
    Finding {
        guardrail: b.guardrail,
        action: Action::Block,
        stage: b.stage,
        score: b.score,
        detail: b.detail,
        failed: b.failed,
    }
}

/// `findings` over `text` as audit events (its digest, never the text),
/// each counted in `guardrail_decisions_total`. A classifier that failed
/// is `guardrail.failed`, its action `fail_open` or `fail_closed`.
pub(super) fn events(
    ctx: &CallContext,
    findings: &[Finding],
    subject: &str,
    text: &str,
) -> Vec<AuditEvent> {
    findings
        .iter()
        .map(|f| {
            let (action, decision) = match (f.failed, f.action) {
                (false, a) => ("guardrail.flagged", a.as_str()),
                (true, Action::Block) => ("guardrail.failed", "fail_closed"),
                (true, _) => ("guardrail.failed", "fail_open"),
            };
            metrics::guardrail_decision(&f.guardrail, decision);
            let mut reason = format!("{}:{}", f.guardrail, f.stage.as_str());
            if let Some(score) = f.score {
                reason.push_str(&format!(":{score:.2}"));
            }
            if let Some(detail) = &f.detail {
                reason.push(':');
                reason.push_str(detail);
            }
            AuditEvent::new(
                &ctx.team_id,
                &ctx.principal,
                &ctx.trace_id,
                Category::Guardrail,
                action,
                subject,
            )
            .decided(decision, &reason)
            .with_input(&serde_json::Value::String(text.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::guardrails::PiiKind, domain::ChatMessage};

    #[test]
    fn a_masked_request_is_restored_in_the_answer_and_the_tool_calls_the_model_writes() {
        let mut pii = Pii {
            masker: Masker::new(&[PiiKind::Email]),
            restore: true,
        };
        let request = CompletionRequest {
            tools: Vec::new(),
            tool_choice: crate::domain::ToolChoice::Auto,
            model: "m".into(),
            system: Some("Reply to ann@example.com".into()),
            messages: vec![ChatMessage::text(Role::User, "Write to ann@example.com")],
            temperature: None,
            max_tokens: 10,
            response_format: None,
            trace_id: "t".into(),
            traceparent: None,
            deadline: tokio::time::Instant::now(),
        };
        let masked = pii.mask(&request);
        assert_eq!(masked.system.as_deref(), Some("Reply to <EMAIL_1>"));
        assert_eq!(masked.messages[0].content, "Write to <EMAIL_1>");
        let mut calls = vec![ToolCall {
            id: "c1".into(),
            name: "mail.send".into(),
            arguments: r#"{"to":"<EMAIL_1>"}"#.into(),
        }];
        pii.show_calls(&mut calls);
        assert_eq!(calls[0].arguments, r#"{"to":"ann@example.com"}"#);
        assert_eq!(pii.shown("Sent to <EMAIL_1>."), "Sent to ann@example.com.");
        pii.restore = false;
        assert_eq!(pii.shown("Sent to <EMAIL_1>."), "Sent to <EMAIL_1>.");
    }
}
