//! A streamed model call (`ExecuteStream`): reserved first, then its events
//! passed through as the router yields them; the call is finished (its
//! record written, its reservations settled) before its last event.

use super::{Call, CallError, CallMeta};
use crate::{
    providers::{Completion, JsonSchemaFormat},
    router::{RouteEvent, RouteOptions},
    tasks::{Rendered, TaskError},
};
use futures::{Stream, StreamExt};

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
        /// Provider that failed.
        from: String,
        /// Provider tried next.
        to: String,
        /// Stable error code.
        reason: String,
    },
    /// A piece of output.
    Delta(String),
    /// The answer, recorded and settled. Always the last event on success.
    Completed {
        /// The assembled answer.
        completion: Box<Completion>,
        /// The call's meta.
        meta: CallMeta,
    },
    /// No answer (or it could not be recorded); always the last event on
    /// failure.
    Failed(CallError),
}

impl Call {
    /// Reserves one model call of `task` with `prompt`, then streams it.
    /// The stream owns the call: dropping it cancels the upstream call and
    /// settles the reservation at its estimate.
    pub async fn stream(
        self,
        task: &str,
        prompt: &Rendered,
        format: Option<JsonSchemaFormat>,
    ) -> Result<impl Stream<Item = CallEvent> + Send + use<>, CallError> {
        let router = self.pipeline.router().clone();
        let chain = router
            .chain(task)
            .map_err(|e| self.refused(TaskError::from(e)))?;
        let request = self.request(task, prompt, format);
        let options = RouteOptions {
            priority: self.ctx.priority,
            primary_model: prompt.prompt.model.clone(),
        };
        // Priced as called: a prompt's model override at the primary.
        self.reserve(task, &options.chain_as_called(chain), &request)
            .await
            .map_err(|e| self.refused(e))?;
        let events = router.stream(chain.to_vec(), request, self.ctx.deadline, &options);
        Ok(async_stream::stream! {
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                match event {
                    RouteEvent::Started { provider, model } => yield CallEvent::Started { provider, model },
                    RouteEvent::Fallback { from, to, reason } => yield CallEvent::Fallback { from, to, reason },
                    RouteEvent::Delta(text) => yield CallEvent::Delta(text),
                    RouteEvent::Completed { completion, provider, model, degraded, attempts } => {
                        {
                            let mut log = self.log();
                            log.add(&attempts, self.pipeline.meter().pricing());
                            log.served = Some((provider, model, degraded));
                        }
                        yield match self.finish(Ok(())).await {
                            Ok(((), meta)) => CallEvent::Completed { completion: Box::new(completion), meta },
                            Err(err) => CallEvent::Failed(err),
                        };
                        return;
                    }
                    RouteEvent::Failed(err) => {
                        self.log().add(err.attempts(), self.pipeline.meter().pricing());
                        // A failed route always finishes with an error.
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
