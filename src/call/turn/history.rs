//! Layer 5's stored part and what becomes of it when it outgrows its budget
//! (SPEC §15, `history_overflow`): `drop` leaves the oldest messages out of
//! the prompt; `summarize` replaces them with one summary written by the
//! agent's `summary_task` (a call of its own, metered), stored on the
//! conversation with the last message it covers, so later turns read only
//! what came after. Either way `agent_history_truncated_total` counts it.

use super::super::{CallContext, CallError, Pipeline};
use super::lease;
use crate::{
    agent::conversations::{self, Conversation, StoredMessage},
    config::agents::{AgentConfig, HistoryOverflow},
    domain::completion::Role,
    telemetry::metrics,
};
use serde_json::{Map, Value};

/// Messages after the summary read beyond `max_history_messages`, to be
/// summarized with what the budget cuts. Older ones than these (a turn
/// would need hundreds of tool calls to leave them) are dropped unsummarized.
const OLDER_READ: u32 = 200;

/// The conversation's messages a turn reads.
pub(super) struct Stored {
    /// The newest `max_history_messages` the summary does not cover, oldest first.
    pub messages: Vec<StoredMessage>,
    /// Older ones the summary does not cover either, oldest first
    /// (dropping, at most one: enough to know the limit cut).
    pub older: Vec<StoredMessage>,
}

/// A turn's history that did not fit.
pub(super) struct Overflow<'a> {
    pub agent: &'a str,
    pub config: &'a AgentConfig,
    pub conversation: &'a Conversation,
    /// The lease's holder, which the summary's write is conditioned on.
    pub token: &'a str,
    /// How many of the oldest `Stored::messages` the assembly left out.
    pub dropped: usize,
}

impl Pipeline {
    /// The stored messages of `conversation` a turn of `agent` reads.
    pub(super) async fn history(
        &self,
        agent: &AgentConfig,
        conversation: &Conversation,
    ) -> Result<Stored, CallError> {
        let mut stored = Stored {
            messages: Vec::new(),
            older: Vec::new(),
        };
        if conversation.turns == 0 {
            return Ok(stored);
        }
        let summarize = agent.history_overflow == HistoryOverflow::Summarize;
        let limit = agent.max_history_messages;
        // Dropping, one more than the limit tells whether the limit cut any.
        let read = limit.saturating_add(if summarize { OLDER_READ } else { 1 });
        let (id, after) = (&conversation.id, conversation.summary_through);
        let mut messages = conversations::history_after(self.store(), id, after, read)
            .await
            .map_err(|e| CallError::Storage(e.to_string()))?;
        let split = messages.len().saturating_sub(limit as usize);
        stored.messages = messages.split_off(split);
        stored.older = messages;
        Ok(stored)
    }

    /// Counts a turn whose history did not fit and, under `summarize`,
    /// replaces what was left out with a new summary (the old one and the
    /// left-out messages, summarized together), stored on the conversation.
    /// The summary to assemble with, or `None` to keep the assembly (nothing
    /// overflowed, the agent drops, or the summary failed: dropped then,
    /// and tried again next turn).
    pub(super) async fn overflowed(
        &self,
        ctx: &CallContext,
        stored: &Stored,
        overflow: Overflow<'_>,
    ) -> Result<Option<String>, CallError> {
        let left_out = stored.messages.iter().take(overflow.dropped);
        let covered: Vec<&StoredMessage> = stored.older.iter().chain(left_out).collect();
        let Some(last) = covered.last() else {
            return Ok(None);
        };
        let task = match (
            &overflow.config.summary_task,
            overflow.config.history_overflow,
        ) {
            (Some(task), HistoryOverflow::Summarize) => task,
            _ => {
                metrics::agent_history_truncated(overflow.agent, "drop");
                return Ok(None);
            }
        };
        let previous = &overflow.conversation.summary;
        let summary = match self.summarize(ctx, task, previous, &covered).await {
            Ok(summary) => summary,
            Err(why) => {
                tracing::warn!(trace_id = %ctx.trace_id, agent = overflow.agent, error = %why, "summarizing the history failed; its oldest messages are left out");
                metrics::agent_history_truncated(overflow.agent, "drop");
                return Ok(None);
            }
        };
        let id = &overflow.conversation.id;
        let write = conversations::summarized(id, overflow.token, &summary, last.seq);
        lease::write(self, &ctx.team_id, vec![write], false, Vec::new()).await?;
        metrics::agent_history_truncated(overflow.agent, "summarize");
        Ok(Some(summary))
    }

    /// One summary of `previous` and `messages`, by `task` through the
    /// pipeline (a call of its own: admitted, metered, recorded).
    async fn summarize(
        &self,
        ctx: &CallContext,
        task: &str,
        previous: &str,
        messages: &[&StoredMessage],
    ) -> Result<String, String> {
        let limit = self.config().server.max_prompt_bytes / 4;
        let mut input = Map::new();
        input.insert("summary".into(), Value::String(previous.to_owned()));
        input.insert(
            "messages".into(),
            Value::String(transcript(messages, limit)),
        );
        match self
            .run_aside(ctx, task, input)
            .await
            .map(|(output, _)| output)
        {
            Ok(output) if !output.text.trim().is_empty() => Ok(output.text.trim().to_owned()),
            Ok(_) => Err("the summary task answered nothing".into()),
            Err(reason) => Err(reason.to_owned()),
        }
    }
}

/// `messages` as lines of text (`user: ...`, a tool call, a tool's result),
/// the newest `limit` bytes of them: an overflow too long to summarize
/// whole keeps what is closest to the conversation that follows.
fn transcript(messages: &[&StoredMessage], limit: usize) -> String {
    let mut lines: Vec<String> = Vec::with_capacity(messages.len());
    for m in messages {
        let m = &m.message;
        let role = match m.role {
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        if !m.content.is_empty() {
            lines.push(format!("{role}: {}", m.content));
        }
        for call in &m.tool_calls {
            lines.push(format!(
                "assistant called {}: {}",
                call.name, call.arguments
            ));
        }
        if let Some(result) = &m.tool_result {
            lines.push(format!("{} answered: {}", result.name, result.content));
        }
    }
    let text = lines.join("\n");
    if text.len() <= limit {
        return text;
    }
    let mut start = text.len() - limit;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ChatMessage, ToolCall, ToolOutcome};

    fn stored(seq: i64, message: ChatMessage) -> StoredMessage {
        StoredMessage {
            turn: 1,
            message,
            created_at_ms: 0,
            seq,
        }
    }

    #[test]
    fn a_transcript_names_each_speaker_and_keeps_the_newest_bytes() {
        let call = ChatMessage {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "crm.lookup".into(),
                arguments: r#"{"id":"L-1"}"#.into(),
            }],
            tool_result: None,
        };
        let result = ChatMessage {
            role: Role::Tool,
            content: String::new(),
            tool_calls: Vec::new(),
            tool_result: Some(ToolOutcome {
                call_id: "c1".into(),
                name: "crm.lookup".into(),
                content: "Ann, Berlin".into(),
                is_error: false,
            }),
        };
        let all = [
            stored(1, ChatMessage::text(Role::User, "Who is L-1?")),
            stored(2, call),
            stored(3, result),
            stored(4, ChatMessage::text(Role::Assistant, "Ann, in Berlin — ok")),
        ];
        let refs: Vec<&StoredMessage> = all.iter().collect();
        let whole = transcript(&refs, 10_000);
        assert_eq!(
            whole,
            "user: Who is L-1?\nassistant called crm.lookup: {\"id\":\"L-1\"}\n\
             crm.lookup answered: Ann, Berlin\nassistant: Ann, in Berlin — ok"
        );
        // Cut inside the dash (3 bytes): the cut moves to the next boundary.
        let cut = transcript(&refs, 5);
        assert_eq!(cut, " ok");
    }
}
