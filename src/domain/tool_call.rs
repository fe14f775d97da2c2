//! Tool calling in our own terms (SPEC §11.4), whatever the wire format: a conversation that
//! falls back to another provider is carried in these types, so it translates.

use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Its name on the wire ([`WireNames`]).
    pub name: String,
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub parameters: Value,
}

/// Whether and which tool the model must call (OpenAI's `tool_choice`); only meaningful with tools.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// The model decides (every provider's default).
    #[default]
    Auto,
    /// No tool call.
    None,
    /// At least one tool call.
    Required,
    /// A call of this tool (its wire name).
    Named(String),
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

/// Most bytes of a tool name on the wire.
const MAX_WIRE_NAME: usize = 64;

/// Our tool names and their wire names, both ways.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WireNames {
    to_wire: BTreeMap<String, String>,
    from_wire: BTreeMap<String, String>,
}

impl WireNames {
    /// Wire names for `names`: `.` becomes `__`, other characters outside the alphabet `_`, cut
    /// to 64 bytes; a collision gets a numeric suffix, so the mapping is one to one.
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out = Self::default();
        for name in names {
            if out.to_wire.contains_key(name) {
                continue;
            }
            let base = encode(name);
            let mut wire = base.clone();
            let mut n = 2;
            while out.from_wire.contains_key(&wire) {
                let suffix = format!("_{n}");
                let keep = MAX_WIRE_NAME.saturating_sub(suffix.len()).min(base.len());
                wire = format!("{}{suffix}", &base[..keep]);
                n += 1;
            }
            out.to_wire.insert(name.to_owned(), wire.clone());
            out.from_wire.insert(wire, name.to_owned());
        }
        out
    }

    /// The wire name of `name`.
    pub fn wire(&self, name: &str) -> Option<&str> {
        self.to_wire.get(name).map(String::as_str)
    }

    /// Our name of `wire`; `None` for one we did not offer (the model made it up).
    pub fn ours(&self, wire: &str) -> Option<&str> {
        self.from_wire.get(wire).map(String::as_str)
    }
}

fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            '.' => out.push_str("__"),
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => out.push(c),
            _ => out.push('_'),
        }
    }
    if out.is_empty() {
        out.push('_');
    }
    // ASCII only by now, so any byte is a character boundary.
    out.truncate(MAX_WIRE_NAME);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_are_in_every_providers_alphabet_and_map_back() {
        let long = "x".repeat(80);
        let names = WireNames::new([
            "system.echo",
            "system__echo",
            "everything.get-sum",
            "crm.add note!",
            long.as_str(),
            "system.echo",
        ]);
        assert_eq!(names.wire("system.echo"), Some("system__echo"));
        assert_eq!(names.wire("system__echo"), Some("system__echo_2"));
        assert_eq!(
            names.wire("everything.get-sum"),
            Some("everything__get-sum")
        );
        assert_eq!(names.wire("crm.add note!"), Some("crm__add_note_"));
        assert_eq!(names.wire(&long).map(str::len), Some(64));
        for (ours, wire) in &names.to_wire {
            assert!(
                wire.len() <= 64
                    && wire
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
                "{wire}"
            );
            assert_eq!(names.ours(wire), Some(ours.as_str()));
        }
        assert_eq!(names.ours("made_up"), None);
    }
}
