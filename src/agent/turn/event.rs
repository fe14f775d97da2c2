//! What a turn reports to its caller, and how it ended.

use crate::agent::StopReason;

/// What a turn reports, in order: `Started` first, `Completed` (or
/// `Failed`) last.
#[derive(Debug)]
pub enum TurnEvent<M, E> {
    /// The turn runs in this conversation.
    Started {
        /// The conversation (new or continued).
        conversation_id: String,
    },
    /// A piece of answer text.
    Delta(String),
    /// A tool call starts.
    ToolCall {
        /// The model's ID for it.
        call_id: String,
        /// Tool name.
        tool: String,
    },
    /// A tool call ended.
    ToolResult {
        /// The model's ID for it.
        call_id: String,
        /// Tool name.
        tool: String,
        /// SUCCEEDED, FAILED, TIMED_OUT or DENIED.
        status: &'static str,
        /// How long it ran.
        duration_ms: u64,
        /// Why it did not succeed.
        error_code: String,
    },
    /// A model call moved to its next target before any output.
    Fallback {
        /// Provider that failed.
        from: String,
        /// Provider tried next.
        to: String,
        /// Stable error code.
        reason: String,
    },
    /// A tool call waits for a person's decision: it was not run.
    ApprovalRequired {
        /// The model's ID for it.
        call_id: String,
        /// Tool name.
        tool: String,
        /// The approval to decide.
        approval_id: String,
    },
    /// The answer's memory suggestions.
    MemorySuggestions(Vec<String>),
    /// The turn ended.
    Completed(Box<TurnOutcome<M>>),
    /// The turn failed; nothing of it was stored.
    Failed(E),
}

/// How a turn ended.
#[derive(Debug)]
pub struct TurnOutcome<M> {
    /// The final answer, or the text so far when a cap ended the turn.
    pub text: String,
    /// Model calls made.
    pub iterations: u32,
    /// Tool executions made.
    pub tool_calls: u32,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Every model call and tool of the turn, summed.
    pub meta: M,
}
