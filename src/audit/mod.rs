//! The audit log (SPEC §10): one event per decision and change (who, what, decision, reason,
//! payload digests, times, costs; never content), in a per-team hash chain ([`chain`]), appended
//! in the ledger's group commit, durable before the reply that depends on it, or by the CLI.

mod canonical;
pub mod chain;
pub mod digest;
pub mod outbox;
pub mod store;

use serde::Serialize;

/// What an audit event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Category {
    /// A tool invocation (any kind).
    Tool,
    /// A workflow (HTTP webhook) tool's run.
    Workflow,
    /// An agent turn.
    Agent,
    /// The prompt store.
    Prompt,
    /// Limits and keys.
    Admin,
    /// A model call through any edge (SPEC §14.3, `[audit] calls`).
    Call,
    /// A tool call held for a person's decision (SPEC §14.1).
    Approval,
    /// A guardrail's detection (SPEC §15).
    Guardrail,
    /// A spending cap's warning or crossing (`usage.cap.warning`, `usage.cap.reached`).
    Usage,
    /// A provider's health (`breaker.opened`).
    Provider,
}

impl Category {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Tool => "tool",
            Category::Workflow => "workflow",
            Category::Agent => "agent",
            Category::Prompt => "prompt",
            Category::Admin => "admin",
            Category::Call => "call",
            Category::Approval => "approval",
            Category::Guardrail => "guardrail",
            Category::Usage => "usage",
            Category::Provider => "provider",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "tool" => Category::Tool,
            "workflow" => Category::Workflow,
            "agent" => Category::Agent,
            "prompt" => Category::Prompt,
            "admin" => Category::Admin,
            "call" => Category::Call,
            "approval" => Category::Approval,
            "guardrail" => Category::Guardrail,
            "usage" => Category::Usage,
            "provider" => Category::Provider,
            _ => return None,
        })
    }
}

/// One audit event, before its chain; field names are the columns and the hashed JSON.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEvent {
    /// UUIDv7.
    pub id: String,
    /// When, unix ms.
    pub at_ms: i64,
    /// The request's trace ID.
    pub trace_id: String,
    /// The team whose chain it joins.
    pub team_id: String,
    /// The API key's name (never the key), `anonymous` with auth off, or `cli:<user>`.
    pub principal: String,
    /// What it is about.
    pub category: Category,
    /// `tool.call`, `workflow.result`, `agent.turn.start`, `call.completed`, `key.revoked`, …
    pub action: String,
    /// What was acted on: `tool@version`, `prompt key/version`, a team, a key's name.
    pub subject: String,
    /// `allow`, `deny`, `ok` or `error`.
    pub decision: String,
    /// The stable reason of a denial or failure (`TIMED_OUT`, …), empty otherwise; the end
    /// of a turn or a call puts it first and its counts after it as `key=value` words.
    pub reason: String,
    /// Digest of the redacted input ([`digest::digest`]).
    pub input_sha256: Option<String>,
    /// Digest of the redacted output.
    pub output_sha256: Option<String>,
    /// Canonical size of the redacted input, bytes.
    pub input_bytes: Option<i64>,
    /// Canonical size of the redacted output, bytes.
    pub output_bytes: Option<i64>,
    /// How long the audited work took, ms.
    pub duration_ms: Option<i64>,
    /// Estimated cost, micro-USD.
    pub estimated_cost_micros: Option<i64>,
    /// Actual cost, micro-USD.
    pub actual_cost_micros: Option<i64>,
    /// The idempotency key of a workflow invocation.
    pub idempotency_key: Option<String>,
}

impl AuditEvent {
    /// An event of `category`/`action` on `subject`, now, with a new ID.
    pub fn new(
        team_id: &str,
        principal: &str,
        trace_id: &str,
        category: Category,
        action: &str,
        subject: &str,
    ) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            at_ms: chrono::Utc::now().timestamp_millis(),
            trace_id: trace_id.to_owned(),
            team_id: team_id.to_owned(),
            principal: principal.to_owned(),
            category,
            action: action.to_owned(),
            subject: subject.to_owned(),
            decision: String::new(),
            reason: String::new(),
            input_sha256: None,
            output_sha256: None,
            input_bytes: None,
            output_bytes: None,
            duration_ms: None,
            estimated_cost_micros: None,
            actual_cost_micros: None,
            idempotency_key: None,
        }
    }

    /// With its decision and reason.
    pub fn decided(mut self, decision: &str, reason: &str) -> Self {
        decision.clone_into(&mut self.decision);
        reason.clone_into(&mut self.reason);
        self
    }

    /// With the digest and size of its input.
    pub fn with_input(mut self, input: &serde_json::Value) -> Self {
        let (sha, bytes) = digest::digest(input);
        self.input_sha256 = Some(sha);
        self.input_bytes = Some(bytes);
        self
    }

    /// With the digest and size of its output.
    pub fn with_output(mut self, output: &serde_json::Value) -> Self {
        let (sha, bytes) = digest::digest(output);
        self.output_sha256 = Some(sha);
        self.output_bytes = Some(bytes);
        self
    }
}
