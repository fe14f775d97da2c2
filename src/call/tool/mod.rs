//! The one entry point of every tool invocation (SPEC §9.2), for `InvokeTool`,
//! MCP `tools/call` and the agent loop: look up, policy gate, input schema,
//! cost estimate reserved, quota, audit the call, execute within the timeout,
//! output schema, settle the actual cost (at the call's finish), audit the result.
//!
//! Every decision is audited: a denial durably before the reply, the
//! `tool.call` in the same group commit as its result. A workflow claims
//! its idempotency key first; a later holder gets the first invocation.

pub mod admin;
mod admit;
mod approval;
mod audit;
pub mod callback;
mod run;

pub(crate) use audit::denial;
pub(crate) use run::{callback_until, decision, judge, run};

use super::{Call, CallError};
use crate::{
    audit::{AuditEvent, Category},
    auth::Principal,
    telemetry::metrics,
    tools::{
        Failure, Kind, Status, Tool, cost,
        idempotency::{self, Keyed},
        invocations::{self, Claimed, Invocation, Mode, Outcome},
        policy::{self, Caller},
        quota::Slot,
    },
};
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;
use tracing::Instrument;

/// One invocation as asked for.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// `name` or `name@version`.
    pub tool: String,
    pub input: Value,
    pub mode: Mode,
    /// A caller's idempotency key, replacing the derived one.
    pub idempotency_key: Option<String>,
    /// An agent's limits, when an agent's model asked for the call.
    pub agent: Option<AgentScope>,
    /// The model's ID of an agent's call: a held call is approved by it.
    pub call_id: Option<String>,
    /// The approval a person gave this call: it runs without asking again.
    pub approved: Option<String>,
}

/// A caller's tool invocation (`InvokeTool`, MCP `tools/call`), as a feature.
#[derive(Debug, Clone)]
pub struct InvokeTool {
    /// Who asks: the policy gate checks its capabilities.
    pub principal: Principal,
    pub request: ToolRequest,
}

impl super::Feature for InvokeTool {
    type Output = ToolResult;

    fn task(&self) -> String {
        let name = self.request.tool.split('@').next().unwrap_or_default();
        format!("tool:{name}")
    }

    /// A tool audits its own call and result (`tool.call`, `tool.result`).
    fn audit_input(&self) -> Option<Value> {
        None
    }

    async fn run(self, call: &Call) -> Result<ToolResult, CallError> {
        call.invoke_tool(&self.principal, self.request).await
    }
}

/// What an agent adds: its tool allowlist (checked after the policy gate,
/// so both apply) and its tool timeout (at most the tool's own).
#[derive(Debug, Clone)]
pub struct AgentScope {
    pub tools: Vec<String>,
    pub timeout: Duration,
}

/// How an invocation stands, as `ToolInvocation` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    pub invocation_id: String,
    pub tool: String,
    pub version: String,
    pub status: Status,
    pub output: Option<Value>,
    pub error: Option<Failure>,
    /// What it cost (the estimate while it runs), micro-USD.
    pub cost_micros: i64,
    pub duration_ms: i64,
    /// Another invocation with the same idempotency key answered.
    pub deduplicated: bool,
    pub execution_id: Option<String>,
    /// POSTs made to a workflow's webhook.
    pub attempts: i64,
    /// The approval it waits for (or waited for).
    pub approval_id: Option<String>,
}

impl ToolResult {
    /// The result a stored invocation reads as.
    pub fn from_stored(inv: &Invocation, deduplicated: bool) -> Self {
        Self {
            invocation_id: inv.id.clone(),
            tool: inv.tool.clone(),
            version: inv.version.clone(),
            status: inv.status,
            output: inv.output.clone(),
            error: inv.error.clone(),
            cost_micros: inv.cost_micros.unwrap_or(inv.estimated_cost_micros),
            duration_ms: inv.duration_ms.unwrap_or(0),
            deduplicated,
            execution_id: inv.execution_id.clone(),
            attempts: inv.attempts,
            approval_id: None,
        }
    }
}

/// An invocation past the entry point's checks.
struct Admitted {
    tool: Arc<Tool>,
    id: String,
    estimate: i64,
    /// A SYNC invocation's concurrency slot, held while it runs.
    slot: Option<Slot>,
    now_ms: i64,
    /// Whether it waits for a person.
    gate: approval::Gate,
}

/// An invocation's stored row, and a SYNC row's lease (guards `finish`).
struct Row {
    inv: Invocation,
    lease: Option<i64>,
}

/// Who runs an invocation whose row claimed its idempotency key.
enum Claim<R = Row> {
    /// This call: the row is new.
    Ours(Box<R>),
    /// An earlier holder of the key (its invocation, and the key).
    Theirs(Box<Invocation>, String),
}

/// What a SYNC run came to.
struct Done {
    status: Status,
    output: Option<Value>,
    error: Option<Failure>,
    actual: i64,
    duration_ms: i64,
    execution_id: Option<String>,
    attempts: i64,
    callback_until_ms: Option<i64>,
}

impl Done {
    fn outcome(&self) -> Outcome {
        Outcome {
            status: self.status,
            output: self.output.clone(),
            error: self.error.clone(),
            cost_micros: self.actual,
            duration_ms: self.duration_ms,
            execution_id: self.execution_id.clone(),
            attempts: self.attempts,
            callback_until_ms: self.callback_until_ms,
        }
    }

    fn result(self, invocation_id: String, tool: &Tool) -> ToolResult {
        ToolResult {
            invocation_id,
            tool: tool.name.clone(),
            version: tool.version.to_string(),
            status: self.status,
            output: self.output,
            error: self.error,
            cost_micros: self.actual,
            duration_ms: self.duration_ms,
            deduplicated: false,
            execution_id: self.execution_id,
            attempts: self.attempts,
            approval_id: None,
        }
    }
}

/// The audit category and call/result actions of a tool's kind.
fn actions(tool: &Tool) -> (Category, &'static str, &'static str) {
    match tool.kind {
        Kind::Http(_) => (Category::Workflow, "workflow.invoke", "workflow.result"),
        _ => (Category::Tool, "tool.call", "tool.result"),
    }
}

/// `principal` acting for `team`, as the policy gate sees it.
fn caller<'a>(principal: &Principal, capabilities: &'a [String], team: &'a str) -> Caller<'a> {
    Caller {
        role: principal.role,
        capabilities,
        team,
        may_act_for_team: principal.may_act_for(team),
    }
}

impl super::Pipeline {
    fn capabilities(&self, principal: &Principal) -> Vec<String> {
        self.config().auth.capabilities(principal.role.as_str())
    }

    /// The tools `principal` may use for `team` (ListTools, MCP `tools/list`),
    /// by name then newest version.
    pub fn tools_for(&self, principal: &Principal, team: &str) -> Vec<Arc<Tool>> {
        let capabilities = self.capabilities(principal);
        let caller = caller(principal, &capabilities, team);
        self.toolbox()
            .registry
            .all()
            .into_iter()
            .filter(|t| policy::visible(&caller, t))
            .collect()
    }
}

impl Call {
    /// Runs `req` through every step of the entry point. A denial is an error
    /// (audited); an execution failure is a FAILED or TIMED_OUT result.
    pub async fn invoke_tool(
        &self,
        principal: &Principal,
        req: ToolRequest,
    ) -> Result<ToolResult, CallError> {
        // The span's kind is fixed at open: CLIENT if the tool calls out, else INTERNAL.
        let calls_out = self
            .pipeline
            .toolbox()
            .registry
            .lookup(&req.tool)
            .is_ok_and(|t| !matches!(t.kind, Kind::Builtin));
        let span = tracing::info_span!(
            "tool_invocation",
            otel.name = %format_args!("execute_tool {}", req.tool),
            otel.kind = if calls_out { "client" } else { "internal" },
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = tracing::field::Empty,
            trace_id = %self.ctx.trace_id,
            tool = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        self.invoke_tool_in(principal, req, &span)
            .instrument(span.clone())
            .await
    }

    async fn invoke_tool_in(
        &self,
        principal: &Principal,
        req: ToolRequest,
        span: &tracing::Span,
    ) -> Result<ToolResult, CallError> {
        let admitted = self.admit(principal, &req, span).await?;
        let called = self.call_event(principal, &req, &admitted);
        if admitted.gate == approval::Gate::Held {
            return self.hold(principal, &req, admitted, called, span).await;
        }
        // A workflow claims its key first: the unique key, not a check, decides who runs.
        let needs_row = matches!(admitted.tool.kind, Kind::Http(_)) || req.mode == Mode::Async;
        let row = if needs_row {
            match self.claim(principal, &req, &admitted).await? {
                Claim::Ours(row) => Some(*row),
                Claim::Theirs(first, key) => {
                    return self
                        .deduplicated(called, &admitted, &first, key, span)
                        .await;
                }
            }
        } else {
            None
        };
        let called = AuditEvent {
            idempotency_key: row.as_ref().map(|r| r.inv.idempotency_key.clone()),
            ..called
        };
        match (req.mode, row) {
            (Mode::Async, Some(row)) => self.accept_async(called, &admitted, row.inv, span).await,
            (Mode::Async, None) => Err(CallError::Storage(
                "an ASYNC invocation was not stored".into(),
            )),
            (Mode::Sync, row) => {
                self.audit_later(vec![called]).await?;
                self.execute(principal, &req, admitted, row, span).await
            }
        }
    }

    /// The first holder of the idempotency key answers: nothing runs,
    /// nothing more is charged.
    async fn deduplicated(
        &self,
        called: AuditEvent,
        a: &Admitted,
        first: &Invocation,
        key: String,
        span: &tracing::Span,
    ) -> Result<ToolResult, CallError> {
        let mut dedup = called;
        dedup.decision = "deduplicated".into();
        dedup.idempotency_key = Some(key);
        self.audit(vec![dedup]).await?;
        let kind = a.tool.kind.as_str();
        self.log().add_tool(kind, a.id.clone(), 0, Duration::ZERO);
        span.record("status", first.status.as_str());
        let mut result = ToolResult::from_stored(first, true);
        if first.status == Status::AwaitingApproval || first.status == Status::Rejected {
            result.approval_id = self.approval_of(first).await;
        }
        Ok(result)
    }

    fn call_event(&self, principal: &Principal, req: &ToolRequest, a: &Admitted) -> AuditEvent {
        let (category, call_action, _) = actions(&a.tool);
        let ctx = &self.ctx;
        let event = AuditEvent::new(
            &ctx.team_id,
            &principal.name,
            &ctx.trace_id,
            category,
            call_action,
            &a.id,
        )
        .decided("allow", a.gate.reason())
        .with_input(&req.input);
        AuditEvent {
            estimated_cost_micros: Some(a.estimate),
            ..event
        }
    }

    /// Claims the idempotency key with its row: ours, or the first holder's.
    async fn claim(
        &self,
        principal: &Principal,
        req: &ToolRequest,
        a: &Admitted,
    ) -> Result<Claim, CallError> {
        let tool = &a.tool;
        let (key, window_start) = self.idempotency(tool, req, &principal.name, a.now_ms);
        let inv = Invocation::new(
            &self.ctx.team_id,
            &tool.name,
            &tool.version.to_string(),
            req.mode,
            &key,
            window_start,
            &self.ctx.trace_id,
            &principal.name,
            req.input.clone(),
            a.estimate,
            tool.timeout,
        );
        let slack = self.pipeline.config().tool_worker.lease_slack;
        let lease = (req.mode == Mode::Sync).then(|| {
            let ms = i64::try_from((tool.timeout + slack).as_millis()).unwrap_or(i64::MAX);
            a.now_ms + ms
        });
        let claimed = invocations::claim(self.pipeline.store(), &inv, lease)
            .await
            .map_err(|e| CallError::Storage(e.to_string()))?;
        Ok(match claimed {
            Claimed::Existing(first) => Claim::Theirs(first, key),
            Claimed::New => Claim::Ours(Box::new(Row { inv, lease })),
        })
    }

    /// An ASYNC invocation accepted: durable before the reply, charged its
    /// estimate; `call::worker` runs it under a concurrency slot it takes then.
    async fn accept_async(
        &self,
        called: AuditEvent,
        a: &Admitted,
        inv: Invocation,
        span: &tracing::Span,
    ) -> Result<ToolResult, CallError> {
        self.audit(vec![called]).await?;
        let kind = a.tool.kind.as_str();
        self.log()
            .add_tool(kind, a.id.clone(), a.estimate, Duration::ZERO);
        span.record("status", Status::Pending.as_str());
        metrics::tool_invocation(&a.tool.name, Status::Pending.as_str(), Duration::ZERO);
        Ok(ToolResult::from_stored(&inv, false))
    }

    /// Runs a SYNC invocation, judges its output, stores and audits its result.
    async fn execute(
        &self,
        principal: &Principal,
        req: &ToolRequest,
        a: Admitted,
        row: Option<Row>,
        span: &tracing::Span,
    ) -> Result<ToolResult, CallError> {
        let Admitted {
            tool,
            id,
            estimate,
            slot,
            ..
        } = a;
        let started = Instant::now();
        let timeout = req
            .agent
            .as_ref()
            .map_or(tool.timeout, |a| a.timeout.min(tool.timeout));
        let deadline = (started + timeout).min(self.ctx.deadline);
        let stored = row.as_ref().map(|r| &r.inv);
        let ran = run(
            &self.pipeline,
            &self.ctx,
            &tool,
            &req.input,
            stored,
            deadline,
        )
        .await;
        drop(slot);
        let took = started.elapsed();
        let (status, output, error) = judge(&tool, ran.result);
        // Work a workflow goes on with after accepting it is charged at its
        // estimate, as an ASYNC invocation is (docs/tools.md).
        let actual = match ran.cost_micros {
            Some(cost) => cost,
            None if status == Status::AwaitingCallback => estimate,
            None => cost::micros(&tool.cost, &req.input, took),
        };
        let done = Done {
            status,
            output,
            error,
            actual,
            duration_ms: i64::try_from(took.as_millis()).unwrap_or(i64::MAX),
            execution_id: ran.execution_id,
            attempts: i64::from(ran.attempts),
            callback_until_ms: callback_until(&tool, status),
        };
        let kind = tool.kind.as_str();
        // A task tool's model call was metered as a call of its own.
        let charged = if ran.cost_micros.is_some() {
            0
        } else {
            done.actual
        };
        self.log().add_tool(kind, id.clone(), charged, took);
        let mut called_back = None;
        if let Some(row) = &row {
            // A SYNC row has one runner, this one; the other writers are
            // the sweeper's INTERRUPTED, which `finish` replaces, and a
            // workflow calling back before this records its acceptance.
            let lease = row.lease.unwrap_or(i64::MAX);
            let store = self.pipeline.store();
            let recorded = invocations::finish(store, &row.inv.id, lease, &done.outcome())
                .await
                .map_err(|e| CallError::Storage(e.to_string()))?;
            if !recorded && done.status == Status::AwaitingCallback {
                called_back = invocations::get(store, &row.inv.team_id, &row.inv.id)
                    .await
                    .map_err(|e| CallError::Storage(e.to_string()))?;
            }
        }
        let key = row.as_ref().map(|r| r.inv.idempotency_key.clone());
        let event = self.result_event(principal, req, (&tool, &id), estimate, &done, key);
        self.audit_before_finish(vec![event]).await?;
        span.record("status", done.status.as_str());
        if !matches!(done.status, Status::Succeeded | Status::AwaitingCallback) {
            span.record("otel.status_code", "error");
        }
        metrics::tool_invocation(&tool.name, done.status.as_str(), took);
        if let Some(ended) = called_back {
            return Ok(ToolResult::from_stored(&ended, false));
        }
        let invocation_id = row.map_or_else(|| uuid::Uuid::now_v7().to_string(), |r| r.inv.id);
        Ok(done.result(invocation_id, &tool))
    }

    fn result_event(
        &self,
        principal: &Principal,
        req: &ToolRequest,
        (tool, id): (&Tool, &str),
        estimate: i64,
        done: &Done,
        idempotency_key: Option<String>,
    ) -> AuditEvent {
        let (category, _, result_action) = actions(tool);
        let decision = decision(done.status);
        let code = done.error.as_ref().map_or("", |e| e.code.as_str());
        let ctx = &self.ctx;
        let mut event = AuditEvent::new(
            &ctx.team_id,
            &principal.name,
            &ctx.trace_id,
            category,
            result_action,
            id,
        )
        .decided(decision, code)
        .with_input(&req.input);
        if let Some(out) = &done.output {
            event = event.with_output(out);
        }
        event.duration_ms = Some(done.duration_ms);
        event.estimated_cost_micros = Some(estimate);
        event.actual_cost_micros = Some(done.actual);
        event.idempotency_key = idempotency_key;
        event
    }

    /// The idempotency key (the caller's, else derived) and its window's start.
    fn idempotency(
        &self,
        tool: &Tool,
        req: &ToolRequest,
        principal: &str,
        now_ms: i64,
    ) -> (String, i64) {
        let window = match &tool.kind {
            Kind::Http(h) => h.idempotency_window,
            // Not a workflow: the row only queues the ASYNC work.
            _ => Duration::from_secs(300),
        };
        let window_start = idempotency::window_start(now_ms, window);
        let key = match (&req.idempotency_key, &tool.kind) {
            (Some(k), _) if !k.is_empty() => k.clone(),
            (_, Kind::Http(_)) => idempotency::key(&Keyed {
                tool: &tool.name,
                version: &tool.version.to_string(),
                team: &self.ctx.team_id,
                input: &req.input,
                triggered_by: principal,
                at_ms: now_ms,
                window,
            }),
            // Each ASYNC invocation of another kind is its own.
            _ => uuid::Uuid::now_v7().simple().to_string(),
        };
        (key, window_start)
    }
}

impl super::Pipeline {
    /// Runs `statement` (its guard) with `event` in one ledger transaction of
    /// `team`'s, the event appended only if the statement changed a row:
    /// true then. `Err` says why the ledger could not.
    pub(crate) async fn guarded_write(
        &self,
        team: &str,
        statement: crate::store::Statement,
        event: AuditEvent,
    ) -> Result<bool, String> {
        use crate::usage::ledger::{Done, Op, Write};
        let op = Op::Write(Write {
            team_id: team.to_owned(),
            statements: vec![statement],
            durable: true,
            audit: vec![event],
            audit_only_if_stored: true,
            outbox: Vec::new(),
        });
        match self.ledger().submit(op).await {
            Ok(Done::Written { stored, .. }) => Ok(stored),
            Ok(other) => Err(format!(
                "the ledger answered a guarded write with {other:?}"
            )),
            Err(e) => Err(e.to_string()),
        }
    }
}
