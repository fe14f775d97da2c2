//! Task → ordered chain of `(provider, model)` targets, and the walk along it.
//!
//! The chain is data from the config (validated at load time). The walk calls
//! each target in order until one gives a usable answer, keeping a record of
//! every attempt, and never starts an attempt after the request deadline.

mod attempt;
mod probe;
mod report;
mod span;
mod stream;
#[cfg(test)]
mod tests;

pub use attempt::{AttemptOutcome, AttemptRecord, CANCELLED, total_usage};
use attempt::{InFlight, implausible};
pub use report::ProvidersReport;
pub use stream::RouteEvent;

use crate::{
    cluster::Cluster,
    config::{Config, TargetConfig},
    domain::{Completion, CompletionRequest, ProviderError, TokenUsage},
    domain::{Priority, instant_after},
    providers::Providers,
    resilience::{Decision, Outcome, Resilience, retry::Jitter},
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
    /// [`Self::reason`] of [`RouteError::UnknownTask`].
    pub const TASK_UNKNOWN: &'static str = "TASK_UNKNOWN";
    /// [`Self::reason`] of [`RouteError::AllProvidersFailed`].
    pub const ALL_PROVIDERS_FAILED: &'static str = "ALL_PROVIDERS_FAILED";
    /// [`Self::reason`] of [`RouteError::DeadlineExceeded`].
    pub const DEADLINE_EXCEEDED: &'static str = "DEADLINE_EXCEEDED";
    /// [`Self::reason`] of [`RouteError::AllProvidersFailed`] when every
    /// target was refused because the cluster store was down
    /// (`on_unavailable = "refuse"`).
    pub const CLUSTER_STORE_UNAVAILABLE: &'static str = "CLUSTER_STORE_UNAVAILABLE";

    /// The stable name of this failure: the API's `ErrorInfo.reason` and
    /// the usage record's `outcome`.
    pub fn reason(&self) -> &'static str {
        match self {
            RouteError::UnknownTask(_) => Self::TASK_UNKNOWN,
            RouteError::AllProvidersFailed { attempts }
                if !attempts.is_empty()
                    && attempts.iter().all(|a| {
                        a.error_code.as_deref() == Some(Self::CLUSTER_STORE_UNAVAILABLE)
                    }) =>
            {
                Self::CLUSTER_STORE_UNAVAILABLE
            }
            RouteError::AllProvidersFailed { .. } => Self::ALL_PROVIDERS_FAILED,
            RouteError::DeadlineExceeded { .. } => Self::DEADLINE_EXCEEDED,
        }
    }

    /// The same failure carrying `attempts` instead (a call's failure
    /// reports every attempt of the call, not only its last model call's).
    pub fn with_attempts(self, attempts: Vec<AttemptRecord>) -> Self {
        match self {
            RouteError::UnknownTask(task) => RouteError::UnknownTask(task),
            RouteError::AllProvidersFailed { .. } => RouteError::AllProvidersFailed { attempts },
            RouteError::DeadlineExceeded { .. } => RouteError::DeadlineExceeded { attempts },
        }
    }

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

/// How a request wants to be routed.
#[derive(Debug, Clone, Default)]
pub struct RouteOptions {
    /// INTERACTIVE fails over instead of sleeping; BACKGROUND retries fully.
    pub priority: Priority,
    /// Model to use at the primary target instead of the chain's (a prompt
    /// version's model override).
    pub primary_model: Option<String>,
}

impl RouteOptions {
    /// Makes `chain` the chain these options walk: the primary's model
    /// overridden.
    pub fn call_as(&self, chain: &mut [TargetConfig]) {
        if let (Some(model), Some(primary)) = (&self.primary_model, chain.first_mut()) {
            primary.model.clone_from(model);
        }
    }

    /// [`Self::call_as`] on a borrowed chain, copied only when it changes:
    /// what a reservation must price and what `run` calls.
    pub fn chain_as_called<'a>(
        &self,
        chain: &'a [TargetConfig],
    ) -> std::borrow::Cow<'a, [TargetConfig]> {
        match (&self.primary_model, chain.first()) {
            (Some(model), Some(primary)) if *model != primary.model => {
                let mut called = chain.to_vec();
                self.call_as(&mut called);
                std::borrow::Cow::Owned(called)
            }
            _ => std::borrow::Cow::Borrowed(chain),
        }
    }
}

/// Walks task chains, guarded per provider by `resilience`.
#[derive(Clone)]
pub struct Router {
    config: Arc<Config>,
    providers: Providers,
    resilience: Resilience,
    /// Where backoff jitter comes from; random unless a test fixes it.
    jitter: Jitter,
}

/// What happened to one call at one target.
enum Tried<T> {
    /// Served: the parsed answer and the completion.
    Served(T, Completion),
    /// The target was skipped or failed; the attempt is recorded. `Some`
    /// carries the error to decide about retrying.
    Failed(Option<ProviderError>),
}

impl Router {
    /// A router over the configured tasks and providers, their limits
    /// shared through `cluster` when there is one.
    pub fn new(config: Arc<Config>, providers: Providers, cluster: Option<&Cluster>) -> Self {
        let resilience = Resilience::from_config(&config, cluster);
        Self {
            config,
            providers,
            resilience,
            jitter: Jitter::Random,
        }
    }

    /// The same router drawing its backoff jitter from `jitter`
    /// (`Jitter::Fixed` makes every wait exact, for tests).
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The per-provider guards (breakers, limits, health), for ops and metrics.
    pub fn resilience(&self) -> &Resilience {
        &self.resilience
    }

    /// The kind of a configured provider.
    fn kind(&self, provider: &str) -> Option<crate::config::ProviderKind> {
        self.config.providers.get(provider).map(|p| p.kind)
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
            // `timeout` comes from config: an absurd one must not overflow.
            .map_or(deadline, |p| deadline.min(instant_after(now, p.timeout)))
    }

    /// Calls `chain`'s targets in order until one answers and `parse`
    /// accepts the answer, applying per target (see `resilience`): the
    /// breaker (an open provider is skipped with no call), the rate and
    /// concurrency limits, the call bounded by the provider timeout and the
    /// deadline, then the retry policy. A `parse` error is a malformed
    /// response: it counts against the provider and the walk moves on.
    /// Nothing starts after `deadline`; every attempt is recorded.
    ///
    /// `request` is borrowed: each attempt sends its own copy with the
    /// target's model and deadline, and a caller's future would otherwise
    /// hold the request twice more through this one.
    pub async fn run<T>(
        &self,
        chain: &[TargetConfig],
        request: &CompletionRequest,
        deadline: Instant,
        options: &RouteOptions,
        parse: impl Fn(&Completion) -> Result<T, String>,
    ) -> Result<Routed<T>, RouteError> {
        let mut attempts: Vec<AttemptRecord> = Vec::new();
        let chain = options.chain_as_called(chain);
        for (index, target) in chain.iter().enumerate() {
            let has_next = index + 1 < chain.len();
            let mut retry = 0_u32;
            // Backoff slept before the next attempt (credited to it).
            let mut slept = Duration::ZERO;
            loop {
                if Instant::now() >= deadline {
                    if let Some(last) = attempts.last_mut() {
                        last.waited += slept;
                    }
                    return Err(RouteError::DeadlineExceeded { attempts });
                }
                let first_new = attempts.len();
                let tried = self
                    .try_target(
                        target,
                        retry,
                        request,
                        deadline,
                        options.priority,
                        &parse,
                        &mut attempts,
                    )
                    .await;
                if let Some(record) = attempts.get_mut(first_new) {
                    record.waited += std::mem::take(&mut slept);
                }
                let err = match tried {
                    Tried::Served(value, completion) => {
                        return Ok(Routed {
                            value,
                            completion,
                            provider: target.provider.clone(),
                            model: target.model.clone(),
                            degraded: index > 0,
                            attempts,
                        });
                    }
                    Tried::Failed(None) => break,
                    Tried::Failed(Some(err)) => err,
                };
                let mut jitter = self.jitter;
                let decision = self.resilience.retry.decide(
                    &err,
                    retry + 1,
                    options.priority,
                    has_next,
                    Instant::now(),
                    deadline,
                    &mut jitter,
                );
                match decision {
                    Decision::RetryAfter(wait) => {
                        let before = Instant::now();
                        tokio::time::sleep(wait).await;
                        slept = before.elapsed();
                        retry += 1;
                    }
                    Decision::NextTarget | Decision::GiveUp => break,
                }
            }
        }
        if Instant::now() >= deadline {
            Err(RouteError::DeadlineExceeded { attempts })
        } else {
            Err(RouteError::AllProvidersFailed { attempts })
        }
    }

    /// One attempt at one target, through its breaker and limits.
    #[allow(clippy::too_many_arguments)] // one attempt needs every one of these facts
    async fn try_target<T>(
        &self,
        target: &TargetConfig,
        retry: u32,
        request: &CompletionRequest,
        deadline: Instant,
        priority: Priority,
        parse: &impl Fn(&Completion) -> Result<T, String>,
        attempts: &mut Vec<AttemptRecord>,
    ) -> Tried<T> {
        let (Some(provider), Some(guards)) = (
            self.providers.get(&target.provider),
            self.resilience.get(&target.provider),
        ) else {
            // Config validation makes this unreachable; record it anyway.
            attempts.push(AttemptRecord::skipped(
                target,
                AttemptOutcome::Error,
                "UNKNOWN_PROVIDER",
            ));
            return Tried::Failed(None);
        };
        let permit = match guards.breaker.try_acquire() {
            Ok(permit) => permit,
            Err(rejected) => {
                let outcome = if rejected.is_cooldown() {
                    AttemptOutcome::SkippedRateLimited
                } else {
                    AttemptOutcome::SkippedCircuitOpen
                };
                attempts.push(
                    AttemptRecord::skipped(target, outcome, rejected.code()).with_retry(retry),
                );
                return Tried::Failed(None);
            }
        };
        let queued = Instant::now();
        let slot = guards
            .limits
            .acquire(wait_until(priority, deadline), request.token_estimate())
            .await;
        let waited = queued.elapsed();
        let slot = match slot {
            Ok(slot) => slot,
            Err(rejected) => {
                // Dropping the unrecorded breaker permit frees its probe slot.
                drop(permit);
                attempts.push(
                    AttemptRecord::skipped(
                        target,
                        AttemptOutcome::SkippedRateLimited,
                        rejected.code(),
                    )
                    .with_retry(retry)
                    .with_waited(waited),
                );
                return Tried::Failed(None);
            }
        };
        let mut call = InFlight::start(guards, target);
        let attempt_deadline = self.attempt_deadline(&target.provider, call.started(), deadline);
        let req = CompletionRequest {
            model: target.model.clone(),
            deadline: attempt_deadline,
            ..request.clone()
        };
        let span = span::attempt(target, self.kind(&target.provider), &req.trace_id, retry);
        let again = || CompletionRequest {
            model: target.model.clone(),
            deadline: attempt_deadline,
            ..request.clone()
        };
        let called = call
            .send(&span, req, again, deadline, |req| provider.complete(req))
            .await;
        match &called {
            Ok(c) => span::answered(&span, c),
            Err(e) => span::failed(&span, e),
        }
        let err = match called {
            Ok(completion) => {
                // An answer with absurd token counts is as unusable as one
                // that does not parse, and is charged its plausible part.
                let parsed = match implausible(&completion, request) {
                    Some(refused) => Err(refused),
                    None => parse(&completion)
                        .map_err(|why| (ProviderError::Malformed(why), completion.usage)),
                };
                match parsed {
                    Ok(value) => {
                        let elapsed = call.end(None);
                        slot.settle(tokens(completion.usage));
                        permit.record(Outcome::Success);
                        attempts.push(
                            AttemptRecord::succeeded(target, retry, elapsed, completion.usage)
                                .with_waited(waited),
                        );
                        return Tried::Served(value, completion);
                    }
                    Err((err, charged)) => {
                        span::record_failure(&span, "MALFORMED_RESPONSE");
                        let elapsed = call.end(Some(&err));
                        slot.settle(tokens(charged));
                        // An unusable answer still consumed tokens.
                        attempts.push(
                            AttemptRecord::failed(target, retry, elapsed, &err)
                                .with_usage(charged)
                                .with_waited(waited),
                        );
                        err
                    }
                }
            }
            Err(err) => {
                let elapsed = call.end(Some(&err));
                slot.settle(None);
                attempts
                    .push(AttemptRecord::failed(target, retry, elapsed, &err).with_waited(waited));
                err
            }
        };
        permit.record_error(&err);

        tracing::warn!(provider = %target.provider, model = %target.model, retry, code = %err.code(), summary = err.summary(), "provider attempt failed");
        Tried::Failed(Some(err))
    }
}

/// How long a call may wait for its limits: not at all when a person is
/// waiting (INTERACTIVE fails over instead), else until its deadline.
fn wait_until(priority: Priority, deadline: Instant) -> Option<Instant> {
    match priority {
        Priority::Interactive => None,
        Priority::Background => Some(deadline),
    }
}

/// What a `tpm` limit counts of a call: input and output tokens, or
/// `None` when the provider reported none (many OpenAI-compatible servers
/// send no usage in a stream): then the estimate stands.
fn tokens(usage: TokenUsage) -> Option<u64> {
    let total = usage.input_tokens.saturating_add(usage.output_tokens);
    (total > 0).then_some(total)
}
