//! Task → ordered chain of `(provider, model)` targets, and the walk along it:
//! each target in order until one answers usably, every attempt recorded,
//! none started after the request deadline.

mod attempt;
mod probe;
mod report;
mod span;
mod stream;
#[cfg(test)]
mod tests;

pub use crate::resilience::breaker::Opened;
pub use attempt::{AttemptOutcome, AttemptRecord, CANCELLED, total_usage};
use attempt::{InFlight, implausible};
pub use report::ProvidersReport;
pub use stream::RouteEvent;

use crate::{
    cluster::Cluster,
    config::{Config, TargetConfig},
    domain::{Completion, CompletionRequest, ProviderError, TokenUsage},
    domain::{Priority, instant_after},
    providers::{Provider, Providers},
    resilience::{
        Decision, LimitPermit, Outcome, Permit, ProviderGuards, Resilience, retry::Jitter,
    },
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
    /// [`Self::reason`] when every target was refused for a down cluster store.
    pub const CLUSTER_STORE_UNAVAILABLE: &'static str = "CLUSTER_STORE_UNAVAILABLE";

    /// The stable name of this failure (`ErrorInfo.reason`, usage `outcome`).
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

    /// The same failure reporting `attempts`: all of a call's, not its last model call's.
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
    /// Model for the primary target instead of the chain's (a prompt version's).
    pub primary_model: Option<String>,
}

impl RouteOptions {
    /// Overrides the primary's model in `chain`.
    pub fn call_as(&self, chain: &mut [TargetConfig]) {
        if let (Some(model), Some(primary)) = (&self.primary_model, chain.first_mut()) {
            primary.model.clone_from(model);
        }
    }

    /// [`Self::call_as`] on a borrowed chain, copied only when it changes.
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
    /// Skipped or failed (recorded); `Some` error to decide about retrying.
    Failed(Option<ProviderError>),
}

impl Router {
    /// A router over the configured providers, limits shared through `cluster`.
    pub fn new(config: Arc<Config>, providers: Providers, cluster: Option<&Cluster>) -> Self {
        let resilience = Resilience::from_config(&config, cluster);
        Self {
            config,
            providers,
            resilience,
            jitter: Jitter::Random,
        }
    }

    /// Draws backoff jitter from `jitter` (`Jitter::Fixed`: exact waits, for tests).
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// The per-provider guards (breakers, limits, health), for ops and metrics.
    pub fn resilience(&self) -> &Resilience {
        &self.resilience
    }

    /// Every breaker's openings from now on ([`Resilience::watch_openings`]).
    pub fn watch_openings(&self, capacity: usize) -> Option<tokio::sync::mpsc::Receiver<Opened>> {
        self.resilience.watch_openings(capacity)
    }

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

    /// When an attempt starting `now` must end: the deadline or the provider timeout.
    fn attempt_deadline(&self, provider: &str, now: Instant, deadline: Instant) -> Instant {
        self.config
            .providers
            .get(provider)
            // `timeout` comes from config: an absurd one must not overflow.
            .map_or(deadline, |p| deadline.min(instant_after(now, p.timeout)))
    }

    /// Calls `chain`'s targets in order (breaker, limits, timeout, retry policy)
    /// until one answers and `parse` accepts it; a `parse` error counts as a
    /// malformed answer. `request` is borrowed: each attempt sends its own
    /// copy, and a caller's future would otherwise hold it twice more.
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
        let (wait, estimate) = (wait_until(priority, deadline), request.token_estimate());
        let Some(admitted) = self.admit(target, retry, wait, estimate, attempts).await else {
            return Tried::Failed(None);
        };
        let waited = admitted.waited;
        let mut call = InFlight::start(admitted.guards, target);
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
        let provider = &admitted.provider;
        let called = call
            .send(&span, req, again, deadline, |req| provider.complete(req))
            .await;
        match judge(called, request, parse, &span) {
            Ok((value, completion)) => {
                let elapsed = call.end(None);
                admitted.slot.settle(tokens(completion.usage));
                admitted.permit.record(Outcome::Success);
                attempts.push(
                    AttemptRecord::succeeded(target, retry, elapsed, completion.usage)
                        .with_waited(waited),
                );
                Tried::Served(value, completion)
            }
            Err((err, charged)) => {
                let elapsed = call.end(Some(&err));
                admitted.slot.settle(tokens(charged));
                attempts.push(
                    AttemptRecord::failed(target, retry, elapsed, &err)
                        .with_usage(charged)
                        .with_waited(waited),
                );
                admitted.permit.record_error(&err);
                tracing::warn!(provider = %target.provider, model = %target.model, retry, code = %err.code(), summary = err.summary(), "provider attempt failed");
                Tried::Failed(Some(err))
            }
        }
    }

    /// `target`'s breaker permit and a limit slot for `estimate` tokens
    /// (waiting no later than `wait`), or `None` with the skip recorded.
    async fn admit(
        &self,
        target: &TargetConfig,
        retry: u32,
        wait: Option<Instant>,
        estimate: u64,
        attempts: &mut Vec<AttemptRecord>,
    ) -> Option<Admitted<'_>> {
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
            return None;
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
                return None;
            }
        };
        let queued = Instant::now();
        let slot = guards.limits.acquire(wait, estimate).await;
        let waited = queued.elapsed();
        match slot {
            Ok(slot) => Some(Admitted {
                slot,
                permit,
                provider,
                guards,
                waited,
            }),
            Err(rejected) => {
                // Dropping the unrecorded breaker permit frees its probe slot.
                drop(permit);
                attempts.push(AttemptRecord::rate_limited(
                    target,
                    rejected.code(),
                    retry,
                    waited,
                ));
                None
            }
        }
    }
}

/// A target's breaker permit and limit slot for one attempt (dropped in this order).
struct Admitted<'a> {
    slot: LimitPermit,
    permit: Permit,
    provider: Arc<dyn Provider>,
    guards: &'a ProviderGuards,
    waited: Duration,
}

/// The parsed answer, or the error ending the attempt and the tokens charged:
/// absurd token counts make an answer malformed, charged their plausible part.
fn judge<T>(
    called: Result<Completion, ProviderError>,
    request: &CompletionRequest,
    parse: &impl Fn(&Completion) -> Result<T, String>,
    span: &tracing::Span,
) -> Result<(T, Completion), (ProviderError, TokenUsage)> {
    match &called {
        Ok(c) => span::answered(span, c),
        Err(e) => span::failed(span, e),
    }
    let completion = called.map_err(|err| (err, TokenUsage::default()))?;
    let parsed = match implausible(&completion, request) {
        Some(refused) => Err(refused),
        None => parse(&completion).map_err(|why| (ProviderError::Malformed(why), completion.usage)),
    };
    match parsed {
        Ok(value) => Ok((value, completion)),
        Err(refused) => {
            span::record_failure(span, "MALFORMED_RESPONSE");
            Err(refused)
        }
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

/// What a `tpm` limit counts of a call; `None` when the provider reported no
/// usage (many OpenAI-compatible streams): the estimate stands.
fn tokens(usage: TokenUsage) -> Option<u64> {
    let total = usage.input_tokens.saturating_add(usage.output_tokens);
    (total > 0).then_some(total)
}
