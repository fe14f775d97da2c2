//! Tool calls on the wire. Names travel in every provider's alphabet, `^[a-zA-Z0-9_-]{1,64}$`
//! ([`WireNames`]): `system.echo` is sent as `system__echo` and maps back unambiguously.

use crate::domain::ToolCall;
use std::collections::{BTreeMap, HashMap};

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

/// Most tool calls one answer may make: far above the handful a model asks for, small enough
/// that a provider streaming ever new call indexes cannot make us hold an unbounded list.
pub const MAX_TOOL_CALLS: usize = 128;

/// `Err(TooLarge)`, reporting `limit`, when an answer holds more than [`MAX_TOOL_CALLS`] calls.
pub fn check_count(calls: usize, limit: usize) -> Result<(), super::ProviderError> {
    if calls > MAX_TOOL_CALLS {
        return Err(super::ProviderError::TooLarge { limit });
    }
    Ok(())
}

/// Tool calls assembled from a stream's pieces by call index; arguments, split anywhere, are
/// parsed only once complete. Everything kept counts against one byte limit.
#[derive(Debug, Default)]
pub struct CallBuffer {
    calls: Vec<Partial>,
    /// Index → place in `calls`: indexes may be sparse and out of order (Anthropic's are
    /// content-block indexes), and a map keeps each piece's cost flat.
    positions: HashMap<u64, usize>,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Partial {
    id: String,
    name: String,
    arguments: String,
}

impl CallBuffer {
    /// Adds a piece of call `key` (an ID or name replaces the earlier one); `Err(TooLarge)`,
    /// keeping nothing, past `limit` bytes or [`MAX_TOOL_CALLS`] calls.
    pub fn add(
        &mut self,
        key: u64,
        id: Option<&str>,
        name: Option<&str>,
        fragment: &str,
        limit: usize,
    ) -> Result<(), super::ProviderError> {
        let id = id.filter(|s| !s.is_empty());
        let name = name.filter(|s| !s.is_empty());
        let existing = self.positions.get(&key).map(|&i| &self.calls[i]);
        if existing.is_none() {
            check_count(self.calls.len().saturating_add(1), limit)?;
        }
        // Some servers repeat the ID and name in every chunk: only the difference counts.
        let (old_id, old_name) = existing.map_or((0, 0), |c| (c.id.len(), c.name.len()));
        let bytes = self
            .bytes
            .saturating_sub(old_id.saturating_add(old_name))
            .saturating_add(id.map_or(old_id, str::len))
            .saturating_add(name.map_or(old_name, str::len))
            .saturating_add(fragment.len());
        if bytes > limit {
            return Err(super::ProviderError::TooLarge { limit });
        }
        let calls = &mut self.calls;
        let index = *self.positions.entry(key).or_insert_with(|| {
            calls.push(Partial::default());
            calls.len() - 1
        });
        let call = &mut self.calls[index];
        if let Some(id) = id {
            id.clone_into(&mut call.id);
        }
        if let Some(name) = name {
            name.clone_into(&mut call.name);
        }
        call.arguments.push_str(fragment);
        self.bytes = bytes;
        Ok(())
    }

    /// Whether any call has begun.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The calls, in the order they began; one without a name is malformed.
    pub fn finish(self) -> Result<Vec<ToolCall>, super::ProviderError> {
        self.calls
            .into_iter()
            .map(|c| {
                if c.name.is_empty() {
                    return Err(super::ProviderError::Malformed(
                        "a streamed tool call has no name".into(),
                    ));
                }
                Ok(ToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: c.arguments,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

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

    #[test]
    fn arguments_split_anywhere_are_whole_at_the_end() {
        let mut buffer = CallBuffer::default();
        let text = r#"{"note":"caf\u00e9 ☕ \"quoted\""}"#;
        let pieces: Vec<String> = text.chars().map(String::from).collect();
        buffer
            .add(0, Some("call_1"), Some("crm__add_note"), "", 1 << 20)
            .unwrap();
        for p in &pieces {
            buffer.add(0, None, None, p, 1 << 20).unwrap();
        }
        buffer
            .add(1, Some("call_2"), Some("system__echo"), "{}", 1 << 20)
            .unwrap();
        let calls = buffer.finish().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, text);
        assert_eq!(calls[0].parsed().unwrap()["note"], "café ☕ \"quoted\"");
        assert_eq!(calls[1].id, "call_2");
    }

    #[test]
    fn malformed_arguments_say_why_without_quoting_them() {
        let call = ToolCall {
            id: "c".into(),
            name: "t".into(),
            arguments: r#"{"note": "SECRET-VALUE"#.into(),
        };
        let why = call.parsed().unwrap_err();
        assert!(why.contains("not valid JSON"), "{why}");
        assert!(!why.contains("SECRET"), "{why}");
        assert_eq!(call.arguments_object(), Value::Object(Map::new()));
        let array = ToolCall {
            arguments: "[1]".into(),
            ..call
        };
        assert!(array.parsed().is_err());
    }

    #[test]
    fn a_buffer_refuses_arguments_past_its_limit() {
        let mut buffer = CallBuffer::default();
        buffer
            .add(0, Some("a"), Some("t"), "0123456789", 16)
            .unwrap();
        assert!(buffer.add(0, None, None, "0123456789", 16).is_err());
    }

    #[test]
    fn ids_and_names_count_toward_the_limit() {
        let mut buffer = CallBuffer::default();
        let name = "n".repeat(100);
        let refused = (0..64u64)
            .map(|key| buffer.add(key, Some("call_0123"), Some(&name), "", 1024))
            .enumerate()
            .find(|(_, r)| r.is_err());
        // 109 bytes a call: the tenth would pass 1024.
        assert_eq!(
            refused,
            Some((
                9,
                Err(crate::providers::ProviderError::TooLarge { limit: 1024 })
            ))
        );
        assert_eq!(buffer.finish().map(|c| c.len()), Ok(9));
    }

    #[test]
    fn a_repeated_id_or_name_replaces_rather_than_adds() {
        let mut buffer = CallBuffer::default();
        for _ in 0..100 {
            buffer.add(0, Some("call_1"), Some("echo"), "", 16).unwrap();
        }
        // 10 bytes kept: 6 more fit, a 7th does not.
        assert!(
            buffer
                .add(0, Some("call_1"), None, "{\"a\":1}", 16)
                .is_err()
        );
        buffer.add(0, None, Some("echo"), "{}", 16).unwrap();
        buffer.add(0, None, None, "[]", 16).unwrap();
        buffer.add(0, None, None, "()", 16).unwrap();
        assert!(buffer.add(0, None, None, "!", 16).is_err());
    }

    #[test]
    fn one_answer_holds_at_most_max_tool_calls() {
        let mut buffer = CallBuffer::default();
        // Sparse, out-of-order keys, as Anthropic's block indexes can be.
        let keys: Vec<u64> = (0..MAX_TOOL_CALLS as u64).rev().map(|k| k * 3).collect();
        for &key in &keys {
            buffer.add(key, Some("c"), Some("t"), "{", 1 << 20).unwrap();
        }
        assert_eq!(
            buffer.add(1, Some("c"), Some("t"), "", 1 << 20),
            Err(crate::providers::ProviderError::TooLarge { limit: 1 << 20 })
        );
        for &key in &keys {
            buffer.add(key, None, None, "}", 1 << 20).unwrap();
        }
        let calls = buffer.finish().unwrap();
        assert_eq!(calls.len(), MAX_TOOL_CALLS);
        assert!(calls.iter().all(|c| c.arguments == "{}"));
        assert_eq!(check_count(MAX_TOOL_CALLS, 1), Ok(()));
        assert!(check_count(MAX_TOOL_CALLS + 1, 1).is_err());
    }
}
