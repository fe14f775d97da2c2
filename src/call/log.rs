//! What a call's model calls did, kept as they happen: every attempt with
//! its cost (computed once, here), which target served, which prompt was
//! used. The response meta and the usage record are both read from it.

use crate::{
    domain::TokenUsage,
    prompts::Prompt,
    router::{AttemptRecord, total_usage},
    usage::pricing::{Pricing, usd},
};
use std::time::Duration;

/// The log of one call.
#[derive(Debug, Default)]
pub(super) struct CallLog {
    /// Every attempt of every model call, in order.
    pub attempts: Vec<AttemptRecord>,
    /// Cost of each attempt in `attempts`, micro-USD; `None` when it
    /// consumed tokens of a model without a price.
    costs: Vec<Option<i64>>,
    /// The target that served the last answered model call, and whether it
    /// was a fallback.
    pub served: Option<(String, String, bool)>,
    /// The stored prompt version used: `(owner team, key, version)`;
    /// version 0 is a built-in.
    pub prompt: Option<(String, String, u32)>,
    /// Tools invoked: `(kind, name@version, cost in micro-USD)`.
    pub tools: Vec<(&'static str, String, i64)>,
    /// How long the tools ran: waiting on them, like on a provider, is not
    /// our overhead.
    pub tool_time: Duration,
}

impl CallLog {
    /// Adds a model call's attempts, pricing each once.
    pub fn add(&mut self, attempts: &[AttemptRecord], pricing: &Pricing) {
        for a in attempts {
            let (input, output) = (a.usage.input_tokens, a.usage.output_tokens);
            let cost = if input == 0 && output == 0 {
                Some(0)
            } else {
                pricing.cost_micros(&a.provider, &a.model, input, output)
            };
            self.costs.push(cost);
            self.attempts.push(a.clone());
        }
    }

    /// Adds a tool invocation, what it cost and how long it ran.
    pub fn add_tool(&mut self, kind: &'static str, id: String, cost_micros: i64, took: Duration) {
        self.tools.push((kind, id, cost_micros));
        self.tool_time += took;
    }

    /// Remembers the prompt a model call used.
    pub fn prompt(&mut self, prompt: &Prompt) {
        self.prompt = Some((prompt.owner.clone(), prompt.key.clone(), prompt.version));
    }

    /// Tokens over every attempt.
    pub fn usage(&self) -> TokenUsage {
        total_usage(&self.attempts)
    }

    /// Cost of every attempt, micro-USD; `None` when one that consumed
    /// tokens has no price (the cost is then unknown, not understated).
    pub fn cost_micros(&self) -> Option<i64> {
        let models = self
            .costs
            .iter()
            .try_fold(0_i64, |sum, cost| cost.map(|c| sum.saturating_add(c)))?;
        Some(
            self.tools
                .iter()
                .fold(models, |sum, (_, _, c)| sum.saturating_add(*c)),
        )
    }

    /// Each attempt with its cost, for metrics.
    pub fn priced(&self) -> impl Iterator<Item = (&AttemptRecord, Option<i64>)> {
        self.attempts.iter().zip(self.costs.iter().copied())
    }
}

/// What happened while serving a call (becomes `ResponseMeta`).
#[derive(Debug, Clone, Default)]
pub struct CallMeta {
    /// Trace ID.
    pub trace_id: String,
    /// Serving provider (empty when none was needed).
    pub provider: String,
    /// Serving model.
    pub model: String,
    /// A fallback served.
    pub degraded: bool,
    /// Every attempt.
    pub attempts: Vec<AttemptRecord>,
    /// Tokens over all attempts.
    pub usage: TokenUsage,
    /// Cost in USD, when every model involved has a price.
    pub cost_usd: Option<f64>,
    /// Server-side latency.
    pub latency: Duration,
    /// Prompt key.
    pub prompt_key: String,
    /// Prompt version (0 = built-in).
    pub prompt_version: u32,
}

impl CallMeta {
    /// The meta of a call whose log is `log`.
    pub(super) fn of(log: &CallLog, trace_id: &str, latency: Duration) -> Self {
        // A call that ran a tool and no model is served by the tool.
        let tool = || {
            log.tools
                .last()
                .map(|(kind, id, _)| (format!("tool:{kind}"), id.clone(), false))
        };
        let (provider, model, degraded) = log.served.clone().or_else(tool).unwrap_or_default();
        let (prompt_key, prompt_version) = log
            .prompt
            .as_ref()
            .map(|(_, key, version)| (key.clone(), *version))
            .unwrap_or_default();
        CallMeta {
            trace_id: trace_id.to_owned(),
            provider,
            model,
            degraded,
            attempts: log.attempts.clone(),
            usage: log.usage(),
            cost_usd: log.cost_micros().map(usd),
            latency,
            prompt_key,
            prompt_version,
        }
    }
}
