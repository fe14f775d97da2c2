//! `/health/providers` (SPEC §18): which targets of each chain could serve a
//! call now (breaker not open, no 429 cooldown, latest probe answered).
//! Readiness never looks at providers: an outage must not drain replicas.

use super::Router;
use crate::{
    config::TargetConfig,
    resilience::{BreakerState, ProviderGuards},
};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The report and its verdict.
#[derive(Debug, Clone)]
pub struct ProvidersReport {
    /// Every task and agent chain has at least one healthy target.
    pub healthy: bool,
    /// The JSON body: each provider's state, each chain's healthy targets.
    pub body: Value,
}

impl Router {
    /// What `/health/providers` answers, as of now.
    pub fn providers_report(&self) -> ProvidersReport {
        let mut providers = BTreeMap::new();
        for (name, guards) in self.resilience.iter() {
            providers.insert(name.to_owned(), provider_entry(guards));
        }
        let is_healthy = |target: &TargetConfig| {
            providers
                .get(&target.provider)
                .is_some_and(|p| p["healthy"] == Value::Bool(true))
        };
        let mut chains = BTreeMap::new();
        let mut unhealthy = Vec::new();
        let tasks = self.config.tasks.iter().map(|(n, t)| (n.clone(), &t.chain));
        let agents = (self.config.agents.iter()).map(|(n, a)| (format!("agent/{n}"), &a.chain));
        for (name, chain) in tasks.chain(agents) {
            let healthy: Vec<String> = chain
                .iter()
                .filter(|t| is_healthy(t))
                .map(|t| format!("{}/{}", t.provider, t.model))
                .collect();
            if healthy.is_empty() {
                unhealthy.push(name.clone());
            }
            chains.insert(
                name,
                json!({ "targets": chain.len(), "healthy_targets": healthy }),
            );
        }
        let healthy = unhealthy.is_empty();
        let body = json!({
            "status": if healthy { "ok" } else { "degraded" },
            "chains_without_healthy_target": unhealthy,
            "providers": providers,
            "chains": chains,
        });
        ProvidersReport { healthy, body }
    }
}

fn provider_entry(guards: &ProviderGuards) -> Value {
    let breaker = guards.breaker.snapshot();
    let probe = guards.probe.last();
    let cooling_down = breaker.cooldown_until.is_some();
    let healthy = breaker.state != BreakerState::Open
        && !cooling_down
        && probe.as_ref().is_none_or(|p| p.ok());
    json!({
        "healthy": healthy,
        "breaker": breaker.state.as_str(),
        "cooling_down": cooling_down,
        "probe": probe.map(|p| json!({
            "ok": p.ok(),
            "latency_ms": u64::try_from(p.latency.as_millis()).unwrap_or(u64::MAX),
            "error_code": p.error_code,
            "at": humantime_serde::re::humantime::format_rfc3339_millis(p.at).to_string(),
        })),
    })
}
