//! Generic tasks (`meeting_brief` and any task added in config) run through
//! `Execute`: a JSON object in, the model's text (and JSON, when it is JSON) out.

use super::{CallContext, CallMeta, Rendered, TaskError, TaskRunner, parse_json_object};
use crate::prompts;
use crate::providers::CompletionRequest;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A generic task's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The model's text.
    pub text: String,
    /// The text parsed as a JSON object, when it is one.
    pub json: Option<Map<String, Value>>,
}

/// Builds the prompt and request for `task` with `input`. Template variables
/// are `task`, `input` (the whole object as JSON) and each top-level field of
/// the object (strings as-is, other values as JSON), all inserted as data.
pub(crate) fn prepare(
    runner: &TaskRunner,
    ctx: &CallContext,
    task: &str,
    input: Map<String, Value>,
) -> Result<(Rendered, CompletionRequest), TaskError> {
    // Unknown tasks fail before any prompt work.
    runner.router.chain(task)?;
    let mut vars: BTreeMap<String, String> = input
        .iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), prompts::as_data(&text))
        })
        .collect();
    let whole = serde_json::to_string_pretty(&Value::Object(input)).unwrap_or_default();
    vars.insert("input".into(), prompts::as_data(&whole));
    vars.insert("task".into(), task.to_owned());
    let rendered = runner.render(task, &vars)?;
    let request = runner.request(task, &rendered, ctx, None);
    Ok((rendered, request))
}

/// Runs `task` with `input` (see [`prepare`]).
pub async fn execute(
    runner: &TaskRunner,
    ctx: &CallContext,
    task: &str,
    input: Map<String, Value>,
) -> Result<(Output, CallMeta), TaskError> {
    let (rendered, request) = prepare(runner, ctx, task, input)?;
    let (output, _, meta) = runner
        .route(task, &rendered, ctx, request, |c| {
            Ok(Output {
                text: c.text.clone(),
                json: parse_json_object(&c.text).ok(),
            })
        })
        .await?;
    Ok((output, meta))
}
