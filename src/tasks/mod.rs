//! The typed tasks: each builds its prompt, asks the router for an answer it
//! can parse and validate, and shapes the result. Tasks know nothing of gRPC.

pub mod execute;
pub mod opt_out;
pub mod research;
pub mod sms_classify;
pub mod sms_encoding;
pub mod sms_generate;

use crate::{
    config::Config,
    prompts::{self, Prompt, TemplateError, store::PromptStore},
    providers::{ChatMessage, Completion, CompletionRequest, JsonSchemaFormat, Role, TokenUsage},
    router::{AttemptRecord, RouteError, RouteOptions, Router},
    usage::{MeterError, MeterSession},
};
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use tokio::time::Instant;

/// Where a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Channel {
    /// SMS inbox pipeline.
    Sms,
    /// Web front end.
    Web,
    /// Backend job.
    #[default]
    System,
}

/// Latency/success trade-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Priority {
    /// A human waits: fail over rather than wait.
    #[default]
    Interactive,
    /// Nobody waits: full retry schedule.
    Background,
}

impl Channel {
    /// Lower-case name for records.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Web => "web",
            Channel::System => "system",
        }
    }
}

impl Priority {
    /// Lower-case name for records.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Background => "background",
        }
    }
}

/// Who is asking, parsed and validated at the API edge.
#[derive(Debug, Clone)]
pub struct CallContext {
    /// Tenant, never empty.
    pub team_id: String,
    /// End user, may be empty.
    pub user_id: String,
    /// Trace ID of the request.
    pub trace_id: String,
    /// Channel.
    pub channel: Channel,
    /// Priority.
    pub priority: Priority,
    /// When the request started.
    pub started: Instant,
    /// When everything must be over.
    pub deadline: Instant,
    /// Metering of this request.
    pub meter: Arc<MeterSession>,
    /// This request's slot under `server.max_concurrent_requests`.
    pub slot: Option<Arc<tokio::sync::OwnedSemaphorePermit>>,
    /// The caller's valid W3C `traceparent`, continued by our spans and
    /// forwarded upstream when trace export is off.
    pub traceparent: Option<String>,
}

/// What happened while serving a call (becomes `ResponseMeta`).
#[derive(Debug, Clone, Default)]
pub struct CallMeta {
    /// Trace ID.
    pub trace_id: String,
    /// Serving provider (empty when none was needed).
    pub provider: String,
    /// Serving model.
    pub model: String,
    /// A fallback served.
    pub degraded: bool,
    /// Every attempt.
    pub attempts: Vec<AttemptRecord>,
    /// Tokens over all attempts.
    pub usage: TokenUsage,
    /// Cost in USD, when every model involved has a price.
    pub cost_usd: Option<f64>,
    /// Server-side latency.
    pub latency: Duration,
    /// Prompt key.
    pub prompt_key: String,
    /// Prompt version (0 = built-in).
    pub prompt_version: u32,
}

/// Why a task produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The input is unusable; each entry is `(field, description)`.
    #[error("invalid input")]
    Invalid(Vec<(String, String)>),
    /// Routing failed.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// Metering refused the call (cap, budget) or could not reserve.
    #[error(transparent)]
    Meter(#[from] MeterError),
}

impl TaskError {
    /// One invalid field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        TaskError::Invalid(vec![(field.into(), description.into())])
    }
}

/// The variable holding `Execute`'s whole input object; only `Execute`
/// provides it, so its presence tells the two kinds of caller apart.
const EXECUTE_INPUT_VAR: &str = "input";

/// Reports a prompt that does not render. For `Execute` a missing variable
/// is a missing input field (`input.<name>`), which the caller can supply.
/// A typed RPC has no `input` field and fixed variables, so there the stored
/// prompt is at fault: the violation is on `prompt` and names the variable,
/// the prompt version and what the RPC provides.
fn template_error(
    err: TemplateError,
    prompt: &Prompt,
    vars: &BTreeMap<String, String>,
) -> TaskError {
    match &err {
        TemplateError::Missing(name) if vars.contains_key(EXECUTE_INPUT_VAR) => {
            TaskError::invalid(format!("input.{name}"), err.to_string())
        }
        TemplateError::Missing(name) => {
            let owner = if prompt.owner.is_empty() {
                "global".to_owned()
            } else {
                format!("team `{}`", prompt.owner)
            };
            let rpc = prompts::typed_rpc(&prompt.key).unwrap_or("this RPC");
            let provided = vars.keys().map(String::as_str).collect::<Vec<_>>();
            TaskError::invalid(
                "prompt",
                format!(
                    "prompt `{}` v{} ({owner}) uses template variable `{name}`, which {rpc} does not provide (it provides: {}); activate a version that uses only those",
                    prompt.key,
                    prompt.version,
                    provided.join(", ")
                ),
            )
        }
        TemplateError::Unclosed => TaskError::invalid("prompt", err.to_string()),
        // The request's own text, repeated or escaped by the template, is
        // what grew past the limit.
        TemplateError::TooLarge { .. } if vars.contains_key(EXECUTE_INPUT_VAR) => {
            TaskError::invalid(EXECUTE_INPUT_VAR, err.to_string())
        }
        TemplateError::TooLarge { .. } => TaskError::invalid("prompt", err.to_string()),
    }
}

/// What tasks share: config, router, prompt store.
#[derive(Clone)]
pub struct TaskRunner {
    /// Loaded config.
    pub config: Arc<Config>,
    /// The router.
    pub router: Router,
    /// Versioned prompts.
    pub prompts: PromptStore,
    /// Compiled output schemas of generic tasks, by task name.
    pub output_schemas: Arc<std::collections::HashMap<String, Arc<jsonschema::Validator>>>,
}

/// A prompt ready to send: rendered system and user text.
pub(crate) struct Rendered {
    pub prompt: Prompt,
    pub system: String,
    pub user: String,
}

impl TaskRunner {
    /// A runner; compiles the tasks' output schemas (validated at config load).
    pub fn new(config: Arc<Config>, router: Router, prompts: PromptStore) -> Self {
        let output_schemas = config
            .tasks
            .iter()
            .filter_map(|(name, t)| {
                let schema = t.output_schema.as_ref()?;
                jsonschema::validator_for(schema)
                    .ok()
                    .map(|v| (name.clone(), Arc::new(v)))
            })
            .collect();
        Self {
            config,
            router,
            prompts,
            output_schemas: Arc::new(output_schemas),
        }
    }

    /// The compiled output schema of `task`, if it has one.
    pub fn output_validator(&self, task: &str) -> Option<Arc<jsonschema::Validator>> {
        self.output_schemas.get(task).cloned()
    }

    /// Resolves the prompt for `key` (team version, global version, built-in)
    /// and renders it with `vars` (system and user templates share them).
    pub(crate) async fn render(
        &self,
        ctx: &CallContext,
        key: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Rendered, TaskError> {
        let prompt = match self.prompts.resolve(&ctx.team_id, key).await {
            Ok(p) => p,
            Err(e) => {
                // The built-in default keeps the product working when the
                // prompt table cannot be read.
                tracing::warn!(trace_id = %ctx.trace_id, error = %e, key, "prompt store unavailable; using the built-in prompt");
                prompts::builtin(key)
            }
        };
        ctx.meter
            .note_prompt(&prompt.owner, &prompt.key, prompt.version);
        // One budget for both texts: together they are what is sent.
        let limit = self.config.server.max_prompt_bytes;
        let system = prompts::render_bounded(&prompt.system, vars, limit)
            .map_err(|e| template_error(e, &prompt, vars))?;
        let user = prompts::render_bounded(&prompt.user_template, vars, limit - system.len())
            .map_err(|e| template_error(e, &prompt, vars))?;
        Ok(Rendered {
            prompt,
            system,
            user,
        })
    }

    /// Builds the completion request for a task from a rendered prompt.
    pub(crate) fn request(
        &self,
        task: &str,
        rendered: &Rendered,
        ctx: &CallContext,
        response_format: Option<JsonSchemaFormat>,
    ) -> CompletionRequest {
        let task_cfg = self.config.tasks.get(task);
        CompletionRequest {
            model: String::new(),
            system: Some(rendered.system.clone()),
            messages: vec![ChatMessage {
                role: Role::User,
                content: rendered.user.clone(),
            }],
            temperature: rendered
                .prompt
                .temperature
                .or_else(|| task_cfg.and_then(|t| t.temperature)),
            max_tokens: rendered
                .prompt
                .max_tokens
                .or_else(|| task_cfg.map(|t| t.max_tokens))
                .unwrap_or(512),
            response_format,
            trace_id: ctx.trace_id.clone(),
            traceparent: ctx.traceparent.clone(),
            deadline: ctx.deadline,
        }
    }

    /// Routes a request and builds the meta of the answer.
    pub(crate) async fn route<T>(
        &self,
        task: &str,
        rendered: &Rendered,
        ctx: &CallContext,
        request: &CompletionRequest,
        parse: impl Fn(&Completion) -> Result<T, String>,
    ) -> Result<(T, Completion, CallMeta), TaskError> {
        ctx.meter
            .reserve(task, self.router.chain(task)?, request)
            .await?;
        let options = RouteOptions {
            priority: ctx.priority,
            primary_model: rendered.prompt.model.clone(),
        };
        let routed = self
            .router
            .run(task, request, ctx.deadline, &options, parse)
            .await?;
        let meta = CallMeta {
            trace_id: ctx.trace_id.clone(),
            usage: routed.usage(),
            provider: routed.provider,
            model: routed.model,
            degraded: routed.degraded,
            attempts: routed.attempts,
            cost_usd: None,
            latency: ctx.started.elapsed(),
            prompt_key: rendered.prompt.key.clone(),
            prompt_version: rendered.prompt.version,
        };
        Ok((routed.value, routed.completion, meta))
    }
}

/// One earlier SMS of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmsTurn {
    /// Sent by the lead (true) or by us (false).
    pub inbound: bool,
    /// Message text.
    pub text: String,
}

/// Formats an SMS history for a prompt, oldest first, as inert data.
pub(crate) fn history_text(history: &[SmsTurn]) -> String {
    if history.is_empty() {
        return "(none)".into();
    }
    history
        .iter()
        .map(|turn| {
            format!(
                "{}: {}",
                if turn.inbound { "LEAD" } else { "US" },
                prompts::as_data(&turn.text)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Parses a model answer as a JSON object, tolerating a Markdown code fence
/// around it (some models add one even when asked not to).
pub(crate) fn parse_json_object(
    text: &str,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let trimmed = text.trim();
    let body = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .unwrap_or(trimmed)
        .trim();
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err("answer is not a JSON object".into()),
        Err(e) => Err(format!("answer is not JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(names: &[&str]) -> BTreeMap<String, String> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), String::new()))
            .collect()
    }

    fn violation(err: TaskError) -> (String, String) {
        match err {
            TaskError::Invalid(mut v) => v.remove(0),
            other => panic!("not invalid input: {other:?}"),
        }
    }

    #[test]
    fn a_missing_variable_is_an_input_field_only_for_execute() {
        let missing = || TemplateError::Missing("company".into());
        let mut prompt = prompts::builtin("sms_classify");
        prompt.owner = "t1".into();
        prompt.version = 3;

        let (field, why) = violation(template_error(
            missing(),
            &prompt,
            &vars(&["message", "history"]),
        ));
        assert_eq!(field, "prompt");
        assert_eq!(
            why,
            "prompt `sms_classify` v3 (team `t1`) uses template variable `company`, which \
ClassifySms does not provide (it provides: history, message); activate a version that uses only those"
        );

        let (field, _) = violation(template_error(
            missing(),
            &prompt,
            &vars(&["input", "task", "message"]),
        ));
        assert_eq!(field, "input.company", "Execute on the same key");
    }
}
