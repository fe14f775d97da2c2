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
    pub trace_id: String,
    pub channel: Channel,
    pub priority: Priority,
    pub started: Instant,
    /// Wall-clock start (unix ms): the month its usage counts in.
    pub started_at_ms: i64,
    pub deadline: Instant,
    /// `budget.max_cost_usd` as sent; the meter reads one not positive as none.
    pub budget_usd: Option<f64>,
    /// The caller's valid W3C `traceparent` (sent upstream when export is off).
    pub traceparent: Option<String>,
    /// The API key's name (never the key), `anonymous` while auth is off.
    pub principal: String,
}
