//! Conversation shaping for wire formats that insist on strictly alternating
//! turns starting with the user (Anthropic Messages, Gemini contents).
//!
//! Our conversations need not follow that rule: an SMS thread often starts
//! with our own outbound text (an assistant turn) and may hold two inbound
//! texts in a row. Sending such a history as-is gets a 400 from those APIs,
//! so it is reshaped here, without dropping any text.

use super::{ChatMessage, Role, ToolCall, ToolOutcome};

/// Stand-in first user turn for a conversation that starts with the
/// assistant. Neutral on purpose: it must not steer the answer.
pub(super) const OPENING_USER_TURN: &str = "(start of conversation)";

/// One part of a turn, for wire formats whose messages hold typed parts
/// (Anthropic content blocks, Gemini parts).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Part {
    /// Text.
    Text(String),
    /// A tool call of the assistant.
    Call(ToolCall),
    /// A tool's result (a user-side part).
    Result(ToolOutcome),
}

/// The conversation as alternating turns starting with the user, each a
/// list of parts: consecutive messages of one role are merged (their texts
/// joined with a blank line), blank texts are dropped (both APIs reject
/// empty text), a conversation that opens with the assistant gets
/// [`OPENING_USER_TURN`] in front, a tool result counts as the user's side,
/// and a turn's results come before its text (Anthropic requires it).
pub(super) fn alternating_parts(messages: &[ChatMessage]) -> Vec<(Role, Vec<Part>)> {
    let mut turns: Vec<(Role, Vec<Part>)> = Vec::with_capacity(messages.len() + 1);
    for m in messages {
        let role = match m.role {
            Role::Assistant => Role::Assistant,
            Role::User | Role::Tool => Role::User,
        };
        let mut parts = Vec::new();
        if let Some(result) = &m.tool_result {
            parts.push(Part::Result(result.clone()));
        }
        if !m.content.trim().is_empty() {
            parts.push(Part::Text(m.content.clone()));
        }
        parts.extend(m.tool_calls.iter().cloned().map(Part::Call));
        if parts.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, existing)) if *last == role => {
                for part in parts {
                    push_part(existing, part);
                }
            }
            _ => turns.push((role, parts)),
        }
    }
    if turns
        .first()
        .is_some_and(|(role, _)| *role == Role::Assistant)
    {
        turns.insert(
            0,
            (Role::User, vec![Part::Text(OPENING_USER_TURN.to_owned())]),
        );
    }
    turns
}

/// Adds `part` to a turn: results before any text, texts joined.
fn push_part(parts: &mut Vec<Part>, part: Part) {
    match part {
        Part::Result(_) => {
            let at = parts
                .iter()
                .position(|p| !matches!(p, Part::Result(_)))
                .unwrap_or(parts.len());
            parts.insert(at, part);
        }
        Part::Text(text) => match parts.last_mut() {
            Some(Part::Text(last)) => {
                last.push_str("\n\n");
                last.push_str(&text);
            }
            _ => parts.push(Part::Text(text)),
        },
        Part::Call(_) => parts.push(part),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: Role, content: &str) -> ChatMessage {
        ChatMessage {
            role,
            content: content.into(),
            ..Default::default()
        }
    }

    /// The turns of a text-only conversation as `(role, text)`.
    fn alternating(messages: &[ChatMessage]) -> Vec<(Role, String)> {
        alternating_parts(messages)
            .into_iter()
            .map(|(role, parts)| match parts.as_slice() {
                [Part::Text(text)] => (role, text.clone()),
                other => panic!("a text-only turn has one text part: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn merges_runs_and_opens_with_the_user() {
        let turns = alternating(&[
            msg(Role::Assistant, "Hi, it's Sam from Acme."),
            msg(Role::User, "who?"),
            msg(Role::User, "   "),
            msg(Role::User, "oh right"),
            msg(Role::Assistant, "a"),
            msg(Role::Assistant, "b"),
        ]);
        assert_eq!(
            turns,
            vec![
                (Role::User, OPENING_USER_TURN.to_owned()),
                (Role::Assistant, "Hi, it's Sam from Acme.".to_owned()),
                (Role::User, "who?\n\noh right".to_owned()),
                (Role::Assistant, "a\n\nb".to_owned()),
            ]
        );
    }

    #[test]
    fn an_already_valid_conversation_is_unchanged() {
        let turns = alternating(&[msg(Role::User, "q"), msg(Role::Assistant, "a")]);
        assert_eq!(
            turns,
            vec![(Role::User, "q".into()), (Role::Assistant, "a".into())]
        );
        assert!(alternating(&[]).is_empty());
    }

    #[test]
    fn tool_parts_keep_their_turns_and_results_come_first() {
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "crm__lookup".into(),
            arguments: "{}".into(),
        };
        let result = |id: &str| ChatMessage {
            role: Role::Tool,
            tool_result: Some(ToolOutcome {
                call_id: id.into(),
                name: "crm__lookup".into(),
                content: "{}".into(),
                is_error: false,
            }),
            ..ChatMessage::default()
        };
        let turns = alternating_parts(&[
            msg(Role::User, "look up L-1 and L-2"),
            ChatMessage {
                role: Role::Assistant,
                content: "Looking.".into(),
                tool_calls: vec![call("a"), call("b")],
                ..ChatMessage::default()
            },
            result("a"),
            msg(Role::User, "and hurry"),
            result("b"),
        ]);
        assert_eq!(turns.len(), 3);
        assert_eq!(turns[1].0, Role::Assistant);
        assert_eq!(
            turns[1].1,
            vec![
                Part::Text("Looking.".into()),
                Part::Call(call("a")),
                Part::Call(call("b"))
            ]
        );
        let user: Vec<&str> = turns[2]
            .1
            .iter()
            .map(|p| match p {
                Part::Result(r) => r.call_id.as_str(),
                Part::Text(_) => "text",
                Part::Call(_) => "call",
            })
            .collect();
        assert_eq!(user, ["a", "b", "text"], "results before text");
        // A conversation opening with the assistant gets the stand-in turn.
        let plain = alternating_parts(&[msg(Role::Assistant, "hi"), msg(Role::User, "yo")]);
        assert_eq!(plain[0].1, vec![Part::Text(OPENING_USER_TURN.into())]);
    }
}
