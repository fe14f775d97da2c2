//! Tools' per-team quotas (SPEC §9.1), shared by every replica. The key holds the caller's clock
//! hour: replicas' clocks agree well enough that only calls at the hour's turn may slip.

use super::{Cluster, Unavailable, scripts};
use std::time::Duration;

/// The store's answer to an invocation asking for its place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolAdmission {
    /// Counted; holds the running slot, if one was asked for, until released.
    Admitted(Option<String>),
    /// The team's `max_per_hour` is reached.
    HourFull,
    /// The team's `max_concurrent` invocations are running.
    RunningFull,
}

/// What an invocation asks of the quotas.
#[derive(Debug, Clone, Copy)]
pub struct ToolAsk<'a> {
    /// The team.
    pub team: &'a str,
    /// The tool (`name@version`).
    pub tool: &'a str,
    /// Count it against this hour's `max_per_hour` (unix hours), if any.
    pub hour: Option<(i64, u32)>,
    /// Take a running slot under this `max_concurrent` for the tool's timeout, if any.
    pub running: Option<(u32, Duration)>,
}

impl Cluster {
    /// Counts and/or leases as `ask` says, all or nothing.
    pub async fn admit_tool(&self, ask: ToolAsk<'_>) -> Result<ToolAdmission, Unavailable> {
        let scope = format!("tool:{}:{}", ask.team, ask.tool);
        let id = ask.running.map(|_| self.lease_id());
        let (hour, per_hour) = ask.hour.unwrap_or((0, 0));
        let (max_running, hold) = ask.running.unwrap_or((0, Duration::ZERO));
        let lease = hold.saturating_add(self.lease_slack());
        let verdict: i64 = self
            .invoke(
                scripts::TOOL_ADMIT
                    .key(self.key(&scope, &format!("hour:{hour}")))
                    .key(self.key(&scope, "running"))
                    .arg(per_hour)
                    .arg(max_running)
                    .arg(u64::try_from(lease.as_micros()).unwrap_or(u64::MAX))
                    .arg(id.as_deref().unwrap_or("")),
            )
            .await?;
        match verdict {
            0 => Ok(ToolAdmission::Admitted(id)),
            1 => Ok(ToolAdmission::HourFull),
            2 => Ok(ToolAdmission::RunningFull),
            _ => {
                self.lost("unexpected script answer");
                Err(Unavailable)
            }
        }
    }

    /// Gives a running slot back.
    pub async fn release_tool(&self, team: &str, tool: &str, id: &str) -> Result<(), Unavailable> {
        let key = self.key(&format!("tool:{team}:{tool}"), "running");
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(key).arg(id);
        self.query::<i64>(&cmd).await.map(drop)
    }
}
