//! Who is asking and until when: a call's envelope, validated at the edge.

use crate::domain::{Channel, Priority};
use tokio::time::Instant;

/// Who is asking, parsed and validated at the API edge.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// Tenant, never empty.
    pub team_id: String,
    /// End user, may be empty.
    pub user_id: String,
    /// Trace ID of the request.
    pub trace_id: String,
    /// Channel.
    pub channel: Channel,
    /// Priority.
    pub priority: Priority,
    /// When the request started.
    pub started: Instant,
    /// When it started in wall-clock time (unix ms): its usage counts in
    /// that month, and its record carries it.
    pub started_at_ms: i64,
    /// When everything must be over.
    pub deadline: Instant,
    /// `budget.max_cost_usd`, as the caller sent it (the meter reads a
    /// value that is not positive as no budget).
    pub budget_usd: Option<f64>,
    /// The caller's valid W3C `traceparent`, continued by our spans and
    /// forwarded upstream when trace export is off.
    pub traceparent: Option<String>,
    /// Who is asking: the API key's name (audit events name it; never the
    /// key), `anonymous` while authentication is off.
    pub principal: String,
}
