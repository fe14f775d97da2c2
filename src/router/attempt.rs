//! The record of one provider attempt, kept for `meta.attempts`, errors and usage.

use crate::{
    config::TargetConfig,
    domain::{Completion, CompletionRequest, ProviderError, TokenUsage},
    resilience::{CutShort, ProviderGuards},
    telemetry::metrics,
};
use std::{future::Future, time::Duration};
use tokio::time::Instant;
use tracing::Instrument;

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
    /// Cut at the caller's deadline or budget: not a failure of the provider.
    Deadline,
    /// Abandoned by a caller that went away: not a failure of the provider.
    Cancelled,
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
    /// Waited before the attempt (backoff, `Retry-After`, the provider's
    /// limits): not our work, so the overhead metric leaves it out.
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
            ProviderError::Deadline => AttemptOutcome::Deadline,
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

    /// Attempt `retry` at `target`, refused by its limits (`code`) after
    /// waiting `waited` for them.
    pub fn rate_limited(target: &TargetConfig, code: &str, retry: u32, waited: Duration) -> Self {
        Self::skipped(target, AttemptOutcome::SkippedRateLimited, code)
            .with_retry(retry)
            .with_waited(waited)
    }

    /// Whether a request was sent (a skipped target was not called).
    pub fn reached_provider(&self) -> bool {
        !matches!(
            self.outcome,
            AttemptOutcome::SkippedCircuitOpen | AttemptOutcome::SkippedRateLimited
        )
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
        .fold(TokenUsage::default(), |acc, a| acc.saturating_add(a.usage))
}

/// A completion with implausible usage for `req`: malformed, charged the capped usage.
pub(super) fn implausible(
    completion: &Completion,
    req: &CompletionRequest,
) -> Option<(ProviderError, TokenUsage)> {
    completion.usage.plausible_for(req).err().map(|capped| {
        (
            ProviderError::Malformed("implausible token usage reported".into()),
            capped,
        )
    })
}

/// A timeout at or after the request's deadline was the caller's: it becomes
/// [`ProviderError::Deadline`] (providers see one deadline, report `Timeout`).
pub(super) fn attribute(err: ProviderError, request_deadline: Instant) -> ProviderError {
    if err.is_timeout() && Instant::now() >= request_deadline {
        ProviderError::Deadline
    } else {
        err
    }
}

/// A provider call under way, recorded in health and metrics by
/// [`InFlight::end`]; dropped before that, as cancelled (never the provider's fault).
pub(super) struct InFlight<'a> {
    guards: &'a ProviderGuards,
    target: &'a TargetConfig,
    started: Instant,
    ended: bool,
    resends: u32,
}

impl<'a> InFlight<'a> {
    pub(super) fn start(guards: &'a ProviderGuards, target: &'a TargetConfig) -> Self {
        Self {
            guards,
            target,
            started: Instant::now(),
            ended: false,
            resends: 0,
        }
    }

    pub(super) fn started(&self) -> Instant {
        self.started
    }

    /// Records the call's end (`None`: a usable answer) and returns its latency.
    pub(super) fn end(mut self, err: Option<&ProviderError>) -> Duration {
        self.ended = true;
        let elapsed = self.started.elapsed();
        let health = &self.guards.health;
        let status = match err {
            None => {
                health.record(elapsed, true);
                "ok".to_owned()
            }
            Some(ProviderError::Deadline) => {
                health.record_cut_short(CutShort::Deadline);
                ProviderError::Deadline.code()
            }
            Some(err @ ProviderError::Connect(_)) => {
                health.record_connection_failure(elapsed);
                err.code()
            }
            Some(err) => {
                health.record(elapsed, false);
                err.code()
            }
        };
        metrics::attempt(&self.target.provider, &self.target.model, &status, elapsed);
        elapsed
    }
}

/// Resends per attempt: enough for a refused stream and a dropped connection,
/// few enough that a provider refusing everything fails the attempt.
pub(super) const MAX_RESENDS: u32 = 2;

impl InFlight<'_> {
    /// Whether `err` provably never reached the provider and may be resent
    /// now (at most [`MAX_RESENDS`] times, before `deadline`); counts it.
    pub(super) fn resend(&mut self, err: &ProviderError, deadline: Instant) -> bool {
        let Some(failure) = err.connection_failure() else {
            return false;
        };
        if !failure.unsent() || self.resends >= MAX_RESENDS || Instant::now() >= deadline {
            return false;
        }
        self.resends += 1;
        self.guards.health.record_resend();
        metrics::resend(&self.target.provider, failure.as_str());
        tracing::info!(provider = %self.target.provider, cause = failure.as_str(), "resending a call that never reached the provider");
        true
    }
}

impl InFlight<'_> {
    /// Sends `first` with `send` within its deadline, resending `again()`
    /// while it never reached the provider ([`Self::resend`]).
    pub(super) async fn send<T, Fut>(
        &mut self,
        span: &tracing::Span,
        first: CompletionRequest,
        again: impl Fn() -> CompletionRequest,
        deadline: Instant,
        send: impl Fn(CompletionRequest) -> Fut,
    ) -> Result<T, ProviderError>
    where
        Fut: Future<Output = Result<T, ProviderError>>,
    {
        let attempt_deadline = first.deadline;
        let mut req = Some(first);
        loop {
            // A resend is the same call again: built anew only then.
            let req = req.take().unwrap_or_else(&again);
            let sent = match tokio::time::timeout_at(attempt_deadline, send(req))
                .instrument(span.clone())
                .await
            {
                Ok(result) => result.map_err(|e| attribute(e, deadline)),
                Err(_) => Err(attribute(ProviderError::Timeout, deadline)),
            };
            match sent {
                Err(e) if self.resend(&e, attempt_deadline) => continue,
                sent => return sent,
            }
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.guards.health.record_cut_short(CutShort::Cancelled);
            metrics::attempt(
                &self.target.provider,
                &self.target.model,
                CANCELLED,
                self.started.elapsed(),
            );
        }
    }
}

/// Error code of an attempt abandoned by a caller that went away.
pub const CANCELLED: &str = "CANCELLED";
