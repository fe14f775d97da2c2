//! Tool calling in our own terms (SPEC §11.4), whatever the wire format: a conversation that
//! falls back to another provider is carried in these types, so it translates.

use serde_json::{Map, Value};

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Its name on the wire ([`WireNames`]).
    pub name: String,
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    /// The provider's ID for the call (a result answers it by this ID).
    pub id: String,
    pub name: String,
    /// JSON text as the model wrote it; if malformed, the model is answered with an error.
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as a JSON object, or why not (described, never quoted).
    pub fn parsed(&self) -> Result<Map<String, Value>, String> {
        if self.arguments.trim().is_empty() {
            return Ok(Map::new());
        }
        match serde_json::from_str::<Value>(&self.arguments) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err("the arguments are not a JSON object".into()),
            Err(e) => Err(format!(
                "the arguments are not valid JSON ({:?} error at column {})",
                e.classify(),
                e.column()
            )),
        }
    }

    /// The arguments as an object (Anthropic `input`, Gemini `args`); empty if they do not parse.
    pub fn arguments_object(&self) -> Value {
        Value::Object(self.parsed().unwrap_or_default())
    }
}

/// The result of a tool call, sent back to the model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolOutcome {
    pub call_id: String,
    pub name: String,
    /// The result as JSON text (the tool's output, or an error object).
    pub content: String,
    pub is_error: bool,
}
