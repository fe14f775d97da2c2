//! `[cluster]`: the shared store (Redis ≥ 6.2 or Valkey) that makes limits, tool quotas and
//! MCP sessions hold fleet-wide (SPEC §12); absent, every limit is this replica's.

use super::Secret;
use serde::Deserialize;
use std::time::Duration;

/// What calls that need a shared limit do while the store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUnavailable {
    /// Each replica enforces `limit × fallback_share` on its own.
    #[default]
    Local,
    /// Refused: `UNAVAILABLE`, `CLUSTER_STORE_UNAVAILABLE`, with `RetryInfo`.
    Refuse,
}

impl OnUnavailable {
    /// The name as in the config.
    pub const fn as_str(self) -> &'static str {
        match self {
            OnUnavailable::Local => "local",
            OnUnavailable::Refuse => "refuse",
        }
    }
}

/// `[cluster]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// `redis://host:6379/0` (`rediss://` for TLS). It may carry a password, so it is a secret:
    /// set it with `AIO_CLUSTER__REDIS_URL` from a Kubernetes Secret.
    pub redis_url: Secret,
    /// Prefix of every key, so one Redis can serve several deployments.
    #[serde(default = "defaults::key_prefix")]
    pub key_prefix: String,
    #[serde(default)]
    pub on_unavailable: OnUnavailable,
    /// Share of each limit one replica enforces alone while the store is down (`local`); (0, 1].
    #[serde(default = "defaults::fallback_share")]
    pub fallback_share: f64,
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Bound on one command's answer; past it the store counts as down.
    #[serde(default = "defaults::command_timeout", with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How often a store found down is tried again (a PING).
    #[serde(default = "defaults::recheck_interval", with = "humantime_serde")]
    pub recheck_interval: Duration,
    /// Added to a provider's (a tool's) `timeout` for a concurrency slot's lease: a killed
    /// replica's slots come back within that.
    #[serde(default = "defaults::lease_slack", with = "humantime_serde")]
    pub lease_slack: Duration,
}

mod defaults {
    use std::time::Duration;
    pub fn key_prefix() -> String {
        "aio:".into()
    }
    /// SPEC §12: a quarter each keeps four replicas near the account's
    /// limit while the store is away.
    pub fn fallback_share() -> f64 {
        0.25
    }
    /// A LAN connect takes well under a millisecond; longer is as good as down.
    pub fn connect_timeout() -> Duration {
        Duration::from_millis(250)
    }
    /// One script is a round trip plus microseconds of work.
    pub fn command_timeout() -> Duration {
        Duration::from_millis(100)
    }
    pub fn recheck_interval() -> Duration {
        Duration::from_millis(500)
    }
    pub fn lease_slack() -> Duration {
        Duration::from_secs(5)
    }
}
