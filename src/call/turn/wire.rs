//! Tool names between ours and the wire's (`system__echo`), and unique call IDs.

use crate::{
    domain::{ChatMessage, ToolCall, ToolOutcome},
    providers::WireNames,
};

/// The model's tool calls in our terms: our names, and IDs unique in the
/// conversation. A model may omit or repeat an ID (Gemini numbers its calls
/// per answer), which would answer the wrong call once the history reaches
/// a provider that matches results by ID. A provider's ID is kept unless
/// taken; ours are `call_<turn>_<iteration>_<i>`, unique across turns.
pub(super) fn ours(
    names: &WireNames,
    calls: &[ToolCall],
    history: &[ChatMessage],
    turn: u32,
    iteration: u32,
) -> Vec<ToolCall> {
    let mut taken: std::collections::HashSet<String> = history
        .iter()
        .flat_map(|m| m.tool_calls.iter().map(|c| c.id.clone()))
        .collect();
    let mut out: Vec<ToolCall> = Vec::with_capacity(calls.len());
    for (i, c) in calls.iter().enumerate() {
        let id = if !c.id.is_empty() && !taken.contains(&c.id) {
            c.id.clone()
        } else {
            // A provider may itself have sent an ID of this form.
            let mut id = format!("call_{turn}_{iteration}_{i}");
            while taken.contains(&id) {
                id.push('_');
            }
            id
        };
        taken.insert(id.clone());
        out.push(ToolCall {
            id,
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
    use crate::{
        domain::{ChatMessage, ToolCall, completion::Role},
        providers::WireNames,
    };

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
            3,
            2,
        );
        let ids: Vec<&str> = got.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["call_3_2_0", "call_1", "call_3_2_2", "call_3_2_3"]);
        assert_eq!(got[0].name, "system.echo");
        assert_eq!(
            got[3].name, "made_up",
            "a name we did not offer stays as sent"
        );
    }

    /// Other turns make other IDs; an ID of ours a provider sent is not made twice.
    #[test]
    fn made_up_ids_differ_between_turns_and_never_repeat_one_sent() {
        let names = WireNames::new(["system.echo"]);
        let earlier = ours(&names, &[call("", "system__echo")], &[], 1, 1);
        let history = [ChatMessage {
            role: Role::Assistant,
            tool_calls: earlier,
            ..ChatMessage::default()
        }];
        let got = ours(
            &names,
            &[call("call_2_1_1", "system__echo"), call("", "system__echo")],
            &history,
            2,
            1,
        );
        let ids: Vec<&str> = history[0]
            .tool_calls
            .iter()
            .chain(&got)
            .map(|c| c.id.as_str())
            .collect();
        assert_eq!(ids, ["call_1_1_0", "call_2_1_1", "call_2_1_1_"]);
    }
}
