//! `[cluster]`: the shared store (Redis ≥ 6.2 or Valkey) that makes
//! providers' `rpm`, `tpm` and `max_concurrency`, tools' quotas and MCP
//! endpoint sessions hold for the whole fleet (SPEC §12). Absent: every
//! limit is this replica's, as on one replica.

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
    /// `redis://host:6379/0` (`rediss://` for TLS). It may carry a password,
    /// so it is kept as a secret: set it with `AIO_CLUSTER__REDIS_URL` from
    /// a Kubernetes Secret rather than in the file.
    pub redis_url: Secret,
    /// Prefix of every key, so one Redis can serve several deployments.
    #[serde(default = "defaults::key_prefix")]
    pub key_prefix: String,
    /// What calls that need a shared limit do while the store is down.
    #[serde(default)]
    pub on_unavailable: OnUnavailable,
    /// The share of each limit one replica enforces on its own while the
    /// store is down (`local`); in (0, 1].
    #[serde(default = "defaults::fallback_share")]
    pub fallback_share: f64,
    /// Bound on opening a connection to the store.
    #[serde(default = "defaults::connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Bound on one command's answer; past it the store counts as down.
    #[serde(default = "defaults::command_timeout", with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How often a store found down is tried again (a PING).
    #[serde(default = "defaults::recheck_interval", with = "humantime_serde")]
    pub recheck_interval: Duration,
    /// Added to a provider's `timeout` (a tool's) to make the lease of a
    /// concurrency slot: a replica killed with its slots taken gives them
    /// back within that.
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
    /// On a LAN a connect takes well under a millisecond; a store that
    /// takes longer than this is as good as down for a call waiting on it.
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
