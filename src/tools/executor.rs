//! How each kind of tool runs: one [`Executor`] per [`Kind`](super::Kind),
//! used through [`super::Toolbox::run`] by the entry point and the ASYNC
//! worker. A new kind is a new executor here, its variant, config and proto.

use super::{Failure, Tool, builtin::Health};
use serde_json::Value;
use tokio::time::Instant;

/// One run of a tool as the entry point asks for it.
pub struct Run<'a> {
    pub tool: &'a Tool,
    /// Its input, checked against the tool's schema.
    pub input: &'a Value,
    /// A workflow's idempotency key, sent with every POST.
    pub idempotency_key: Option<&'a str>,
    /// The invocation's stored ID, when it has a row (a workflow's callback names it).
    pub invocation_id: Option<&'a str>,
    pub trace_id: &'a str,
    pub deadline: Instant,
    /// What `system.health` reports, read only when asked.
    pub health: &'a (dyn Fn() -> Health + Sync),
}

/// What a run came to.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    pub result: Result<Value, Failure>,
    /// Requests made (a workflow's POSTs; one otherwise).
    pub attempts: u32,
    pub execution_id: Option<String>,
    /// What the run cost when the run itself knows (a task tool's model
    /// call, micro-USD); `None` leaves it to the tool's cost model.
    pub cost_micros: Option<i64>,
}

impl Ran {
    /// A single-request run.
    pub fn once(result: Result<Value, Failure>) -> Self {
        Self {
            result,
            attempts: 1,
            execution_id: None,
            cost_micros: None,
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

/// A tool not of the executor's kind: a registry bug, a failure, not a panic.
pub(crate) fn wrong_kind(tool: &Tool, kind: &str) -> Ran {
    Ran::once(Err(Failure::new(
        "INTERNAL",
        format!("tool `{}` is not a {kind} tool", tool.name),
    )))
}
