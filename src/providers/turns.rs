//! Conversation shaping for wire formats that insist on strictly alternating
//! turns starting with the user (Anthropic Messages, Gemini contents).
//!
//! Our conversations need not follow that rule: an SMS thread often starts
//! with our own outbound text (an assistant turn) and may hold two inbound
//! texts in a row. Sending such a history as-is gets a 400 from those APIs,
//! so it is reshaped here, without dropping any text.

use super::{ChatMessage, Role};

/// Stand-in first user turn for a conversation that starts with the
/// assistant. Neutral on purpose: it must not steer the answer.
pub(super) const OPENING_USER_TURN: &str = "(start of conversation)";

/// The conversation as alternating `(role, text)` turns starting with the
/// user: consecutive messages of one role are joined with a blank line,
/// blank messages are dropped (both APIs reject empty text), and a
/// conversation that opens with the assistant gets [`OPENING_USER_TURN`]
/// in front.
pub(super) fn alternating(messages: &[ChatMessage]) -> Vec<(Role, String)> {
    let mut turns: Vec<(Role, String)> = Vec::with_capacity(messages.len() + 1);
    for m in messages.iter().filter(|m| !m.content.trim().is_empty()) {
        match turns.last_mut() {
            Some((role, text)) if *role == m.role => {
                text.push_str("\n\n");
                text.push_str(&m.content);
            }
            _ => turns.push((m.role, m.content.clone())),
        }
    }
    if turns
        .first()
        .is_some_and(|(role, _)| *role == Role::Assistant)
    {
        turns.insert(0, (Role::User, OPENING_USER_TURN.to_owned()));
    }
    turns
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
}
