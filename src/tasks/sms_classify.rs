//! `sms_classify`: intent of an inbound SMS, with a carrier opt-out fast path.

use super::{Session, SmsTurn, TaskError, Tasks, history_text, opt_out, parse_json_object};
use crate::{domain::JsonSchemaFormat, prompts};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Task name in the config.
pub const TASK: &str = "sms_classify";

/// Intent of an inbound SMS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    Interested,
    NotInterested,
    Question,
    AppointmentRequest,
    CallbackLater,
    OptOut,
    WrongNumber,
    Other,
}

impl Intent {
    /// Every intent with its wire name.
    pub const ALL: [(Intent, &'static str); 8] = [
        (Intent::Interested, "INTERESTED"),
        (Intent::NotInterested, "NOT_INTERESTED"),
        (Intent::Question, "QUESTION"),
        (Intent::AppointmentRequest, "APPOINTMENT_REQUEST"),
        (Intent::CallbackLater, "CALLBACK_LATER"),
        (Intent::OptOut, "OPT_OUT"),
        (Intent::WrongNumber, "WRONG_NUMBER"),
        (Intent::Other, "OTHER"),
    ];

    /// Parses a wire name.
    pub fn parse(name: &str) -> Option<Intent> {
        Self::ALL.iter().find(|(_, n)| *n == name).map(|(i, _)| *i)
    }
}

/// Classify input.
#[derive(Debug, Clone)]
pub struct ClassifyInput {
    pub message: String,
    /// Earlier messages, oldest first.
    pub history: Vec<SmsTurn>,
}

/// A classification.
#[derive(Debug, Clone, PartialEq)]
pub struct Classification {
    pub intent: Intent,
    /// Confidence in [0, 1].
    pub confidence: f64,
    /// Below the review threshold.
    pub needs_review: bool,
    pub reason: String,
}

/// Prompt key reported for answers given by the keyword rule, not a model.
pub const OPT_OUT_RULE_KEY: &str = "opt_out_keyword";

/// The JSON schema the model must answer with.
pub fn schema() -> Value {
    let intents: Vec<&str> = Intent::ALL.iter().map(|(_, n)| *n).collect();
    json!({
        "type": "object",
        "properties": {
            "intent": {"type": "string", "enum": intents},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1, "examples": [0.92]},
            "reason": {"type": "string", "examples": ["Lead says they are interested."]}
        },
        "required": ["intent", "confidence", "reason"],
        "additionalProperties": false
    })
}

impl super::Task for ClassifyInput {
    type Output = Classification;

    fn name(&self) -> &str {
        TASK
    }

    fn input(&self) -> Value {
        json!({"message": self.message, "history": super::history_json(&self.history)})
    }

    async fn run(self, tasks: &Tasks, session: &impl Session) -> Result<Classification, TaskError> {
        classify(tasks, session, self).await
    }
}

/// Classifies one inbound SMS.
pub async fn classify(
    tasks: &Tasks,
    session: &impl Session,
    input: ClassifyInput,
) -> Result<Classification, TaskError> {
    if input.message.trim().is_empty() {
        return Err(TaskError::invalid("message", "must not be empty"));
    }
    if opt_out::is_opt_out(&input.message) {
        session.answered_by_rule(OPT_OUT_RULE_KEY);
        return Ok(Classification {
            intent: Intent::OptOut,
            confidence: 1.0,
            needs_review: false,
            reason: "carrier opt-out keyword".into(),
        });
    }
    let threshold = tasks
        .config
        .tasks
        .get(TASK)
        .map_or(0.70, |t| t.review_threshold);
    let vars = BTreeMap::from([
        ("message".to_owned(), prompts::as_data(&input.message)),
        ("history".to_owned(), history_text(&input.history)),
    ]);
    let rendered = session.render(TASK, &vars).await?;
    let format = JsonSchemaFormat {
        name: "sms_classification".into(),
        schema: schema(),
    };
    let (answer, _) = session
        .complete(TASK, &rendered, Some(format), |c| parse(&c.text, threshold))
        .await?;
    Ok(answer)
}

/// Parses and validates the model's answer; any problem is a malformed response.
pub fn parse(text: &str, review_threshold: f64) -> Result<Classification, String> {
    let obj = parse_json_object(text)?;
    let intent_name = obj
        .get("intent")
        .and_then(Value::as_str)
        .ok_or("missing intent")?;
    let intent =
        Intent::parse(intent_name).ok_or_else(|| format!("unknown intent `{intent_name}`"))?;
    let confidence = obj
        .get("confidence")
        .and_then(Value::as_f64)
        .ok_or("missing confidence")?;
    if !(0.0..=1.0).contains(&confidence) {
        return Err(format!("confidence {confidence} outside [0, 1]"));
    }
    let reason: String = obj
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .chars()
        .take(280)
        .collect();
    Ok(Classification {
        intent,
        confidence,
        needs_review: confidence < review_threshold,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_the_model_answer() {
        let ok = parse(
            r#"{"intent":"QUESTION","confidence":0.69,"reason":"asks price"}"#,
            0.7,
        )
        .unwrap();
        assert_eq!(ok.intent, Intent::Question);
        assert!(ok.needs_review);
        let ok = parse(
            "```json\n{\"intent\":\"INTERESTED\",\"confidence\":0.7,\"reason\":\"\"}\n```",
            0.7,
        )
        .unwrap();
        assert!(!ok.needs_review, "exactly at the threshold needs no review");
        for bad in [
            "not json",
            "[1,2]",
            r#"{"intent":"MAYBE","confidence":0.9}"#,
            r#"{"intent":"OTHER","confidence":1.5}"#,
            r#"{"intent":"OTHER","confidence":-0.1}"#,
            r#"{"intent":"OTHER"}"#,
            r#"{"confidence":0.5}"#,
        ] {
            assert!(parse(bad, 0.7).is_err(), "{bad}");
        }
    }
}
