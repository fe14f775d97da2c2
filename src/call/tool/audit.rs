//! How the entry point audits: a denial durably before its error goes
//! back, a call's events in the group commit its result waits for.

use crate::{
    audit::{AuditEvent, Category},
    call::{Call, CallError},
    telemetry::metrics,
    tools::Denial,
    usage::ledger::Op,
};
use serde_json::Value;

/// The `tool.denied` event: a digest of the input, never the input.
pub(crate) fn denial(
    team: &str,
    principal: &str,
    trace_id: &str,
    subject: &str,
    input: &Value,
    reason: &str,
) -> AuditEvent {
    AuditEvent::new(
        team,
        principal,
        trace_id,
        Category::Tool,
        "tool.denied",
        subject,
    )
    .decided("deny", reason)
    .with_input(input)
}

impl Call {
    /// Audits a denial (durably, before the error goes back) and counts it.
    pub(super) async fn deny(&self, subject: &str, input: &Value, denial: Denial) -> CallError {
        self.audit_denial(subject, input, denial.reason()).await;
        CallError::ToolDenied(denial)
    }

    /// Audits (durably) and counts a refusal, the entry point's or a turn's;
    /// the subject is the tool's `name@version` when the registry knows it.
    pub(crate) async fn audit_denial(&self, subject: &str, input: &Value, reason: &'static str) {
        metrics::tool_denial(reason);
        let subject = self
            .pipeline
            .toolbox()
            .registry
            .lookup(subject)
            .map_or_else(|_| subject.to_owned(), |tool| tool.id());
        let event = denial(
            &self.ctx.team_id,
            &self.ctx.principal,
            &self.ctx.trace_id,
            &subject,
            input,
            reason,
        );
        if let Err(e) = self.audit(vec![event]).await {
            tracing::error!(trace_id = %self.ctx.trace_id, error = ?e, "auditing a tool denial failed");
        }
    }

    /// Appends `events` to the audit log and waits until they are durable.
    pub(crate) async fn audit(&self, events: Vec<AuditEvent>) -> Result<(), CallError> {
        self.pipeline
            .ledger()
            .submit(Op::Audit(events))
            .await
            .map(drop)
            .map_err(|e| CallError::Storage(e.to_string()))
    }

    /// Queues `events` for the group commit a later durable operation of this
    /// team waits for: in order, before anything the call queues after.
    pub(crate) async fn audit_later(&self, events: Vec<AuditEvent>) -> Result<(), CallError> {
        self.pipeline
            .ledger()
            .enqueue(Op::Audit(events))
            .await
            .map_err(|e| CallError::Storage(e.to_string()))
    }

    /// Audit events the reply depends on: queued for the settlement's durable
    /// group commit when metering is on, else appended durably now.
    pub(crate) async fn audit_before_finish(
        &self,
        events: Vec<AuditEvent>,
    ) -> Result<(), CallError> {
        if self.pipeline.meter().enabled() {
            self.audit_later(events).await
        } else {
            self.audit(events).await
        }
    }
}
