//! A chat call (SPEC §13, the HTTP edge's Chat Completions): the caller's
//! own messages and tools under a task's chain, fallbacks, breakers, pricing
//! and defaults. No template runs, so no prompt is recorded; the model's
//! tool calls come back to the caller, who runs its own tools.

use super::{Call, CallContext, CallError, CallEvent, Feature, Pipeline, audit};
use crate::{
    domain::{ChatMessage, Completion, CompletionRequest, JsonSchemaFormat, ToolChoice, ToolSpec},
    router::RouteOptions,
    tasks::TaskError,
};
use futures::Stream;
use serde_json::Value;

/// One chat call, parsed by an edge.
#[derive(Debug, Clone)]
pub struct Chat {
    /// The task whose chain, pricing and defaults apply.
    pub task: String,
    pub system: Option<String>,
    /// Oldest first, as the caller sent them.
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    /// The caller's, else the task's.
    pub temperature: Option<f32>,
    /// The caller's, else the task's `max_tokens`.
    pub max_tokens: Option<u32>,
    pub response_format: Option<JsonSchemaFormat>,
}

impl Chat {
    /// The model call's request: the caller's settings over the task's.
    fn request(self, call: &Call) -> CompletionRequest {
        let task = call.pipeline.config().tasks.get(&self.task);
        CompletionRequest {
            model: String::new(),
            system: self.system,
            messages: self.messages,
            temperature: self
                .temperature
                .or_else(|| task.and_then(|t| t.temperature)),
            max_tokens: self
                .max_tokens
                .or_else(|| task.map(|t| t.max_tokens))
                .unwrap_or(512),
            response_format: self.response_format,
            tools: self.tools,
            tool_choice: self.tool_choice,
            trace_id: call.ctx.trace_id.clone(),
            traceparent: call.ctx.traceparent.clone(),
            deadline: call.ctx.deadline,
        }
    }
}

impl Feature for Chat {
    type Output = Completion;

    fn task(&self) -> String {
        self.task.clone()
    }

    fn audit_input(&self) -> Option<Value> {
        Some(audit::messages(self.system.as_deref(), &self.messages))
    }

    async fn run(self, call: &Call) -> Result<Completion, CallError> {
        let task = self.task.clone();
        let chain = call
            .pipeline
            .router()
            .chain(&task)
            .map_err(TaskError::from)?;
        let request = self.request(call);
        let options = call.route_options();
        let ((), completion) = call
            .routed(&task, chain, &request, &options, |_| Ok(()))
            .await?;
        Ok(completion)
    }
}

impl Pipeline {
    /// Streams a chat call's one model call; errors before the first event
    /// are `Err`. The last event is `Completed` (recorded, settled) or `Failed`.
    pub async fn stream_chat(
        &self,
        ctx: CallContext,
        chat: Chat,
    ) -> Result<impl Stream<Item = CallEvent> + Send + use<>, CallError> {
        let call = self.open(ctx, &chat.task)?;
        call.audit_input(|| chat.audit_input());
        let task = chat.task.clone();
        let request = chat.request(&call);
        let options = call.route_options();
        call.stream(&task, request, options).await
    }
}

impl Call {
    /// The call's routing: its priority, the chain's own models.
    fn route_options(&self) -> RouteOptions {
        RouteOptions {
            priority: self.ctx.priority,
            primary_model: None,
        }
    }
}
