//! Per-team tool quotas (`max_per_hour`, `max_concurrent`, SPEC §9.1):
//! counted by this replica without `[cluster]` ([`local`]), else in the
//! cluster store, and while it is down as `on_unavailable` says (this
//! replica's share, or refused). A SYNC invocation takes both at the entry
//! point (`acquire`); an ASYNC one counts the hour when accepted (`admit`)
//! and waits, never refused, for its slot when the worker runs it.

mod local;

pub use local::{LocalQuotas, LocalSlot};

use super::Denial;
use crate::{
    cluster::{
        Cluster,
        quotas::{ToolAdmission, ToolAsk},
    },
    config::{cluster::OnUnavailable, tools::QuotaConfig},
};
use std::time::Duration;

/// Unix ms in a clock hour.
const HOUR_MS: i64 = 3_600_000;

/// The quotas of every (team, tool). Cheap to clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    /// Without a cluster, the counts; with one, the fallback share.
    local: LocalQuotas,
    cluster: Option<Cluster>,
}

/// A running invocation's place under `max_concurrent`; given back on drop.
#[derive(Debug)]
pub enum Slot {
    Local(LocalSlot),
    /// Leased in the cluster store (`None`: no `max_concurrent`).
    Shared(Option<SharedSlot>),
}

/// A running slot leased in the cluster store.
#[derive(Debug)]
pub struct SharedSlot {
    cluster: Cluster,
    team: String,
    tool: String,
    id: String,
}

impl Drop for SharedSlot {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (cluster, team, tool, id) = (
            self.cluster.clone(),
            std::mem::take(&mut self.team),
            std::mem::take(&mut self.tool),
            std::mem::take(&mut self.id),
        );
        // While the store is down this is dropped: the lease expires.
        runtime.spawn(async move {
            let _ = cluster.release_tool(&team, &tool, &id).await;
        });
    }
}

impl Quotas {
    /// Quotas shared by the fleet through `cluster`.
    pub fn shared(cluster: Cluster) -> Self {
        Self {
            local: LocalQuotas::default(),
            cluster: Some(cluster),
        }
    }

    /// A SYNC invocation's place: counted against the hour and holding a
    /// running slot (for at most `timeout`), or the limit that is full.
    pub async fn acquire(
        &self,
        team: &str,
        tool: &str,
        quota: &QuotaConfig,
        timeout: Duration,
        now_ms: i64,
    ) -> Result<Slot, Denial> {
        let ask = ToolAsk {
            team,
            tool,
            hour: hour(quota, now_ms),
            running: quota.max_concurrent.map(|max| (max, timeout)),
        };
        if let Some(answer) = self.ask_store(ask).await {
            return self.slot(answer, team, tool, quota);
        }
        let quota = self.local_quota(quota)?;
        self.local
            .acquire(team, tool, &quota, now_ms)
            .map(Slot::Local)
    }

    /// Counts an ASYNC invocation accepted at `now_ms` against `max_per_hour`;
    /// its concurrency is the worker's (`try_running`).
    pub async fn admit(
        &self,
        team: &str,
        tool: &str,
        quota: &QuotaConfig,
        now_ms: i64,
    ) -> Result<(), Denial> {
        let ask = ToolAsk {
            team,
            tool,
            hour: hour(quota, now_ms),
            running: None,
        };
        if let Some(answer) = self.ask_store(ask).await {
            return self.slot(answer, team, tool, quota).map(drop);
        }
        let quota = self.local_quota(quota)?;
        self.local.admit(team, tool, &quota, now_ms)
    }

    /// A running slot (for at most `timeout`), or `None` while the tool is at
    /// `max_concurrent`, or the store is down under `refuse` (it waits).
    pub async fn try_running(
        &self,
        team: &str,
        tool: &str,
        quota: &QuotaConfig,
        timeout: Duration,
    ) -> Option<Slot> {
        let ask = ToolAsk {
            team,
            tool,
            hour: None,
            running: quota.max_concurrent.map(|max| (max, timeout)),
        };
        if let Some(answer) = self.ask_store(ask).await {
            return self.slot(answer, team, tool, quota).ok();
        }
        let quota = self.local_quota(quota).ok()?;
        self.local.try_running(team, tool, &quota).map(Slot::Local)
    }

    /// Every `(team, tool)` running on this replica's own counts, and how many.
    pub fn running(&self) -> Vec<(String, String, u32)> {
        self.local.running()
    }

    /// The store's answer, or `None` to count here (no cluster, or it is down).
    async fn ask_store(&self, ask: ToolAsk<'_>) -> Option<ToolAdmission> {
        let cluster = self.cluster.as_ref()?;
        if ask.hour.is_none() && ask.running.is_none() {
            return Some(ToolAdmission::Admitted(None));
        }
        cluster.admit_tool(ask).await.ok()
    }

    fn slot(
        &self,
        answer: ToolAdmission,
        team: &str,
        tool: &str,
        quota: &QuotaConfig,
    ) -> Result<Slot, Denial> {
        let full = |limit, max: Option<u32>| Denial::Quota {
            limit,
            max: max.unwrap_or(0),
        };
        match (answer, &self.cluster) {
            (ToolAdmission::Admitted(Some(id)), Some(cluster)) => {
                Ok(Slot::Shared(Some(SharedSlot {
                    cluster: cluster.clone(),
                    team: team.to_owned(),
                    tool: tool.to_owned(),
                    id,
                })))
            }
            (ToolAdmission::Admitted(_), _) => Ok(Slot::Shared(None)),
            (ToolAdmission::HourFull, _) => Err(full("max_per_hour", quota.max_per_hour)),
            (ToolAdmission::RunningFull, _) => Err(full("max_concurrent", quota.max_concurrent)),
        }
    }

    /// The quota this replica enforces alone: the configured one without a
    /// cluster, its share while the store is down; refused under `refuse`.
    fn local_quota(&self, quota: &QuotaConfig) -> Result<QuotaConfig, Denial> {
        let Some(cluster) = &self.cluster else {
            return Ok(*quota);
        };
        if cluster.on_unavailable() == OnUnavailable::Refuse {
            return Err(Denial::StoreUnavailable);
        }
        let share = cluster.fallback_share();
        let part = |max: u32| ((f64::from(max) * share).ceil() as u32).max(1);
        Ok(QuotaConfig {
            max_per_hour: quota.max_per_hour.map(part),
            max_concurrent: quota.max_concurrent.map(part),
        })
    }
}

/// The clock hour to count in, under a `max_per_hour`.
fn hour(quota: &QuotaConfig, now_ms: i64) -> Option<(i64, u32)> {
    quota
        .max_per_hour
        .map(|max| (now_ms.div_euclid(HOUR_MS), max))
}
