//! Generic tasks (`meeting_brief` and any task added in config) run through
//! `Execute`: a JSON object in, the model's text (and JSON, when it is JSON) out.

use super::{CallContext, CallMeta, Rendered, TaskError, TaskRunner, parse_json_object};
use crate::prompts;
use crate::providers::{CompletionRequest, JsonSchemaFormat};
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
pub(crate) async fn prepare(
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
    let rendered = runner.render(ctx, task, &vars).await?;
    let format = runner
        .config
        .tasks
        .get(task)
        .and_then(|t| t.output_schema.clone())
        .map(|schema| JsonSchemaFormat {
            name: task.to_owned(),
            schema,
        });
    let request = runner.request(task, &rendered, ctx, format);
    Ok((rendered, request))
}

/// Runs `task` with `input` (see [`prepare`]).
pub async fn execute(
    runner: &TaskRunner,
    ctx: &CallContext,
    task: &str,
    input: Map<String, Value>,
) -> Result<(Output, CallMeta), TaskError> {
    let (rendered, request) = prepare(runner, ctx, task, input).await?;
    let validator = runner.output_validator(task);
    let (output, _, meta) = runner
        .route(task, &rendered, ctx, &request, |c| {
            parse(&c.text, validator.as_deref())
        })
        .await?;
    Ok((output, meta))
}

/// The answer as text and, when it is a JSON object, as JSON. With an output
/// schema the answer must be a JSON object matching it.
pub fn parse(text: &str, schema: Option<&jsonschema::Validator>) -> Result<Output, String> {
    let json = parse_json_object(text);
    if let Some(validator) = schema {
        let obj = json.clone()?;
        validator
            .validate(&Value::Object(obj))
            .map_err(|e| format!("answer does not match the task's output schema: {e}"))?;
    }
    Ok(Output {
        text: text.to_owned(),
        json: json.ok(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn output_schema_is_enforced() {
        let v = jsonschema::validator_for(&json!({"type":"object","required":["summary"],
            "properties":{"summary":{"type":"string"}}}))
        .unwrap();
        assert!(parse(r#"{"summary":"ok"}"#, Some(&v)).is_ok());
        assert!(parse(r#"{"title":"no summary"}"#, Some(&v)).is_err());
        assert!(parse("free text", Some(&v)).is_err());
        let free = parse("free text", None).unwrap();
        assert_eq!((free.text.as_str(), free.json), ("free text", None));
    }
}
