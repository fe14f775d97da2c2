//! `sms_generate`: a suggested reply that fits the segment budget, or an
//! escalation to a human. Never writes a reply to an opt-out.

use super::{Session, SmsTurn, TaskError, Tasks, history_text, opt_out, parse_json_object};
use crate::{
    domain::JsonSchemaFormat,
    domain::sms::{self as sms_encoding, SmsEncoding, SmsSize},
    prompts,
    usage::MeterError,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// Task name in the config.
pub const TASK: &str = "sms_generate";

/// Segments allowed when the caller does not say.
pub const DEFAULT_MAX_SEGMENTS: u32 = 2;
/// More than this is never a sensible SMS reply.
pub const MAX_SEGMENTS_LIMIT: u32 = 10;

/// Generate input.
#[derive(Debug, Clone, Default)]
pub struct GenerateInput {
    pub inbound_message: String,
    /// Earlier messages, oldest first.
    pub history: Vec<SmsTurn>,
    /// Lead profile as `key: value` lines.
    pub lead: BTreeMap<String, String>,
    pub goal: String,
    /// Segment budget (0 = default).
    pub max_segments: u32,
}

/// A reply or an escalation.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// Reply text, empty when escalated without one.
    pub text: String,
    pub escalate: bool,
    pub escalate_reason: String,
    /// Size of `text` (`None` when there is no text).
    pub size: Option<SmsSize>,
}

/// What the model returns.
#[derive(Debug, Clone, PartialEq)]
struct Draft {
    reply: String,
    escalate: bool,
    escalate_reason: String,
}

/// The JSON schema the model must answer with.
pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "reply": {"type": "string", "examples": ["Thanks for getting back to us! Would Tuesday at 10am work for a quick call?"]},
            "escalate": {"type": "boolean", "examples": [false]},
            "escalate_reason": {"type": "string", "examples": [""]}
        },
        "required": ["reply", "escalate", "escalate_reason"],
        "additionalProperties": false
    })
}

impl super::Task for GenerateInput {
    type Output = Reply;

    fn name(&self) -> &str {
        TASK
    }

    fn input(&self) -> Value {
        json!({
            "inbound_message": self.inbound_message,
            "history": super::history_json(&self.history),
            "lead": self.lead,
            "goal": self.goal,
            "max_segments": self.max_segments,
        })
    }

    async fn run(self, tasks: &Tasks, session: &impl Session) -> Result<Reply, TaskError> {
        generate(tasks, session, self).await
    }
}

/// Writes a reply, retrying once with a stricter length instruction when the
/// first draft does not fit, and escalating when the second does not either.
pub async fn generate(
    tasks: &Tasks,
    session: &impl Session,
    input: GenerateInput,
) -> Result<Reply, TaskError> {
    if input.inbound_message.trim().is_empty() {
        return Err(TaskError::invalid("inbound_message", "must not be empty"));
    }
    let max_segments = match input.max_segments {
        0 => DEFAULT_MAX_SEGMENTS,
        n if n > MAX_SEGMENTS_LIMIT => {
            return Err(TaskError::invalid(
                "max_segments",
                format!("must be at most {MAX_SEGMENTS_LIMIT}"),
            ));
        }
        n => n,
    };
    // Never answer a request to stop, whatever a model would make of it (SPEC §6.2).
    if opt_out::asks_to_stop(&input.inbound_message) {
        session.answered_by_rule(super::sms_classify::OPT_OUT_RULE_KEY);
        return Ok(escalation(OPT_OUT_REASON));
    }

    let lead = input
        .lead
        .iter()
        .map(|(k, v)| format!("{k}: {}", prompts::as_data(v)))
        .collect::<Vec<_>>()
        .join("; ");
    let mut vars = BTreeMap::from([
        (
            "message".to_owned(),
            prompts::as_data(&input.inbound_message),
        ),
        ("history".to_owned(), history_text(&input.history)),
        (
            "lead".to_owned(),
            if lead.is_empty() {
                "(unknown)".into()
            } else {
                lead
            },
        ),
        (
            "goal".to_owned(),
            if input.goal.is_empty() {
                "keep the conversation going".into()
            } else {
                prompts::as_data(&input.goal)
            },
        ),
        (
            "max_chars".to_owned(),
            sms_encoding::gsm7_char_budget(max_segments).to_string(),
        ),
    ]);

    let smart = tasks
        .config
        .tasks
        .get(TASK)
        .is_none_or(|t| t.smart_encoding);
    let first = draft(session, &vars, smart).await?;
    let size = sms_encoding::measure(&first.reply);
    if size.segments <= max_segments {
        return Ok(accept(first, size));
    }

    // One stricter retry: a budget with a safety margin, GSM characters only.
    let stricter = sms_encoding::gsm7_char_budget(max_segments) * 8 / 10;
    vars.insert("max_chars".to_owned(), format!(
        "{stricter} (STRICT: your previous reply took {} segments; use only plain GSM characters, no emoji or accents)",
        size.segments
    ));
    let second = match draft(session, &vars, smart).await {
        Ok(found) => found,
        Err(TaskError::Meter(refused @ (MeterError::Quota(_) | MeterError::Budget { .. }))) => {
            // The retry cannot be afforded; the first draft is paid for, so escalate
            // (it does not fit) and the call settles with the first draft's usage.
            let limit = match refused {
                MeterError::Quota(refusal) => {
                    format!("the {} cap ({})", refusal.cap_name(), refusal.subject())
                }
                _ => "budget.max_cost_usd".to_owned(),
            };
            return Ok(escalation(&format!(
                "reply does not fit in {max_segments} SMS segment(s) (needs {}); \
                 a shorter retry would exceed {limit}",
                size.segments
            )));
        }
        Err(other) => return Err(other),
    };
    let size = sms_encoding::measure(&second.reply);
    if size.segments <= max_segments {
        return Ok(accept(second, size));
    }
    Ok(escalation(&format!(
        "reply does not fit in {max_segments} SMS segment(s) (needs {})",
        size.segments
    )))
}

/// One draft; `smart` makes typographic characters GSM-7 where that keeps the reply GSM-7.
async fn draft(
    session: &impl Session,
    vars: &BTreeMap<String, String>,
    smart: bool,
) -> Result<Draft, TaskError> {
    let rendered = session.render(TASK, vars).await?;
    let format = JsonSchemaFormat {
        name: "sms_reply".into(),
        schema: schema(),
    };
    let (mut draft, _) = session
        .complete(TASK, &rendered, Some(format), |c| parse(&c.text))
        .await?;
    if smart && let std::borrow::Cow::Owned(plain) = sms_encoding::normalize(&draft.reply) {
        draft.reply = plain;
    }
    Ok(draft)
}

fn parse(text: &str) -> Result<Draft, String> {
    let obj = parse_json_object(text)?;
    let reply = obj
        .get("reply")
        .and_then(Value::as_str)
        .ok_or("missing reply")?
        .trim()
        .to_owned();
    let escalate = obj
        .get("escalate")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let escalate_reason = obj
        .get("escalate_reason")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if reply.is_empty() && !escalate {
        return Err("empty reply without escalation".into());
    }
    Ok(Draft {
        reply,
        escalate,
        escalate_reason,
    })
}

fn accept(draft: Draft, size: SmsSize) -> Reply {
    // The model recognised an opt-out the word rules did not: whatever
    // text it wrote is not sent (SPEC §6.2: never a reply to an opt-out).
    if draft.escalate && names_an_opt_out(&draft.escalate_reason) {
        return escalation(OPT_OUT_REASON);
    }
    let escalate_reason = match (draft.escalate, draft.escalate_reason.is_empty()) {
        (true, true) => "model asked for a human".to_owned(),
        (true, false) => draft.escalate_reason,
        (false, _) => String::new(),
    };
    Reply {
        size: (!draft.reply.is_empty()).then_some(size),
        text: draft.reply,
        escalate: draft.escalate,
        escalate_reason,
    }
}

/// Why an opt-out is escalated with no reply.
const OPT_OUT_REASON: &str = "inbound message is an opt-out; no reply may be sent";

/// Whether a model's escalation reason says the lead opted out.
fn names_an_opt_out(reason: &str) -> bool {
    let reason = reason.to_lowercase();
    ["opt-out", "opt out", "optout", "opted out"]
        .iter()
        .any(|w| reason.contains(w))
}

fn escalation(reason: &str) -> Reply {
    Reply {
        text: String::new(),
        escalate: true,
        escalate_reason: reason.to_owned(),
        size: None,
    }
}

/// Wire encoding of a reply (`None` when there is no text).
pub fn encoding(reply: &Reply) -> Option<SmsEncoding> {
    reply.size.map(|s| s.encoding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_drafts() {
        let d = parse(r#"{"reply":"Hi!","escalate":false,"escalate_reason":""}"#).unwrap();
        assert_eq!(d.reply, "Hi!");
        let d =
            parse(r#"{"reply":"","escalate":true,"escalate_reason":"wants a manager"}"#).unwrap();
        assert!(d.escalate);
        assert!(parse(r#"{"reply":"","escalate":false}"#).is_err());
        assert!(parse("Sure, see you then").is_err());
    }

    #[test]
    fn a_model_escalating_an_opt_out_sends_no_text() {
        let draft = parse(r#"{"reply":"Sorry to see you go!","escalate":true,"escalate_reason":"Opt-out request"}"#)
            .unwrap();
        let size = sms_encoding::measure(&draft.reply);
        let reply = accept(draft, size);
        assert!(reply.escalate && reply.text.is_empty() && reply.size.is_none());
        assert_eq!(reply.escalate_reason, OPT_OUT_REASON);
        // Another escalation keeps its text and reason.
        let draft = parse(r#"{"reply":"A manager will call.","escalate":true,"escalate_reason":"wants a manager"}"#)
            .unwrap();
        let size = sms_encoding::measure(&draft.reply);
        let reply = accept(draft, size);
        assert_eq!(
            (reply.text.as_str(), reply.escalate_reason.as_str()),
            ("A manager will call.", "wants a manager")
        );
    }
}
