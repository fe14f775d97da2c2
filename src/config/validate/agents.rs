//! Validation of `[agents]`: a chain through existing providers (tool-capable for an agent
//! with tools), caps within bounds, tool patterns that can match.

use crate::config::{Config, ProviderKind};

/// Most model calls or tool calls a turn may be configured to make.
const MAX_TURN_CAP: u32 = 100;

/// Whether a provider kind speaks tool calling (Perplexity's API has none).
pub fn calls_tools(kind: ProviderKind) -> bool {
    !matches!(kind, ProviderKind::Perplexity)
}

/// A tool pattern: a tool name, or a prefix ending in `.*`, or `*`.
fn valid_pattern(p: &str) -> bool {
    let name = p.strip_suffix(".*").unwrap_or(p);
    p == "*"
        || ((1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')))
}

pub(super) fn check(config: &Config, bad: &mut dyn FnMut(String, &str)) {
    for (name, a) in &config.agents {
        let at = |key: &str| format!("agents.{name}.{key}");
        if a.chain.is_empty() {
            bad(at("chain"), "needs at least one target");
        }
        for (i, target) in a.chain.iter().enumerate() {
            match config.providers.get(&target.provider) {
                None => bad(
                    at(&format!("chain[{i}].provider")),
                    &format!("unknown provider `{}`", target.provider),
                ),
                Some(p) if !a.tools.is_empty() && !calls_tools(p.kind) => bad(
                    at(&format!("chain[{i}].provider")),
                    &format!(
                        "provider `{}` cannot call tools, and this agent has tools",
                        target.provider
                    ),
                ),
                Some(_) => {}
            }
            if target.model.trim().is_empty() {
                bad(at(&format!("chain[{i}].model")), "must not be empty");
            }
        }
        if a.core_prompt.trim().is_empty() {
            bad(
                at("core_prompt"),
                "must not be empty (layer 1 of the prompt)",
            );
        }
        summary_task(config, a, &at, bad);
        for (i, p) in a.tools.iter().enumerate() {
            if !valid_pattern(p) {
                bad(
                    at(&format!("tools[{i}]")),
                    "a tool name or a `prefix.*` pattern",
                );
            }
        }
        for (key, v) in [
            ("max_iterations", a.max_iterations),
            ("max_tool_calls", a.max_tool_calls),
        ] {
            if v == 0 || v > MAX_TURN_CAP {
                bad(at(key), &format!("must be between 1 and {MAX_TURN_CAP}"));
            }
        }
        // Capped by `tool_limits.max_timeout` at load.
        if a.tool_timeout.is_zero() {
            bad(at("tool_timeout"), "must be greater than zero");
        }
        if a.max_tokens == 0 || a.max_tokens > super::MAX_OUTPUT_TOKENS {
            bad(
                at("max_tokens"),
                &format!("must be between 1 and {}", super::MAX_OUTPUT_TOKENS),
            );
        }
        if let Some(t) = a.temperature
            && !(0.0..=2.0).contains(&t)
        {
            bad(at("temperature"), "must be between 0 and 2");
        }
        if a.history_token_budget == 0 || a.max_history_messages == 0 {
            bad(
                at("history_token_budget"),
                "the history layer needs room for the new message",
            );
        }
        // Layer 1 is fixed here; layer 2 when a prompt version is activated and when a turn starts.
        let room = u64::from(a.context_window).saturating_sub(a.variable_tokens());
        let fixed = a
            .chain
            .iter()
            .map(|t| crate::domain::tokens::count_within(&t.model, &a.core_prompt, room))
            .max()
            .unwrap_or(0);
        if fixed.saturating_add(a.variable_tokens()) > u64::from(a.context_window) {
            bad(
                at("core_prompt"),
                &format!(
                    "the core prompt ({fixed} tokens), the layer budgets and max_tokens ({}) \
                     exceed context_window ({})",
                    a.variable_tokens(),
                    a.context_window
                ),
            );
        }
        if a.retention_days == 0 {
            bad(at("retention_days"), "must be at least 1");
        }
        if config.metering.enabled {
            for (i, target) in a.chain.iter().enumerate() {
                let qualified = format!("{}/{}", target.provider, target.model);
                if !config.pricing.contains_key(&qualified)
                    && !config.pricing.contains_key(&target.model)
                {
                    bad(
                        at(&format!("chain[{i}].model")),
                        &format!("no price for `{}` (or price = \"unknown\")", target.model),
                    );
                }
            }
        }
    }
}

/// `history_overflow = "summarize"` names a task that writes the summary;
/// a `summary_task` elsewhere would never run.
fn summary_task(
    config: &Config,
    a: &crate::config::agents::AgentConfig,
    at: &dyn Fn(&str) -> String,
    bad: &mut dyn FnMut(String, &str),
) {
    use crate::config::agents::HistoryOverflow;
    match (a.history_overflow, &a.summary_task) {
        (HistoryOverflow::Summarize, None) => bad(
            at("summary_task"),
            "is required with history_overflow = \"summarize\"",
        ),
        (HistoryOverflow::Summarize, Some(task)) if !config.tasks.contains_key(task) => {
            bad(at("summary_task"), "names no [tasks.<name>] section");
        }
        (HistoryOverflow::Drop, Some(_)) => bad(
            at("summary_task"),
            "is for history_overflow = \"summarize\" only",
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn paths(extra: &str) -> Vec<String> {
        let toml = format!(
            r#"
[providers.openai]
kind = "openai"
api_key_env = "K"
[providers.pplx]
kind = "perplexity"
api_key_env = "K"
[pricing.m]
price = "unknown"
{extra}"#
        );
        match Config::from_toml_str(&toml, |_| Some("k".into())) {
            Ok(_) => Vec::new(),
            Err(e) => e.paths(),
        }
    }

    #[test]
    fn an_agent_with_tools_needs_providers_that_call_tools() {
        let agent = |tools: &str| {
            format!(
                "[agents.sdr]\nchain = [{{ provider = \"openai\", model = \"m\" }}, {{ provider = \"pplx\", model = \"m\" }}]\ncore_prompt = \"You help.\"\ntools = {tools}\n"
            )
        };
        assert_eq!(
            paths(&agent(r#"["crm.*"]"#)),
            ["agents.sdr.chain[1].provider"]
        );
        assert!(
            paths(&agent("[]")).is_empty(),
            "without tools Perplexity is fine"
        );
    }

    #[test]
    fn caps_patterns_and_prompts_are_checked() {
        let bad = paths(
            r#"[agents.a]
chain = [{ provider = "nobody", model = "m" }]
core_prompt = " "
tools = ["crm.*", "bad pattern!"]
max_iterations = 0
max_tool_calls = 1000
tool_timeout = "0s"
retention_days = 0
"#,
        );
        assert_eq!(
            bad,
            [
                "agents.a.chain[0].provider",
                "agents.a.core_prompt",
                "agents.a.tools[1]",
                "agents.a.max_iterations",
                "agents.a.max_tool_calls",
                "agents.a.tool_timeout",
                "agents.a.retention_days",
            ]
        );
        let defaults: Config = Config::from_toml_str(
            "[providers.o]\nkind = \"mock\"\n[pricing.m]\nprice = \"unknown\"\n[agents.a]\nchain = [{ provider = \"o\", model = \"m\" }]\ncore_prompt = \"x\"\n",
            |_| None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let a = &defaults.agents["a"];
        assert_eq!((a.max_iterations, a.max_tool_calls), (10, 20));
        assert_eq!(a.tool_timeout, std::time::Duration::from_secs(5));
        assert!(a.parallel_tool_calls && !a.memory_suggestions);
        assert_eq!(a.max_history_messages, 50);
    }

    #[test]
    fn fixed_layers_past_the_window_are_refused_at_load() {
        let agent = |window: u32| {
            format!(
                "[agents.a]\nchain = [{{ provider = \"openai\", model = \"m\" }}]\ncore_prompt = \"{}\"\ncontext_window = {window}\n",
                "You help. ".repeat(300)
            )
        };
        // Defaults: 512 + 4096 + 8192 budgets and 1024 output tokens; the
        // core prompt is 3,000 bytes, 1,000 tokens for this family.
        assert!(paths(&agent(13_824 + 1_000)).is_empty());
        assert_eq!(paths(&agent(13_824 + 999)), ["agents.a.core_prompt"]);
    }
}
