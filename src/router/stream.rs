//! The streaming walk: like [`Router::run`], but output is passed through as
//! it arrives. Falling back is only possible until the first piece of output
//! has been handed to the caller; after that a failure ends the stream.

use super::{AttemptRecord, RouteError, Router};
use crate::providers::{Completion, CompletionRequest, ProviderError, StreamEvent};
use futures::{Stream, StreamExt};
use tokio::time::Instant;

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
    /// Streams the task's answer. Dropping the stream cancels the upstream call.
    pub fn stream(
        &self,
        task: &str,
        request: CompletionRequest,
        deadline: Instant,
    ) -> impl Stream<Item = RouteEvent> + Send + 'static {
        let router = self.clone();
        let task = task.to_owned();
        async_stream::stream! {
            let chain = match router.chain(&task) {
                Ok(chain) => chain.to_vec(),
                Err(err) => { yield RouteEvent::Failed(err); return; }
            };
            let mut attempts: Vec<AttemptRecord> = Vec::new();
            for (index, target) in chain.iter().enumerate() {
                let now = Instant::now();
                if now >= deadline {
                    yield RouteEvent::Failed(RouteError::DeadlineExceeded { attempts });
                    return;
                }
                let Some(provider) = router.providers.get(&target.provider) else { continue };
                let attempt_deadline = router.attempt_deadline(&target.provider, now, deadline);
                let req = CompletionRequest { model: target.model.clone(), deadline: attempt_deadline, ..request.clone() };
                yield RouteEvent::Started { provider: target.provider.clone(), model: target.model.clone() };

                let opened = tokio::time::timeout_at(attempt_deadline, provider.stream(req)).await;
                let mut upstream = match opened {
                    Ok(Ok(s)) => s,
                    Ok(Err(err)) => {
                        attempts.push(AttemptRecord::failed(target, 0, now.elapsed(), &err));
                        if let Some(next) = chain.get(index + 1) {
                            yield RouteEvent::Fallback { from: target.provider.clone(), to: next.provider.clone(), reason: err.code() };
                        }
                        continue;
                    }
                    Err(_) => {
                        attempts.push(AttemptRecord::failed(target, 0, now.elapsed(), &ProviderError::Timeout));
                        if let Some(next) = chain.get(index + 1) {
                            yield RouteEvent::Fallback { from: target.provider.clone(), to: next.provider.clone(), reason: ProviderError::Timeout.code() };
                        }
                        continue;
                    }
                };
                let mut sent_output = false;
                loop {
                    let item = match tokio::time::timeout_at(attempt_deadline, upstream.next()).await {
                        Ok(Some(item)) => item,
                        Ok(None) => Err(ProviderError::Malformed("stream ended without completion".into())),
                        Err(_) => Err(ProviderError::Timeout),
                    };
                    match item {
                        Ok(StreamEvent::Delta(text)) => {
                            sent_output = true;
                            yield RouteEvent::Delta(text);
                        }
                        Ok(StreamEvent::Done(completion)) => {
                            attempts.push(AttemptRecord::succeeded(target, 0, now.elapsed(), completion.usage));
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
                            attempts.push(AttemptRecord::failed(target, 0, now.elapsed(), &err));
                            if sent_output {
                                yield RouteEvent::Failed(RouteError::AllProvidersFailed { attempts });
                                return;
                            }
                            if let Some(next) = chain.get(index + 1) {
                                yield RouteEvent::Fallback { from: target.provider.clone(), to: next.provider.clone(), reason: err.code() };
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
