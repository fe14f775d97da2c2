//! Resilience primitives for provider calls (SPEC §4): circuit breaker, retry policy, limits and
//! rolling health. Bookkeeping or bounded waits only: no network call, no message content, no
//! choice of target (the router owns the chain walk; order and rules in docs/routing.md).
//!
//! The breaker is asked first, so an open provider costs no rate token and holds no slot; a
//! stream records its outcome when it ends, not at its first byte; both permits are dropped
//! before a backoff sleep, so a sleeper holds no slot and no half-open probe.
//! Time is [`tokio::time::Instant`], so tests drive it with the paused clock.

pub mod breaker;
pub mod health;
pub mod limits;
pub mod probe;
pub mod retry;

pub use breaker::{BreakerSnapshot, BreakerState, CircuitBreaker, Outcome, Permit, Rejected};
pub use health::{CutShort, HealthSnapshot, ProviderHealth};
pub use limits::{LimitPermit, LimitRejected, ProviderLimits};
pub use probe::{ProbeResult, ProbeState};
pub use retry::{Decision, FixedJitter, JitterSource, RetryPolicy};

use crate::{
    cluster::Cluster,
    config::{Config, ProviderConfig},
};
use std::collections::BTreeMap;

/// The resilience state of one provider. Clones share the same state.
#[derive(Debug, Clone)]
pub struct ProviderGuards {
    /// The provider's circuit breaker.
    pub breaker: CircuitBreaker,
    /// The provider's rate and concurrency limits.
    pub limits: ProviderLimits,
    /// Rolling statistics of the provider's recent calls.
    pub health: ProviderHealth,
    /// The latest active probe, when `probe` is configured.
    pub probe: ProbeState,
}

impl ProviderGuards {
    /// Fresh guards for one provider, its limits shared through `cluster` if there is one.
    pub fn from_config(name: &str, config: &ProviderConfig, cluster: Option<&Cluster>) -> Self {
        Self {
            breaker: CircuitBreaker::new(name, &config.breaker),
            limits: match cluster {
                Some(cluster) => ProviderLimits::shared(name, config, cluster),
                None => ProviderLimits::local(config),
            },
            health: ProviderHealth::default(),
            probe: ProbeState::default(),
        }
    }
}

/// Every provider's guards and the retry policy: what the router holds. Clones share state.
#[derive(Debug, Clone)]
pub struct Resilience {
    providers: BTreeMap<String, ProviderGuards>,
    /// How failed attempts are retried.
    pub retry: RetryPolicy,
}

impl Resilience {
    /// Guards for every provider in `config`, and its retry policy.
    pub fn from_config(config: &Config, cluster: Option<&Cluster>) -> Self {
        let providers = config
            .providers
            .iter()
            .map(|(name, p)| (name.clone(), ProviderGuards::from_config(name, p, cluster)))
            .collect();
        let r = &config.retry;
        Self {
            providers,
            retry: RetryPolicy {
                max_attempts: r.max_attempts,
                base_backoff: r.base_backoff,
                max_backoff: r.max_backoff,
                interactive_max_wait: r.interactive_max_wait,
            },
        }
    }

    /// The guards of one provider, `None` when it is not configured.
    pub fn get(&self, provider: &str) -> Option<&ProviderGuards> {
        self.providers.get(provider)
    }

    /// Every provider's guards by name, for the ops RPC and metrics.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ProviderGuards)> {
        self.providers.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Every breaker's openings from now on, up to `capacity` untaken
    /// (more are dropped, never waited for); `None` when they are told
    /// elsewhere already.
    pub fn watch_openings(
        &self,
        capacity: usize,
    ) -> Option<tokio::sync::mpsc::Receiver<breaker::Opened>> {
        if self.providers.values().any(|g| g.breaker.tells_openings()) {
            return None;
        }
        let (tx, rx) = tokio::sync::mpsc::channel(capacity.max(1));
        let mut all = true;
        for guards in self.providers.values() {
            all &= guards.breaker.tell_openings(tx.clone());
        }
        all.then_some(rx)
    }
}
