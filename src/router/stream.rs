//! The streaming walk: like [`Router::run`], but output is passed through as
//! it arrives. Until the first piece of output has been handed to the
//! caller a failed attempt is retried in place or falls back exactly as in
//! `run` (breaker, limits, the retry policy: BACKGROUND's full schedule,
//! INTERACTIVE failing over); after it a failure ends the stream.

use super::{
    AttemptOutcome, AttemptRecord, RouteError, RouteOptions, Router,
    attempt::{InFlight, attribute, implausible},
    span,
};
use crate::domain::{Completion, CompletionRequest, ProviderError, StreamEvent, TokenUsage};
use crate::{
    config::TargetConfig,
    resilience::{Outcome, retry::Decision},
};
use futures::{Stream, StreamExt};
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

/// Records a failed attempt on its span (a stream's is a child of the span
/// the stream is polled in, the request's) and in the log (code only).
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
    /// Streams the answer along `chain`. Dropping the stream cancels the
    /// upstream call.
    pub fn stream(
        &self,
        mut chain: Vec<TargetConfig>,
        request: CompletionRequest,
        deadline: Instant,
        options: &RouteOptions,
    ) -> impl Stream<Item = RouteEvent> + Send + use<> {
        let router = self.clone();
        let priority = options.priority;
        options.call_as(&mut chain);
        async_stream::stream! {
            let mut attempts: Vec<AttemptRecord> = Vec::new();
            for (index, target) in chain.iter().enumerate() {
                let has_next = index + 1 < chain.len();
                // Announced only when the next target will be tried: past
                // the deadline the walk ends instead.
                let fallback = |reason: String| {
                    chain.get(index + 1).filter(|_| Instant::now() < deadline).map(|next| RouteEvent::Fallback {
                        from: target.provider.clone(),
                        to: next.provider.clone(),
                        reason,
                    })
                };
                let mut retry = 0_u32;
                // Backoff slept before this attempt (credited to it).
                let mut slept = Duration::ZERO;
                loop {
                    if Instant::now() >= deadline {
                        if let Some(last) = attempts.last_mut() {
                            last.waited += slept;
                        }
                        yield RouteEvent::Failed(RouteError::DeadlineExceeded { attempts });
                        return;
                    }
                    let (Some(provider), Some(guards)) = (router.providers.get(&target.provider), router.resilience.get(&target.provider)) else { break };
                    let permit = match guards.breaker.try_acquire() {
                        Ok(permit) => permit,
                        Err(rejected) => {
                            let outcome = if rejected.is_cooldown() { AttemptOutcome::SkippedRateLimited } else { AttemptOutcome::SkippedCircuitOpen };
                            attempts.push(AttemptRecord::skipped(target, outcome, rejected.code()).with_retry(retry).with_waited(std::mem::take(&mut slept)));
                            if let Some(event) = fallback(rejected.code().to_owned()) {
                                yield event;
                            }
                            break;
                        }
                    };
                    let asked = Instant::now();
                    let slot = guards.limits.acquire(super::wait_until(priority, deadline), request.token_estimate()).await;
                    // The backoff slept before this attempt and its wait
                    // for a slot, as `run` credits them.
                    let waited = std::mem::take(&mut slept) + asked.elapsed();
                    let slot = match slot {
                        Ok(slot) => slot,
                        Err(rejected) => {
                            drop(permit);
                            attempts.push(AttemptRecord::skipped(target, AttemptOutcome::SkippedRateLimited, rejected.code()).with_retry(retry).with_waited(waited));
                            // A background call waits for room until the deadline.
                            if let Some(event) = fallback(rejected.code().to_owned()) {
                                yield event;
                            }
                            break;
                        }
                    };
                    // Tokens the provider reported for a failed attempt.
                    let mut reported = None;
                    // Timed from here, as in `run`: a rate-limiter wait is not provider time.
                    let mut call = InFlight::start(guards, target);
                    let attempt_deadline = router.attempt_deadline(&target.provider, call.started(), deadline);
                    let req = CompletionRequest { model: target.model.clone(), deadline: attempt_deadline, ..request.clone() };
                    let span = span::attempt(target, router.kind(&target.provider), &req.trace_id, retry);
                    yield RouteEvent::Started { provider: target.provider.clone(), model: target.model.clone() };

                    // Opened inside the attempt span: the upstream `traceparent` names it.
                    let again = || CompletionRequest { model: target.model.clone(), deadline: attempt_deadline, ..request.clone() };
                    let opened = call.send(&span, req, again, deadline, |req| provider.stream(req)).await;
                    // The error that ended this attempt before any output:
                    // retried here or moved on from, as `run` does.
                    let err = match opened {
                        Err(err) => {
                            failed(&span, target, retry, &err);
                            let elapsed = call.end(Some(&err));
                            permit.record_error(&err);
                            attempts.push(AttemptRecord::failed(target, retry, elapsed, &err).with_waited(waited));
                            err
                        }
                        Ok(mut upstream) => {
                            let mut sent_output = false;
                            let err = loop {
                                let next = tokio::time::timeout_at(attempt_deadline, upstream.next());
                                let item = match next.instrument(span.clone()).await {
                                    Ok(Some(item)) => item.map_err(|e| attribute(e, deadline)),
                                    Ok(None) => Err(ProviderError::Malformed("stream ended without completion".into())),
                                    Err(_) => Err(attribute(ProviderError::Timeout, deadline)),
                                };
                                // Absurd token counts make the answer malformed; it is
                                // charged their plausible part.
                                let mut charged = TokenUsage::default();
                                let item = match item {
                                    Ok(StreamEvent::Done(completion)) => match implausible(&completion, &request) {
                                        Some((err, capped)) => {
                                            charged = capped;
                                            Err(err)
                                        }
                                        None => Ok(StreamEvent::Done(completion)),
                                    },
                                    other => other,
                                };
                                match item {
                                    Ok(StreamEvent::Delta(text)) => {
                                        sent_output = true;
                                        yield RouteEvent::Delta(text);
                                    }
                                    Ok(StreamEvent::Done(completion)) => {
                                        span::answered(&span, &completion);
                                        let elapsed = call.end(None);
                                        slot.settle(super::tokens(completion.usage));
                                        permit.record(Outcome::Success);
                                        attempts.push(AttemptRecord::succeeded(target, retry, elapsed, completion.usage).with_waited(waited));
                                        drop(span);
                                        yield RouteEvent::Completed {
                                            completion,
                                            provider: target.provider.clone(),
                                            model: target.model.clone(),
                                            degraded: index > 0,
                                            attempts,
                                        };
                                        return;
                                    }
                                    Err(err) => {
                                        failed(&span, target, retry, &err);
                                        let elapsed = call.end(Some(&err));
                                        permit.record_error(&err);
                                        reported = super::tokens(charged);
                                        attempts.push(AttemptRecord::failed(target, retry, elapsed, &err).with_usage(charged).with_waited(waited));
                                        break err;
                                    }
                                }
                            };
                            // Output already reached the caller: no retry,
                            // no fallback, the stream ends.
                            if sent_output {
                                slot.settle(reported);
                                yield RouteEvent::Failed(if matches!(err, ProviderError::Deadline) {
                                    RouteError::DeadlineExceeded { attempts }
                                } else {
                                    RouteError::AllProvidersFailed { attempts }
                                });
                                return;
                            }
                            err
                        }
                    };
                    // The attempt is over: its span ends, and both permits
                    // go before any sleep.
                    drop(span);
                    slot.settle(reported);
                    let mut jitter = router.jitter;
                    let decision = router.resilience.retry.decide(&err, retry + 1, priority, has_next, Instant::now(), deadline, &mut jitter);
                    match decision {
                        Decision::RetryAfter(wait) => {
                            let before = Instant::now();
                            tokio::time::sleep(wait).await;
                            slept = before.elapsed();
                            retry += 1;
                        }
                        Decision::NextTarget | Decision::GiveUp => {
                            if let Some(event) = fallback(err.code()) {
                                yield event;
                            }
                            break;
                        }
                    }
                }
            }
            if Instant::now() >= deadline {
                yield RouteEvent::Failed(RouteError::DeadlineExceeded { attempts });
            } else {
                yield RouteEvent::Failed(RouteError::AllProvidersFailed { attempts });
            }
        }
    }
}
