//! Providers' `rpm`, `tpm` and `max_concurrency`, shared by every replica: one script admits
//! a call all or nothing, one settles it. How far each may be overshot: ADR 0025.

use super::{Cluster, Unavailable, scripts};
use std::time::Duration;

/// One provider's shared limits, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderQuota {
    /// Requests per minute.
    pub rpm: Option<u32>,
    /// Tokens per minute.
    pub tpm: Option<u64>,
    /// Calls in flight at once.
    pub max_concurrency: Option<usize>,
}

/// The store's answer to a call asking to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Sent: the call holds this lease until it settles.
    Admitted(Lease),
    /// Every slot is leased.
    Saturated {
        /// Until the oldest lease expires.
        retry_in: Duration,
    },
    /// The rate is spent.
    RateLimited {
        /// Until a call conforms.
        retry_in: Duration,
    },
    /// The minute's tokens are spent.
    TokensLimited {
        /// Until the bucket has room for this call.
        retry_in: Duration,
    },
}

/// A call's place in the shared limits, given back by [`Cluster::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The slot's name in the store.
    pub id: String,
    /// Tokens taken at admission.
    pub estimate: u64,
    /// When it was admitted, on the store's clock (µs).
    pub admitted_us: i64,
}

impl Cluster {
    /// Asks to send one call, holding a slot for `hold` plus `lease_slack`.
    pub async fn admit(
        &self,
        provider: &str,
        quota: &ProviderQuota,
        estimate: u64,
        hold: Duration,
    ) -> Result<Admission, Unavailable> {
        let id = self.lease_id();
        let lease = hold.saturating_add(self.lease_slack());
        let answer: Vec<i64> = self
            .invoke(
                scripts::ADMIT
                    .key(self.key(provider, "rate"))
                    .key(self.key(provider, "tokens"))
                    .key(self.key(provider, "slots"))
                    .arg(quota.rpm.unwrap_or(0))
                    .arg(quota.tpm.unwrap_or(0))
                    .arg(estimate)
                    .arg(quota.max_concurrency.unwrap_or(0))
                    .arg(u64::try_from(lease.as_micros()).unwrap_or(u64::MAX))
                    .arg(&id),
            )
            .await?;
        let retry_in = || {
            let micros = answer.get(1).copied().unwrap_or(0).max(1);
            Duration::from_micros(u64::try_from(micros).unwrap_or(1))
        };
        match answer.first() {
            Some(0) => Ok(Admission::Admitted(Lease {
                id,
                estimate,
                admitted_us: answer.get(1).copied().unwrap_or(0),
            })),
            Some(1) => Ok(Admission::Saturated {
                retry_in: retry_in(),
            }),
            Some(2) => Ok(Admission::RateLimited {
                retry_in: retry_in(),
            }),
            Some(3) => Ok(Admission::TokensLimited {
                retry_in: retry_in(),
            }),
            _ => {
                self.lost("unexpected script answer");
                Err(Unavailable)
            }
        }
    }

    /// Gives `lease` back; `actual` tokens, when reported, replace the estimate.
    pub async fn settle(
        &self,
        provider: &str,
        quota: &ProviderQuota,
        lease: &Lease,
        actual: Option<u64>,
    ) -> Result<(), Unavailable> {
        let correction = actual.map_or(0, |actual| {
            i64::try_from(actual)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(lease.estimate).unwrap_or(i64::MAX))
        });
        self.invoke::<i64>(
            scripts::SETTLE
                .key(self.key(provider, "tokens"))
                .key(self.key(provider, "slots"))
                .arg(quota.tpm.unwrap_or(0))
                .arg(correction)
                .arg(&lease.id)
                .arg(lease.admitted_us)
                .arg(lease.estimate),
        )
        .await
        .map(drop)
    }
}
