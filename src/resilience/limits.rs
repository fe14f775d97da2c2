//! A provider's `rpm`, `tpm` and `max_concurrency` (SPEC §4, §12): this replica's ([`local`]), or
//! with `[cluster]` the account's, shared through the store and settled off the call's path.
//! While the store is down, `on_unavailable` keeps `limit × fallback_share` here or refuses.
//! A call's estimate, input bytes / 4 plus `max_tokens`, is what it could bill at most; the
//! settlement corrects it.

mod local;
mod tokens;

pub use local::{LocalLimits, LocalPermit, TokioClock};
pub use tokens::TokenBucket;

use crate::cluster::{
    Cluster,
    limits::{Admission, Lease, ProviderQuota},
};
use crate::config::{ProviderConfig, cluster::OnUnavailable};
use std::time::Duration;
use tokio::time::Instant;

/// Why no permit was granted: the target is skipped, or a wait would pass the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitRejected {
    /// Every concurrency slot is in use (until the deadline, when waiting).
    #[error("provider concurrency limit reached")]
    Saturated,
    /// The RPM budget is spent; the next request conforms in `retry_in`.
    #[error("provider rate limit reached (retry in {retry_in:?})")]
    RateLimited {
        /// Time until a request would be admitted.
        retry_in: Duration,
    },
    /// The TPM budget is spent; this call's tokens fit in `retry_in`.
    #[error("provider token rate limit reached (retry in {retry_in:?})")]
    TokensLimited {
        /// Time until the call's tokens fit.
        retry_in: Duration,
    },
    /// The cluster store is down and `on_unavailable = "refuse"`.
    #[error("cluster store unavailable")]
    StoreUnavailable {
        /// When to try again.
        retry_in: Duration,
    },
}

impl LimitRejected {
    /// The attempt's error code.
    pub const fn code(&self) -> &'static str {
        match self {
            LimitRejected::StoreUnavailable { .. } => "CLUSTER_STORE_UNAVAILABLE",
            _ => "SATURATED",
        }
    }
}

/// One provider's limits. Cheap to clone; clones share state.
#[derive(Debug, Clone)]
pub struct ProviderLimits {
    /// Without a cluster, the limits; with one, the fallback share.
    local: LocalLimits,
    shared: Option<Shared>,
}

#[derive(Debug, Clone)]
struct Shared {
    cluster: Cluster,
    provider: std::sync::Arc<str>,
    quota: ProviderQuota,
    hold: Duration,
}

/// Permission to send one call; settle it with what the provider reported.
#[derive(Debug)]
#[must_use = "the call's slot is given back as soon as the permit is dropped"]
pub struct LimitPermit {
    held: Held,
}

#[derive(Debug)]
enum Held {
    Local(LocalPermit),
    Shared { shared: Shared, lease: Lease },
    Settled,
}

impl LimitPermit {
    /// Ends the call: its slot back, its estimate corrected to `actual` when reported.
    pub fn settle(mut self, actual: Option<u64>) {
        match std::mem::replace(&mut self.held, Held::Settled) {
            Held::Local(permit) => permit.settle(actual),
            Held::Shared { shared, lease } => shared.settle_later(lease, actual),
            Held::Settled => {}
        }
    }
}

impl Drop for LimitPermit {
    fn drop(&mut self) {
        if let Held::Shared { shared, lease } = std::mem::replace(&mut self.held, Held::Settled) {
            shared.settle_later(lease, None);
        }
    }
}

impl ProviderLimits {
    /// This replica's limits of one provider.
    pub fn local(config: &ProviderConfig) -> Self {
        Self {
            local: LocalLimits::new(config.rpm, config.tpm, config.concurrency()),
            shared: None,
        }
    }

    /// The account's limits of `name`, kept in `cluster`, with the fallback share here. Without
    /// `rpm`, `tpm` or `max_concurrency` there is nothing to share: it stays local.
    pub fn shared(name: &str, config: &ProviderConfig, cluster: &Cluster) -> Self {
        if config.rpm.is_none() && config.tpm.is_none() && config.max_concurrency.is_none() {
            return Self::local(config);
        }
        let share = cluster.fallback_share();
        let part = |n: f64| (n * share).ceil().max(1.0);
        let local = LocalLimits::new(
            config.rpm.map(|n| part(f64::from(n)) as u32),
            config.tpm.map(|n| part(n as f64) as u64),
            config
                .max_concurrency
                .map_or(config.concurrency(), |n| part(n as f64) as usize),
        );
        let quota = ProviderQuota {
            rpm: config.rpm,
            tpm: config.tpm,
            max_concurrency: config.max_concurrency,
        };
        Self {
            local,
            shared: Some(Shared {
                cluster: cluster.clone(),
                provider: name.into(),
                quota,
                hold: config.timeout,
            }),
        }
    }

    /// A permit for a call of `estimate` tokens: at once or refused
    /// (`wait_until` = `None`, INTERACTIVE), or waiting for room but never
    /// past `wait_until` (BACKGROUND).
    pub async fn acquire(
        &self,
        wait_until: Option<Instant>,
        estimate: u64,
    ) -> Result<LimitPermit, LimitRejected> {
        if let Some(shared) = &self.shared {
            match shared.admit(wait_until, estimate).await {
                Ok(held) => return Ok(LimitPermit { held }),
                Err(Fallback::Refused(rejected)) => return Err(rejected),
                Err(Fallback::StoreDown)
                    if shared.cluster.on_unavailable() == OnUnavailable::Refuse =>
                {
                    return Err(LimitRejected::StoreUnavailable {
                        retry_in: shared.cluster.retry_after(),
                    });
                }
                Err(Fallback::StoreDown) => {}
            }
        }
        let permit = match wait_until {
            None => self.local.try_acquire(estimate)?,
            Some(deadline) => self.local.acquire_until(deadline, estimate).await?,
        };
        Ok(LimitPermit {
            held: Held::Local(permit),
        })
    }

    /// Where the limits are counted now: `local`, `shared`, `fallback` or `refusing`.
    pub fn mode(&self) -> &'static str {
        match &self.shared {
            None => "local",
            Some(shared) if shared.cluster.is_up() => "shared",
            Some(shared) => match shared.cluster.on_unavailable() {
                OnUnavailable::Local => "fallback",
                OnUnavailable::Refuse => "refusing",
            },
        }
    }

    /// Concurrency slots this replica keeps on its own.
    pub fn max_concurrency(&self) -> usize {
        self.local.max_concurrency()
    }

    /// Calls holding one of this replica's own slots right now.
    pub fn in_flight(&self) -> usize {
        self.local.in_flight()
    }
}

enum Fallback {
    Refused(LimitRejected),
    StoreDown,
}

/// Longest pause between asks: a slot freed early is not announced, so a waiter looks again.
const MAX_POLL: Duration = Duration::from_millis(100);

impl Shared {
    async fn admit(&self, wait_until: Option<Instant>, estimate: u64) -> Result<Held, Fallback> {
        loop {
            let answer = self
                .cluster
                .admit(&self.provider, &self.quota, estimate, self.hold)
                .await
                .map_err(|_| Fallback::StoreDown)?;
            let (rejected, retry_in) = match answer {
                Admission::Admitted(lease) => {
                    return Ok(Held::Shared {
                        shared: self.clone(),
                        lease,
                    });
                }
                Admission::Saturated { retry_in } => {
                    (LimitRejected::Saturated, retry_in.min(MAX_POLL))
                }
                Admission::RateLimited { retry_in } => {
                    (LimitRejected::RateLimited { retry_in }, retry_in)
                }
                Admission::TokensLimited { retry_in } => {
                    (LimitRejected::TokensLimited { retry_in }, retry_in)
                }
            };
            let Some(deadline) = wait_until else {
                return Err(Fallback::Refused(rejected));
            };
            if retry_in >= deadline.saturating_duration_since(Instant::now()) {
                return Err(Fallback::Refused(rejected));
            }
            tokio::time::sleep(retry_in).await;
        }
    }

    /// Settles off the call's path; dropped while the store is down (the lease expires).
    fn settle_later(self, lease: Lease, actual: Option<u64>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let _ = self
                .cluster
                .settle(&self.provider, &self.quota, &lease, actual)
                .await;
        });
    }
}
