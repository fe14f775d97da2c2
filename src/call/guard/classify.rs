//! The `classifier` guardrail (SPEC §15): a task whose JSON answer
//! `{flagged, categories[]}` decides. It runs as a call of its own through
//! the pipeline (admitted, metered, recorded and audited under its task,
//! with the caller's trace), after the pattern guardrails of the same stage.

use super::super::{CallContext, Pipeline};
use crate::{
    config::guardrails::{Action, Fail, Stage},
    guardrails::{Blocked, Finding, Guardrail, Screened},
};
use serde_json::{Map, Value};
use std::{future::Future, pin::Pin, sync::Arc};

/// Categories a verdict keeps for the audit event, and characters of each.
const MAX_CATEGORIES: usize = 10;
const MAX_CATEGORY_CHARS: usize = 64;

/// A classification's future, boxed: it runs the pipeline that screens it.
type Classification<'a> =
    Pin<Box<dyn Future<Output = Result<Option<Vec<String>>, String>> + Send + 'a>>;

impl Pipeline {
    /// `screened` (what the pattern guardrails left of a text at `stage`)
    /// put to each classifier of `list` that applies, in order.
    pub(in crate::call) async fn classified(
        &self,
        ctx: &CallContext,
        list: &[Arc<Guardrail>],
        stage: Stage,
        mut screened: Screened,
    ) -> Result<Screened, Blocked> {
        for g in list.iter().filter(|g| g.applies(stage)) {
            let Some((task, fail)) = g.classifier() else {
                continue;
            };
            let (detail, failed) = match self.classify(ctx, task, stage, &screened.text).await {
                Ok(None) => continue,
                Ok(Some(categories)) => (categories.join(","), false),
                Err(why) => (why, true),
            };
            let blocks = if failed {
                fail == Fail::Closed
            } else {
                g.action == Action::Block
            };
            if blocks {
                return Err(Blocked {
                    guardrail: g.name.clone(),
                    stage,
                    score: None,
                    detail: Some(detail),
                    failed,
                });
            }
            screened.findings.push(Finding {
                guardrail: g.name.clone(),
                action: if failed { Action::Flag } else { g.action },
                stage,
                score: None,
                detail: Some(detail),
                failed,
            });
        }
        Ok(screened)
    }

    /// `text` classified by `task`: `Some(categories)` when flagged, or
    /// why no verdict came (the call failed, or its answer is not the
    /// JSON asked for). A named future: the call it makes may screen
    /// through here again, so its type cannot be inferred from itself.
    fn classify<'a>(
        &'a self,
        ctx: &CallContext,
        task: &str,
        stage: Stage,
        text: &str,
    ) -> Classification<'a> {
        let mut input = Map::new();
        input.insert("text".into(), Value::String(text.to_owned()));
        input.insert("stage".into(), Value::String(stage.as_str().into()));
        let (ctx, task) = (ctx.clone(), task.to_owned());
        Box::pin(async move {
            match self
                .run_aside(&ctx, &task, input)
                .await
                .map(|(output, _)| output)
            {
                Ok(output) => verdict(output.json.as_ref()),
                Err(reason) => Err(format!("classifier call failed: {reason}")),
            }
        })
    }
}

/// The verdict in a classifier's answer: `flagged` must be a boolean;
/// `categories`, if there, strings (kept short for the audit event).
fn verdict(json: Option<&Map<String, Value>>) -> Result<Option<Vec<String>>, String> {
    let Some(json) = json else {
        return Err("classifier answer is not a JSON object".into());
    };
    let Some(flagged) = json.get("flagged").and_then(Value::as_bool) else {
        return Err("classifier answer has no boolean `flagged`".into());
    };
    if !flagged {
        return Ok(None);
    }
    let categories = match json.get("categories") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .take(MAX_CATEGORIES)
            .map(|c| c.chars().take(MAX_CATEGORY_CHARS).collect())
            .collect(),
        Some(_) => return Err("classifier answer's `categories` is not a list".into()),
    };
    Ok(Some(categories))
}

#[cfg(test)]
mod tests {
    use super::verdict;
    use serde_json::json;

    fn of(v: serde_json::Value) -> Result<Option<Vec<String>>, String> {
        verdict(v.as_object())
    }

    #[test]
    fn a_verdict_needs_a_boolean_flagged_and_keeps_string_categories() {
        assert_eq!(of(json!({"flagged": false})), Ok(None));
        assert_eq!(
            of(json!({"flagged": true, "categories": ["hate", 3, "violence"]})),
            Ok(Some(vec!["hate".into(), "violence".into()]))
        );
        assert_eq!(of(json!({"flagged": true})), Ok(Some(Vec::new())));
        assert!(of(json!({"flagged": "yes"})).is_err());
        assert!(of(json!({"categories": []})).is_err());
        assert!(of(json!({"flagged": true, "categories": "hate"})).is_err());
        assert!(verdict(None).is_err());
    }
}
