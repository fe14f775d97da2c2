//! Task → ordered chain of `(provider, model)` targets, and the walk along it.
//!
//! The chain is data from the config (validated at load time). The walk calls
//! each target in order until one gives a usable answer, keeping a record of
//! every attempt, and never starts an attempt after the request deadline.

mod attempt;
mod stream;

pub use attempt::{AttemptOutcome, AttemptRecord, total_usage};
pub use stream::RouteEvent;

use crate::{
    config::{Config, TargetConfig},
    providers::{Completion, CompletionRequest, ProviderError, Providers, TokenUsage},
};
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;

/// Why a routed call produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The task is not in the config.
    #[error("unknown task `{0}`")]
    UnknownTask(String),
    /// Every target failed.
    #[error("all providers failed")]
    AllProvidersFailed {
        /// Every attempt, in order.
        attempts: Vec<AttemptRecord>,
    },
    /// The deadline passed before any target answered.
    #[error("deadline exceeded")]
    DeadlineExceeded {
        /// Attempts made before the deadline.
        attempts: Vec<AttemptRecord>,
    },
}

impl RouteError {
    /// The attempts made, for error details and usage records.
    pub fn attempts(&self) -> &[AttemptRecord] {
        match self {
            RouteError::UnknownTask(_) => &[],
            RouteError::AllProvidersFailed { attempts }
            | RouteError::DeadlineExceeded { attempts } => attempts,
        }
    }
}

/// A routed answer.
#[derive(Debug, Clone)]
pub struct Routed<T> {
    /// The parsed answer.
    pub value: T,
    /// The provider's raw completion.
    pub completion: Completion,
    /// Provider that served.
    pub provider: String,
    /// Model that served.
    pub model: String,
    /// A target other than the primary served.
    pub degraded: bool,
    /// Every attempt, the serving one last.
    pub attempts: Vec<AttemptRecord>,
}

impl<T> Routed<T> {
    /// Tokens summed over every attempt (failed attempts may have consumed some).
    pub fn usage(&self) -> TokenUsage {
        attempt::total_usage(&self.attempts)
    }
}

/// Walks task chains.
#[derive(Clone)]
pub struct Router {
    config: Arc<Config>,
    providers: Providers,
}

impl Router {
    /// A router over the configured tasks and providers.
    pub fn new(config: Arc<Config>, providers: Providers) -> Self {
        Self { config, providers }
    }

    /// The chain of a task.
    pub fn chain(&self, task: &str) -> Result<&[TargetConfig], RouteError> {
        self.config
            .tasks
            .get(task)
            .map(|t| t.chain.as_slice())
            .ok_or_else(|| RouteError::UnknownTask(task.to_owned()))
    }

    /// When an attempt starting `now` must end: the request deadline or the
    /// provider's own timeout, whichever comes first.
    fn attempt_deadline(&self, provider: &str, now: Instant, deadline: Instant) -> Instant {
        self.config
            .providers
            .get(provider)
            .map_or(deadline, |p| deadline.min(now + p.timeout))
    }

    /// Calls the task's targets in order until one answers and `parse`
    /// accepts the answer. A `parse` error is a malformed response: it
    /// counts as that target's failure and the walk moves on.
    ///
    /// `request.model` is replaced by each target's model; `deadline` bounds
    /// the whole walk.
    pub async fn run<T>(
        &self,
        task: &str,
        request: CompletionRequest,
        deadline: Instant,
        parse: impl Fn(&Completion) -> Result<T, String>,
    ) -> Result<Routed<T>, RouteError> {
        let chain = self.chain(task)?;
        let mut attempts = Vec::new();
        for (index, target) in chain.iter().enumerate() {
            let now = Instant::now();
            if now >= deadline {
                return Err(RouteError::DeadlineExceeded { attempts });
            }
            let Some(provider) = self.providers.get(&target.provider) else {
                // Config validation makes this unreachable; record it anyway.
                attempts.push(AttemptRecord::failed(
                    target,
                    0,
                    Duration::ZERO,
                    &ProviderError::Unsupported("provider missing".into()),
                ));
                continue;
            };
            let attempt_deadline = self.attempt_deadline(&target.provider, now, deadline);
            let req = CompletionRequest {
                model: target.model.clone(),
                deadline: attempt_deadline,
                ..request.clone()
            };
            let called =
                match tokio::time::timeout_at(attempt_deadline, provider.complete(req)).await {
                    Ok(result) => result,
                    Err(_) => Err(ProviderError::Timeout),
                };
            let elapsed = now.elapsed();
            let failure = match called {
                Ok(completion) => match parse(&completion) {
                    Ok(value) => {
                        attempts.push(AttemptRecord::succeeded(
                            target,
                            0,
                            elapsed,
                            completion.usage,
                        ));
                        return Ok(Routed {
                            value,
                            completion,
                            provider: target.provider.clone(),
                            model: target.model.clone(),
                            degraded: index > 0,
                            attempts,
                        });
                    }
                    // An unusable answer still consumed tokens.
                    Err(why) => {
                        AttemptRecord::failed(target, 0, elapsed, &ProviderError::Malformed(why))
                            .with_usage(completion.usage)
                    }
                },
                Err(err) => AttemptRecord::failed(target, 0, elapsed, &err),
            };
            tracing::warn!(
                provider = %target.provider,
                model = %target.model,
                code = failure.error_code.as_deref().unwrap_or_default(),
                "provider attempt failed"
            );
            attempts.push(failure);
        }
        if Instant::now() >= deadline {
            Err(RouteError::DeadlineExceeded { attempts })
        } else {
            Err(RouteError::AllProvidersFailed { attempts })
        }
    }
}
