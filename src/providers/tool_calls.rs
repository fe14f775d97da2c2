//! Tool calls on the wire: their count bounded, their streamed pieces assembled. Their names
//! travel as `domain::WireNames`.

use crate::domain::ToolCall;
use std::collections::HashMap;

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
