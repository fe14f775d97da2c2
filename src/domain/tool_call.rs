//! Tool calling in our own terms (SPEC §11.4): the tools offered to a
//! model, the calls it makes, and their results, whatever the wire format.
//! Each adapter maps these to its provider's shape and back; a conversation
//! that falls back from one provider to another is carried in these types,
//! so it translates.

use serde_json::{Map, Value};

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Its name on the wire ([`WireNames`]).
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

/// A call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    /// The provider's ID for the call (a result answers it by this ID).
    pub id: String,
    /// The tool's wire name.
    pub name: String,
    /// The arguments as the model wrote them: JSON text, which may be
    /// malformed (it is then answered to the model as an error).
    pub arguments: String,
}

impl ToolCall {
    /// The arguments as a JSON object, or why they are not one (a
    /// description without the text itself).
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

    /// The arguments as a JSON value for formats that send them as an
    /// object (Anthropic `input`, Gemini `args`): an empty object when they
    /// do not parse (the model is told so by the call's result).
    pub fn arguments_object(&self) -> Value {
        Value::Object(self.parsed().unwrap_or_default())
    }
}

/// The result of a tool call, sent back to the model.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolOutcome {
    /// The call it answers.
    pub call_id: String,
    /// The tool's wire name.
    pub name: String,
    /// The result as JSON text (the tool's output, or an error object).
    pub content: String,
    /// Whether the call failed or was refused.
    pub is_error: bool,
}
