//! Tool calls between our names and a provider's: wire names
//! (`system__echo`) out and back, and call IDs unique in a conversation.

use crate::providers::{ChatMessage, ToolCall, ToolOutcome, WireNames};

/// The model's tool calls in our terms: our tool names, and IDs unique in
/// the conversation. Gemini numbers its calls per answer (`call_0`, ...)
/// and a model may omit an ID; a repeated ID would answer the wrong call
/// once the history is sent to a provider that matches results by ID.
pub(super) fn ours(
    names: &WireNames,
    calls: &[ToolCall],
    history: &[ChatMessage],
    iteration: u32,
) -> Vec<ToolCall> {
    let seen: std::collections::HashSet<&str> = history
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.as_str()))
        .collect();
    let mut out: Vec<ToolCall> = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        let taken =
            c.id.is_empty() || seen.contains(c.id.as_str()) || out.iter().any(|o| o.id == c.id);
        out.push(ToolCall {
            id: if taken {
                format!("call_{iteration}_{i}")
            } else {
                c.id.clone()
            },
            name: names.ours(&c.name).unwrap_or(&c.name).to_owned(),
            arguments: c.arguments.clone(),
        });
    }
    out
}

/// `m` with its tool names as the wire knows them.
pub(super) fn on_wire(names: &WireNames, m: &ChatMessage) -> ChatMessage {
    let wire = |n: &str| names.wire(n).unwrap_or(n).to_owned();
    ChatMessage {
        role: m.role,
        content: m.content.clone(),
        tool_calls: m
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                name: wire(&c.name),
                ..c.clone()
            })
            .collect(),
        tool_result: m.tool_result.as_ref().map(|r| ToolOutcome {
            name: wire(&r.name),
            ..r.clone()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::ours;
    use crate::providers::{ChatMessage, Role, ToolCall, WireNames};

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: "{}".into(),
        }
    }

    #[test]
    fn repeated_or_missing_call_ids_are_made_unique_and_names_ours() {
        let names = WireNames::new(["system.echo"]);
        let history = [ChatMessage {
            role: Role::Assistant,
            tool_calls: vec![call("call_0", "system.echo")],
            ..ChatMessage::default()
        }];
        let got = ours(
            &names,
            &[
                call("call_0", "system__echo"),
                call("call_1", "system__echo"),
                call("call_1", "system__echo"),
                call("", "made_up"),
            ],
            &history,
            2,
        );
        let ids: Vec<&str> = got.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_2_0", "call_1", "call_2_2", "call_2_3"]);
        assert_eq!(got[0].name, "system.echo");
        assert_eq!(
            got[3].name, "made_up",
            "a name we did not offer stays as sent"
        );
    }
}
