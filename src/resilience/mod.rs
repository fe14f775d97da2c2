//! Resilience primitives for provider calls (SPEC §4): circuit breaker,
//! retry/backoff policy, per-provider rate and concurrency limits, and rolling
//! health statistics.
//!
//! Everything here is synchronous bookkeeping or a bounded wait; nothing in
//! this module makes a network call, logs message contents, or decides *which*
//! target to call — the router owns the chain walk and asks these types for
//! permission and advice.
//!
//! # Layering (the order the router applies them, per target)
//!
//! ```text
//! for target in chain:
//!   loop (attempt = 1, 2, ...):
//!     1. breaker.try_acquire()          OPEN / HALF_OPEN full / 429 cooldown
//!                                       -> skip target, no network call
//!     2. limits.try_acquire()           INTERACTIVE: saturated -> skip target
//!        limits.acquire_until(deadline) BACKGROUND: wait, never past deadline
//!     3. call the provider (attempt deadline = min(request deadline, timeout))
//!     4. health.record(latency, ok)     every real call, never skipped ones;
//!                                       an attempt the caller cut short
//!                                       (deadline, gone) is counted apart
//!        permit.record(Outcome::Success) / permit.record_error(&err)
//!                                       (a 429 also starts the cooldown)
//!     5. on error: policy.decide(..)    RetryAfter(d): drop both permits,
//!                                       sleep d, next attempt at this target
//!                                       NextTarget / GiveUp
//! ```
//!
//! Why this order:
//! - The breaker comes first so an open provider costs nothing: no rate-limit
//!   token is spent and no concurrency slot is held for a call that will not
//!   happen. If step 2 then fails, dropping the breaker permit unrecorded
//!   frees its half-open probe slot and changes nothing else.
//! - Limits are per replica and local; they shape our own traffic, whereas the
//!   breaker reacts to the provider's behaviour.
//! - Both permits must be dropped before a backoff sleep: a sleeping request
//!   must not hold a concurrency slot or a half-open probe slot.
//! - A stream records its breaker outcome when it ends (completed or failed),
//!   not when the first byte arrives.
//!
//! All timing uses [`tokio::time::Instant`], so tests drive it with tokio's
//! paused clock instead of sleeping.

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
    /// Fresh guards (breaker closed, no history) for one configured
    /// provider, its limits shared through `cluster` when there is one.
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

/// The guards of every configured provider plus the retry policy: what the
/// router holds. Clones share the same state.
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
}
