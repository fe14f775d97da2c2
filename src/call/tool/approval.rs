//! Human approval at the entry point (SPEC §14.1): a call of a tool that
//! needs it is held, not run, unless its caller holds `approve:<tool>`
//! (auto-approved, audited as such) or a person already approved it. A held
//! `InvokeTool` is stored `AWAITING_APPROVAL` with its approval in one
//! transaction and runs as ASYNC once approved; a held agent call is
//! answered to the turn, which stops until the conversation is resumed.

use super::{Admitted, Claim, ToolRequest, ToolResult};
use crate::{
    audit::{AuditEvent, Category},
    auth::Principal,
    call::{Call, CallError},
    telemetry::metrics,
    tools::{
        Status, Tool,
        approvals::{self, Approval},
        invocations::{Claimed, Invocation, Mode},
        policy,
    },
};
use std::time::Duration;

/// Whether an invocation waits for a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// The tool needs no approval.
    Free,
    /// Its caller holds `approve:<tool>`.
    AutoApproved,
    /// A person approved this call (an agent's, resumed).
    Approved,
    /// It waits for a decision.
    Held,
}

impl Gate {
    /// The reason its `tool.call` event records.
    pub(super) fn reason(self) -> &'static str {
        match self {
            Gate::Free => "",
            Gate::AutoApproved => "AUTO_APPROVED",
            Gate::Approved => "APPROVED",
            Gate::Held => "AWAITING_APPROVAL",
        }
    }
}

/// The `approval.requested` event of `approval`.
pub(crate) fn requested_event(approval: &Approval) -> AuditEvent {
    AuditEvent::new(
        &approval.team_id,
        &approval.requested_by,
        &approval.trace_id,
        Category::Approval,
        "approval.requested",
        &format!("{}@{}", approval.tool, approval.version),
    )
    .decided("pending", &approval.id)
    .with_input(&approval.input)
}

impl Call {
    /// Whether the call of `tool` by a caller with `capabilities` waits.
    /// Under `four_eyes` no one approves their own call, not even by
    /// holding the capability: another principal decides.
    pub(super) fn approval_gate(
        &self,
        tool: &Tool,
        capabilities: &[String],
        req: &ToolRequest,
    ) -> Gate {
        let approvals = &self.pipeline.config().approvals;
        if !policy::needs_approval(tool, approvals) {
            Gate::Free
        } else if req.approved.is_some() {
            Gate::Approved
        } else if !approvals.four_eyes && policy::may_approve(capabilities, &tool.name) {
            Gate::AutoApproved
        } else {
            Gate::Held
        }
    }

    /// Holds an admitted call for a decision: durable (with its
    /// `approval.requested` event) before the reply.
    pub(super) async fn hold(
        &self,
        principal: &Principal,
        req: &ToolRequest,
        a: Admitted,
        called: AuditEvent,
        span: &tracing::Span,
    ) -> Result<ToolResult, CallError> {
        let tool = &a.tool;
        let approval = Approval::new(
            &self.ctx.team_id,
            &tool.name,
            &tool.version.to_string(),
            &principal.name,
            &self.ctx.trace_id,
            req.input.clone(),
            self.pipeline.config().approvals.approval_timeout,
        );
        span.record("status", Status::AwaitingApproval.as_str());
        metrics::tool_invocation(
            &tool.name,
            Status::AwaitingApproval.as_str(),
            Duration::ZERO,
        );
        if req.agent.is_some() {
            return self.hold_agent_call(req, approval, called).await;
        }
        let (inv, approval) = match self.hold_invocation(principal, req, &a, approval).await? {
            Claim::Ours(row) => (row.inv, row.approval),
            Claim::Theirs(first, key) => {
                return self.deduplicated(called, &a, &first, key, span).await;
            }
        };
        let called = AuditEvent {
            idempotency_key: Some(inv.idempotency_key.clone()),
            ..called
        };
        self.audit(vec![called, requested_event(&approval)]).await?;
        // Charged its estimate now, as an ASYNC invocation is (docs/governance.md).
        let kind = tool.kind.as_str();
        self.log()
            .add_tool(kind, a.id.clone(), a.estimate, Duration::ZERO);
        let mut result = ToolResult::from_stored(&inv, false);
        result.approval_id = Some(approval.id);
        Ok(result)
    }

    /// Stores the invocation `AWAITING_APPROVAL` and its approval, in one
    /// transaction; an earlier holder of its idempotency key answers instead.
    async fn hold_invocation(
        &self,
        principal: &Principal,
        req: &ToolRequest,
        a: &Admitted,
        approval: Approval,
    ) -> Result<Claim<Held>, CallError> {
        let tool = &a.tool;
        let (key, window_start) = self.idempotency(tool, req, &principal.name, a.now_ms);
        let mut inv = Invocation::new(
            &self.ctx.team_id,
            &tool.name,
            &tool.version.to_string(),
            Mode::Async,
            &key,
            window_start,
            &self.ctx.trace_id,
            &principal.name,
            req.input.clone(),
            a.estimate,
            tool.timeout,
        );
        inv.status = Status::AwaitingApproval;
        let approval = approval.for_invocation(&inv.id);
        let claimed = approvals::request_invocation(self.pipeline.store(), &inv, &approval)
            .await
            .map_err(|e| CallError::Storage(e.to_string()))?;
        Ok(match claimed {
            Claimed::New => Claim::Ours(Box::new(Held { inv, approval })),
            Claimed::Existing(first) => Claim::Theirs(first, key),
        })
    }

    /// An agent's call held: its approval stored (by conversation and call),
    /// answered to the turn; nothing is charged until it runs.
    async fn hold_agent_call(
        &self,
        req: &ToolRequest,
        approval: Approval,
        called: AuditEvent,
    ) -> Result<ToolResult, CallError> {
        let conversation = self.turn.as_ref().map_or("", |(c, _)| c.as_str());
        let call_id = req.call_id.as_deref().unwrap_or_default();
        let approval = approval.for_call(conversation, call_id);
        let approval = approvals::request_call(self.pipeline.store(), &approval)
            .await
            .map_err(|e| CallError::Storage(e.to_string()))?;
        self.audit(vec![called, requested_event(&approval)]).await?;
        Ok(ToolResult {
            invocation_id: String::new(),
            tool: approval.tool.clone(),
            version: approval.version.clone(),
            status: Status::AwaitingApproval,
            output: None,
            error: None,
            cost_micros: 0,
            duration_ms: 0,
            deduplicated: false,
            execution_id: None,
            attempts: 0,
            approval_id: Some(approval.id),
        })
    }

    /// The approval of a held (or rejected) invocation, if it can be read.
    pub(super) async fn approval_of(&self, inv: &Invocation) -> Option<String> {
        let store = self.pipeline.store();
        match approvals::for_invocation(store, &inv.team_id, &inv.id).await {
            Ok(found) => found.map(|a| a.id),
            Err(e) => {
                tracing::warn!(invocation = %inv.id, error = %e, "reading an invocation's approval failed");
                None
            }
        }
    }
}

/// A held invocation's row and its approval.
pub(super) struct Held {
    inv: Invocation,
    approval: Approval,
}
