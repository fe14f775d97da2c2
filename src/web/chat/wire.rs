//! The Chat Completions request as OpenAI defines it, read into a
//! [`Chat`]: every refusal names its field (`messages[2].tool_call_id`).
//! Fields we do not act on (`seed`, `top_p`, `stop`, `metadata`, ...) are
//! accepted and ignored, as SDKs send some of them by default.

use crate::{
    call::chat::Chat,
    config::MAX_OUTPUT_TOKENS,
    domain::{
        ChatMessage, JsonSchemaFormat, ToolCall, ToolChoice, ToolOutcome, ToolSpec,
        completion::Role,
    },
};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;

/// A refused field: `(field, why)`.
pub(super) type Refusal = (String, String);

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub(super) struct ChatRequest {
    pub model: String,
    pub messages: Vec<Message>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceWire>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// One message, by its `role`.
#[derive(Debug, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(super) enum Message {
    System {
        content: Content,
    },
    Developer {
        content: Content,
    },
    User {
        content: Content,
    },
    Assistant {
        #[serde(default)]
        content: Option<Content>,
        #[serde(default)]
        tool_calls: Option<Vec<WireToolCall>>,
    },
    Tool {
        content: Content,
        tool_call_id: String,
    },
}

/// A string, or content parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub(super) struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct WireToolCall {
    pub id: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: WireFunctionCall,
}

#[derive(Debug, Deserialize)]
pub(super) struct WireFunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Deserialize)]
pub(super) struct FunctionDef {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
}

/// `"auto"`, `"none"`, `"required"`, or `{"type": "function", "function": {"name"}}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ToolChoiceWire {
    Mode(String),
    Named { function: NamedFunction },
}

#[derive(Debug, Deserialize)]
pub(super) struct NamedFunction {
    pub name: String,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaWire },
}

#[derive(Debug, Deserialize)]
pub(super) struct JsonSchemaWire {
    pub name: String,
    #[serde(default)]
    pub schema: Option<Value>,
}

impl ChatRequest {
    /// The call it asks for, or every refused field.
    pub(super) fn into_chat(self) -> Result<Chat, Vec<Refusal>> {
        let mut bad = Vec::new();
        if self.n.is_some_and(|n| n != 1) {
            bad.push(refusal("n", "only 1 choice is generated"));
        }
        if self.messages.is_empty() {
            bad.push(refusal("messages", "must hold at least one message"));
        }
        let max_tokens = self.max_completion_tokens.or(self.max_tokens);
        if let Some(t) = max_tokens
            && !(1..=MAX_OUTPUT_TOKENS).contains(&t)
        {
            let field = if self.max_completion_tokens.is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            };
            bad.push(refusal(field, &format!("must be 1 to {MAX_OUTPUT_TOKENS}")));
        }
        if let Some(t) = self.temperature
            && !(0.0..=2.0).contains(&t)
        {
            bad.push(refusal("temperature", "must be between 0 and 2"));
        }
        let tools = tools(self.tools.unwrap_or_default(), &mut bad);
        let tool_choice = tool_choice(self.tool_choice, &tools, &mut bad);
        let (system, messages) = messages(self.messages, &mut bad);
        let response_format = response_format(self.response_format, &mut bad);
        if !bad.is_empty() {
            return Err(bad);
        }
        Ok(Chat {
            task: self.model,
            system,
            messages,
            tools,
            tool_choice,
            temperature: self.temperature,
            max_tokens,
            response_format,
        })
    }
}

fn refusal(field: &str, why: &str) -> Refusal {
    (field.to_owned(), why.to_owned())
}

/// Whether `name` is a function name every provider accepts.
fn valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn tools(wire: Vec<Tool>, bad: &mut Vec<Refusal>) -> Vec<ToolSpec> {
    let mut out = Vec::with_capacity(wire.len());
    for (i, tool) in wire.into_iter().enumerate() {
        if tool.kind != "function" {
            bad.push(refusal(&format!("tools[{i}].type"), "must be `function`"));
            continue;
        }
        let f = tool.function;
        if !valid_tool_name(&f.name) {
            bad.push(refusal(
                &format!("tools[{i}].function.name"),
                "must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
            ));
        }
        if out.iter().any(|t: &ToolSpec| t.name == f.name) {
            bad.push(refusal(
                &format!("tools[{i}].function.name"),
                "is a duplicate",
            ));
        }
        let parameters = f
            .parameters
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
        if !parameters.is_object() {
            bad.push(refusal(
                &format!("tools[{i}].function.parameters"),
                "must be a JSON Schema object",
            ));
        }
        out.push(ToolSpec {
            name: f.name,
            description: f.description.unwrap_or_default(),
            parameters,
        });
    }
    out
}

fn tool_choice(
    wire: Option<ToolChoiceWire>,
    tools: &[ToolSpec],
    bad: &mut Vec<Refusal>,
) -> ToolChoice {
    let choice = match wire {
        None => return ToolChoice::Auto,
        Some(ToolChoiceWire::Mode(mode)) => match mode.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => {
                let why = "must be `auto`, `none`, `required` or a named function";
                bad.push(refusal("tool_choice", why));
                return ToolChoice::Auto;
            }
        },
        Some(ToolChoiceWire::Named { function }) => ToolChoice::Named(function.name),
    };
    match &choice {
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
            bad.push(refusal(
                "tool_choice.function.name",
                "names no tool in `tools`",
            ));
        }
        ToolChoice::Required | ToolChoice::Named(_) if tools.is_empty() => {
            bad.push(refusal("tool_choice", "needs `tools`"));
        }
        _ => {}
    }
    choice
}

/// The text of `content`; only text parts are supported.
fn text(content: Content, field: &str, bad: &mut Vec<Refusal>) -> String {
    match content {
        Content::Text(text) => text,
        Content::Parts(parts) => {
            let mut out = String::new();
            for (j, part) in parts.into_iter().enumerate() {
                match (part.kind.as_str(), part.text) {
                    ("text", Some(text)) => out.push_str(&text),
                    ("text", None) => {
                        bad.push(refusal(&format!("{field}[{j}].text"), "is required"));
                    }
                    _ => bad.push(refusal(
                        &format!("{field}[{j}].type"),
                        "only `text` parts are supported",
                    )),
                }
            }
            out
        }
    }
}

/// System and developer messages joined as the system text (every wire
/// format has one), the rest in order; a tool result names its call's tool.
fn messages(wire: Vec<Message>, bad: &mut Vec<Refusal>) -> (Option<String>, Vec<ChatMessage>) {
    let mut system: Vec<String> = Vec::new();
    let mut out = Vec::with_capacity(wire.len());
    // Tool names by call ID, from earlier assistant messages.
    let mut calls: HashMap<String, String> = HashMap::new();
    for (i, message) in wire.into_iter().enumerate() {
        let field = format!("messages[{i}].content");
        match message {
            Message::System { content } | Message::Developer { content } => {
                system.push(text(content, &field, bad));
            }
            Message::User { content } => {
                out.push(ChatMessage::text(Role::User, text(content, &field, bad)));
            }
            Message::Assistant {
                content,
                tool_calls,
            } => {
                let content = content.map(|c| text(c, &field, bad)).unwrap_or_default();
                let tool_calls = assistant_calls(i, tool_calls.unwrap_or_default(), bad);
                for call in &tool_calls {
                    calls.insert(call.id.clone(), call.name.clone());
                }
                out.push(ChatMessage {
                    role: Role::Assistant,
                    content,
                    tool_calls,
                    tool_result: None,
                });
            }
            Message::Tool {
                content,
                tool_call_id,
            } => {
                let Some(name) = calls.get(&tool_call_id).cloned() else {
                    bad.push(refusal(
                        &format!("messages[{i}].tool_call_id"),
                        "answers no tool call of an earlier assistant message",
                    ));
                    continue;
                };
                out.push(ChatMessage {
                    role: Role::Tool,
                    content: String::new(),
                    tool_calls: Vec::new(),
                    tool_result: Some(ToolOutcome {
                        call_id: tool_call_id,
                        name,
                        content: text(content, &field, bad),
                        is_error: false,
                    }),
                });
            }
        }
    }
    let system = (!system.is_empty()).then(|| system.join("\n\n"));
    (system, out)
}

fn assistant_calls(i: usize, wire: Vec<WireToolCall>, bad: &mut Vec<Refusal>) -> Vec<ToolCall> {
    wire.into_iter()
        .enumerate()
        .map(|(j, call)| {
            if call.kind.as_deref().is_some_and(|k| k != "function") {
                bad.push(refusal(
                    &format!("messages[{i}].tool_calls[{j}].type"),
                    "must be `function`",
                ));
            }
            ToolCall {
                id: call.id,
                name: call.function.name,
                arguments: call.function.arguments,
            }
        })
        .collect()
}

fn response_format(
    wire: Option<ResponseFormat>,
    bad: &mut Vec<Refusal>,
) -> Option<JsonSchemaFormat> {
    match wire? {
        ResponseFormat::Text => None,
        // Any JSON object: the schema that says only that.
        ResponseFormat::JsonObject => Some(JsonSchemaFormat {
            name: "json_object".into(),
            schema: serde_json::json!({"type": "object"}),
        }),
        ResponseFormat::JsonSchema { json_schema } => {
            if !valid_tool_name(&json_schema.name) {
                bad.push(refusal(
                    "response_format.json_schema.name",
                    "must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                ));
            }
            Some(JsonSchemaFormat {
                name: json_schema.name,
                schema: json_schema
                    .schema
                    .unwrap_or_else(|| serde_json::json!({"type": "object"})),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: Value) -> Result<Chat, Vec<Refusal>> {
        serde_json::from_value::<ChatRequest>(body)
            .map_err(|e| vec![refusal("body", &e.to_string())])?
            .into_chat()
    }

    #[test]
    fn a_conversation_with_tools_reads_into_our_types() {
        let chat = parse(json!({
            "model": "chat",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "No jokes."}]},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\":21}"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_completion_tokens": 50,
            "seed": 7
        }))
        .unwrap();
        assert_eq!(chat.system.as_deref(), Some("Be brief.\n\nNo jokes."));
        assert_eq!(chat.messages.len(), 3);
        let result = chat.messages[2].tool_result.as_ref().unwrap();
        assert_eq!(
            (result.call_id.as_str(), result.name.as_str()),
            ("c1", "get_weather")
        );
        assert_eq!(chat.tool_choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(chat.max_tokens, Some(50));
    }

    #[test]
    fn every_refusal_names_its_field() {
        let bad = parse(json!({
            "model": "chat", "n": 2, "temperature": 3.0,
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                {"role": "tool", "tool_call_id": "nope", "content": "x"}
            ],
            "tools": [{"type": "function", "function": {"name": "bad name"}}],
            "tool_choice": "sometimes"
        }))
        .unwrap_err();
        let fields: Vec<&str> = bad.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "n",
                "temperature",
                "tools[0].function.name",
                "tool_choice",
                "messages[0].content[0].type",
                "messages[1].tool_call_id"
            ]
        );
    }
}
