//! The record of one provider attempt, kept for `meta.attempts`, errors and usage.

use crate::{
    config::TargetConfig,
    providers::{ProviderError, TokenUsage},
};
use std::time::Duration;

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Served the answer.
    Success,
    /// The provider failed.
    Error,
    /// Ran out of time.
    Timeout,
    /// Not called: breaker open.
    SkippedCircuitOpen,
    /// Not called: cooling down after 429, or saturated.
    SkippedRateLimited,
    /// Answered, but unusable.
    Malformed,
}

/// One attempt at one target.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    /// Provider name.
    pub provider: String,
    /// Model name.
    pub model: String,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// Time spent.
    pub latency: Duration,
    /// Stable error code; `None` on success.
    pub error_code: Option<String>,
    /// 0 for the first try at this target.
    pub retry: u32,
    /// Tokens it consumed (a malformed answer still costs tokens).
    pub usage: TokenUsage,
    /// Time spent waiting *for* this attempt before it was made: the retry
    /// backoff (incl. `Retry-After`) before it and the provider's rate and
    /// concurrency limits. Waiting on a provider, not work of ours, so the
    /// overhead metric leaves it out.
    pub waited: Duration,
}

impl AttemptRecord {
    /// A successful attempt.
    pub fn succeeded(
        target: &TargetConfig,
        retry: u32,
        latency: Duration,
        usage: TokenUsage,
    ) -> Self {
        Self {
            provider: target.provider.clone(),
            model: target.model.clone(),
            outcome: AttemptOutcome::Success,
            latency,
            error_code: None,
            retry,
            usage,
            waited: Duration::ZERO,
        }
    }

    /// A failed attempt.
    pub fn failed(
        target: &TargetConfig,
        retry: u32,
        latency: Duration,
        err: &ProviderError,
    ) -> Self {
        let outcome = match err {
            ProviderError::Timeout => AttemptOutcome::Timeout,
            ProviderError::Malformed(_) => AttemptOutcome::Malformed,
            _ => AttemptOutcome::Error,
        };
        Self {
            provider: target.provider.clone(),
            model: target.model.clone(),
            outcome,
            latency,
            error_code: Some(err.code()),
            retry,
            usage: TokenUsage::default(),
            waited: Duration::ZERO,
        }
    }

    /// A target not called, with the reason.
    pub fn skipped(target: &TargetConfig, outcome: AttemptOutcome, code: &str) -> Self {
        Self {
            provider: target.provider.clone(),
            model: target.model.clone(),
            outcome,
            latency: Duration::ZERO,
            error_code: Some(code.to_owned()),
            retry: 0,
            usage: TokenUsage::default(),
            waited: Duration::ZERO,
        }
    }

    /// Same record with its retry number.
    pub fn with_retry(mut self, retry: u32) -> Self {
        self.retry = retry;
        self
    }

    /// Same record with the tokens the attempt consumed.
    pub fn with_usage(mut self, usage: TokenUsage) -> Self {
        self.usage = usage;
        self
    }

    /// Same record with the time it waited for a rate or concurrency slot.
    pub fn with_waited(mut self, waited: Duration) -> Self {
        self.waited = waited;
        self
    }
}

/// Tokens over all attempts.
pub fn total_usage(attempts: &[AttemptRecord]) -> TokenUsage {
    attempts
        .iter()
        .fold(TokenUsage::default(), |acc, a| TokenUsage {
            input_tokens: acc.input_tokens + a.usage.input_tokens,
            output_tokens: acc.output_tokens + a.usage.output_tokens,
        })
}
