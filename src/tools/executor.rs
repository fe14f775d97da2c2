//! How each kind of tool runs: one [`Executor`] per kind, chosen by the
//! tool's [`Kind`](super::Kind). The entry point (`call::tool`) and the
//! ASYNC worker run every tool through [`super::Toolbox::run`]; a new kind
//! is a new executor here, its `Kind` variant, config and proto.

use super::{Failure, Tool, builtin::Health};
use serde_json::Value;
use tokio::time::Instant;

/// One run of a tool as the entry point asks for it.
pub struct Run<'a> {
    /// The tool.
    pub tool: &'a Tool,
    /// Its input, checked against the tool's schema.
    pub input: &'a Value,
    /// A workflow's idempotency key, sent with every POST.
    pub idempotency_key: Option<&'a str>,
    /// The call's trace ID.
    pub trace_id: &'a str,
    /// When the run is out of time.
    pub deadline: Instant,
    /// What `system.health` reports, read only when asked.
    pub health: &'a (dyn Fn() -> Health + Sync),
}

/// What a run came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    /// The output, or why there is none.
    pub result: Result<Value, Failure>,
    /// Requests made (a workflow's POSTs; one otherwise).
    pub attempts: u32,
    /// A workflow's execution ID.
    pub execution_id: Option<String>,
}

impl Ran {
    /// A single-request run.
    pub fn once(result: Result<Value, Failure>) -> Self {
        Self {
            result,
            attempts: 1,
            execution_id: None,
        }
    }
}

/// Runs the tools of one kind. Never retries beyond its kind's own rules,
/// never outlives `deadline`; the entry point judges the output.
#[async_trait::async_trait]
pub trait Executor: Send + Sync {
    /// Runs `run.tool` with `run.input`.
    async fn run(&self, run: Run<'_>) -> Ran;
}

/// A run refused because the tool is not of the executor's kind: a
/// registry bug, reported as the tool's failure rather than a panic.
pub(super) fn wrong_kind(tool: &Tool, kind: &str) -> Ran {
    Ran::once(Err(Failure::new(
        "INTERNAL",
        format!("tool `{}` is not a {kind} tool", tool.name),
    )))
}
