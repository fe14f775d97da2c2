//! Agents (SPEC §11): the turn's loop (`turn`, over the session the call
//! pipeline gives it), the conversations it keeps, the layered prompt it
//! sends, the memory suggestions it parses, why it stops.

pub mod conversations;
pub mod memory;
pub mod prompt;
pub mod safety;
pub mod turn;

use crate::config::agents::AgentConfig;

/// Layers 0 and 1 as a turn sends them: the safety core (unless the agent
/// turned it off), the core prompt, and for an agent asking for memory
/// suggestions the structured-answer instruction, which is the agent's own
/// (above the quoted data, counted against the window).
pub fn core_layer(agent: &AgentConfig) -> String {
    let mut core = safety::core(agent).map_or_else(String::new, |s| format!("{s}\n\n"));
    core.push_str(&agent.core_prompt);
    if agent.memory_suggestions {
        core.push_str("\n\n");
        core.push_str(memory::instruction());
    }
    core
}

/// The system prompt's fixed text, as the window counts it: layers 0–1,
/// the governed prompt (`system`), and the tool guardrail.
pub fn fixed_text(agent: &AgentConfig, system: Option<&str>) -> String {
    let mut text = core_layer(agent);
    for part in [system, safety::tool_guardrail(agent)]
        .into_iter()
        .flatten()
    {
        text.push_str("\n\n");
        text.push_str(part);
    }
    text
}

/// Tokens every turn of `agent` needs before any caller data: the fixed
/// text ([`fixed_text`], with `system` the governed prompt), counted with
/// the primary model's tokenizer as a turn counts them, plus the layer
/// budgets and `max_tokens`. Past `context_window` every turn is refused.
/// Counted with the free bound first, as a turn does (the tokenizer's
/// tables take tens of MB): a need within the window may be an over-count,
/// one past it is exact. CPU work on long prompts: call it off the
/// runtime's threads.
pub fn fixed_need(agent: &AgentConfig, system: Option<&str>) -> u64 {
    let model = agent.chain.first().map_or("", |t| t.model.as_str());
    let text = fixed_text(agent, system);
    let variable = agent.variable_tokens();
    let room = u64::from(agent.context_window).saturating_sub(variable);
    crate::domain::tokens::count_within(model, &text, room).saturating_add(variable)
}

/// Why a turn ended (`completed.stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model answered without calling a tool.
    FinalAnswer,
    /// `max_iterations` model calls were made.
    MaxIterations,
    /// `max_tool_calls` tool executions were made.
    MaxToolCalls,
    /// The next model call's estimate exceeds what is left of the budget.
    Budget,
    /// The deadline passed.
    Deadline,
    /// A tool call waits for a person's decision (SPEC §14.1); `resume` goes on.
    ApprovalRequired,
}

impl StopReason {
    /// The stored and exported spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::FinalAnswer => "FINAL_ANSWER",
            StopReason::MaxIterations => "MAX_ITERATIONS",
            StopReason::MaxToolCalls => "MAX_TOOL_CALLS",
            StopReason::Budget => "BUDGET",
            StopReason::Deadline => "DEADLINE",
            StopReason::ApprovalRequired => "APPROVAL_REQUIRED",
        }
    }
}

/// Why a turn could not start (each is a gRPC error before any event).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum AgentError {
    /// No `[agents.<name>]`; `known` lists the configured ones.
    #[error("unknown agent `{name}`")]
    UnknownAgent { name: String, known: Vec<String> },
    /// No such conversation for the team (or it was erased).
    #[error("conversation `{0}` not found")]
    ConversationNotFound(String),
    /// Another turn of the conversation is running.
    #[error("another turn of conversation `{0}` is running")]
    ConversationBusy(String),
    /// The conversation belongs to another agent.
    #[error("conversation `{conversation}` talks to agent `{agent}`")]
    AgentMismatch {
        /// The conversation.
        conversation: String,
        /// Its agent.
        agent: String,
    },
    /// The fixed layers (the core and the governed system prompt), the
    /// budgets and the answer exceed the agent's `context_window`: the
    /// governed prompt grew past what the config allowed for.
    #[error(
        "the prompt's fixed layers need {tokens} tokens with the budgets; the window is {window}"
    )]
    WindowExceeded {
        /// Tokens needed.
        tokens: u64,
        /// `context_window`.
        window: u32,
    },
    /// A layer of the prompt does not fit its budget.
    #[error(transparent)]
    Prompt(#[from] prompt::PromptError),
    /// A tool call of the conversation waits for a decision (or for
    /// `resume`): no new message until it is settled.
    #[error(
        "conversation `{conversation}` has a tool call awaiting approval {approval_id}: {what}"
    )]
    ApprovalPending {
        /// The conversation.
        conversation: String,
        /// The approval it waits on.
        approval_id: String,
        /// What to do.
        what: &'static str,
    },
    /// `resume` of a conversation with no held call.
    #[error("conversation `{0}` has no tool call to resume")]
    NothingToResume(String),
}

impl AgentError {
    /// The reason of [`AgentError::WindowExceeded`], also given when a
    /// prompt version that would cause it is refused activation.
    pub const PROMPT_EXCEEDS_WINDOW: &str = "PROMPT_EXCEEDS_WINDOW";

    /// The stable reason (`ErrorInfo.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            AgentError::UnknownAgent { .. } => "AGENT_UNKNOWN",
            AgentError::ConversationNotFound(_) => "CONVERSATION_NOT_FOUND",
            AgentError::ConversationBusy(_) => "CONVERSATION_BUSY",
            AgentError::AgentMismatch { .. } => "CONVERSATION_AGENT_MISMATCH",
            AgentError::WindowExceeded { .. } => Self::PROMPT_EXCEEDS_WINDOW,
            AgentError::Prompt(p) => p.reason(),
            AgentError::ApprovalPending { .. } => "APPROVAL_PENDING",
            AgentError::NothingToResume(_) => "NOTHING_TO_RESUME",
        }
    }
}

/// Whether tool `name` matches one of an agent's `tools` patterns: a name,
/// a `prefix.*` (the prefix and a dot, then anything), or `*`.
pub fn allows(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| {
        p == "*"
            || p == name
            || p.strip_suffix('*')
                .is_some_and(|prefix| prefix.ends_with('.') && name.starts_with(prefix))
    })
}

#[cfg(test)]
mod tests {
    use super::allows;

    #[test]
    fn patterns_match_names_and_prefixes_only() {
        let p = ["crm.*".to_owned(), "sms.segments".to_owned()];
        assert!(allows(&p, "crm.add_note"));
        assert!(allows(&p, "sms.segments"));
        assert!(
            !allows(&p, "crmx.add_note"),
            "the dot is part of the prefix"
        );
        assert!(!allows(&p, "crm"));
        assert!(!allows(&p, "sms.segments_v2"));
        assert!(!allows(&p, "system.echo"));
        assert!(allows(&["*".to_owned()], "system.echo"));
        assert!(!allows(&[], "system.echo"));
    }
}
