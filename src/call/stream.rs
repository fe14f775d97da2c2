//! A streamed model call (`ExecuteStream`): reserved, its events passed
//! through, and the call finished (recorded, settled) before its last event.

use super::{Call, CallContext, CallError, CallMeta, Feature, Pipeline};
use crate::{
    config::guardrails::Stage,
    domain::{Completion, CompletionRequest},
    router::{RouteEvent, RouteOptions},
    tasks::{
        TaskError,
        execute::{self, Execute},
    },
};
use futures::{Stream, StreamExt};
use serde_json::{Map, Value};

/// What a streamed call reports, in order.
#[derive(Debug)]
pub enum CallEvent {
    /// A target is being called.
    Started {
        /// Provider name.
        provider: String,
        /// Model name.
        model: String,
    },
    /// The previous target failed before any output; moving to the next.
    Fallback {
        from: String,
        to: String,
        reason: String,
    },
    /// A piece of output.
    Delta(String),
    /// The answer, recorded and settled. Always the last event on success.
    Completed {
        completion: Box<Completion>,
        /// The answer as a JSON object, if it is one and fits the output schema
        /// (streamed text cannot be taken back: a mismatch only leaves this empty).
        json: Option<Map<String, Value>>,
        meta: CallMeta,
    },
    /// No answer (or it could not be recorded); the last event on failure.
    Failed(CallError),
}

impl Pipeline {
    /// Streams a task's one model call; errors before the first event are `Err`.
    pub async fn stream(
        &self,
        ctx: CallContext,
        execute: Execute,
    ) -> Result<impl Stream<Item = CallEvent> + Send + use<>, CallError> {
        let call = self.open(ctx, &execute.task)?;
        call.audit_input(|| Feature::audit_input(&execute));
        let tasks = self.tasks();
        let prompt_key = execute.prompt_key.as_deref();
        let prepared =
            execute::prepare(tasks, &call, &execute.task, prompt_key, execute.input).await;
        let (rendered, format) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => return Err(call.refused(e)),
        };
        let validator = tasks.output_validator(&execute.task);
        let request = call.request(&execute.task, &rendered, format);
        let options = RouteOptions {
            priority: call.ctx.priority,
            primary_model: rendered.prompt.model.clone(),
        };
        let events = call.stream(&execute.task, request, options).await?;
        Ok(events.map(move |event| match event {
            CallEvent::Completed {
                completion, meta, ..
            } => CallEvent::Completed {
                json: execute::parse(&completion.text, validator.as_deref())
                    .ok()
                    .and_then(|o| o.json),
                completion,
                meta,
            },
            other => other,
        }))
    }
}

impl Call {
    /// Reserves one model call of `request`, then streams it. Dropping the
    /// stream cancels the upstream call and settles the reservation at its
    /// estimate.
    pub(super) async fn stream(
        self,
        task: &str,
        request: CompletionRequest,
        options: RouteOptions,
    ) -> Result<impl Stream<Item = CallEvent> + Send + use<>, CallError> {
        let router = self.pipeline.router().clone();
        let chain = router
            .chain(task)
            .map_err(|e| self.refused(TaskError::from(e)))?;
        // Priced as called: a prompt's model override at the primary.
        self.reserve(task, &options.chain_as_called(chain), &request)
            .await
            .map_err(|e| self.refused(e))?;
        let guardrails = self.task_guardrails(task);
        let mut pii = self.task_pii(task);
        let request = match pii.as_mut() {
            Some(p) => p.mask(&request),
            None => request,
        };
        let request = match self.screen_request(&guardrails, task, &request).await {
            Ok(screened) => screened.unwrap_or(request),
            Err(e) => return Err(self.refused(e)),
        };
        // Output screened, or placeholders put back, needs the whole answer:
        // it is sent in one piece (a placeholder may span two deltas).
        let restore = pii.as_ref().is_some_and(|p| p.restore);
        let hold = restore || guardrails.iter().any(|g| g.applies(Stage::Output));
        let task = task.to_owned();
        let events = router.stream(chain.to_vec(), request, self.ctx.deadline, &options);
        Ok(async_stream::stream! {
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                match event {
                    RouteEvent::Started { provider, model } => yield CallEvent::Started { provider, model },
                    RouteEvent::Fallback { from, to, reason } => yield CallEvent::Fallback { from, to, reason },
                    RouteEvent::Delta(text) if !hold => yield CallEvent::Delta(text),
                    RouteEvent::Delta(_) => {}
                    RouteEvent::Completed { mut completion, provider, model, degraded, attempts } => {
                        self.audit_answer(&completion);
                        {
                            let mut log = self.log();
                            log.add(&attempts, self.pipeline.meter().pricing());
                            log.served = Some((provider, model, degraded));
                        }
                        if hold {
                            match self.screen(&guardrails, Stage::Output, &completion.text, &task, true).await {
                                Ok(text) => {
                                    completion.text = pii.as_ref().map_or_else(|| text.clone(), |p| p.shown(&text));
                                    if let Some(p) = &pii {
                                        p.show_calls(&mut completion.tool_calls);
                                    }
                                    if !completion.text.is_empty() {
                                        yield CallEvent::Delta(completion.text.clone());
                                    }
                                }
                                Err(e) => {
                                    if let Err(err) = self.finish::<()>(Err(e.into())).await {
                                        yield CallEvent::Failed(err);
                                    }
                                    return;
                                }
                            }
                        }
                        yield match self.finish(Ok(())).await {
                            Ok(((), meta)) => CallEvent::Completed { completion: Box::new(completion), json: None, meta },
                            Err(err) => CallEvent::Failed(err),
                        };
                        return;
                    }
                    RouteEvent::Failed(err) => {
                        self.log().add(err.attempts(), self.pipeline.meter().pricing());
                        if let Err(err) = self.finish::<()>(Err(CallError::Route(err))).await {
                            yield CallEvent::Failed(err);
                        }
                        return;
                    }
                }
            }
        })
    }
}
