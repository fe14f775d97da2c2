//! Results: the machine-readable shape (`results.json`), its validation
//! when read back, the targets of issue #6, and the Markdown report
//! (`results.md`). Only what a reader of the report uses is recorded.

mod markdown;
mod step;
mod summary;
pub mod targets;
#[cfg(test)]
mod tests;
mod validate;

use crate::sys::Machine;
use serde::{Deserialize, Serialize};

pub use markdown::markdown;
pub use step::{LedgerView, Quantiles, ServerHistogram, Step};
pub use summary::{
    edge_cpu_ratio, edge_pairs, paired_summary, saturation_rates, saturation_rates_of, summary,
};
pub use validate::validate;

/// Version of the JSON layout; bump on incompatible changes.
pub const SCHEMA_VERSION: u32 = 3;

/// Everything a run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Results {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Start, RFC 3339 UTC.
    pub started_at: String,
    /// End, RFC 3339 UTC.
    pub finished_at: String,
    /// Short CI mode (numbers meaningless).
    pub smoke: bool,
    /// `git rev-parse --short HEAD`, when available.
    pub git_commit: Option<String>,
    /// The server binary measured.
    pub server_bin: String,
    /// The machine.
    pub machine: Option<Machine>,
    /// Load average when the run ended.
    pub load_avg_at_end: [f64; 3],
    /// The settings used.
    pub settings: serde_json::Value,
    /// Server processes.
    pub groups: Vec<Group>,
    /// Fixed-rate steps and the direct baseline.
    pub steps: Vec<Step>,
    /// Paired rounds (direct and orchestrator back to back), the p99
    /// target's measurement.
    pub paired: Vec<Pair>,
    /// Saturation sweeps.
    pub saturation: Vec<Saturation>,
    /// Their steps.
    pub saturation_steps: Vec<Step>,
    /// Breaker scenario.
    pub breaker: Option<Breaker>,
    /// Long-calls scenario.
    pub in_flight: Option<InFlight>,
    /// Start-up times.
    pub cold_start: ColdStart,
    /// GetUsage over a team with many records this month.
    #[serde(default)]
    pub usage: Vec<UsageRead>,
    /// Two replicas with and without a shared cluster store (issue #44).
    #[serde(default)]
    pub cluster: Vec<ClusterRound>,
    /// `--wait-quiet`: the probes before each server's fixed-rate steps.
    pub quiet_waits: Vec<QuietWait>,
    /// Targets of issue #6.
    pub targets: Vec<Target>,
    /// Remarks (skipped parts, warnings).
    pub notes: Vec<String>,
}

impl Results {
    /// Every step of the run, whatever its scenario.
    pub fn all_steps(&self) -> impl Iterator<Item = &Step> {
        let breaker = self.breaker.iter().flat_map(|b| {
            b.healthy
                .iter()
                .chain(b.fast_fail.iter())
                .chain(b.refused.iter().map(|r| &r.step))
        });
        self.steps
            .iter()
            .chain(self.saturation_steps.iter())
            .chain(breaker)
            .chain(self.in_flight.iter().flat_map(|f| f.steps.iter()))
            .chain(
                self.paired
                    .iter()
                    .flat_map(|p| [&p.direct, &p.orchestrator]),
            )
    }
}

/// One server process of the run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Group {
    /// Metering mode.
    pub metering: String,
    /// Fake upstream latency, ms.
    pub upstream_latency_ms: u64,
    /// What it was started for: `load`, `breaker`, `in flight`, `cold start
    /// (new db)`, `cold start (existing db)`.
    pub purpose: String,
    /// Process start → health SERVING, ms.
    pub cold_start_ms: Option<f64>,
    /// Peak RSS over its life, MiB.
    pub peak_rss_mb: Option<f64>,
    /// Exited 0 after SIGTERM.
    pub clean_exit: Option<bool>,
    /// Why it did not run, if it did not.
    pub skipped: Option<String>,
}

/// One paired round: a direct step and an orchestrator step back to back.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Pair {
    /// Metering mode of the server.
    pub metering: String,
    /// RPC of this round.
    pub rpc: String,
    /// Round on this server, 0-based.
    pub round: u32,
    /// The direct step ran first (rounds alternate).
    pub direct_first: bool,
    /// Straight to the fake upstream.
    pub direct: Step,
    /// Through the orchestrator; its `added_latency_us` is against `direct`.
    pub orchestrator: Step,
}

/// One saturation sweep: the highest rate that met the criteria.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Saturation {
    /// Metering mode.
    pub metering: String,
    /// Which sweep of this server (0-based): `--saturation-repeats` sweeps
    /// run one after another, an idle wait between them.
    pub repeat: u32,
    /// RPC.
    pub rpc: String,
    /// Fake upstream latency, ms.
    pub upstream_latency_ms: u64,
    /// Highest offered rate that passed.
    pub highest_passing_rps: Option<f64>,
    /// Achieved rate at that step.
    pub achieved_rps: Option<f64>,
    /// First offered rate that failed.
    pub first_failing_rps: Option<f64>,
    /// Why it failed.
    pub failed_because: Option<String>,
}

/// One round of the cluster scenario: two replicas, `[cluster]` on one
/// Redis or not, Execute at a fixed rate and a saturation sweep, the load
/// spread over both.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClusterRound {
    /// Position in the run (rounds alternate off, on, on, off, ...).
    pub round: u32,
    /// Whether `[cluster]` was on.
    pub cluster: bool,
    /// The fixed-rate step (its CPU figure is the first replica's).
    pub step: Step,
    /// CPU seconds per 1,000 calls of that step over both replicas.
    pub cpu_s_per_1k_both: Option<f64>,
    /// Redis's CPU seconds per 1,000 calls of that step.
    pub redis_cpu_s_per_1k: Option<f64>,
    /// The saturation sweep over both replicas.
    pub saturation: Saturation,
}

/// The fast-fail paths of an open breaker.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Breaker {
    /// Calls sent before the breaker was seen OPEN.
    pub calls_to_open: u64,
    /// Calls the failing upstream received while measuring (must be 0).
    pub broken_upstream_calls_while_open: u64,
    /// Chain straight to the healthy provider (SQLite metering).
    pub healthy: Option<Step>,
    /// Chain whose open primary is skipped before the healthy fallback.
    pub fast_fail: Option<Step>,
    /// A task whose only target is the open breaker: every call refused
    /// with UNAVAILABLE and no provider call, one step per metering mode.
    pub refused: Vec<Refused>,
}

/// Calls refused at once (closed loop), on one server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Refused {
    /// Metering mode of the server.
    pub metering: String,
    /// Calls the failing upstream received while measuring (must be 0).
    pub broken_upstream_calls: u64,
    /// The step; `ok` counts the calls refused with UNAVAILABLE.
    pub step: Step,
}

/// Long calls (as LLM calls are): memory per call in flight.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct InFlight {
    /// Fake upstream latency, ms.
    pub upstream_latency_ms: u64,
    /// Execute at each rate, SQLite metering.
    pub steps: Vec<Step>,
    /// Calls in flight at each step: offered rps × success share × mean
    /// latency (Little's law in the steady state).
    pub calls_in_flight: Vec<f64>,
    /// Resident memory per call in flight, KiB: the RSS slope from the first
    /// to the last step.
    pub kib_per_call: Option<f64>,
}

/// Start-up times, ms.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ColdStart {
    /// New SQLite file (created and migrated during start-up).
    pub fresh_db_ms: Vec<f64>,
    /// Restart on an existing SQLite file.
    pub existing_db_ms: Vec<f64>,
}

/// GetUsage timed on one backend and query shape.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct UsageRead {
    /// Metering mode (the backend).
    pub metering: String,
    /// The team's records this month.
    pub records: u64,
    /// Seconds to write them (the rollup trigger runs for each).
    pub seed_s: f64,
    /// `group_by` of the calls (`totals` for none).
    pub group_by: String,
    /// Calls timed, one at a time.
    pub calls: u64,
    /// Their latency, client side, ms.
    pub p50_ms: f64,
    /// 95th percentile, ms.
    pub p95_ms: f64,
    /// Slowest, ms.
    pub max_ms: f64,
}

/// One wait for a quiet host (`--wait-quiet`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct QuietWait {
    /// The server group whose fixed-rate steps waited.
    pub before: String,
    /// Each probe's p99 (direct, 1,000 rps, 2 s), µs.
    pub probe_p99_us: Vec<f64>,
    /// Each probe's disk sync p99 (400 `fdatasync`s of 16 KiB rewrites in
    /// the scratch folder), µs.
    pub probe_sync_p99_us: Vec<f64>,
    /// Whether the last probe was quiet (else the wait timed out).
    pub quiet: bool,
    /// Seconds spent probing and waiting.
    pub waited_s: f64,
}

/// One target of issue #6 and what this run reached.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Target {
    /// What is measured.
    pub name: String,
    /// The goal.
    pub goal: String,
    /// What this run measured.
    pub reached: String,
    /// Met, missed, or not judged (null): not measured, or inconclusive.
    pub met: Option<bool>,
}
