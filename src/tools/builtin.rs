//! The built-in tools: `system.echo@1.0.0` (`{text}` → `{text}`),
//! `system.health@1.0.0` (`{}` → `{status, providers[]}`), `sms.segments@1.0.0`
//! (`{text}` → `{segments, encoding, characters}`, SPEC §6.2's SMS counter).

use super::Failure;
use crate::domain::sms::{self, SmsEncoding};
use serde_json::{Value, json};

/// What `system.health` reports, given by the caller (tools know no provider).
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// `SERVING` or `NOT_SERVING`.
    pub status: String,
    /// Each provider and its breaker state (`CLOSED`, `OPEN`, `HALF_OPEN`).
    pub providers: Vec<(String, String)>,
}

/// Runs built-in `name` on a validated `input`.
pub fn run(name: &str, input: &Value, health: impl FnOnce() -> Health) -> Result<Value, Failure> {
    let text = || {
        input
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    match name {
        "system.echo" => Ok(json!({"text": text()})),
        "system.health" => {
            let h = health();
            let providers: Vec<Value> = h
                .providers
                .iter()
                .map(|(name, state)| json!({"name": name, "state": state}))
                .collect();
            Ok(json!({"status": h.status, "providers": providers}))
        }
        "sms.segments" => {
            let size = sms::measure(text());
            let encoding = match size.encoding {
                SmsEncoding::Gsm7 => "GSM7",
                SmsEncoding::Ucs2 => "UCS2",
            };
            Ok(json!({
                "segments": size.segments,
                "encoding": encoding,
                "characters": text().chars().count(),
            }))
        }
        other => Err(Failure::new(
            "TOOL_ERROR",
            format!("no built-in tool `{other}`"),
        )),
    }
}

/// The executor of built-in tools.
#[derive(Debug, Clone, Copy, Default)]
pub struct Builtins;

#[async_trait::async_trait]
impl super::executor::Executor for Builtins {
    async fn run(&self, run: super::executor::Run<'_>) -> super::executor::Ran {
        super::executor::Ran::once(self::run(&run.tool.name, run.input, run.health))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_answer_as_specified() {
        let none = Health::default;
        assert_eq!(
            run("system.echo", &json!({"text": "hi"}), none).unwrap(),
            json!({"text": "hi"})
        );
        assert_eq!(
            run("sms.segments", &json!({"text": "a".repeat(161)}), none).unwrap(),
            json!({"segments": 2, "encoding": "GSM7", "characters": 161})
        );
        assert_eq!(
            run("sms.segments", &json!({"text": "Olá 😀"}), none).unwrap(),
            json!({"segments": 1, "encoding": "UCS2", "characters": 5})
        );
        let health = || Health {
            status: "SERVING".into(),
            providers: vec![("openai".into(), "CLOSED".into())],
        };
        assert_eq!(
            run("system.health", &json!({}), health).unwrap(),
            json!({"status": "SERVING", "providers": [{"name": "openai", "state": "CLOSED"}]})
        );
    }
}
