//! Generic tasks (`meeting_brief` and any task added in config) run through
//! `Execute`: a JSON object in, the model's text (and JSON, when it is JSON) out.

use super::{Rendered, Session, Task, TaskError, Tasks, parse_json_object};
use crate::{domain::JsonSchemaFormat, prompts, router::RouteError};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A generic task's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub text: String,
    /// The text parsed as a JSON object, when it is one.
    pub json: Option<Map<String, Value>>,
}

/// Builds the prompt for `task` (from `prompt_key` instead of the task's own, when given)
/// and the structured output to ask for. Template variables: `task`, `input` (the whole
/// object as JSON) and each top-level field (strings as-is, other values as JSON), all
/// inserted as data.
pub async fn prepare(
    tasks: &Tasks,
    session: &impl Session,
    task: &str,
    prompt_key: Option<&str>,
    input: Map<String, Value>,
) -> Result<(Rendered, Option<JsonSchemaFormat>), TaskError> {
    if !tasks.known(task) {
        return Err(RouteError::UnknownTask(task.to_owned()).into());
    }
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
    let whole = whole_input(&Value::Object(input), tasks.config.server.max_prompt_bytes);
    vars.insert("input".into(), prompts::as_data(&whole));
    vars.insert("task".into(), task.to_owned());
    let rendered = match prompt_key {
        Some(key) => session.render_named(key, &vars).await?,
        None => session.render(task, &vars).await?,
    };
    let format = tasks
        .config
        .tasks
        .get(task)
        .and_then(|t| t.output_schema.clone())
        .map(|schema| JsonSchemaFormat {
            name: task.to_owned(),
            schema,
        });
    Ok((rendered, format))
}

/// The whole input as `{{input}}`: pretty JSON, or compact when pretty would pass the
/// prompt limit (indenting by depth can grow a nested input some 30 times).
fn whole_input(input: &Value, limit: usize) -> String {
    struct Capped {
        buf: Vec<u8>,
        limit: usize,
    }
    impl std::io::Write for Capped {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if self.buf.len().saturating_add(bytes.len()) > self.limit {
                return Err(std::io::Error::other("longer than a prompt may be"));
            }
            self.buf.extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut pretty = Capped {
        buf: Vec::new(),
        limit,
    };
    match serde_json::to_writer_pretty(&mut pretty, input) {
        Ok(()) => String::from_utf8(pretty.buf).unwrap_or_else(|_| input.to_string()),
        Err(_) => input.to_string(),
    }
}

/// A generic task asked for through `Execute`.
#[derive(Debug, Clone)]
pub struct Execute {
    pub task: String,
    pub input: Map<String, Value>,
    /// The prompt key to render instead of the task's own (`ExecuteRequest.prompt_key`).
    pub prompt_key: Option<String>,
}

impl Task for Execute {
    type Output = Output;

    fn name(&self) -> &str {
        &self.task
    }

    fn input(&self) -> Value {
        Value::Object(self.input.clone())
    }

    async fn run(self, tasks: &Tasks, session: &impl Session) -> Result<Output, TaskError> {
        execute(tasks, session, self).await
    }
}

/// Runs `request` (see [`prepare`]).
pub async fn execute(
    tasks: &Tasks,
    session: &impl Session,
    request: Execute,
) -> Result<Output, TaskError> {
    let Execute {
        task,
        input,
        prompt_key,
    } = request;
    let (rendered, format) = prepare(tasks, session, &task, prompt_key.as_deref(), input).await?;
    let validator = tasks.output_validator(&task);
    let (output, _) = session
        .complete(&task, &rendered, format, |c| {
            parse(&c.text, validator.as_deref())
        })
        .await?;
    Ok(output)
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
    fn the_whole_input_is_pretty_unless_that_passes_the_prompt_limit() {
        let small = json!({"lead": {"name": "Ann"}});
        assert_eq!(
            whole_input(&small, 1024),
            serde_json::to_string_pretty(&small).unwrap()
        );
        // 32 levels deep, ~64 KiB compact; pretty, each `0` is a line indented 64 spaces.
        let mut deep = Value::Array(vec![json!(0); 30_000]);
        for _ in 0..31 {
            deep = Value::Array(vec![deep]);
        }
        let compact = deep.to_string();
        assert!(compact.len() < 64 * 1024);
        let limit = 256 * 1024;
        assert!(serde_json::to_string_pretty(&deep).unwrap().len() > limit);
        assert_eq!(whole_input(&deep, limit), compact);
    }

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
