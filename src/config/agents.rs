//! `[agents.<name>]` (SPEC §11.2): a conversation agent's model chain, its
//! layered prompt, the tools it may call and the caps of one turn.

use super::TargetConfig;
use serde::Deserialize;
use std::time::Duration;

/// One agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Ordered targets, as a task's: the first is primary.
    pub chain: Vec<TargetConfig>,
    /// Layer 1: the immutable core prompt.
    pub core_prompt: String,
    /// Layer 2: the `ai_prompts` key of its governed system prompt, if any.
    #[serde(default)]
    pub prompt_key: Option<String>,
    /// Names (`sms.segments`) or `prefix.*` patterns, further limited by the caller's capabilities.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Model calls per turn at most.
    #[serde(default = "default_max_iterations")]
    pub max_iterations: u32,
    /// Tool executions per turn at most.
    #[serde(default = "default_max_tool_calls")]
    pub max_tool_calls: u32,
    /// Timeout of each tool call (and at most the tool's own).
    #[serde(with = "humantime_serde", default = "default_tool_timeout")]
    pub tool_timeout: Duration,
    /// Run a model answer's tool calls concurrently.
    #[serde(default = "yes")]
    pub parallel_tool_calls: bool,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Layer 3 (the caller's preferences) token budget.
    #[serde(default = "default_preferences_budget")]
    pub preferences_token_budget: u32,
    /// Layer 4 (retrieved context) token budget.
    #[serde(default = "default_retrieved_budget")]
    pub retrieved_token_budget: u32,
    /// Layer 5 (history and the new message) token budget.
    #[serde(default = "default_history_budget")]
    pub history_token_budget: u32,
    /// Stored messages kept in the prompt at most.
    #[serde(default = "default_max_history_messages")]
    pub max_history_messages: u32,
    /// Days a conversation is kept after its last turn.
    #[serde(default = "default_retention_days")]
    pub retention_days: u32,
    /// The smallest context window of the chain's models: fixed layers, budgets, `max_tokens` fit.
    #[serde(default = "default_context_window")]
    pub context_window: u32,
    /// Ask for memory suggestions with each answer.
    #[serde(default)]
    pub memory_suggestions: bool,
    /// Layer 0, the built-in safety core, above `core_prompt` (SPEC §15).
    #[serde(default = "yes")]
    pub safety_core: bool,
    /// `[guardrails.<name>]` screening its turns, in order.
    #[serde(default)]
    pub guardrails: Vec<String>,
    /// Personal data masked before a provider sees it (SPEC §15).
    #[serde(default)]
    pub pii: Option<super::guardrails::PiiConfig>,
    /// What becomes of history that no longer fits layer 5 (SPEC §15).
    #[serde(default)]
    pub history_overflow: HistoryOverflow,
    /// `summarize`: the task (`[tasks.<name>]`) that writes the summary.
    #[serde(default)]
    pub summary_task: Option<String>,
}

/// What becomes of the oldest messages once the history outgrows its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HistoryOverflow {
    /// Left out of the prompt (still stored).
    #[default]
    Drop,
    /// Replaced by one summary, written by `summary_task` and stored on the
    /// conversation.
    Summarize,
}

impl HistoryOverflow {
    /// The name in config and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryOverflow::Drop => "drop",
            HistoryOverflow::Summarize => "summarize",
        }
    }
}

fn yes() -> bool {
    true
}
fn default_max_iterations() -> u32 {
    10
}
fn default_max_tool_calls() -> u32 {
    20
}
fn default_tool_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_max_tokens() -> u32 {
    1024
}
fn default_preferences_budget() -> u32 {
    512
}
fn default_retrieved_budget() -> u32 {
    4096
}
fn default_history_budget() -> u32 {
    8192
}
fn default_max_history_messages() -> u32 {
    50
}
fn default_context_window() -> u32 {
    128_000
}
fn default_retention_days() -> u32 {
    30
}

impl AgentConfig {
    /// Tokens besides the fixed layers: the budgets of layers 3-5 and `max_tokens`.
    pub fn variable_tokens(&self) -> u64 {
        [
            self.preferences_token_budget,
            self.retrieved_token_budget,
            self.history_token_budget,
            self.max_tokens,
        ]
        .into_iter()
        .map(u64::from)
        .sum()
    }
}
