//! Admission of a tool invocation (SPEC §9.3, steps 1 to 5): look-up, the
//! policy gate and the agent's list, the input schema, the cost reserved,
//! the quota taken; and whether it waits for a person (§14.1). Each
//! refusal is audited.

use super::{Admitted, ToolRequest, approval, caller};
use crate::{
    auth::Principal,
    call::{Call, CallError},
    tools::{Denial, Tool, cost, invocations::Mode, policy, quota::Slot, schema},
    usage::Estimate,
};
use serde_json::Value;

impl Call {
    /// Steps 1 to 5: look up, policy gate (and the agent's list), input
    /// schema, cost reserved, quota taken. Each refusal is audited.
    pub(super) async fn admit(
        &self,
        principal: &Principal,
        req: &ToolRequest,
        span: &tracing::Span,
    ) -> Result<Admitted, CallError> {
        let tools = self.pipeline.toolbox();
        let tool = match tools.registry.lookup(&req.tool) {
            Ok(t) => t,
            Err(d) => return Err(self.deny(&req.tool, &req.input, d).await),
        };
        let id = tool.id();
        span.record("tool", id.as_str());
        span.record("gen_ai.tool.name", tool.name.as_str());
        // The team is the principal's, never the input's.
        let capabilities = self.pipeline.capabilities(principal);
        let caller = caller(principal, &capabilities, &self.ctx.team_id);
        if let Err(d) = policy::gate(&caller, &tool) {
            return Err(self.deny(&id, &req.input, d).await);
        }
        if let Some(scope) = &req.agent
            && !crate::agent::allows(&scope.tools, &tool.name)
        {
            return Err(self.deny(&id, &req.input, Denial::NotAgentTool).await);
        }
        let violations = schema::violations(&tool.input, &req.input);
        if !violations.is_empty() {
            let denial = Denial::InputInvalid(violations);
            return Err(self.deny(&id, &req.input, denial).await);
        }
        let gate = self.approval_gate(&tool, &capabilities, req);
        let estimate = cost::estimate(&tool.cost, &req.input, tool.timeout);
        self.reserve_tool(&tool, &id, &req.input, estimate).await?;
        let now_ms = chrono::Utc::now().timestamp_millis();
        let quota = match (gate, &req.agent) {
            // An agent's held call is not run now: its quota is taken when it is.
            (approval::Gate::Held, Some(_)) => Ok(None),
            // Held, it runs later as ASYNC does: its hour counts now.
            (approval::Gate::Held, None) => self.take_quota(&tool, &id, Mode::Async, now_ms).await,
            _ => self.take_quota(&tool, &id, req.mode, now_ms).await,
        };
        match quota {
            Ok(slot) => Ok(Admitted {
                tool,
                id,
                estimate,
                slot,
                now_ms,
                gate,
            }),
            Err(d) => Err(self.deny(&id, &req.input, d).await),
        }
    }

    /// The tool's cost estimate reserved; a refusal is audited.
    pub(super) async fn reserve_tool(
        &self,
        tool: &Tool,
        id: &str,
        input: &Value,
        estimate: i64,
    ) -> Result<(), CallError> {
        let task = format!("tool:{}", tool.name);
        let reserve = Estimate {
            cost_micros: estimate,
            ..Estimate::default()
        };
        if let Err(e) = self.meter.reserve(&task, reserve).await {
            let err = CallError::tool(e);
            if let Some(reason) = err.reason() {
                self.audit_denial(id, input, reason).await;
            }
            return Err(err);
        }
        Ok(())
    }

    /// The quota. An ASYNC invocation counts against the hour here; its
    /// concurrency slot is the worker's, so a busy tool queues it, not refuses.
    pub(super) async fn take_quota(
        &self,
        tool: &Tool,
        id: &str,
        mode: Mode,
        now_ms: i64,
    ) -> Result<Option<Slot>, Denial> {
        let (quotas, team) = (&self.pipeline.toolbox().quotas, &self.ctx.team_id);
        match mode {
            Mode::Sync => quotas
                .acquire(team, id, &tool.quota, tool.timeout, now_ms)
                .await
                .map(Some),
            Mode::Async => quotas
                .admit(team, id, &tool.quota, now_ms)
                .await
                .map(|()| None),
        }
    }
}
