//! What to run and how hard: the command line resolved into the full-run
//! or the smoke defaults, and recorded in `results.json` as it ran.

use crate::{
    cli::Args,
    paired,
    server::{AuditCalls, Metering},
    target::Rpc,
};
use anyhow::Context;
use std::{path::PathBuf, time::Duration};

/// What to run and how hard.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Orchestrator binary.
    pub server_bin: PathBuf,
    /// Fixed rates, requests/s.
    pub rates: Vec<f64>,
    /// Sending time of a fixed-rate step.
    pub duration: Duration,
    /// Load before measuring, per RPC, on each new server.
    pub warmup: Duration,
    /// Fake upstream latencies, ms.
    pub latencies: Vec<u64>,
    /// Metering modes.
    pub metering: Vec<Metering>,
    /// `[audit] calls` modes of the fixed-rate groups.
    pub audit_calls: Vec<AuditCalls>,
    /// RPCs at fixed rates.
    pub rpcs: Vec<Rpc>,
    /// Run the direct baseline.
    pub direct: bool,
    /// Run the saturation sweep (Execute, lowest upstream latency).
    pub saturation: bool,
    /// RPCs swept at saturation, taking turns: `Execute`, and `InvokeTool`
    /// and `Converse` when `--rpcs` names them.
    pub sat_rpcs: Vec<Rpc>,
    /// How the orchestrator and the direct baseline reach the fake
    /// upstream.
    pub upstream: crate::upstream::Leg,
    /// HTTP/2 connections to the server.
    pub connections: usize,
    /// In-flight cap of the load generator.
    pub max_inflight: usize,
    /// Client-side timeout of one request.
    pub timeout: Duration,
    /// Each call sends its own random `x-trace-id`.
    pub caller_trace_ids: bool,
    /// First saturation rate.
    pub sat_start: f64,
    /// Rate multiplier between saturation steps.
    pub sat_factor: f64,
    /// Most saturation steps.
    pub sat_max_steps: usize,
    /// Bisection steps between the last passing and the first failing rate.
    pub sat_refine: usize,
    /// Sweeps per server: one sweep on a shared host cannot judge a
    /// target, so targets read the median of these.
    pub sat_repeats: usize,
    /// Sending time of a saturation step.
    pub sat_duration: Duration,
    /// Rate of the breaker scenario's open-loop steps.
    pub breaker_rate: f64,
    /// Callers of its refused calls (closed loop).
    pub breaker_callers: usize,
    /// Fake upstream latency of the long-calls scenario, ms.
    pub inflight_latency_ms: u64,
    /// Rates of the long-calls scenario.
    pub inflight_rates: Vec<f64>,
    /// Rate of the cluster scenario's fixed-rate step.
    pub cluster_rate: f64,
    /// Cold-start launches (each: new database, then a restart).
    pub coldstart_runs: usize,
    /// Records of the GetUsage scenario's team this month.
    pub usage_records: u64,
    /// GetUsage calls timed per query shape.
    pub usage_calls: usize,
    /// PostgreSQL admin URL (a database is created per server).
    pub postgres_url: String,
    /// Wait for a quiet host before each server's fixed-rate steps.
    pub quiet: Option<Quiet>,
    /// Paired rounds on each server at the lowest upstream latency.
    pub paired: Option<paired::Rounds>,
    /// Scratch folder (configs, SQLite files, server logs).
    pub dir: PathBuf,
}

/// When the host counts as quiet (`--wait-quiet`).
#[derive(Debug, Clone, Copy)]
pub struct Quiet {
    /// Longest wait before each server's fixed-rate steps.
    pub max_wait: Duration,
    /// A probe's direct p99 at 1,000 rps must be at most this, µs.
    pub p99_us: f64,
    /// And the disk probe's sync p99 at most this, µs.
    pub sync_p99_us: f64,
}

fn pick<T>(value: Option<T>, smoke: bool, smoke_default: T, full_default: T) -> T {
    value.unwrap_or(if smoke { smoke_default } else { full_default })
}

impl Settings {
    /// How each gRPC call is sent.
    pub fn sending(&self) -> crate::target::Sending {
        crate::target::Sending {
            timeout: self.timeout,
            caller_trace_ids: self.caller_trace_ids,
        }
    }

    /// `args` with the defaults of a full or a smoke run; `dir` is the
    /// scratch folder.
    pub fn new(args: &Args, dir: PathBuf) -> anyhow::Result<Self> {
        let s = args.smoke;
        let server_bin = match &args.server_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe()?.with_file_name("ai-orchestrator"),
        };
        anyhow::ensure!(
            server_bin.is_file(),
            "no server binary at {} (build it: cargo build --release --workspace --bins, or pass --server-bin)",
            server_bin.display()
        );
        let metering = args
            .metering
            .iter()
            .map(|m| Metering::parse(m).with_context(|| format!("--metering: unknown mode `{m}`")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let audit_calls = args
            .audit_calls
            .iter()
            .map(|a| {
                AuditCalls::parse(a).with_context(|| format!("--audit-calls: unknown mode `{a}`"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let rpcs = args
            .rpcs
            .iter()
            .map(|r| match r.as_str() {
                "execute" => Ok(Rpc::Execute),
                "classify" | "classify-sms" => Ok(Rpc::ClassifySms),
                "tool" | "invoke-tool" => Ok(Rpc::InvokeTool),
                "agent" | "converse" => Ok(Rpc::Converse),
                "chat-http" => Ok(Rpc::ChatHttp),
                other => Err(anyhow::anyhow!("--rpcs: unknown rpc `{other}`")),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let scenario = |name: &str| args.scenarios.iter().any(|x| x == name);
        let secs = |v: f64| Duration::from_secs_f64(v.max(0.05));
        let rates = pick(
            args.rates.clone(),
            s,
            vec![50.0],
            vec![200.0, 1000.0, 3000.0],
        );
        let inflight_rates = pick(
            args.inflight_rates.clone(),
            s,
            vec![20.0, 60.0],
            vec![100.0, 400.0, 800.0],
        );
        for (flag, rates) in [("--rates", &rates), ("--inflight-rates", &inflight_rates)] {
            anyhow::ensure!(rates.iter().all(|r| *r > 0.0), "{flag} must be positive");
        }
        Ok(Settings {
            server_bin,
            rates,
            duration: secs(pick(args.duration, s, 0.5, 10.0)),
            warmup: secs(pick(args.warmup, s, 0.3, 2.0)),
            latencies: pick(args.upstream_latency_ms.clone(), s, vec![0], vec![0, 50]),
            metering,
            audit_calls,
            sat_rpcs: std::iter::once(Rpc::Execute)
                .chain(rpcs.contains(&Rpc::InvokeTool).then_some(Rpc::InvokeTool))
                .chain(rpcs.contains(&Rpc::Converse).then_some(Rpc::Converse))
                .collect(),
            rpcs: if scenario("load") { rpcs } else { Vec::new() },
            direct: scenario("direct"),
            saturation: scenario("saturation"),
            upstream: crate::upstream::Leg::parse(&args.upstream_http).with_context(|| {
                format!("--upstream-http: unknown leg `{}`", args.upstream_http)
            })?,
            connections: args.connections.max(1),
            max_inflight: args.max_inflight.max(1),
            timeout: Duration::from_secs(10),
            caller_trace_ids: args.caller_trace_ids,
            sat_start: pick(args.saturation_start, s, 50.0, 1000.0),
            sat_factor: args.saturation_factor.max(1.01),
            sat_max_steps: pick(args.saturation_steps, s, 2, 25),
            sat_refine: pick(args.saturation_refine, s, 0, 3),
            // Smoke runs two so CI goes through the repeat and its idle wait.
            sat_repeats: pick(args.saturation_repeats, s, 2, 3).max(1),
            sat_duration: secs(pick(args.saturation_duration, s, 0.5, 5.0)),
            breaker_rate: pick(args.breaker_rate, s, 50.0, 1000.0),
            breaker_callers: args.breaker_callers.max(1),
            inflight_latency_ms: pick(args.inflight_latency_ms, s, 100, 1000),
            inflight_rates,
            cluster_rate: pick(args.cluster_rate, s, 50.0, 1000.0),
            coldstart_runs: pick(args.coldstart_runs, s, 1, 5),
            usage_records: pick(args.usage_records, s, 2_000, 1_000_000).max(1),
            usage_calls: pick(args.usage_calls, s, 3, 20).max(1),
            postgres_url: args.postgres_url.clone(),
            paired: scenario("paired").then(|| paired::Rounds {
                rounds: pick(args.paired_rounds, s, 2, 6).max(1),
                rate: pick(args.paired_rate, s, 50.0, 1000.0).max(1.0),
                duration: secs(pick(args.paired_duration, s, 0.5, 5.0)),
            }),
            quiet: (args.wait_quiet > 0).then(|| Quiet {
                max_wait: Duration::from_secs(args.wait_quiet),
                p99_us: args.quiet_p99_ms * 1000.0,
                sync_p99_us: args.quiet_sync_p99_ms * 1000.0,
            }),
            dir,
        })
    }

    /// The settings as `results.json` records them (validation reads some).
    pub fn to_json(&self, args: &Args) -> serde_json::Value {
        serde_json::json!({
            "rates": self.rates,
            "duration_s": self.duration.as_secs_f64(),
            "warmup_s": self.warmup.as_secs_f64(),
            "upstream_latency_ms": self.latencies,
            "metering": self.metering.iter().map(|m| m.name()).collect::<Vec<_>>(),
            "audit_calls": self.audit_calls.iter().map(|a| a.name()).collect::<Vec<_>>(),
            "scenarios": args.scenarios,
            "connections": self.connections,
            "max_inflight": self.max_inflight,
            "request_timeout_s": self.timeout.as_secs_f64(),
            "caller_trace_ids": self.caller_trace_ids,
            "saturation": {
                "start_rps": self.sat_start, "factor": self.sat_factor,
                "max_steps": self.sat_max_steps, "refine_steps": self.sat_refine,
                "repeats": self.sat_repeats, "duration_s": self.sat_duration.as_secs_f64(),
                "criteria": "achieved >= 95% of offered, errors <= 1%, p99 <= 100 ms",
            },
            "breaker": {"rate": self.breaker_rate, "callers": self.breaker_callers},
            "cluster": {"rate": self.cluster_rate},
            "usage": {"records": self.usage_records, "calls": self.usage_calls},
            "upstream_threads": args.upstream_threads,
            "client_threads": args.client_threads,
            "upstream_http": args.upstream_http,
            "in_flight": {"upstream_latency_ms": self.inflight_latency_ms, "rates": self.inflight_rates},
            "paired": self.paired.map(|p| serde_json::json!({
                "rounds": p.rounds, "rate": p.rate, "duration_s": p.duration.as_secs_f64(),
            })),
            "wait_quiet": self.quiet.map(|q| serde_json::json!({
                "max_wait_s": q.max_wait.as_secs(), "p99_ms": q.p99_us / 1000.0,
                "sync_p99_ms": q.sync_p99_us / 1000.0,
            })),
        })
    }
}
