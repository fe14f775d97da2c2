//! A conversation's held tool calls (SPEC §14.1): the calls of its last
//! model answer still without a result, each waiting on an approval. A new
//! message is refused while one is held; `resume` settles them as decided.

use super::super::{CallError, Pipeline};
use crate::{
    agent::AgentError,
    domain::{ChatMessage, ToolCall, completion::Role},
    tools::approvals::{self, Approval, ApprovalStatus},
};
use std::collections::BTreeMap;

/// How a person decided a held call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// It runs, under this approval.
    Approved(String),
    /// The model is told why it did not run.
    Rejected(String),
}

/// The held calls a resumed turn settles, and how each was decided.
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    pub calls: Vec<ToolCall>,
    pub resolved: BTreeMap<String, Resolution>,
}

/// The calls of the history's last assistant message that have no result.
pub fn held_calls(history: &[ChatMessage]) -> Vec<ToolCall> {
    let Some(at) = history.iter().rposition(|m| m.role == Role::Assistant) else {
        return Vec::new();
    };
    let answered: Vec<&str> = history[at + 1..]
        .iter()
        .filter_map(|m| m.tool_result.as_ref().map(|r| r.call_id.as_str()))
        .collect();
    history[at]
        .tool_calls
        .iter()
        .filter(|c| !answered.contains(&c.id.as_str()))
        .cloned()
        .collect()
}

/// How `approval` stands for the turn, read at `now_ms`: `None` while
/// it is still open.
fn resolution(approval: &Approval, now_ms: i64) -> Option<Resolution> {
    match approval.status {
        ApprovalStatus::Approved => Some(Resolution::Approved(approval.id.clone())),
        ApprovalStatus::Rejected if approval.reason.is_empty() => {
            Some(Resolution::Rejected("no reason given".into()))
        }
        ApprovalStatus::Rejected => Some(Resolution::Rejected(approval.reason.clone())),
        ApprovalStatus::Expired => Some(Resolution::Rejected("the approval expired".into())),
        // Past its time the sweeper will say so; the turn need not wait for it.
        ApprovalStatus::Pending if approval.expires_at_ms <= now_ms => {
            Some(Resolution::Rejected("the approval expired".into()))
        }
        ApprovalStatus::Pending => None,
    }
}

impl Pipeline {
    /// Checks the conversation's held calls against the request: a new
    /// message while one is held, or a `resume` with nothing decided (or
    /// nothing held), is refused; a `resume` gets the calls to settle.
    pub(super) async fn held(
        &self,
        team: &str,
        conversation: &str,
        history: &[ChatMessage],
        resume: bool,
    ) -> Result<Resumed, CallError> {
        let calls = held_calls(history);
        if calls.is_empty() {
            return if resume {
                Err(AgentError::NothingToResume(conversation.to_owned()).into())
            } else {
                Ok(Resumed::default())
            };
        }
        let now = chrono::Utc::now().timestamp_millis();
        let mut resolved = BTreeMap::new();
        for call in &calls {
            let found = approvals::for_call(self.store(), team, conversation, &call.id)
                .await
                .map_err(|e| CallError::Storage(e.to_string()))?;
            let Some(approval) = found else {
                // Held by a turn whose approval never became durable: nothing to wait for.
                let why = Resolution::Rejected("no approval was recorded".into());
                resolved.insert(call.id.clone(), why);
                continue;
            };
            match (resume, resolution(&approval, now)) {
                (true, Some(r)) => {
                    resolved.insert(call.id.clone(), r);
                }
                (true, None) => {
                    return Err(pending(conversation, &approval, "it is not decided yet"));
                }
                (false, _) => {
                    let what = "settle it with `resume = true` (once it is decided) first";
                    return Err(pending(conversation, &approval, what));
                }
            }
        }
        Ok(Resumed { calls, resolved })
    }
}

fn pending(conversation: &str, approval: &Approval, what: &'static str) -> CallError {
    AgentError::ApprovalPending {
        conversation: conversation.to_owned(),
        approval_id: approval.id.clone(),
        what,
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ToolOutcome;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "crm.add_note".into(),
            arguments: "{}".into(),
        }
    }

    #[test]
    fn the_calls_of_the_last_answer_without_a_result_are_held() {
        let mut answer = ChatMessage::text(Role::Assistant, String::new());
        answer.tool_calls = vec![call("a"), call("b")];
        let result = ChatMessage {
            role: Role::Tool,
            content: String::new(),
            tool_calls: Vec::new(),
            tool_result: Some(ToolOutcome {
                call_id: "a".into(),
                name: "crm.add_note".into(),
                content: "{}".into(),
                is_error: false,
            }),
        };
        let user = ChatMessage::text(Role::User, "hi".to_owned());
        let history = vec![user.clone(), answer.clone(), result.clone()];
        let held: Vec<_> = held_calls(&history).into_iter().map(|c| c.id).collect();
        assert_eq!(held, vec!["b".to_owned()]);
        let done = ChatMessage::text(Role::Assistant, "done".to_owned());
        assert!(held_calls(&[user.clone(), answer, result, done]).is_empty());
        assert!(held_calls(&[user]).is_empty());
    }
}
