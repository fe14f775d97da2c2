//! The streaming walk: [`Router::run`] with output passed through as it
//! arrives. Until output has reached the caller a failed attempt is retried
//! or falls back as in `run`; after it a failure ends the stream.

use super::{
    AttemptOutcome, AttemptRecord, RouteError, RouteOptions, Router,
    attempt::{InFlight, attribute, implausible},
    span,
};
use crate::domain::{
    Completion, CompletionRequest, Priority, ProviderError, StreamEvent, TokenUsage,
};
use crate::{
    config::TargetConfig,
    providers::{CompletionStream, Provider},
    resilience::{LimitPermit, Outcome, Permit, retry::Decision},
};
use futures::{Stream, StreamExt};
use std::{sync::Arc, time::Duration};
use tokio::time::Instant;
use tracing::Instrument;

/// Records a failed attempt on its span and in the log (code only).
fn failed(span: &tracing::Span, target: &TargetConfig, retry: u32, err: &ProviderError) {
    let code = err.code();
    span::failed(span, err);
    tracing::warn!(provider = %target.provider, model = %target.model, retry, code = %code, summary = err.summary(), "provider attempt failed");
}

/// What the streaming walk reports, in order.
#[derive(Debug)]
pub enum RouteEvent {
    /// A target is being called.
    Started {
        /// Provider name.
        provider: String,
        /// Model name.
        model: String,
    },
    /// The previous target failed before any output; moving to the next.
    Fallback {
        /// Provider that failed.
        from: String,
        /// Provider tried next.
        to: String,
        /// Stable error code.
        reason: String,
    },
    /// A piece of output.
    Delta(String),
    /// The answer is complete. Always the last event on success.
    Completed {
        /// The assembled answer.
        completion: Completion,
        /// Provider that served.
        provider: String,
        /// Model that served.
        model: String,
        /// A non-primary target served.
        degraded: bool,
        /// Every attempt.
        attempts: Vec<AttemptRecord>,
    },
    /// No answer; always the last event on failure.
    Failed(RouteError),
}

impl Router {
    /// Streams the answer along `chain`; dropping the stream cancels the upstream call.
    pub fn stream(
        &self,
        chain: Vec<TargetConfig>,
        request: CompletionRequest,
        deadline: Instant,
        options: &RouteOptions,
    ) -> impl Stream<Item = RouteEvent> + Send + use<> {
        let walk = Walk::new(self, chain, request, deadline, options);
        async_stream::stream! {
            let mut attempts: Vec<AttemptRecord> = Vec::new();
            for (index, target) in walk.chain.iter().enumerate() {
                let mut retry = 0_u32;
                // Backoff slept before the next attempt (credited to it).
                let mut slept = Duration::ZERO;
                loop {
                    if Instant::now() >= walk.deadline {
                        if let Some(last) = attempts.last_mut() {
                            last.waited += slept;
                        }
                        yield RouteEvent::Failed(RouteError::DeadlineExceeded { attempts });
                        return;
                    }
                    let mut attempt = match walk.acquire(target, retry, slept, &mut attempts).await {
                        Acquired::Ready(attempt) => *attempt,
                        Acquired::Skipped(code) => {
                            if let Some(event) = walk.fallback(index, code.to_owned()) {
                                yield event;
                            }
                            break;
                        }
                        Acquired::Unknown => break,
                    };
                    yield RouteEvent::Started { provider: target.provider.clone(), model: target.model.clone() };
                    let opened = attempt.open(&walk.request, walk.deadline).await;
                    let (spent, err) = match opened {
                        Err(err) => (attempt.fail(&err, TokenUsage::default(), &mut attempts), err),
                        Ok(mut upstream) => {
                            let mut sent_output = false;
                            let (spent, err) = loop {
                                let event = walk.next_event(&mut upstream, &attempt.span, attempt.deadline).await;
                                match event {
                                    Ok(StreamEvent::Delta(text)) => {
                                        sent_output = true;
                                        yield RouteEvent::Delta(text);
                                    }
                                    Ok(StreamEvent::Done(completion)) => {
                                        yield attempt.complete(completion, index, attempts);
                                        return;
                                    }
                                    Err((err, charged)) => break (attempt.fail(&err, charged, &mut attempts), err),
                                }
                            };
                            // Output already reached the caller: no retry, no fallback.
                            if sent_output {
                                spent.release();
                                yield RouteEvent::Failed(give_up(matches!(err, ProviderError::Deadline), attempts));
                                return;
                            }
                            (spent, err)
                        }
                    };
                    // Both the span and the slot end before any backoff sleep.
                    spent.release();
                    match walk.back_off(&err, index, retry).await {
                        Some(waited) => {
                            slept = waited;
                            retry += 1;
                        }
                        None => {
                            if let Some(event) = walk.fallback(index, err.code()) {
                                yield event;
                            }
                            break;
                        }
                    }
                }
            }
            yield RouteEvent::Failed(give_up(Instant::now() >= walk.deadline, attempts));
        }
    }
}

/// The failure that ends a walk: the deadline's, or every provider's.
fn give_up(deadline_passed: bool, attempts: Vec<AttemptRecord>) -> RouteError {
    if deadline_passed {
        RouteError::DeadlineExceeded { attempts }
    } else {
        RouteError::AllProvidersFailed { attempts }
    }
}

/// What one streaming walk is over; every attempt borrows from it.
struct Walk {
    router: Router,
    chain: Vec<TargetConfig>,
    request: CompletionRequest,
    deadline: Instant,
    priority: Priority,
}

/// How the next attempt at a target begins.
enum Acquired<'a> {
    Ready(Box<Attempt<'a>>),
    /// Refused by the breaker or the limits (recorded): the code.
    Skipped(&'static str),
    /// Not configured: config validation makes this unreachable.
    Unknown,
}

/// One attempt under way. Fields drop in order (span, call, slot, permit):
/// dropped unfinished, the call is recorded as cancelled.
struct Attempt<'a> {
    target: &'a TargetConfig,
    retry: u32,
    /// Backoff before it plus its wait for a limit slot.
    waited: Duration,
    /// When the attempt must end: the provider timeout or the request deadline.
    deadline: Instant,
    span: tracing::Span,
    call: InFlight<'a>,
    slot: LimitPermit,
    permit: Permit,
    provider: Arc<dyn Provider>,
}

/// What a failed attempt still holds until the walk knows whether it ends.
struct Spent {
    span: tracing::Span,
    slot: LimitPermit,
    reported: Option<u64>,
}

impl Spent {
    /// Ends the attempt's span and gives its limit slot back.
    fn release(self) {
        drop(self.span);
        self.slot.settle(self.reported);
    }
}

impl Walk {
    fn new(
        router: &Router,
        mut chain: Vec<TargetConfig>,
        request: CompletionRequest,
        deadline: Instant,
        options: &RouteOptions,
    ) -> Self {
        options.call_as(&mut chain);
        Self {
            router: router.clone(),
            chain,
            request,
            deadline,
            priority: options.priority,
        }
    }

    /// Takes `target`'s breaker permit and limit slot for try `retry`, or
    /// records the skip. `slept`, the backoff before it, is credited to it.
    async fn acquire<'a>(
        &'a self,
        target: &'a TargetConfig,
        retry: u32,
        slept: Duration,
        attempts: &mut Vec<AttemptRecord>,
    ) -> Acquired<'a> {
        let router = &self.router;
        let (Some(provider), Some(guards)) = (
            router.providers.get(&target.provider),
            router.resilience.get(&target.provider),
        ) else {
            return Acquired::Unknown;
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
                    AttemptRecord::skipped(target, outcome, rejected.code())
                        .with_retry(retry)
                        .with_waited(slept),
                );
                return Acquired::Skipped(rejected.code());
            }
        };
        let asked = Instant::now();
        let slot = guards
            .limits
            .acquire(
                super::wait_until(self.priority, self.deadline),
                self.request.token_estimate(),
            )
            .await;
        let waited = slept + asked.elapsed();
        let slot = match slot {
            Ok(slot) => slot,
            Err(rejected) => {
                drop(permit);
                attempts.push(AttemptRecord::rate_limited(
                    target,
                    rejected.code(),
                    retry,
                    waited,
                ));
                return Acquired::Skipped(rejected.code());
            }
        };
        // Timed from here, as in `run`: a rate-limiter wait is not provider time.
        let call = InFlight::start(guards, target);
        let deadline = router.attempt_deadline(&target.provider, call.started(), self.deadline);
        let span = span::attempt(
            target,
            router.kind(&target.provider),
            &self.request.trace_id,
            retry,
        );
        Acquired::Ready(Box::new(Attempt {
            target,
            retry,
            waited,
            deadline,
            span,
            call,
            slot,
            permit,
            provider,
        }))
    }

    /// The `Fallback` event from `chain[index]`, only when the next target
    /// will be tried: past the deadline the walk ends instead.
    fn fallback(&self, index: usize, reason: String) -> Option<RouteEvent> {
        let from = self.chain.get(index)?;
        let to = self
            .chain
            .get(index + 1)
            .filter(|_| Instant::now() < self.deadline)?;
        Some(RouteEvent::Fallback {
            from: from.provider.clone(),
            to: to.provider.clone(),
            reason,
        })
    }

    /// The next event of `upstream` before `attempt_deadline`; an early end,
    /// a timeout or absurd token counts is an error, with the tokens charged.
    async fn next_event(
        &self,
        upstream: &mut CompletionStream,
        span: &tracing::Span,
        attempt_deadline: Instant,
    ) -> Result<StreamEvent, (ProviderError, TokenUsage)> {
        let next = tokio::time::timeout_at(attempt_deadline, upstream.next());
        let item = match next.instrument(span.clone()).await {
            Ok(Some(item)) => item.map_err(|e| attribute(e, self.deadline)),
            Ok(None) => Err(ProviderError::Malformed(
                "stream ended without completion".into(),
            )),
            Err(_) => Err(attribute(ProviderError::Timeout, self.deadline)),
        };
        match item {
            Ok(StreamEvent::Done(completion)) => match implausible(&completion, &self.request) {
                Some(refused) => Err(refused),
                None => Ok(StreamEvent::Done(completion)),
            },
            other => other.map_err(|err| (err, TokenUsage::default())),
        }
    }

    /// After a failed try `retry` at `chain[index]`: the backoff slept before
    /// retrying it, or `None` to move on.
    async fn back_off(&self, err: &ProviderError, index: usize, retry: u32) -> Option<Duration> {
        let has_next = index + 1 < self.chain.len();
        let mut jitter = self.router.jitter;
        let decision = self.router.resilience.retry.decide(
            err,
            retry + 1,
            self.priority,
            has_next,
            Instant::now(),
            self.deadline,
            &mut jitter,
        );
        match decision {
            Decision::RetryAfter(wait) => {
                let before = Instant::now();
                tokio::time::sleep(wait).await;
                Some(before.elapsed())
            }
            Decision::NextTarget | Decision::GiveUp => None,
        }
    }
}

impl Attempt<'_> {
    /// Opens the upstream stream, inside the attempt span (the upstream
    /// `traceparent` names it).
    async fn open(
        &mut self,
        request: &CompletionRequest,
        deadline: Instant,
    ) -> Result<CompletionStream, ProviderError> {
        let (target, attempt_deadline) = (self.target, self.deadline);
        let build = || CompletionRequest {
            model: target.model.clone(),
            deadline: attempt_deadline,
            ..request.clone()
        };
        let provider = &self.provider;
        self.call
            .send(&self.span, build(), build, deadline, |req| {
                provider.stream(req)
            })
            .await
    }

    /// Records the served answer and builds the `Completed` event.
    fn complete(
        self,
        completion: Completion,
        index: usize,
        mut attempts: Vec<AttemptRecord>,
    ) -> RouteEvent {
        span::answered(&self.span, &completion);
        let elapsed = self.call.end(None);
        self.slot.settle(super::tokens(completion.usage));
        self.permit.record(Outcome::Success);
        attempts.push(
            AttemptRecord::succeeded(self.target, self.retry, elapsed, completion.usage)
                .with_waited(self.waited),
        );
        drop(self.span);
        RouteEvent::Completed {
            completion,
            provider: self.target.provider.clone(),
            model: self.target.model.clone(),
            degraded: index > 0,
            attempts,
        }
    }

    /// Records the failure; the span and slot are left to [`Spent::release`].
    fn fail(
        self,
        err: &ProviderError,
        charged: TokenUsage,
        attempts: &mut Vec<AttemptRecord>,
    ) -> Spent {
        failed(&self.span, self.target, self.retry, err);
        let elapsed = self.call.end(Some(err));
        self.permit.record_error(err);
        attempts.push(
            AttemptRecord::failed(self.target, self.retry, elapsed, err)
                .with_usage(charged)
                .with_waited(self.waited),
        );
        Spent {
            span: self.span,
            slot: self.slot,
            reported: super::tokens(charged),
        }
    }
}
