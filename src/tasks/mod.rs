//! The typed tasks: each builds its prompt, asks for an answer it can parse and
//! validate, and shapes the result. Tasks know nothing of gRPC, the ledger or providers:
//! they call models through a [`Session`], which the call pipeline (`crate::call`) provides.

pub mod execute;
pub mod opt_out;
pub mod research;
pub mod sms_classify;
pub mod sms_generate;

use crate::{
    config::Config,
    domain::{Completion, JsonSchemaFormat},
    prompts::{self, Prompt, TemplateError},
    router::RouteError,
    usage::MeterError,
};
use std::{collections::BTreeMap, future::Future, sync::Arc};

/// A task's view of the call it serves: prompt rendering and model calls. The call
/// records every attempt, so a task that calls twice (a redraft) is billed for both.
pub trait Session: Sync {
    /// Resolves the prompt for `key` (team, global, built-in) and renders it with `vars`.
    fn render(
        &self,
        key: &str,
        vars: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Rendered, TaskError>> + Send;

    /// Like [`Session::render`] for a key the request named: only a stored version (the
    /// team's active one, else the global one) will do, else [`TaskError::PromptNotFound`].
    fn render_named(
        &self,
        key: &str,
        vars: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Rendered, TaskError>> + Send;

    /// One model call; a `parse` error is a malformed answer, so the chain moves on.
    fn complete<T: Send>(
        &self,
        task: &str,
        prompt: &Rendered,
        format: Option<JsonSchemaFormat>,
        parse: impl Fn(&Completion) -> Result<T, String> + Send + Sync,
    ) -> impl Future<Output = Result<(T, Completion), TaskError>> + Send;

    /// Records an answer given by a rule (an opt-out keyword), reporting `key` as prompt key.
    fn answered_by_rule(&self, key: &str);
}

/// A request for one task, run by the call pipeline through a [`Session`].
pub trait Task: Send {
    type Output: Send;

    /// The task it runs (its usage record's task, its routing chain).
    fn name(&self) -> &str;

    /// The caller's request as JSON: what the call's audit event digests
    /// (after redaction, so a lead's email or phone never shows through).
    fn input(&self) -> serde_json::Value;

    /// Runs the task through `session`.
    fn run(
        self,
        tasks: &Tasks,
        session: &impl Session,
    ) -> impl Future<Output = Result<Self::Output, TaskError>> + Send;
}

/// A prompt ready to send: the resolved version and its rendered texts.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub prompt: Prompt,
    pub system: String,
    pub user: String,
}

/// Why a task produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The input is unusable; each entry is `(field, description)`.
    #[error("invalid input")]
    Invalid(Vec<(String, String)>),
    #[error(transparent)]
    Route(#[from] RouteError),
    /// Metering refused the call (cap, budget) or could not reserve.
    #[error(transparent)]
    Meter(#[from] MeterError),
    /// The prompt key the request named has no stored version, the team's or a global one.
    #[error("no prompt `{0}` for the team or global")]
    PromptNotFound(String),
    /// The prompt store could not be read for a key the request named (no built-in stands in).
    #[error("the prompt store is unavailable: {0}")]
    PromptStore(String),
    /// The call's durable state (its audit events) could not be written.
    #[error("storage: {0}")]
    Storage(String),
    /// A guardrail with `action = "block"` detected something (SPEC §15).
    #[error("guardrail `{guardrail}` blocked the {stage}")]
    GuardrailBlocked {
        guardrail: String,
        /// Where: `input`, `output`, ...
        stage: &'static str,
        /// After a provider answered: the call spent tokens and is recorded.
        answered: bool,
    },
}

impl TaskError {
    /// One invalid field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        TaskError::Invalid(vec![(field.into(), description.into())])
    }
}

/// `Execute`'s whole input; only `Execute` provides it, so it tells the callers apart.
const EXECUTE_INPUT_VAR: &str = "input";

/// Reports a prompt that does not render. For `Execute` a missing variable is a missing
/// input field; a typed RPC's variables are fixed, so there the stored prompt is at fault.
pub fn template_error(
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
        // The request's own text, repeated or escaped by the template, grew past the limit.
        TemplateError::TooLarge { .. } if vars.contains_key(EXECUTE_INPUT_VAR) => {
            TaskError::invalid(EXECUTE_INPUT_VAR, err.to_string())
        }
        TemplateError::TooLarge { .. } => TaskError::invalid("prompt", err.to_string()),
    }
}

/// What tasks know at start-up: the config and generic tasks' compiled output schemas.
#[derive(Clone)]
pub struct Tasks {
    pub config: Arc<Config>,
    output_schemas: Arc<std::collections::HashMap<String, Arc<jsonschema::Validator>>>,
}

impl Tasks {
    /// The tasks of `config`, their output schemas (validated at load) compiled.
    pub fn new(config: Arc<Config>) -> Self {
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
            output_schemas: Arc::new(output_schemas),
        }
    }

    /// The compiled output schema of `task`, if it has one.
    pub fn output_validator(&self, task: &str) -> Option<Arc<jsonschema::Validator>> {
        self.output_schemas.get(task).cloned()
    }

    /// Whether `task` is configured.
    pub fn known(&self, task: &str) -> bool {
        self.config.tasks.contains_key(task)
    }
}

/// One earlier SMS of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmsTurn {
    /// Sent by the lead (true) or by us (false).
    pub inbound: bool,
    pub text: String,
}

/// An SMS history as a request's JSON, oldest first.
pub(crate) fn history_json(history: &[SmsTurn]) -> serde_json::Value {
    history
        .iter()
        .map(|t| serde_json::json!({"inbound": t.inbound, "text": t.text}))
        .collect()
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

/// Parses a JSON object answer, tolerating a Markdown fence (some models add one anyway).
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
