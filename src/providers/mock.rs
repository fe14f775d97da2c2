//! The `mock` provider: deterministic answers with configurable latency and
//! failure rate, for local runs, demos and benchmarks. Only ever used where
//! the config names a provider of kind `mock`.
//!
//! Its answers must never pass for a model's: a structured answer picks
//! enum values by plain keyword rules on the inbound text ([`RULES`]), is
//! never more than half sure, and says in its text fields that it is the
//! mock and which rule matched.

use super::{
    ChatMessage, Completion, CompletionRequest, CompletionStream, FinishReason, ProbeRequest,
    Provider, ProviderError, Role, StreamEvent, TokenUsage, ToolCall, ToolChoice, WireNames,
};
use crate::config::MockConfig;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fake provider.
pub struct MockProvider {
    config: MockConfig,
    calls: AtomicU64,
}

impl MockProvider {
    /// A mock with the given behaviour.
    pub fn new(config: MockConfig) -> Self {
        Self {
            config,
            calls: AtomicU64::new(0),
        }
    }

    /// Sleeps the configured latency (stopping at the deadline) and decides
    /// whether this call fails. The n-th call's fate depends only on the seed
    /// and n, so a run is reproducible.
    async fn begin(&self, req: &CompletionRequest) -> Result<(), ProviderError> {
        let n = self.calls.fetch_add(1, Ordering::Relaxed);
        // Saturating: a huge configured latency must not panic (it is a timeout).
        let wake = crate::domain::instant_after(tokio::time::Instant::now(), self.config.latency);
        if wake > req.deadline {
            tokio::time::sleep_until(req.deadline).await;
            return Err(ProviderError::Timeout);
        }
        if !self.config.latency.is_zero() {
            tokio::time::sleep_until(wake).await;
        }
        let draw = splitmix64(self.config.seed ^ n) as f64 / u64::MAX as f64;
        if draw < self.config.failure_rate {
            return Err(ProviderError::Status {
                status: 503,
                retry_after: None,
                summary: "mock failure".into(),
            });
        }
        Ok(())
    }

    /// The scripted tool calls of this answer, when tools are offered, not
    /// refused (`ToolChoice::None`), and the script has an entry for this
    /// answer of the turn.
    fn scripted_calls(&self, req: &CompletionRequest) -> Vec<ToolCall> {
        if req.tools.is_empty() || req.tool_choice == ToolChoice::None {
            return Vec::new();
        }
        let turn_start = req
            .messages
            .iter()
            .rposition(|m| m.role == Role::User)
            .map_or(0, |i| i + 1);
        let answered = req.messages[turn_start..]
            .iter()
            .filter(|m| m.role == Role::Assistant && !m.tool_calls.is_empty())
            .count();
        let Some(step) = self.config.tool_script.get(answered) else {
            return Vec::new();
        };
        let names = WireNames::new(step.iter().map(|c| c.tool.as_str()));
        step.iter()
            .enumerate()
            .map(|(i, c)| ToolCall {
                id: format!("call_mock_{answered}_{i}"),
                name: names.wire(&c.tool).unwrap_or(&c.tool).to_owned(),
                arguments: c.arguments.clone(),
            })
            .collect()
    }

    fn answer(&self, req: &CompletionRequest) -> Completion {
        let tool_calls = self.scripted_calls(req);
        if !tool_calls.is_empty() {
            let input_bytes: usize = req.messages.iter().map(ChatMessage::bytes).sum();
            return Completion {
                usage: TokenUsage {
                    input_tokens: approx_tokens(input_bytes),
                    output_tokens: approx_tokens(
                        tool_calls.iter().map(|c| c.arguments.len() + 8).sum(),
                    ),
                },
                finish_reason: FinishReason::ToolCalls,
                model: Some(req.model.clone()),
                tool_calls,
                ..Completion::default()
            };
        }
        let text = match (&self.config.reply, &req.response_format) {
            (Some(reply), _) => reply.clone(),
            (None, Some(format)) => {
                let rule = matched_rule(req);
                answer_of(&format.schema, "", rule).to_string()
            }
            (None, None) => format!("mock reply to {} message(s)", req.messages.len()),
        };
        let input_chars: usize = req.system.as_deref().map_or(0, str::len)
            + req.messages.iter().map(|m| m.content.len()).sum::<usize>();
        Completion {
            tool_calls: Vec::new(),
            usage: TokenUsage {
                input_tokens: approx_tokens(input_chars),
                output_tokens: approx_tokens(text.len()),
            },
            text,
            finish_reason: FinishReason::Stop,
            citations: Vec::new(),
            model: Some(req.model.clone()),
        }
    }
}

#[async_trait::async_trait]
impl Provider for MockProvider {
    async fn complete(&self, req: CompletionRequest) -> Result<Completion, ProviderError> {
        self.begin(&req).await?;
        Ok(self.answer(&req))
    }

    async fn stream(&self, req: CompletionRequest) -> Result<CompletionStream, ProviderError> {
        self.begin(&req).await?;
        let done = self.answer(&req);
        let mut events: Vec<Result<StreamEvent, ProviderError>> = done
            .text
            .split_inclusive(' ')
            .map(|piece| Ok(StreamEvent::Delta(piece.to_owned())))
            .collect();
        events.push(Ok(StreamEvent::Done(done)));
        Ok(Box::pin(futures::stream::iter(events)))
    }

    /// Answers after the mock's latency, and never fails: the failure
    /// draw is for calls, and a probe must not shift a seeded sequence.
    async fn probe(&self, probe: ProbeRequest) -> Result<(), ProviderError> {
        match tokio::time::timeout_at(probe.deadline, tokio::time::sleep(self.config.latency)).await
        {
            Ok(()) => Ok(()),
            Err(_) => Err(ProviderError::Timeout),
        }
    }
}

/// About four characters per token, the usual rule of thumb for English.
fn approx_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4).max(1)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Keyword rules of the mock's structured answers: the first whose keyword
/// occurs in the inbound text (lower-cased) names the enum value to pick,
/// when the schema's enum has it. Ordered so the narrower phrase wins
/// ("not interested" before "interested").
const RULES: &[(&str, &str)] = &[
    ("wrong number", "WRONG_NUMBER"),
    ("who is this", "WRONG_NUMBER"),
    ("unsubscribe", "OPT_OUT"),
    ("stop", "OPT_OUT"),
    ("not interested", "NOT_INTERESTED"),
    ("no thanks", "NOT_INTERESTED"),
    ("call me", "CALLBACK_LATER"),
    ("call back", "CALLBACK_LATER"),
    ("later", "CALLBACK_LATER"),
    ("next week", "CALLBACK_LATER"),
    ("appointment", "APPOINTMENT_REQUEST"),
    ("schedule", "APPOINTMENT_REQUEST"),
    ("meeting", "APPOINTMENT_REQUEST"),
    ("book", "APPOINTMENT_REQUEST"),
    ("interested", "INTERESTED"),
    ("sounds good", "INTERESTED"),
    ("yes", "INTERESTED"),
    ("?", "QUESTION"),
];

/// The mock's confidence in anything: below any sensible review threshold.
const MOCK_CONFIDENCE: f64 = 0.5;

/// The inbound text of a request: inside the last `<message>` tag of the
/// last user message when the prompt marks it (the SMS prompts do), else
/// the whole last user message.
fn inbound_text(req: &CompletionRequest) -> String {
    let last = req.messages.last().map_or("", |m| m.content.as_str());
    let inner = last
        .rsplit_once("<message>")
        .and_then(|(_, rest)| rest.split_once("</message>"))
        .map_or(last, |(inner, _)| inner);
    inner.to_lowercase()
}

/// The first rule whose keyword is in the request's inbound text.
fn matched_rule(req: &CompletionRequest) -> Option<(&'static str, &'static str)> {
    let text = inbound_text(req);
    RULES
        .iter()
        .copied()
        .find(|(keyword, _)| text.contains(keyword))
}

/// The mock's structured answer to `schema` (property `name`), given the
/// keyword rule that matched: enums by the rule (else `OTHER`, else their
/// first value), numbers capped at [`MOCK_CONFIDENCE`] where they are
/// scores, strings saying they come from the mock.
fn answer_of(schema: &Value, name: &str, rule: Option<(&str, &str)>) -> Value {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        let has = |v: &str| options.iter().any(|o| o.as_str() == Some(v));
        let pick = match rule {
            Some((_, value)) if has(value) => Some(value),
            _ if has("OTHER") => Some("OTHER"),
            _ => None,
        };
        return pick.map_or_else(|| example_of(schema), |v| Value::String(v.to_owned()));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let mut out = Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    out.insert(k.clone(), answer_of(v, k, rule));
                }
            }
            Value::Object(out)
        }
        Some("array") => Value::Array(
            schema
                .get("items")
                .map(|items| vec![answer_of(items, name, rule)])
                .unwrap_or_default(),
        ),
        Some("string") if name.contains("reason") => Value::String(match rule {
            Some((keyword, value)) => format!("mock provider: keyword `{keyword}` means {value}"),
            None => "mock provider: no keyword rule matched".to_owned(),
        }),
        // A URL stays one (research sources): the example's, being the shape asked for.
        Some("string")
            if schema
                .get("examples")
                .and_then(|e| e.get(0))
                .and_then(Value::as_str)
                .is_some_and(|e| e.starts_with("https://")) =>
        {
            example_of(schema)
        }
        Some("string") if !name.is_empty() => Value::String(format!("mock {name}")),
        Some("number")
            if schema
                .get("maximum")
                .and_then(Value::as_f64)
                .is_some_and(|max| max <= 1.0) =>
        {
            Value::from(MOCK_CONFIDENCE)
        }
        _ => example_of(schema),
    }
}

/// A deterministic value matching a JSON schema: `examples[0]`, else `default`,
/// else the first `enum` value, else a plain value of the schema's type.
pub fn example_of(schema: &Value) -> Value {
    if let Some(first) = schema.get("examples").and_then(|e| e.get(0)) {
        return first.clone();
    }
    if let Some(default) = schema.get("default") {
        return default.clone();
    }
    if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
        return first.clone();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let mut out = Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    out.insert(k.clone(), example_of(v));
                }
            }
            Value::Object(out)
        }
        Some("array") => Value::Array(
            schema
                .get("items")
                .map(|items| vec![example_of(items)])
                .unwrap_or_default(),
        ),
        Some("string") => Value::String("mock".into()),
        Some("integer") => Value::from(schema.get("minimum").and_then(Value::as_i64).unwrap_or(1)),
        Some("number") => Value::from(schema.get("maximum").and_then(Value::as_f64).unwrap_or(1.0)),
        Some("boolean") => Value::Bool(false),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ChatMessage, JsonSchemaFormat, ToolOutcome, ToolSpec, completion::Role};
    use serde_json::json;
    use std::time::Duration;

    fn request(format: Option<JsonSchemaFormat>) -> CompletionRequest {
        CompletionRequest {
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            model: "m".into(),
            system: Some("sys".into()),
            messages: vec![ChatMessage {
                role: Role::User,
                content: "hello there".into(),
                ..Default::default()
            }],
            temperature: None,
            max_tokens: 10,
            response_format: format,
            trace_id: "t".into(),
            traceparent: None,
            deadline: tokio::time::Instant::now() + Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn json_requests_get_a_schema_shaped_answer_that_says_it_is_the_mock() {
        let mock = MockProvider::new(MockConfig::default());
        let schema = json!({"type":"object","properties":{
            "intent":{"type":"string","enum":["INTERESTED","CALLBACK_LATER","OTHER"]},
            "confidence":{"type":"number","minimum":0,"maximum":1,"examples":[0.92]},
            "reason":{"type":"string","examples":["Lead says they are interested."]},
            "tags":{"type":"array","items":{"type":"string"}},
            "count":{"type":"integer","minimum":3}}});
        let format = Some(JsonSchemaFormat {
            name: "x".into(),
            schema,
        });
        let out = mock.complete(request(format.clone())).await.unwrap();
        let v: Value = serde_json::from_str(&out.text).unwrap();
        assert_eq!(
            v,
            json!({"intent":"OTHER","confidence":0.5,
                   "reason":"mock provider: no keyword rule matched",
                   "tags":["mock tags"],"count":3})
        );
        assert!(out.usage.input_tokens > 0 && out.usage.output_tokens > 0);

        // The inbound message inside its tag decides, not the prompt around it.
        let mut req = request(format);
        req.messages[0].content =
            "Say if they are interested.\n<message>\nCan you call me at 5?\n</message>".into();
        let v: Value = serde_json::from_str(&mock.complete(req).await.unwrap().text).unwrap();
        assert_eq!(v["intent"], "CALLBACK_LATER");
        assert_eq!(
            v["reason"],
            "mock provider: keyword `call me` means CALLBACK_LATER"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn latency_past_the_deadline_is_a_timeout() {
        let mock = MockProvider::new(MockConfig {
            latency: Duration::from_secs(10),
            ..MockConfig::default()
        });
        let err = mock.complete(request(None)).await.unwrap_err();
        assert_eq!(err, ProviderError::Timeout);
    }

    #[tokio::test]
    async fn failure_rate_is_reproducible() {
        let cfg = MockConfig {
            failure_rate: 0.5,
            ..MockConfig::default()
        };
        let (a, b) = (MockProvider::new(cfg.clone()), MockProvider::new(cfg));
        let mut fails = 0;
        for _ in 0..200 {
            let ra = a.complete(request(None)).await.is_err();
            let rb = b.complete(request(None)).await.is_err();
            assert_eq!(ra, rb);
            fails += usize::from(ra);
        }
        assert!((60..140).contains(&fails), "{fails} of 200 failed");
    }

    #[tokio::test]
    async fn stream_ends_with_the_whole_answer() {
        let mock = MockProvider::new(MockConfig {
            reply: Some("a b c".into()),
            ..MockConfig::default()
        });
        use futures::StreamExt;
        let events: Vec<_> = mock.stream(request(None)).await.unwrap().collect().await;
        let deltas: String = events
            .iter()
            .filter_map(|e| match e {
                Ok(StreamEvent::Delta(t)) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deltas, "a b c");
        assert!(matches!(events.last(), Some(Ok(StreamEvent::Done(c))) if c.text == "a b c"));
    }

    #[tokio::test]
    async fn a_tool_script_calls_its_tools_turn_by_turn_then_answers() {
        let config: crate::config::Config = crate::config::Config::from_toml_str(
            r#"
[providers.m]
kind = "mock"
[providers.m.mock]
reply = "All done."
tool_script = [
  [{ tool = "crm.lookup", arguments = '{"lead_id":"L-1"}' }, { tool = "system.echo" }],
  [{ tool = "crm.add_note", arguments = '{"note": broken' }],
]
"#,
            |_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mock_config = config.providers["m"].mock.clone();
        let mock = MockProvider::new(mock_config);
        let mut req = request(None);
        // Without tools offered, the script does not apply.
        let plain = mock.complete(req.clone()).await.unwrap_or_default();
        assert_eq!(plain.text, "All done.");
        assert!(plain.tool_calls.is_empty());

        req.tools = vec![ToolSpec {
            name: "crm__lookup".into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
        }];
        // Tool calls refused: a plain answer, and the script still at its first step.
        let refused = CompletionRequest {
            tool_choice: ToolChoice::None,
            ..req.clone()
        };
        let refused = mock.complete(refused).await.unwrap_or_default();
        assert_eq!(
            (refused.text.as_str(), refused.tool_calls.len()),
            ("All done.", 0)
        );
        let first = mock.complete(req.clone()).await.unwrap_or_default();
        assert_eq!(first.finish_reason, FinishReason::ToolCalls);
        let names: Vec<&str> = first.tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["crm__lookup", "system__echo"]);
        assert_eq!(first.tool_calls[0].arguments, r#"{"lead_id":"L-1"}"#);
        assert_eq!(first.tool_calls[1].arguments, "{}");
        // The answer and its results join the turn: the script's next step.
        req.messages.push(ChatMessage {
            role: Role::Assistant,
            tool_calls: first.tool_calls.clone(),
            ..Default::default()
        });
        for call in &first.tool_calls {
            req.messages.push(ChatMessage {
                role: Role::Tool,
                tool_result: Some(ToolOutcome {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: "{}".into(),
                    is_error: false,
                }),
                ..Default::default()
            });
        }
        let second = mock.complete(req.clone()).await.unwrap_or_default();
        assert_eq!(second.tool_calls.len(), 1);
        assert!(
            second.tool_calls[0].parsed().is_err(),
            "malformed on purpose"
        );
        req.messages.push(ChatMessage {
            role: Role::Assistant,
            tool_calls: second.tool_calls.clone(),
            ..Default::default()
        });
        let third = mock.complete(req.clone()).await.unwrap_or_default();
        assert_eq!(
            (third.text.as_str(), third.tool_calls.len()),
            ("All done.", 0)
        );
        // A new user message starts a new turn: the script again.
        req.messages.push(ChatMessage::text(Role::User, "again"));
        let again = mock.complete(req).await.unwrap_or_default();
        assert_eq!(again.tool_calls.len(), 2);
    }
}
