//! What a call's model calls and tools did, as they happen, each attempt
//! priced once: the response meta and the usage record are read from it.

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
    /// Cost of each attempt, micro-USD; `None` for a model without a price.
    costs: Vec<Option<i64>>,
    /// `(provider, model, fallback)` of the last answered model call.
    pub served: Option<(String, String, bool)>,
    /// `(owner team, key, version)` of the prompt used; version 0 is a built-in.
    pub prompt: Option<(String, String, u32)>,
    /// Tools invoked: `(kind, name@version, cost in micro-USD)`.
    pub tools: Vec<(&'static str, String, i64)>,
    /// How long tools ran: waiting on them is not our overhead.
    pub tool_time: Duration,
    /// Estimated cost reserved for its model calls, micro-USD (`None` unmetered).
    pub estimated_micros: Option<i64>,
    /// Digest and size of the redacted input of an audited call (`[audit] calls`).
    pub audit_input: Option<(String, i64)>,
    /// Digest and size of its last answer, redacted.
    pub audit_output: Option<(String, i64)>,
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

    /// Adds the estimated cost a model call reserved.
    pub fn estimated(&mut self, cost_micros: i64) {
        let sum = self
            .estimated_micros
            .unwrap_or(0)
            .saturating_add(cost_micros);
        self.estimated_micros = Some(sum);
    }

    /// Remembers the prompt a model call used.
    pub fn prompt(&mut self, prompt: &Prompt) {
        self.prompt = Some((prompt.owner.clone(), prompt.key.clone(), prompt.version));
    }

    /// Tokens over every attempt.
    pub fn usage(&self) -> TokenUsage {
        total_usage(&self.attempts)
    }

    /// Total micro-USD; `None` when an attempt has no price (not understated).
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
    pub trace_id: String,
    /// Serving provider (empty when none was needed).
    pub provider: String,
    pub model: String,
    /// A fallback served.
    pub degraded: bool,
    pub attempts: Vec<AttemptRecord>,
    pub usage: TokenUsage,
    /// Cost in USD, when every model involved has a price.
    pub cost_usd: Option<f64>,
    pub latency: Duration,
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
