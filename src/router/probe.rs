//! Active provider probes (SPEC §18): one loop per provider with `probe`,
//! sending the kind's cheapest request every `interval`.
//!
//! A probe is never metered, counted in call statistics or reported to the
//! breaker, so it can neither open nor close one against real traffic; its
//! result shows in `GetProviderHealth`, `/health/providers`, `provider_probe_up`.

use super::Router;
use crate::{
    config::{Config, ProbeConfig},
    domain::ProviderError,
    domain::instant_after,
    providers::{ProbeRequest, Provider},
    resilience::{ProbeResult, ProbeState},
    telemetry::{metrics, trace_id},
};
use std::{sync::Arc, time::SystemTime};
use tokio::{sync::watch, task::JoinHandle, time::Instant};

impl Router {
    /// Starts one probe loop per provider with `probe`, until `stopped`.
    pub fn spawn_probes(&self, stopped: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        let mut loops = Vec::new();
        for (name, p) in &self.config.providers {
            let (Some(probe), Some(provider), Some(guards)) =
                (p.probe, self.providers.get(name), self.resilience.get(name))
            else {
                continue;
            };
            let target = Target {
                name: name.clone(),
                provider,
                model: routed_model(&self.config, name),
                state: guards.probe.clone(),
            };
            loops.push(tokio::spawn(probe_periodically(
                target,
                probe,
                stopped.clone(),
            )));
        }
        loops
    }
}

/// What one loop probes.
struct Target {
    name: String,
    provider: Arc<dyn Provider>,
    model: Option<String>,
    state: ProbeState,
}

/// The first model a task or agent chain sends to `provider`: what a kind
/// without a model list (Perplexity) probes with.
fn routed_model(config: &Config, provider: &str) -> Option<String> {
    let tasks = config.tasks.values().map(|t| &t.chain);
    let agents = config.agents.values().map(|a| &a.chain);
    tasks
        .chain(agents)
        .flatten()
        .find(|t| t.provider == provider)
        .map(|t| t.model.clone())
}

/// Probes at once, then every `interval` after the previous probe began.
async fn probe_periodically(
    target: Target,
    config: ProbeConfig,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let started = Instant::now();
        tokio::select! {
            result = probe_once(target.provider.as_ref(), target.model.clone(), config) => {
                note(&target, result);
            }
            _ = stopped.wait_for(|s| *s) => return,
        }
        tokio::select! {
            () = tokio::time::sleep_until(instant_after(started, config.interval)) => {}
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

/// One probe, bounded by `config.timeout` whatever the provider does.
pub(crate) async fn probe_once(
    provider: &dyn Provider,
    model: Option<String>,
    config: ProbeConfig,
) -> ProbeResult {
    let started = Instant::now();
    let deadline = instant_after(started, config.timeout);
    let request = ProbeRequest {
        model,
        trace_id: trace_id::generate(),
        deadline,
    };
    let answered = tokio::time::timeout_at(deadline, provider.probe(request))
        .await
        .unwrap_or(Err(ProviderError::Timeout));
    ProbeResult {
        at: SystemTime::now(),
        latency: started.elapsed(),
        error_code: answered.err().map(|e| e.code()),
    }
}

/// Keeps the result, counts it, and logs a change of verdict once.
fn note(target: &Target, result: ProbeResult) {
    metrics::probe(&target.name, result.ok(), result.latency);
    let was_ok = target.state.record(result.clone()).map(|r| r.ok());
    match (was_ok, &result.error_code) {
        (Some(false), None) => {
            tracing::info!(provider = %target.name, "provider probe answered again");
        }
        (None | Some(true), Some(code)) => tracing::warn!(
            provider = %target.name,
            error_code = %code,
            latency_ms = result.latency.as_millis() as u64,
            "provider probe failed"
        ),
        _ => {}
    }
}
